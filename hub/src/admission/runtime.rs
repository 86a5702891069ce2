//! The validating webhook of TrainingRuntime and ClusterTrainingRuntime:
//! the JobSet template's TrainJob steps (replicated Jobs labelled
//! `trainer.kubeflow.org/trainjob-ancestor-step`) run one Job each and hold
//! the container the TrainJob's settings are applied to.

use serde_json::Value;
use trainhub_api::constants;
use trainhub_apiserver::field::{self, FieldError};

/// Where upstream documents when deprecated runtimes go away.
pub const RUNTIME_DEPRECATION_POLICY_URL: &str = "https://trainer.kubeflow.org/en/latest/operator-guides/runtime.html#runtime-deprecation-policy";

/// The container each TrainJob step must have, by ancestor label value.
fn required_container(ancestor: &str) -> Option<&'static str> {
    match ancestor {
        constants::ANCESTOR_TRAINER => Some(constants::NODE),
        constants::ANCESTOR_DATASET_INITIALIZER => Some(constants::DATASET_INITIALIZER),
        constants::ANCESTOR_MODEL_INITIALIZER => Some(constants::MODEL_INITIALIZER),
        _ => None,
    }
}

/// Errors of the runtime's `spec.template.spec.replicatedJobs` (after
/// defaulting, so an absent `replicas` is already 1).
pub fn validate_replicated_jobs(runtime: &Value) -> Vec<FieldError> {
    let path = "spec.template.spec.replicatedJobs";
    let jobs = runtime
        .pointer("/spec/template/spec/replicatedJobs")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut errors = Vec::new();
    for (i, job) in jobs.iter().enumerate() {
        let Some(ancestor) = job
            .pointer("/template/metadata/labels")
            .and_then(|l| l.get(constants::LABEL_TRAINJOB_ANCESTOR))
            .and_then(Value::as_str)
        else {
            continue;
        };
        let Some(container) = required_container(ancestor) else {
            continue;
        };
        let at = field::index(path, i);
        let replicas = job
            .get("replicas")
            .cloned()
            .unwrap_or(Value::from(constants::DEFAULT_JOB_REPLICAS));
        if replicas.as_i64() != Some(1) {
            errors.push(FieldError::invalid(
                field::child(&at, "replicas"),
                replicas,
                "always must be 1",
            ));
        }
        let containers = job
            .pointer("/template/spec/template/spec/containers")
            .cloned()
            .unwrap_or(Value::Null);
        let has = containers.as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c.get("name").and_then(Value::as_str) == Some(container))
        });
        if !has {
            errors.push(FieldError::invalid(
                format!("{at}.template.spec.template.spec.containers"),
                containers,
                format!("must contain the required container for the ancestor: {ancestor}"),
            ));
        }
    }
    errors
}

/// Whether the object carries `trainer.kubeflow.org/support: deprecated`.
pub fn is_deprecated(object: &Value) -> bool {
    object
        .pointer("/metadata/labels")
        .and_then(|l| l.get(constants::LABEL_SUPPORT))
        .and_then(Value::as_str)
        == Some(constants::SUPPORT_DEPRECATED)
}

/// The warning on creating a deprecated ClusterTrainingRuntime.
pub fn deprecated_runtime_warning(name: &str) -> String {
    format!(
        "ClusterTrainingRuntime \"{name}\" is deprecated and will be removed in a future release of Kubeflow Trainer. See runtime deprecation policy: {RUNTIME_DEPRECATION_POLICY_URL}"
    )
}

/// The warning on a TrainJob referencing a deprecated ClusterTrainingRuntime.
pub fn deprecated_reference_warning(name: &str) -> String {
    format!(
        "Referenced ClusterTrainingRuntime \"{name}\" is deprecated and will be removed in a future release of Kubeflow Trainer. See runtime deprecation policy: {RUNTIME_DEPRECATION_POLICY_URL}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn runtime(jobs: Value) -> Value {
        json!({"spec": {"template": {"spec": {"replicatedJobs": jobs}}}})
    }

    fn step(name: &str, ancestor: &str, replicas: i64, container: &str) -> Value {
        json!({
            "name": name,
            "replicas": replicas,
            "template": {
                "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": ancestor}},
                "spec": {"template": {"spec": {"containers": [{"name": container, "image": "i"}]}}}
            }
        })
    }

    #[test]
    fn steps_run_one_job_with_their_container() {
        let ok = runtime(json!([
            step(
                "dataset-initializer",
                "dataset-initializer",
                1,
                "dataset-initializer"
            ),
            step(
                "model-initializer",
                "model-initializer",
                1,
                "model-initializer"
            ),
            step("node", "trainer", 1, "node"),
        ]));
        assert!(validate_replicated_jobs(&ok).is_empty());

        let bad = runtime(json!([
            step(
                "dataset-initializer",
                "dataset-initializer",
                2,
                "dataset-initializer"
            ),
            step("node", "trainer", 1, "trainer"),
            // Jobs without a TrainJob step label are the runtime's own.
            json!({"name": "sidecar", "replicas": 3}),
        ]));
        let errors: Vec<String> = validate_replicated_jobs(&bad)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            errors,
            [
                "spec.template.spec.replicatedJobs[0].replicas: Invalid value: 2: always must be 1",
                "spec.template.spec.replicatedJobs[1].template.spec.template.spec.containers: Invalid value: [{\"image\":\"i\",\"name\":\"trainer\"}]: must contain the required container for the ancestor: trainer",
            ]
        );
    }

    #[test]
    fn deprecation_is_read_from_the_support_label() {
        assert!(is_deprecated(
            &json!({"metadata": {"labels": {"trainer.kubeflow.org/support": "deprecated"}}})
        ));
        assert!(!is_deprecated(&json!({"metadata": {"labels": {}}})));
        assert!(
            deprecated_runtime_warning("x")
                .starts_with("ClusterTrainingRuntime \"x\" is deprecated")
        );
    }
}
