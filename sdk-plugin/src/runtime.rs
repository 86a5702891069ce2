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

impl Runtime {
    /// Parses a runtime from JSON text, as [`Deserialize`] does, but reads
    /// the text twice instead of building a `serde_json::Value` first: once
    /// for `kind` (skipping everything else), once into the typed object.
    /// Plugins parse their runtime on every call, so this is the hot path.
    ///
    /// # Errors
    ///
    /// The JSON is malformed, names no runtime `kind`, or is not a valid
    /// object of that kind.
    pub fn from_json(json: &str) -> Result<Self, serde_json::Error> {
        use serde::de::Error;
        /// Only `kind`; other fields are skipped without being built.
        #[derive(Deserialize)]
        struct Kind {
            kind: Option<serde_json::Value>,
        }
        let Kind { kind } = serde_json::from_str(json)?;
        match kind.as_ref().and_then(serde_json::Value::as_str) {
            Some("TrainingRuntime") => {
                serde_json::from_str(json).map(|r| Runtime::TrainingRuntime(Box::new(r)))
            }
            Some("ClusterTrainingRuntime") => {
                serde_json::from_str(json).map(|r| Runtime::ClusterTrainingRuntime(Box::new(r)))
            }
            other => Err(serde_json::Error::custom(kind_error(other))),
        }
    }
}

/// Why a document with this `kind` is not a runtime.
fn kind_error(kind: Option<&str>) -> String {
    match kind {
        Some(other) => format!(
            "kind {other:?} is not a runtime: expected TrainingRuntime or ClusterTrainingRuntime"
        ),
        None => "the runtime has no kind".to_string(),
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
            other => Err(D::Error::custom(kind_error(other))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn both(json: &str) -> (Result<Runtime, String>, Result<Runtime, String>) {
        (
            Runtime::from_json(json).map_err(|e| e.to_string()),
            serde_json::from_str::<Runtime>(json).map_err(|e| e.to_string()),
        )
    }

    #[test]
    fn from_json_reads_both_kinds_as_deserialize_does() {
        for kind in ["TrainingRuntime", "ClusterTrainingRuntime"] {
            let json = serde_json::json!({
                "apiVersion": "trainer.kubeflow.org/v1alpha1",
                "kind": kind,
                "metadata": {"name": "r", "labels": {"trainer.kubeflow.org/framework": "torch"}},
                "spec": {
                    "mlPolicy": {"numNodes": 2, "torch": {}},
                    "template": {"spec": {"replicatedJobs": [{"name": "node", "template": {}}]}}
                }
            })
            .to_string();
            let (fast, slow) = both(&json);
            let fast = fast.unwrap();
            assert_eq!(fast, slow.unwrap());
            assert_eq!(fast.kind(), kind);
            assert_eq!(fast.framework(), Some("torch"));
        }
    }

    #[test]
    fn from_json_refuses_what_is_not_a_runtime() {
        let (fast, _) = both(r#"{"kind": "TrainJob", "spec": {}}"#);
        assert!(
            fast.unwrap_err()
                .contains("kind \"TrainJob\" is not a runtime")
        );
        for no_kind in [r#"{"spec": {}}"#, r#"{"kind": 3}"#] {
            let (fast, slow) = both(no_kind);
            assert_eq!(fast.unwrap_err(), "the runtime has no kind");
            assert!(slow.unwrap_err().contains("the runtime has no kind"));
        }
        let (fast, slow) = both(r#"{"kind": "TrainingRuntime", "spec": 1}"#);
        assert!(fast.is_err() && slow.is_err());
        let (fast, slow) = both("{");
        assert!(fast.is_err() && slow.is_err());
    }
}
