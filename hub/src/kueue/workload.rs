//! The Workload of a TrainJob, as Kueue's TrainJob integration would make
//! it: named as Kueue names it, owned by the TrainJob, queued in the
//! LocalQueue of its `kueue.x-k8s.io/queue-name` label, with its priority
//! and one pod set per replicated job of the JobSet the hub builds.
//!
//! Pure: the caller resolves the priority class and the pod sets (from the
//! enforce plugins, as dispatch does) and stores the result; quota decisions
//! fill [`WorkloadStatus`].

use serde_json::{Map, Value, json};

use super::{
    GROUP, LABEL_JOB_UID, LABEL_MAX_EXEC_TIME_SECONDS, LABEL_PRIORITY_CLASS, STORAGE_VERSION,
};
use super::{LABEL_QUEUE_NAME, WORKLOAD, WORKLOAD_PRIORITY_CLASS};
use crate::dispatch::core::PodSetDemand;

/// The owner kind Kueue hashes into a TrainJob's Workload name.
const TRAINJOB_KIND: &str = "TrainJob";
const TRAINJOB_GROUP: &str = "trainer.kubeflow.org";
const TRAINJOB_API_VERSION: &str = "trainer.kubeflow.org/v1alpha1";
/// Longest Workload name (a DNS-1123 subdomain; Kueue's default, its
/// `ShortWorkloadNames` gate being off).
const MAX_NAME: usize = 253;
/// Hex digits of the owner hash at the end of the name.
const HASH_LENGTH: usize = 5;

/// The Workload's priority: the WorkloadPriorityClass named by the
/// TrainJob's `kueue.x-k8s.io/priority-class` label and its value, or none
/// (priority 0).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Priority {
    /// The WorkloadPriorityClass, when the TrainJob names one.
    pub class: Option<String>,
    pub value: i32,
}

/// The priority of a TrainJob's Workload: its label's WorkloadPriorityClass,
/// whose value `value_of` looks up.
///
/// # Errors
///
/// The label names a WorkloadPriorityClass that does not exist (Kueue
/// creates no Workload then either).
pub fn priority(
    trainjob: &Value,
    value_of: impl Fn(&str) -> Option<i32>,
) -> Result<Priority, String> {
    let Some(class) = label(trainjob, LABEL_PRIORITY_CLASS).filter(|c| !c.is_empty()) else {
        return Ok(Priority::default());
    };
    let value = value_of(class).ok_or_else(|| {
        format!(
            "workloadPriorityClass {class:?} named by the {LABEL_PRIORITY_CLASS} label not found"
        )
    })?;
    Ok(Priority {
        class: Some(class.to_string()),
        value,
    })
}

/// What quota decisions set on a Workload: its conditions (Kueue's
/// [`super::conditions`]) and its admission. Empty for a Workload just
/// queued.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkloadStatus {
    pub conditions: Vec<Condition>,
    pub admission: Option<Admission>,
}

/// One `metav1.Condition`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    pub reason: String,
    pub message: String,
    /// RFC 3339.
    pub last_transition_time: String,
    pub observed_generation: Option<i64>,
}

/// Where a Workload has its quota.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    pub cluster_queue: String,
    pub pod_set_assignments: Vec<PodSetAssignment>,
}

/// The quota of one pod set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodSetAssignment {
    pub name: String,
    /// Resource name → the flavor it is counted in.
    pub flavors: std::collections::BTreeMap<String, String>,
    /// Resource name → milli-units, for all `count` pods.
    pub resource_usage_milli: std::collections::BTreeMap<String, i64>,
    pub count: u32,
}

/// Kueue's name for the Workload of the TrainJob `name` with `uid`:
/// `trainjob-NAME-HASH`, HASH the first five hex digits of the SHA-1 of the
/// owner's kind, group, name and uid (one per line); the prefix is cut so
/// that the name stays within 253 characters.
pub fn workload_name(name: &str, uid: &str) -> String {
    let prefix: String = format!("{}-{name}", TRAINJOB_KIND.to_ascii_lowercase())
        .chars()
        .take(MAX_NAME - 1 - HASH_LENGTH)
        .collect();
    let digest = sha1(format!("{TRAINJOB_KIND}\n{TRAINJOB_GROUP}\n{name}\n{uid}").as_bytes());
    format!("{prefix}-{}", &digest[..HASH_LENGTH])
}

/// The uid the hub gives the Workload of the TrainJob with `uid`: derived
/// from it (SHA-1), so every hub replica and every rewrite gives the same,
/// in the shape of a UUID.
pub fn workload_uid(uid: &str) -> String {
    let h = sha1(format!("Workload\n{uid}").as_bytes());
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

fn sha1(bytes: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, bytes);
    hex::encode(digest.as_ref())
}

fn label<'a>(object: &'a Value, key: &str) -> Option<&'a str> {
    object["metadata"]["labels"][key].as_str()
}

