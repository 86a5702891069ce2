//! Integration tests: a real registry on loopback (`docker-registry`) and
//! openssl as an independent ECDSA implementation.
// Helpers outside #[test] functions unwrap too: a panic is how they fail.
#![allow(clippy::unwrap_used)]

mod fake_registry;
mod https;
mod openssl_interop;
mod registry;
mod signatures;

use std::collections::BTreeMap;
use std::ops::{Deref, DerefMut};

use trainhub_plugin_oci::local_registry::LocalRegistry;

use trainhub_plugin_oci::{
    GeneratedKeys, ModuleRef, PlainHttp, PushedModule, RegistryClient, RegistryOptions, SigningKey,
    generate_key_pair,
};

/// A wasm component: the component header and a custom section of
/// `padding` bytes (so that blobs span several reads).
pub fn component(padding: usize, seed: u8) -> Vec<u8> {
    let mut bytes = b"\0asm\x0d\x00\x01\x00".to_vec();
    let name = b"trainhub-test";
    let mut section = vec![name.len() as u8];
    section.extend_from_slice(name);
    section.extend((0..padding).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)));
    bytes.push(0); // custom section
    leb128(&mut bytes, section.len());
    bytes.extend(section);
    bytes
}

fn leb128(out: &mut Vec<u8>, mut n: usize) {
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// A client that speaks plain HTTP to loopback registries.
pub fn client() -> RegistryClient {
    RegistryClient::new(RegistryOptions {
        plain_http: PlainHttp::Loopback,
        ..RegistryOptions::default()
    })
}

pub fn module_ref(registry: &str, path: &str) -> ModuleRef {
    ModuleRef::parse(&format!("oci://{registry}/{path}")).expect("reference")
}

pub struct Signer {
    pub keys: GeneratedKeys,
    pub key: SigningKey,
}

pub fn signer() -> Signer {
    let keys = generate_key_pair().expect("keys");
    let key = SigningKey::from_pem(&keys.private_pem).expect("private key");
    Signer { keys, key }
}

pub const CREATED: &str = "2025-01-01T00:00:00Z";

pub fn no_annotations() -> BTreeMap<String, String> {
    BTreeMap::new()
}

/// Pushes `module` to `path` (`repo:tag`) of the registry at `address`.
pub async fn push(address: &str, path: &str, module: &[u8]) -> PushedModule {
    client()
        .push(
            &module_ref(address, path),
            module,
            CREATED,
            &no_annotations(),
        )
        .await
        .unwrap_or_else(|e| panic!("pushing {path}: {e}"))
}

/// A registry storing under its own temporary directory (removed after
/// the registry is killed).
pub struct TestRegistry {
    registry: LocalRegistry,
    _dir: tempfile::TempDir,
}

impl Deref for TestRegistry {
    type Target = LocalRegistry;
    fn deref(&self) -> &LocalRegistry {
        &self.registry
    }
}

impl DerefMut for TestRegistry {
    fn deref_mut(&mut self) -> &mut LocalRegistry {
        &mut self.registry
    }
}

/// A started registry, or `None` (said why) when the test should skip.
pub fn start_registry() -> Option<TestRegistry> {
    start_registry_with(None)
}

/// A started registry requiring the credentials of `htpasswd`.
pub fn start_registry_with(htpasswd: Option<&str>) -> Option<TestRegistry> {
    let dir = tempfile::tempdir().expect("temporary directory");
    let registry =
        LocalRegistry::start_or_skip(dir.path(), htpasswd).unwrap_or_else(|e| panic!("{e}"))?;
    Some(TestRegistry {
        registry,
        _dir: dir,
    })
}
