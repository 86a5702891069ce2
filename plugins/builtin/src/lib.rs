//! The logic of trainhub's built-in pipeline plugins, one module per plugin.
//!
//! Each plugin is a plain type implementing [`trainhub_plugin_sdk::Plugin`],
//! unit-tested natively through [`trainhub_plugin_sdk::testing::Harness`] and
//! built, unchanged, into its own WebAssembly component by the crates under
//! `plugins/<name>/`. They reproduce Kubeflow Trainer v2.3's runtime
//! framework plugins of the same names; `docs/plugins-upstream.md` names the
//! upstream files and commit each was checked against, and the deliberate
//! differences.
//!
//! | plugin | applies to | phases |
//! |---|---|---|
//! | [`jobset::JobSet`] | every TrainJob | validate, build (the JobSet), status |
//! | [`torch::Torch`] | `mlPolicy.torch` (TorchTune included) | validate, enforce ML policy |
//! | [`mpi::Mpi`] | `mlPolicy.mpi` | validate, enforce ML policy, build (SSH Secret, hostfile ConfigMap) |
//! | [`plainml::PlainMl`] | no torch, mpi or jax policy | enforce ML policy |
//! | [`python::Python`] | framework label `python` | validate, enforce ML policy |
//! | [`jax::Jax`] | `mlPolicy.jax` | enforce ML policy |
//! | [`xgboost::Xgboost`] | `mlPolicy.xgboost` | validate, enforce ML policy |
//! | [`flux::Flux`] | `mlPolicy.flux` | validate, enforce ML policy, build (scripts ConfigMap, CURVE Secret) |
//! | [`coscheduling::Coscheduling`] | `podGroupPolicy.coscheduling` | enforce pod-group policy, build (PodGroup) |
//! | [`volcano::Volcano`] | `podGroupPolicy.volcano` | validate, enforce pod-group policy, build (PodGroup) |
//!
//! # Phase order
//!
//! The host calls the plugins in this order, and each plugin relies on it:
//!
//! 1. PreExecution, at admission: `validate` of every plugin that applies to
//!    the TrainJob (the JobSet plugin, the runtime's ML plugin, its pod-group
//!    plugin); their warnings and field errors are gathered into one answer.
//! 2. Build, when the TrainJob is placed on a spoke, on the runtime info the
//!    host computed with [`trainhub_plugin_sdk::info::new_runtime_info`]:
//!    1. `enforce-ml-policy` of the one ML plugin the runtime selects (counts,
//!       env, ports, volumes);
//!    2. then `enforce-pod-group-policy` of its pod-group plugin, which reads
//!       the final counts;
//!    3. then `build` of the JobSet plugin, the ML plugin and the pod-group
//!       plugin, on the same enforced info; the objects are created together.
//! 3. PostExecution: `status` of the JobSet plugin maps each observed JobSet
//!    status to the TrainJob status.
//!
//! Every plugin is also defensive about the order: a phase called for a
//! TrainJob it does not apply to changes nothing.

pub mod coscheduling;
pub mod flux;
pub mod jax;
pub mod jobset;
pub mod mpi;
pub mod plainml;
pub mod python;
pub mod quantity;
pub mod torch;
pub mod volcano;
pub mod xgboost;

mod common;
mod podgroup;
mod ssh;
mod torchtune;