/// The Workload (v1beta2) of `trainjob` with `pod_sets`, `priority` and
/// `status`. The store stamps `resourceVersion`; `uid` and
/// `creationTimestamp` are the writer's to set, as for every object the hub
/// writes itself.
///
/// Each pod set's template holds one container with the pod's requests,
/// what quota is counted from.
pub fn workload_for(
    trainjob: &Value,
    pod_sets: &[PodSetDemand],
    priority: &Priority,
    status: &WorkloadStatus,
) -> Value {
    let meta = &trainjob["metadata"];
    let name = meta["name"].as_str().unwrap_or_default();
    let namespace = meta["namespace"].as_str().unwrap_or_default();
    let uid = meta["uid"].as_str().unwrap_or_default();
    let mut labels = Map::new();
    // A uid that is not a valid label value gets no label, as in Kueue.
    if !uid.is_empty() && trainhub_apiserver::selector::label_value_errors(uid).is_empty() {
        labels.insert(LABEL_JOB_UID.into(), uid.into());
    }
    let mut spec = Map::new();
    spec.insert(
        "podSets".into(),
        pod_sets.iter().map(pod_set).collect::<Vec<_>>().into(),
    );
    if let Some(queue) = label(trainjob, LABEL_QUEUE_NAME).filter(|q| !q.is_empty()) {
        spec.insert("queueName".into(), queue.into());
    }
    if let Some(class) = &priority.class {
        spec.insert(
            "priorityClassRef".into(),
            json!({"group": GROUP, "kind": WORKLOAD_PRIORITY_CLASS, "name": class}),
        );
    }
    spec.insert("priority".into(), priority.value.into());
    spec.insert("active".into(), true.into());
    if let Some(seconds) = label(trainjob, LABEL_MAX_EXEC_TIME_SECONDS)
        .and_then(|s| s.parse::<i32>().ok())
        .filter(|s| *s > 0)
    {
        spec.insert("maximumExecutionTimeSeconds".into(), seconds.into());
    }
    let mut workload = json!({
        "apiVersion": format!("{GROUP}/{STORAGE_VERSION}"),
        "kind": WORKLOAD,
        "metadata": {
            "name": workload_name(name, uid),
            "namespace": namespace,
            "labels": labels,
            "ownerReferences": [{
                "apiVersion": TRAINJOB_API_VERSION,
                "kind": TRAINJOB_KIND,
                "name": name,
                "uid": uid,
                "controller": true,
                "blockOwnerDeletion": true,
            }],
        },
        "spec": spec,
    });
    let status = status_value(status);
    if !status.as_object().is_some_and(Map::is_empty) {
        workload["status"] = status;
    }
    workload
}

fn pod_set(demand: &PodSetDemand) -> Value {
    let requests: Map<String, Value> = demand
        .requests_milli
        .iter()
        .map(|(resource, milli)| (resource.clone(), crate::spokes::quantity(*milli).into()))
        .collect();
    json!({
        "name": demand.name,
        "count": demand.count,
        "template": {"spec": {"containers": [{
            "name": demand.name,
            "resources": {"requests": requests},
        }]}},
    })
}

