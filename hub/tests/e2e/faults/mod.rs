//! Fault tests: real hub and spoke processes over real gRPC.

mod spokes;
