//! Plugin modules in OCI registries, for the hub and `trainctl`.
//!
//! - [`ModuleRef`]: `oci://registry/repo:tag@sha256:<hex>` references.
//! - [`RegistryClient`]: pull a module by digest (every byte checked against
//!   its digest, every answer bounded by [`Limits`]), push one in the CNCF
//!   wasm artifact layout, read and write cosign signatures.
//! - [`cosign`]: cosign's key-based signature format, compatible with
//!   `cosign sign --key` / `cosign verify --key`.
//! - [`detached`]: detached signature files for modules from a URL or file.
//! - [`url::fetch_https`]: a module at an `https://` URL, pinned by sha256.
//! - [`TrustPolicy`]: Kubewarden-shaped `allOf` / `anyOf` of public keys,
//!   evaluated into a [`Verdict`] or a [`Refusal`] naming the missing key.
//!
//! Everything but [`RegistryClient`] is pure: no I/O, no global state.

pub mod artifact;
pub mod cosign;
pub mod detached;
mod digest;
mod error;
pub mod keys;
pub mod local_registry;
pub mod policy;
mod reference;
mod registry;
pub mod url;

pub use cosign::CosignSignature;
pub use detached::DetachedSignature;
pub use digest::Digest;
pub use error::{Error, Object};
pub use keys::{GeneratedKeys, PublicKey, SigningKey, generate_key_pair};
pub use policy::{CompiledPolicy, KeyId, Refusal, RefusalReason, TrustPolicy, Verdict};
pub use reference::ModuleRef;
pub use registry::{
    Credentials, Limits, PlainHttp, PulledModule, PushedModule, RegistryClient, RegistryOptions,
};
