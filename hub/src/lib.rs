//! trainhub: a federation hub for Kubeflow Trainer TrainJobs.
//!
//! Layout follows the path of a TrainJob (see `docs/design.md`):
//! [`api`] (the resources served, on `trainhub_apiserver`) → [`admission`]
//! (defaulting, validation, the PreExecution plugins) → the store →
//! [`controller`]s; [`plugins`] runs the pipeline as sandboxed WebAssembly
//! components; [`kueue`] serves Kueue's quota kinds; [`hub`] assembles a hub
//! process, [`dev`] the embedded default.

pub mod admission;
pub mod api;
pub mod api_limits;
pub mod builtin;
pub mod controller;
pub mod ctl;
pub mod dashboard;
pub mod dev;
pub mod dispatch;
pub mod grpc;
pub mod hub;
pub mod kueue;
pub mod leader;
pub mod logging;
pub mod memory;
pub mod metrics;
pub mod peer;
pub mod plugins;
pub mod render;
pub mod spokes;
pub mod trainer_status;
