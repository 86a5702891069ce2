//! trainspoke: the agent that joins a GPU cluster (or a plain machine) to a
//! trainhub hub.
//!
//! - [`agent`]: the one gRPC stream to the hub over mutual TLS: hello,
//!   heartbeats, admission answers, run reports and log chunks out; offers,
//!   starts, stops and log requests in; reconnects with backoff and jitter.
//! - [`backend`]: the interface between the agent and what runs the work,
//!   and its implementations ([`backend::process`], the embedded default:
//!   every pod of the built JobSet is a local process).
//! - [`cli`]: the `trainspoke` command line.
//! - [`metrics`]: Prometheus metrics and the `--http-address` endpoint.

pub mod agent;
pub mod backend;
pub mod certs;
pub mod cli;
pub mod metrics;
