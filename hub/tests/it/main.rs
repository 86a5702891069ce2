//! Integration tests of the hub crate (one test binary, modules by subject).

mod admission;
mod common;
mod reload;
mod render;
mod sandbox;
