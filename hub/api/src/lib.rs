//! Kubernetes API types shared by the trainhub hub, its spokes and its WebAssembly plugins.
//!
//! The types serialize exactly as the upstream Go types do (camelCase names, absent optional
//! fields omitted), so that parsing an upstream object and serializing it again reproduces it.
//! Deserialization never fills in defaults: call the explicit `default_fields` methods to apply
//! the defaults an API server would apply from the CRD schema.
//!
//! | module | API group / version | kinds |
//! |---|---|---|
//! | [`trainer`] | `trainer.kubeflow.org/v1alpha1` (Kubeflow Trainer v2.3) | [`trainer::TrainJob`], [`trainer::TrainingRuntime`], [`trainer::ClusterTrainingRuntime`] |
//! | [`jobset`] | `jobset.x-k8s.io/v1alpha2` | [`jobset::JobSet`] |
//! | [`podgroup::coscheduling`] | `scheduling.x-k8s.io/v1alpha1` (scheduler-plugins) | [`podgroup::coscheduling::PodGroup`] |
//! | [`podgroup::volcano`] | `scheduling.volcano.sh/v1beta1` | [`podgroup::volcano::PodGroup`] |
//!
//! Every top-level kind implements [`k8s_openapi::Resource`], [`k8s_openapi::ListableResource`]
//! and [`k8s_openapi::Metadata`], so kube-rs can use it directly. [`crd`] builds the
//! trainer.kubeflow.org CustomResourceDefinitions from these types, and [`constants`] holds the
//! label, annotation, condition and environment variable names spelled as upstream spells them.
//!
//! The crate does no I/O and builds for `wasm32-wasip2`.

#[macro_use]
mod resource;

pub mod constants;
pub mod crd;
pub mod jobset;
pub mod podgroup;
pub mod trainer;

mod error;

pub use error::Error;

/// The Kubeflow Trainer release whose API this crate implements; published to
/// clients that ask (the Kubeflow SDK reads it from a ConfigMap).
pub const TRAINER_VERSION: &str = "v2.3.0";
