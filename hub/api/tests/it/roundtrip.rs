//! Every upstream object parses into its typed kind and serializes back to itself.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use trainhub_api::jobset::JobSet;
use trainhub_api::trainer::{ClusterTrainingRuntime, TrainJob, TrainingRuntime};

use crate::support::{documents, file_name, json_diff, read, shared_dir, trainer_dir, yaml_files};

/// Quantities are strings in the typed form; upstream YAML may write whole numbers unquoted.
fn quantities_as_strings(value: &mut Value) {
    match value {
        Value::Object(object) => {
            for (key, child) in object.iter_mut() {
                if matches!(key.as_str(), "limits" | "requests")
                    && let Value::Object(quantities) = child
                {
                    for quantity in quantities.values_mut() {
                        if let Value::Number(number) = quantity {
                            *quantity = Value::String(number.to_string());
                        }
                    }
                }
                quantities_as_strings(child);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(quantities_as_strings),
        _ => {}
    }
}

/// Parses a document into `K` and serializes it back.
type RoundTrip = fn(&Value) -> Result<Value, String>;

fn round_trip<K: DeserializeOwned + Serialize>(document: &Value) -> Result<Value, String> {
    let typed: K = serde_json::from_value(document.clone()).map_err(|e| e.to_string())?;
    serde_json::to_value(&typed).map_err(|e| e.to_string())
}

#[test]
fn every_upstream_object_parses_and_round_trips() {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut failures = Vec::new();
    for path in yaml_files(&trainer_dir()) {
        let name = file_name(&path);
        for (index, document) in documents(&read(&path)).into_iter().enumerate() {
            let kind = document["kind"].as_str().unwrap_or_default().to_owned();
            let back = match kind.as_str() {
                "TrainJob" => round_trip::<TrainJob>(&document),
                "TrainingRuntime" => round_trip::<TrainingRuntime>(&document),
                "ClusterTrainingRuntime" => round_trip::<ClusterTrainingRuntime>(&document),
                "JobSet" => round_trip::<JobSet>(&document),
                other => Err(format!("unexpected kind {other:?}")),
            };
            let mut expected = document;
            quantities_as_strings(&mut expected);
            match back {
                Ok(back) if back == expected => {}
                Ok(back) => failures.push(format!(
                    "{name} document {index} ({kind}) does not round-trip:\n  {}",
                    json_diff(&back, &expected).join("\n  ")
                )),
                Err(error) => failures.push(format!("{name} document {index} ({kind}): {error}")),
            }
            *seen.entry(kind).or_default() += 1;
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    println!("round-tripped upstream objects: {seen:?}");
    for kind in ["TrainJob", "TrainingRuntime", "ClusterTrainingRuntime"] {
        assert!(
            seen.contains_key(kind),
            "no upstream {kind} was checked: {seen:?}"
        );
    }
}

#[test]
fn yaml_parses_straight_into_typed_objects() {
    let runtime: ClusterTrainingRuntime =
        serde_saphyr::from_str(&read(&trainer_dir().join("llama3_2_1B.yaml"))).unwrap();
    let node = runtime
        .spec
        .template
        .spec
        .replicated_job("node")
        .expect("the torchtune runtime has a node job");
    let resources = node
        .template
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0]
        .resources
        .clone()
        .unwrap();
    let gpus = &resources.limits.unwrap()["nvidia.com/gpu"];
    assert_eq!(gpus.0, "2", "an unquoted integer quantity becomes a string");

    let jobs: Vec<TrainJob> =
        serde_saphyr::from_multiple(&read(&trainer_dir().join("01-multi-node.yaml"))).unwrap();
    let job = jobs
        .iter()
        .find(|job| job.spec.trainer.is_some())
        .expect("a TrainJob");
    assert_eq!(job.spec.trainer.as_ref().unwrap().num_nodes, Some(3));
}

#[test]
fn upstream_crds_parse_as_custom_resource_definitions() {
    let mut files = yaml_files(&trainer_dir().join("crds"));
    files.push(shared_dir().join("upstream/jobset/jobset.x-k8s.io_jobsets.yaml"));
    assert_eq!(files.len(), 4, "{files:?}");
    for path in files {
        let crd: CustomResourceDefinition = serde_saphyr::from_str(&read(&path))
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(
            trainhub_api::crd::manifest_file_name(&crd),
            file_name(&path),
            "file name follows <group>_<plural>.yaml"
        );
    }
}

/// Kinds and fields the upstream examples do not exercise: status, JobSet, PodGroups.
#[test]
fn objects_with_status_round_trip() {
    use serde_json::json;
    use trainhub_api::podgroup::{coscheduling, volcano};

    let time = "2025-03-01T10:00:00Z";
    let condition = json!({
        "type": "Complete", "status": "True", "reason": "AllJobsCompleted",
        "message": "jobset completed successfully", "lastTransitionTime": time,
    });
    let cases: Vec<(Value, RoundTrip)> = vec![
        (
            json!({
                "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                "metadata": {"name": "j", "namespace": "ns", "resourceVersion": "7"},
                "spec": {
                    "runtimeRef": {"name": "torch-distributed"},
                    "activeDeadlineSeconds": 3600,
                    "managedBy": "kueue.x-k8s.io/multikueue",
                    "initializer": {"dataset": {"storageUri": "hf://d", "secretRef": {"name": "s"}}},
                    "runtimePatches": [{
                        "manager": "kueue.x-k8s.io/manager", "time": time,
                        "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [{
                            "name": "node",
                            "template": {"spec": {"template": {"spec": {
                                "containers": [{"name": "node", "env": [{"name": "A", "value": "1"}]}],
                                "terminationGracePeriodSeconds": 30,
                            }}}},
                        }]}}},
                    }],
                },
                "status": {
                    "conditions": [condition.clone()],
                    "jobsStatus": [{"name": "node", "ready": 0, "succeeded": 2, "failed": 0, "active": 0, "suspended": 0}],
                    "trainerStatus": {
                        "progressPercentage": 100, "estimatedRemainingSeconds": 0,
                        "metrics": [{"name": "loss", "value": "0.01"}], "lastUpdatedTime": time,
                    },
                },
            }),
            round_trip::<TrainJob>,
        ),
        (
            json!({
                "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                "metadata": {"name": "j", "labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                "spec": {
                    "replicatedJobs": [{
                        "name": "node", "groupName": "default", "replicas": 2,
                        "dependsOn": [{"name": "init", "status": "Complete"}],
                        "template": {"spec": {"completionMode": "Indexed", "template": {"spec": {
                            "containers": [{"name": "node", "image": "i", "resources": {"limits": {"cpu": "1"}}}],
                        }}}},
                    }],
                    "network": {"enableDNSHostnames": true, "subdomain": "j", "publishNotReadyAddresses": true},
                    "successPolicy": {"operator": "All", "targetReplicatedJobs": ["node"]},
                    "failurePolicy": {"maxRestarts": 3, "restartStrategy": "BlockingRecreate", "rules": [{
                        "name": "r", "action": "RestartJobAndIgnoreMaxRestarts",
                        "onJobFailureReasons": ["PodFailurePolicy"],
                        "onJobFailureMessagePatterns": [".*"], "targetReplicatedJobs": ["node"],
                    }]},
                    "startupPolicy": {"startupPolicyOrder": "InOrder"},
                    "coordinator": {"replicatedJob": "node", "jobIndex": 0, "podIndex": 0},
                    "suspend": false, "managedBy": "trainhub", "ttlSecondsAfterFinished": 60,
                    "volumeClaimPolicies": [{
                        "templates": [{"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}],
                        "retentionPolicy": {"whenDeleted": "Retain"},
                    }],
                },
                "status": {
                    "conditions": [condition.clone()], "restarts": 1, "restartsCountTowardsMax": 1,
                    "terminalState": "Completed",
                    "replicatedJobsStatus": [{"name": "node", "ready": 0, "succeeded": 2, "failed": 0, "active": 0, "suspended": 0, "jobRestarts": [1, 0]}],
                },
            }),
            round_trip::<JobSet>,
        ),
        (
            json!({
                "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
                "metadata": {"name": "j"},
                "spec": {"minMember": 3, "minResources": {"cpu": "3", "nvidia.com/gpu": "6"}, "scheduleTimeoutSeconds": 60},
                "status": {"phase": "Running", "occupiedBy": "uid", "running": 3, "succeeded": 0, "failed": 0, "scheduleStartTime": time},
            }),
            round_trip::<coscheduling::PodGroup>,
        ),
        (
            json!({
                "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
                "metadata": {"name": "j"},
                "spec": {
                    "minMember": 3, "minTaskMember": {"node": 3}, "queue": "q", "priorityClassName": "high",
                    "minResources": {"cpu": "3"}, "networkTopology": {"mode": "soft", "highestTierAllowed": 2},
                },
                "status": {
                    "phase": "Running", "running": 3,
                    "conditions": [{"type": "Scheduled", "status": "True", "transitionID": "t", "lastTransitionTime": time, "reason": "tasks in gang are ready to be scheduled", "message": "m"}],
                },
            }),
            round_trip::<volcano::PodGroup>,
        ),
    ];
    for (document, round_trip) in cases {
        let kind = document["apiVersion"].to_string() + " " + &document["kind"].to_string();
        let back = round_trip(&document).unwrap_or_else(|e| panic!("{kind}: {e}"));
        assert!(
            back == document,
            "{kind} does not round-trip:\n  {}",
            json_diff(&back, &document).join("\n  ")
        );
    }
}
