//! Integration tests of trainhub-api against the upstream manifests and CRDs in `shared/`.

// Test helpers unwrap: a panic is how they report a failure.
#![allow(clippy::unwrap_used)]

mod crd_compare;
mod manifests;
mod roundtrip;
mod support;
