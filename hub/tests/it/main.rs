//! Integration tests of the hub crate (one test binary, modules by subject).

mod admission;
mod common;
mod grpc_caps;
mod kueue;
mod leader;
mod plugin_oci;
mod reload;
mod render;
mod sandbox;
mod spoke_protocol;
