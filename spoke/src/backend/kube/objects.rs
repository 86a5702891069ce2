//! The objects of a run as the backend applies them: which API each kind
//! lives in, and the labels, annotation and owner references it adds.

use std::collections::BTreeMap;

use kube::core::ApiResource;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use crate::backend::{BackendError, PodSetRequest, RunSpec};

/// Label: the run (the TrainJob's uid at the hub).
pub const LABEL_RUN_ID: &str = "trainhub.dev/run-id";
/// Label: the placement of the run.
pub const LABEL_GENERATION: &str = "trainhub.dev/generation";
/// Label: the TrainJob's uid at the hub.
pub const LABEL_TRAINJOB_UID: &str = "trainhub.dev/trainjob-uid";
/// Annotation: the hash of the JobSet as the hub built it.
pub const ANNOTATION_SPEC_HASH: &str = "trainhub.dev/spec-hash";
/// Label: the Kueue LocalQueue a JobSet is submitted to.
pub const LABEL_KUEUE_QUEUE: &str = "kueue.x-k8s.io/queue-name";
/// Labels the JobSet controller puts on the pods of a JobSet: its name
/// and the replicated job's.
pub use crate::backend::process::plan::keys::{
    JOBSET_NAME as LABEL_JOBSET_NAME, REPLICATED_JOB_NAME as LABEL_REPLICATED_JOB,
};
/// Label the JobSet controller puts on the pods of a JobSet (recent
/// versions): the JobSet's uid.
pub const LABEL_JOBSET_UID: &str = "jobset.sigs.k8s.io/jobset-uid";

/// The kinds a run may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    JobSet,
    /// The scheduler-plugins coscheduling PodGroup.
    PodGroup,
    /// Volcano's PodGroup.
    VolcanoPodGroup,
    ConfigMap,
    Secret,
}

/// `(kind, group, version, plural)` of every kind the backend applies.
const TABLE: &[(Kind, &str, &str, &str, &str)] = &[
    (
        Kind::JobSet,
        "JobSet",
        "jobset.x-k8s.io",
        "v1alpha2",
        "jobsets",
    ),
    (
        Kind::PodGroup,
        "PodGroup",
        "scheduling.x-k8s.io",
        "v1alpha1",
        "podgroups",
    ),
    (
        Kind::VolcanoPodGroup,
        "PodGroup",
        "scheduling.volcano.sh",
        "v1beta1",
        "podgroups",
    ),
    (Kind::ConfigMap, "ConfigMap", "", "v1", "configmaps"),
    (Kind::Secret, "Secret", "", "v1", "secrets"),
];

impl Kind {
    /// Every kind, JobSet first.
    pub const ALL: [Kind; 5] = [
        Kind::JobSet,
        Kind::PodGroup,
        Kind::VolcanoPodGroup,
        Kind::ConfigMap,
        Kind::Secret,
    ];

    fn row(self) -> (&'static str, &'static str, &'static str, &'static str) {
        TABLE
            .iter()
            .find(|row| row.0 == self)
            .map(|&(_, kind, group, version, plural)| (kind, group, version, plural))
            .unwrap_or(("JobSet", "jobset.x-k8s.io", "v1alpha2", "jobsets"))
    }

    /// The API of this kind.
    pub fn api_resource(self) -> ApiResource {
        let (kind, group, version, plural) = self.row();
        ApiResource {
            group: group.to_owned(),
            version: version.to_owned(),
            api_version: api_version(group, version),
            kind: kind.to_owned(),
            plural: plural.to_owned(),
        }
    }

    /// `group/plural` (`plural` for the core group), as errors name them.
    pub fn describe(self) -> String {
        let (_, group, _, plural) = self.row();
        if group.is_empty() {
            plural.to_owned()
        } else {
            format!("{plural}.{group}")
        }
    }

    /// The kind of an object by its `apiVersion` and `kind`.
    ///
    /// # Errors
    ///
    /// `Invalid` naming the kind and apiVersion when the backend does not
    /// apply that kind.
    pub fn of(object: &Value) -> Result<Kind, BackendError> {
        let api = object["apiVersion"].as_str().unwrap_or_default();
        let kind = object["kind"].as_str().unwrap_or_default();
        TABLE
            .iter()
            .find(|&&(_, k, group, version, _)| k == kind && api == api_version(group, version))
            .map(|row| row.0)
            .ok_or_else(|| {
                let known: Vec<String> = TABLE
                    .iter()
                    .map(|&(_, k, g, v, _)| format!("{} {k}", api_version(g, v)))
                    .collect();
                BackendError::Invalid(format!(
                    "object {:?}: the kube backend does not apply kind {kind:?} of apiVersion {api:?}; it applies {}",
                    object["metadata"]["name"].as_str().unwrap_or_default(),
                    known.join(", ")
                ))
            })
    }
}

