//! Integration tests of the spoke (one test binary).

// Test helpers unwrap: a panic is how they report a failure.
#![allow(clippy::unwrap_used)]

mod kube;
mod process;
