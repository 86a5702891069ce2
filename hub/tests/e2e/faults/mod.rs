//! Fault tests: real processes, real gRPC.

mod exactly_once;
