//! trainhub: a federation hub for Kubeflow Trainer TrainJobs.
//!
//! Layout follows the path of a TrainJob (see `docs/` and the README):
//! `plugins` runs the pipeline as sandboxed WebAssembly components.

pub mod admission;
pub mod builtin;
pub mod ctl;
pub mod plugins;
pub mod render;
