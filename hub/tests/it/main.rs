//! Integration tests of the hub crate (one test binary, modules by subject).

mod common;
mod reload;
mod render;
mod sandbox;