fn status_value(status: &WorkloadStatus) -> Value {
    let mut out = Map::new();
    if !status.conditions.is_empty() {
        let conditions: Vec<Value> = status
            .conditions
            .iter()
            .map(|c| {
                let mut v = json!({
                    "type": c.type_, "status": c.status, "reason": c.reason,
                    "message": c.message, "lastTransitionTime": c.last_transition_time,
                });
                if let Some(generation) = c.observed_generation {
                    v["observedGeneration"] = generation.into();
                }
                v
            })
            .collect();
        out.insert("conditions".into(), conditions.into());
    }
    if let Some(admission) = &status.admission {
        let assignments: Vec<Value> = admission
            .pod_set_assignments
            .iter()
            .map(|a| {
                let usage: Map<String, Value> = a
                    .resource_usage_milli
                    .iter()
                    .map(|(r, m)| (r.clone(), crate::spokes::quantity(*m).into()))
                    .collect();
                json!({"name": a.name, "flavors": a.flavors, "resourceUsage": usage, "count": a.count})
            })
            .collect();
        out.insert(
            "admission".into(),
            json!({"clusterQueue": admission.cluster_queue, "podSetAssignments": assignments}),
        );
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn trainjob(labels: Value) -> Value {
        json!({
            "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": "pytorch-mnist", "namespace": "team-a", "uid": "5b8f7c2e-1f0a-4c3b-9d6e-2a7b8c9d0e1f", "labels": labels},
            "spec": {"runtimeRef": {"name": "torch-distributed"}},
        })
    }

    #[test]
    fn workload_uids_are_stable_and_shaped_as_uuids() {
        let a = workload_uid("u1");
        assert_eq!(a, workload_uid("u1"));
        assert_ne!(a, workload_uid("u2"));
        assert_eq!(a.len(), 36);
        assert_eq!(a.matches('-').count(), 4);
    }

    #[test]
    fn names_follow_kueue() {
        // The first five hex digits of
        // sha1("TrainJob\ntrainer.kubeflow.org\npytorch-mnist\n5b8f7c2e-..."),
        // computed apart (Python's hashlib).
        let name = workload_name("pytorch-mnist", "5b8f7c2e-1f0a-4c3b-9d6e-2a7b8c9d0e1f");
        assert_eq!(name, "trainjob-pytorch-mnist-5b3c5");
        assert_eq!(sha1(b"abc"), "a9993e364706816aba3e25717850c26c9cd0d89d");
        // Another uid, another name; a long name is cut to 253.
        assert_ne!(name, workload_name("pytorch-mnist", "other"));
        let long = workload_name(&"x".repeat(300), "u");
        assert_eq!(long.len(), 253);
        assert!(long.starts_with("trainjob-xxx"));
    }

    #[test]
    fn the_workload_of_a_queued_trainjob() {
        let job = trainjob(json!({
            "kueue.x-k8s.io/queue-name": "user-queue",
            "kueue.x-k8s.io/priority-class": "high",
            "kueue.x-k8s.io/max-exec-time-seconds": "3600",
        }));
        let priority = priority(&job, |c| (c == "high").then_some(1000)).unwrap();
        assert_eq!(
            priority,
            Priority {
                class: Some("high".into()),
                value: 1000
            }
        );
        let pod_sets = [PodSetDemand {
            name: "node".into(),
            count: 2,
            requests_milli: BTreeMap::from([
                ("cpu".into(), 1500),
                ("memory".into(), 2048 * 1024 * 1024 * 1000),
            ]),
        }];
        let wl = workload_for(&job, &pod_sets, &priority, &WorkloadStatus::default());
        assert_eq!(wl["apiVersion"], "kueue.x-k8s.io/v1beta2");
        assert_eq!(wl["kind"], "Workload");
        assert_eq!(wl["metadata"]["namespace"], "team-a");
        assert!(
            wl["metadata"]["name"]
                .as_str()
                .unwrap()
                .starts_with("trainjob-pytorch-mnist-")
        );
        assert_eq!(
            wl["metadata"]["labels"],
            json!({"kueue.x-k8s.io/job-uid": "5b8f7c2e-1f0a-4c3b-9d6e-2a7b8c9d0e1f"})
        );
        assert_eq!(
            wl["metadata"]["ownerReferences"],
            json!([{"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "pytorch-mnist",
                    "uid": "5b8f7c2e-1f0a-4c3b-9d6e-2a7b8c9d0e1f", "controller": true, "blockOwnerDeletion": true}])
        );
        assert_eq!(
            wl["spec"],
            json!({
                "podSets": [{"name": "node", "count": 2, "template": {"spec": {"containers": [
                    {"name": "node", "resources": {"requests": {"cpu": "1500m", "memory": "2Gi"}}}
                ]}}}],
                "queueName": "user-queue",
                "priorityClassRef": {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": "high"},
                "priority": 1000,
                "active": true,
                "maximumExecutionTimeSeconds": 3600,
            })
        );
        assert!(wl.get("status").is_none());
    }

    #[test]
    fn priority_needs_an_existing_class() {
        let job = trainjob(json!({"kueue.x-k8s.io/priority-class": "missing"}));
        let e = priority(&job, |_| None).unwrap_err();
        assert!(e.contains("\"missing\""), "{e}");
        assert_eq!(
            priority(&trainjob(json!({})), |_| Some(5)).unwrap(),
            Priority::default()
        );
    }

    #[test]
    fn status_comes_from_the_quota_decision() {
        let status = WorkloadStatus {
            conditions: vec![Condition {
                type_: super::super::conditions::QUOTA_RESERVED.into(),
                status: "True".into(),
                reason: "QuotaReserved".into(),
                message: "Quota reserved in ClusterQueue cluster-queue".into(),
                last_transition_time: "2026-01-01T00:00:00Z".into(),
                observed_generation: Some(1),
            }],
            admission: Some(Admission {
                cluster_queue: "cluster-queue".into(),
                pod_set_assignments: vec![PodSetAssignment {
                    name: "node".into(),
                    flavors: BTreeMap::from([("cpu".into(), "default-flavor".into())]),
                    resource_usage_milli: BTreeMap::from([("cpu".into(), 3000)]),
                    count: 2,
                }],
            }),
        };
        let wl = workload_for(&trainjob(json!({})), &[], &Priority::default(), &status);
        assert_eq!(wl["status"]["conditions"][0]["type"], "QuotaReserved");
        assert_eq!(wl["status"]["conditions"][0]["observedGeneration"], 1);
        assert_eq!(
            wl["status"]["admission"],
            json!({"clusterQueue": "cluster-queue", "podSetAssignments": [
                {"name": "node", "flavors": {"cpu": "default-flavor"}, "resourceUsage": {"cpu": "3"}, "count": 2}
            ]})
        );
        assert!(wl["spec"].get("queueName").is_none());
        assert_eq!(wl["spec"]["priority"], 0);
    }
}
