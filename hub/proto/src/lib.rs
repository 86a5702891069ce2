//! The gRPC protocol between the hub and its spoke agents
//! (`proto/spoke.proto`): one bidirectional stream per spoke.
//!
//! The Rust code in `src/generated/` is generated from the `.proto` and
//! checked in; `cargo test -p trainhub-proto` fails when it is stale and
//! `UPDATE_GENERATED=1 cargo test -p trainhub-proto` rewrites it.

/// `trainhub.spoke.v1`.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod v1 {
    include!("generated/trainhub.spoke.v1.rs");
}

pub use v1::*;

pub mod limits;