fn api_version(group: &str, version: &str) -> String {
    if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    }
}

/// How the backend marks what it applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marks {
    pub run_id: String,
    pub generation: i64,
    pub trainjob_uid: String,
    /// `--kueue-queue`: the JobSet is submitted suspended to this queue.
    pub kueue_queue: Option<String>,
}

impl Marks {
    pub fn of(spec: &RunSpec, kueue_queue: Option<&str>) -> Self {
        Marks {
            run_id: spec.key.run_id.clone(),
            generation: spec.key.generation,
            trainjob_uid: spec.trainjob_uid.clone(),
            kueue_queue: kueue_queue.map(str::to_owned),
        }
    }

    fn labels(&self) -> [(&'static str, String); 3] {
        [
            (LABEL_RUN_ID, self.run_id.clone()),
            (LABEL_GENERATION, self.generation.to_string()),
            (LABEL_TRAINJOB_UID, self.trainjob_uid.clone()),
        ]
    }
}

/// The label selector of one run's objects.
pub fn run_selector(run_id: &str, generation: i64) -> String {
    format!("{LABEL_RUN_ID}={run_id},{LABEL_GENERATION}={generation}")
}

/// An object as the hub sent it, made ready to apply: in `namespace`,
/// without what a server sets (resourceVersion, uid, status...), with the
/// run's labels.
fn prepared(object: &Value, namespace: &str, marks: &Marks) -> Result<Value, BackendError> {
    let Some(fields) = object.as_object() else {
        return Err(BackendError::Invalid(
            "an object of the run is not a JSON object".into(),
        ));
    };
    let mut out = fields.clone();
    out.remove("status");
    let meta = out
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    let Some(meta) = meta.as_object_mut() else {
        return Err(BackendError::Invalid(format!(
            "{} {:?}: metadata is not an object",
            object["kind"].as_str().unwrap_or_default(),
            object["metadata"]
        )));
    };
    match meta.get("name").and_then(Value::as_str) {
        Some(name) if !name.is_empty() => {}
        _ => {
            return Err(BackendError::Invalid(format!(
                "a {} of the run has no metadata.name",
                object["kind"].as_str().unwrap_or_default()
            )));
        }
    }
    for server_set in [
        "resourceVersion",
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "managedFields",
        "selfLink",
        "generateName",
    ] {
        meta.remove(server_set);
    }
    meta.insert("namespace".into(), namespace.into());
    let labels = meta
        .entry("labels")
        .or_insert_with(|| Value::Object(Map::new()));
    if !labels.is_object() {
        *labels = Value::Object(Map::new());
    }
    for (k, v) in marks.labels() {
        labels[k] = v.into();
    }
    Ok(Value::Object(out))
}

/// The JobSet to apply: labelled, annotated with the hash of what the hub
/// built (so that an unchanged JobSet is not applied again), without owner
/// references (its TrainJob lives at the hub, not in this cluster), and in
/// Kueue mode suspended and queued.
pub fn jobset_to_apply(
    jobset: &Value,
    namespace: &str,
    marks: &Marks,
) -> Result<Value, BackendError> {
    let mut out = prepared(jobset, namespace, marks)?;
    if let Some(meta) = out["metadata"].as_object_mut() {
        meta.remove("ownerReferences");
    }
    if let Some(queue) = &marks.kueue_queue {
        out["metadata"]["labels"][LABEL_KUEUE_QUEUE] = queue.clone().into();
        if !out["spec"].is_object() {
            out["spec"] = json!({});
        }
        out["spec"]["suspend"] = true.into();
    }
    let hash = spec_hash(&out);
    let meta = &mut out["metadata"];
    if !meta["annotations"].is_object() {
        meta["annotations"] = json!({});
    }
    meta["annotations"][ANNOTATION_SPEC_HASH] = hash.into();
    Ok(out)
}

/// Another object of the run (PodGroup, ConfigMap, Secret): labelled and
/// owned by the JobSet (controller, blocking its deletion), in place of the
/// TrainJob that owns it upstream, so that the cluster's garbage collector
/// deletes it with the JobSet.
pub fn child_to_apply(
    object: &Value,
    namespace: &str,
    marks: &Marks,
    jobset_name: &str,
    jobset_uid: &str,
) -> Result<Value, BackendError> {
    let mut out = prepared(object, namespace, marks)?;
    let jobset = Kind::JobSet.api_resource();
    let mut refs: Vec<Value> = out["metadata"]["ownerReferences"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|r| {
            let api = r["apiVersion"].as_str().unwrap_or_default();
            // The hub's TrainJob is not in this cluster; neither is any
            // other controller a reference could name with controller=true.
            !api.starts_with("trainer.kubeflow.org/") && r["controller"] != true
        })
        .collect();
    refs.push(json!({
        "apiVersion": jobset.api_version,
        "kind": jobset.kind,
        "name": jobset_name,
        "uid": jobset_uid,
        "controller": true,
        "blockOwnerDeletion": true,
    }));
    out["metadata"]["ownerReferences"] = Value::Array(refs);
    Ok(out)
}

/// Whether a Secret is immutable: such a Secret is created once and kept
/// (its content, an SSH key, is random per build).
pub fn is_immutable(object: &Value) -> bool {
    object["immutable"] == true
}

/// SHA-256 of the object's JSON with its keys sorted, hex.
pub fn spec_hash(object: &Value) -> String {
    let mut hasher = Sha256::new();
    hash_into(&mut hasher, object);
    hex::encode(hasher.finalize())
}

/// Canonical JSON into `hasher`: keys sorted, no whitespace.
fn hash_into(hasher: &mut Sha256, value: &Value) {
    match value {
        Value::Object(map) => {
            let sorted: BTreeMap<&String, &Value> = map.iter().collect();
            hasher.update(b"{");
            for (i, (k, v)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    hasher.update(b",");
                }
                hasher.update(Value::String(k.clone()).to_string().as_bytes());
                hasher.update(b":");
                hash_into(hasher, v);
            }
            hasher.update(b"}");
        }
        Value::Array(items) => {
            hasher.update(b"[");
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    hasher.update(b",");
                }
                hash_into(hasher, v);
            }
            hasher.update(b"]");
        }
        other => hasher.update(other.to_string().as_bytes()),
    }
}

