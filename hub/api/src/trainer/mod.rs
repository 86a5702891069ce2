//! `trainer.kubeflow.org/v1alpha1`, as of Kubeflow Trainer v2.3: [`TrainJob`], and the
//! runtimes it references, [`TrainingRuntime`] (namespaced) and [`ClusterTrainingRuntime`]
//! (cluster-scoped), which share [`TrainingRuntimeSpec`].

mod runtime;
mod trainjob;

pub use runtime::*;
pub use trainjob::*;

/// API group of every kind in this module.
pub const GROUP: &str = <TrainJob as k8s_openapi::Resource>::GROUP;

/// API version of every kind in this module.
pub const VERSION: &str = <TrainJob as k8s_openapi::Resource>::VERSION;
