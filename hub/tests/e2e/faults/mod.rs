//! Fault tests: real hub and spoke processes over real gRPC, one file per area.

mod exactly_once;
mod hubd;
mod plugins;
mod runtime;
mod spokes;