/// The pod sets of a JobSet: per replicated job, `replicas × parallelism`
/// pods each requesting what its template does (for a start without an
/// offer before it).
pub fn jobset_pod_sets(jobset: &Value) -> Vec<PodSetRequest> {
    jobset["spec"]["replicatedJobs"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|rjob| {
            let replicas = rjob["replicas"].as_u64().unwrap_or(1);
            let job = &rjob["template"]["spec"];
            let parallelism = job["parallelism"].as_u64().unwrap_or(1);
            let count = u32::try_from(replicas.saturating_mul(parallelism)).unwrap_or(u32::MAX);
            let mut requests = super::capacity::pod_requests(&job["template"]["spec"]);
            requests.remove(super::capacity::PODS);
            PodSetRequest {
                name: rjob["name"].as_str().unwrap_or_default().to_owned(),
                count,
                requests_milli: requests,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marks() -> Marks {
        Marks {
            run_id: "uid-1".into(),
            generation: 2,
            trainjob_uid: "uid-1".into(),
            kueue_queue: None,
        }
    }

    fn jobset() -> Value {
        json!({
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {
                "name": "j",
                "namespace": "elsewhere",
                "labels": {"app": "x"},
                "ownerReferences": [{"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "j", "uid": "uid-1", "controller": true}],
                "resourceVersion": "7",
            },
            "spec": {"replicatedJobs": [{"name": "node", "replicas": 2, "template": {"spec": {
                "parallelism": 2,
                "template": {"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "2", "nvidia.com/gpu": "1"}}}]}}
            }}}]},
            "status": {"conditions": []},
        })
    }

    #[test]
    fn kinds_are_looked_up_by_api_version_and_kind() {
        assert_eq!(Kind::of(&jobset()).unwrap(), Kind::JobSet);
        assert_eq!(
            Kind::of(&json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup"}))
                .unwrap(),
            Kind::VolcanoPodGroup
        );
        assert_eq!(
            Kind::of(&json!({"apiVersion": "v1", "kind": "Secret"})).unwrap(),
            Kind::Secret
        );
        let err =
            Kind::of(&json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}))
                .unwrap_err();
        let BackendError::Invalid(message) = err else {
            panic!("expected Invalid, got {err:?}");
        };
        assert!(message.contains("\"Service\""), "{message}");
        assert!(message.contains("object \"s\""), "{message}");
        assert_eq!(
            Kind::VolcanoPodGroup.describe(),
            "podgroups.scheduling.volcano.sh"
        );
        assert_eq!(Kind::ConfigMap.api_resource().api_version, "v1");
        assert_eq!(
            Kind::PodGroup.api_resource().api_version,
            "scheduling.x-k8s.io/v1alpha1"
        );
    }

    #[test]
    fn the_jobset_is_labelled_annotated_and_unowned() {
        let out = jobset_to_apply(&jobset(), "ml", &marks()).unwrap();
        let meta = &out["metadata"];
        assert_eq!(meta["namespace"], "ml");
        assert_eq!(meta["labels"]["app"], "x");
        assert_eq!(meta["labels"][LABEL_RUN_ID], "uid-1");
        assert_eq!(meta["labels"][LABEL_GENERATION], "2");
        assert_eq!(meta["labels"][LABEL_TRAINJOB_UID], "uid-1");
        assert!(meta["ownerReferences"].is_null());
        assert!(meta["resourceVersion"].is_null());
        assert!(out["status"].is_null());
        assert!(out["spec"]["suspend"].is_null());
        let hash = meta["annotations"][ANNOTATION_SPEC_HASH].as_str().unwrap();
        assert_eq!(hash.len(), 64);
        // Everything else is as the hub built it.
        assert_eq!(out["spec"], jobset()["spec"]);
    }

    #[test]
    fn kueue_mode_suspends_and_queues_the_jobset() {
        let m = Marks {
            kueue_queue: Some("team-a".into()),
            ..marks()
        };
        let out = jobset_to_apply(&jobset(), "ml", &m).unwrap();
        assert_eq!(out["spec"]["suspend"], true);
        assert_eq!(out["metadata"]["labels"][LABEL_KUEUE_QUEUE], "team-a");
        let plain = jobset_to_apply(&jobset(), "ml", &marks()).unwrap();
        assert_ne!(
            out["metadata"]["annotations"][ANNOTATION_SPEC_HASH],
            plain["metadata"]["annotations"][ANNOTATION_SPEC_HASH]
        );
    }

    #[test]
    fn the_hash_ignores_key_order_and_sees_values() {
        let a = json!({"a": 1, "b": {"c": [1, 2], "d": "x"}});
        let b = json!({"b": {"d": "x", "c": [1, 2]}, "a": 1});
        let c = json!({"b": {"d": "x", "c": [2, 1]}, "a": 1});
        assert_eq!(spec_hash(&a), spec_hash(&b));
        assert_ne!(spec_hash(&a), spec_hash(&c));
        // Another generation is another hash.
        let mut m = marks();
        let one = jobset_to_apply(&jobset(), "ml", &m).unwrap();
        m.generation = 3;
        let two = jobset_to_apply(&jobset(), "ml", &m).unwrap();
        assert_ne!(
            one["metadata"]["annotations"][ANNOTATION_SPEC_HASH],
            two["metadata"]["annotations"][ANNOTATION_SPEC_HASH]
        );
    }

    #[test]
    fn children_are_owned_by_the_jobset_instead_of_the_trainjob() {
        let cm = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "j-mpi-hostfile", "ownerReferences": [
                {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "j", "uid": "uid-1", "controller": true, "blockOwnerDeletion": true},
            ]},
            "data": {"hostfile": "a slots=1\n"},
        });
        let out = child_to_apply(&cm, "ml", &marks(), "j", "js-uid").unwrap();
        assert_eq!(
            out["metadata"]["ownerReferences"],
            json!([{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "j",
                    "uid": "js-uid", "controller": true, "blockOwnerDeletion": true}])
        );
        assert_eq!(out["metadata"]["labels"][LABEL_RUN_ID], "uid-1");
        assert_eq!(out["metadata"]["namespace"], "ml");
        assert_eq!(out["data"], cm["data"]);
        assert!(out["metadata"]["annotations"].is_null());
    }

    #[test]
    fn objects_without_a_name_are_invalid() {
        let err = jobset_to_apply(
            &json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {}}),
            "ml",
            &marks(),
        )
        .unwrap_err();
        assert_eq!(
            err,
            BackendError::Invalid("a JobSet of the run has no metadata.name".into())
        );
        assert!(jobset_to_apply(&json!([1]), "ml", &marks()).is_err());
    }

    #[test]
    fn pod_sets_of_a_jobset() {
        assert_eq!(
            jobset_pod_sets(&jobset()),
            vec![PodSetRequest {
                name: "node".into(),
                count: 4,
                requests_milli: [("cpu".to_string(), 2000), ("nvidia.com/gpu".into(), 1000)].into()
            }]
        );
        assert!(is_immutable(&json!({"immutable": true})));
        assert!(!is_immutable(&json!({})));
    }
}
