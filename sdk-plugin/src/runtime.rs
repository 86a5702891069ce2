//! A TrainJob's runtime: a namespaced `TrainingRuntime` or a cluster-scoped
//! `ClusterTrainingRuntime`. Both carry the same spec.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use trainhub_api::trainer::{ClusterTrainingRuntime, TrainingRuntime, TrainingRuntimeSpec};

/// Either runtime kind, told apart by `kind` on the wire.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Runtime {
    TrainingRuntime(Box<TrainingRuntime>),
    ClusterTrainingRuntime(Box<ClusterTrainingRuntime>),
}

impl Runtime {
    pub fn metadata(&self) -> &ObjectMeta {
        match self {
            Runtime::TrainingRuntime(r) => &r.metadata,
            Runtime::ClusterTrainingRuntime(r) => &r.metadata,
        }
    }

    pub fn spec(&self) -> &TrainingRuntimeSpec {
        match self {
            Runtime::TrainingRuntime(r) => &r.spec,
            Runtime::ClusterTrainingRuntime(r) => &r.spec,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Runtime::TrainingRuntime(_) => "TrainingRuntime",
            Runtime::ClusterTrainingRuntime(_) => "ClusterTrainingRuntime",
        }
    }

    pub fn name(&self) -> &str {
        self.metadata().name.as_deref().unwrap_or_default()
    }

    /// The `trainer.kubeflow.org/framework` label, if set.
    pub fn framework(&self) -> Option<&str> {
        self.metadata()
            .labels
            .as_ref()?
            .get(trainhub_api::constants::LABEL_FRAMEWORK)
            .map(String::as_str)
    }
}

impl<'de> Deserialize<'de> for Runtime {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let value = serde_json::Value::deserialize(deserializer)?;
        match value.get("kind").and_then(serde_json::Value::as_str) {
            Some("TrainingRuntime") => serde_json::from_value(value)
                .map(|r| Runtime::TrainingRuntime(Box::new(r)))
                .map_err(D::Error::custom),
            Some("ClusterTrainingRuntime") => serde_json::from_value(value)
                .map(|r| Runtime::ClusterTrainingRuntime(Box::new(r)))
                .map_err(D::Error::custom),
            Some(other) => Err(D::Error::custom(format!(
                "kind {other:?} is not a runtime: expected TrainingRuntime or ClusterTrainingRuntime"
            ))),
            None => Err(D::Error::custom("the runtime has no kind")),
        }
    }
}
