//! Admission of TrainJobs and runtimes: defaulting, the CRD rules, the
//! webhooks and the PreExecution plugins, against a real store.

#![allow(
    clippy::unwrap_used,
    clippy::result_large_err,
    reason = "test helpers: a failure is the test's report"
)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use serde_json::{Value, json};
use trainhub::admission::{FixedPlugins, TrainerAdmission};
use trainhub::plugins::{Registry, Snapshot};
use trainhub_apiserver::admission::{Admission, Operation, Outcome, Request};
use trainhub_apiserver::auth::UserInfo;
use trainhub_apiserver::resource::ResourceDef;
use trainhub_apiserver::status::ApiError;
use trainhub_apiserver::store::{Key, Op, RedbStore, Store};

use crate::common::{documents, host, repo_dir, upstream_dir};

/// 2025-06-15T12:00:00Z
const NOW_SECS: u64 = 1_749_988_800;
const NOW: &str = "2025-06-15T12:00:00Z";

fn def(kind: &str) -> ResourceDef {
    trainhub::api::resources()
        .unwrap()
        .into_iter()
        .find(|d| d.group == "trainer.kubeflow.org" && d.kind == kind)
        .unwrap_or_else(|| panic!("not a trainer kind: {kind}"))
}

/// A hub's admission over a store in a temporary directory.
struct Hub {
    store: Arc<RedbStore>,
    admission: TrainerAdmission,
    _dir: tempfile::TempDir,
}

impl Hub {
    fn new() -> Hub {
        Self::with_plugins(Arc::new(FixedPlugins(Arc::new(Snapshot::new(
            trainhub::builtin::native(),
        )))))
    }

    fn with_plugins(plugins: Arc<dyn trainhub::admission::PluginSource>) -> Hub {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(RedbStore::open(&dir.path().join("store.redb"), 100).unwrap());
        let admission = TrainerAdmission::new(store.clone(), plugins)
            .unwrap()
            .with_clock(|| UNIX_EPOCH + Duration::from_secs(NOW_SECS));
        Hub {
            store,
            admission,
            _dir: dir,
        }
    }

    /// Admits a write of `object` (its kind, namespace and name from the
    /// object itself); returns the object as it would be stored.
    fn admit_with(
        &self,
        operation: Operation,
        subresource: Option<&str>,
        object: &Value,
        old: Option<&Value>,
    ) -> Result<(Value, Outcome), ApiError> {
        let kind = object["kind"].as_str().unwrap();
        let def = def(kind);
        let namespace = def.namespaced.then(|| {
            object["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default")
        });
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let user = UserInfo {
            name: "alice".into(),
            uid: "1".into(),
            groups: vec![],
        };
        let request = Request {
            operation,
            resource: &def,
            subresource,
            namespace,
            name,
            old,
            user: &user,
            dry_run: false,
        };
        let mut admitted = object.clone();
        let outcome = self.admission.admit(&request, &mut admitted)?;
        Ok((admitted, outcome))
    }

    fn create(&self, object: &Value) -> Result<Value, ApiError> {
        self.admit_with(Operation::Create, None, object, None)
            .map(|(v, _)| v)
    }

    fn update(&self, old: &Value, new: &Value) -> Result<Value, ApiError> {
        self.admit_with(Operation::Update, None, new, Some(old))
            .map(|(v, _)| v)
    }

    /// Admits and stores `object`.
    async fn apply(&self, object: &Value) -> Value {
        let admitted = self
            .create(object)
            .unwrap_or_else(|e| panic!("{}: {}", object["metadata"]["name"], e.message));
        let kind = admitted["kind"].as_str().unwrap();
        let def = def(kind);
        let namespace = def.namespaced.then(|| {
            admitted["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default")
        });
        let key = Key::new(
            &def.store_key(),
            namespace,
            admitted["metadata"]["name"].as_str().unwrap(),
        );
        let stored = self
            .store
            .commit(vec![Op::Create {
                key,
                value: admitted,
            }])
            .await
            .unwrap();
        (*stored[0].value).clone()
    }

    async fn delete(&self, key: Key) {
        self.store
            .commit(vec![Op::Delete {
                key,
                expected: None,
            }])
            .await
            .unwrap();
    }
}

fn load(path: &Path) -> Vec<Value> {
    documents(path)
}

fn torch_runtime() -> Value {
    load(&upstream_dir().join("torch_distributed.yaml")).remove(0)
}

fn job(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    })
}

/// The causes of a 422, as `(field, reason, message)`.
fn causes(e: &ApiError) -> Vec<(String, String, String)> {
    assert_eq!(e.code, 422, "{}", e.message);
    assert_eq!(e.reason, "Invalid");
    e.causes
        .iter()
        .map(|c| (c.field.clone(), c.reason.clone(), c.message.clone()))
        .collect()
}

fn cause(field: &str, reason: &str, message: &str) -> (String, String, String) {
    (field.into(), reason.into(), message.into())
}

/// Every field of `original` is in `admitted` with the same value: the
/// object was admitted unchanged, with defaults added.
fn assert_superset(admitted: &Value, original: &Value, path: &str) {
    match (admitted, original) {
        (Value::Object(a), Value::Object(o)) => {
            for (k, v) in o {
                let child = format!("{path}.{k}");
                match a.get(k) {
                    Some(av) => assert_superset(av, v, &child),
                    None => panic!("{child} was dropped"),
                }
            }
        }
        (Value::Array(a), Value::Array(o)) => {
            assert_eq!(a.len(), o.len(), "{path}");
            for (i, (av, ov)) in a.iter().zip(o).enumerate() {
                assert_superset(av, ov, &format!("{path}[{i}]"));
            }
        }
        _ => assert_eq!(admitted, original, "{path}"),
    }
}

#[tokio::test]
async fn every_upstream_file_is_admitted() {
    let hub = Hub::new();
    let mut runtimes = Vec::new();
    let mut jobs = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(upstream_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 10, "{files:?}");
    for file in &files {
        for doc in load(file) {
            let name = file.file_name().unwrap().to_string_lossy().into_owned();
            match doc["kind"].as_str() {
                Some("TrainJob") => jobs.push((name, doc)),
                Some(_) => runtimes.push((name, doc)),
                None => panic!("{name}: document without kind"),
            }
        }
    }
    for (file, runtime) in &runtimes {
        let stored = hub.apply(runtime).await;
        assert_superset(&stored, runtime, file);
    }
    // The hub's own runtimes are admitted too (the same names as upstream's).
    let mut ours = 0;
    for entry in std::fs::read_dir(repo_dir().join("manifests/runtimes")).unwrap() {
        for runtime in load(&entry.unwrap().path()) {
            let admitted = hub
                .create(&runtime)
                .unwrap_or_else(|e| panic!("{}", e.message));
            assert_superset(&admitted, &runtime, "manifests/runtimes");
            ours += 1;
        }
    }
    assert!(ours >= 5);
    assert!(jobs.len() >= 5, "{jobs:?}");
    for (file, job) in &jobs {
        let admitted = hub.admit_with(Operation::Create, None, job, None);
        let (admitted, outcome) = admitted.unwrap_or_else(|e| panic!("{file}: {}", e.message));
        assert_superset(&admitted, job, file);
        if file == "05-multi-step.yaml" {
            // This example predates upstream's rule that a dataset
            // initializer mounts the `initializer` volume: admitted (every
            // upstream file must be), with the rule as a warning.
            assert_eq!(
                outcome.warnings,
                [
                    "spec.runtimeRef: \"torch-with-dataset-init\" must have volumeMount with name - initializer in container dataset-initializer of the dataset-initializer job (kubeflow/trainer refuses this TrainJob since #3714)"
                ]
            );
            continue;
        }
        assert!(
            outcome.warnings.is_empty(),
            "{file}: {:?}",
            outcome.warnings
        );
    }
}

#[tokio::test]
async fn defaults_are_visible_in_the_admitted_object() {
    let hub = Hub::new();
    hub.apply(&torch_runtime()).await;
    let admitted = hub
        .create(&job(
            "defaults",
            json!({
                "runtimeRef": {"name": "torch-distributed"},
                "runtimePatches": [{"manager": "example.com/user"}],
            }),
        ))
        .unwrap();
    let spec = &admitted["spec"];
    assert_eq!(spec["runtimeRef"]["apiGroup"], "trainer.kubeflow.org");
    assert_eq!(spec["runtimeRef"]["kind"], "ClusterTrainingRuntime");
    assert_eq!(
        spec["managedBy"],
        "trainer.kubeflow.org/trainjob-controller"
    );
    assert_eq!(spec["suspend"], false);
    assert_eq!(spec["runtimePatches"][0]["time"], NOW);

    // Set fields are kept.
    let admitted = hub
        .create(&job(
            "kept",
            json!({
                "runtimeRef": {"name": "torch-distributed", "kind": "ClusterTrainingRuntime"},
                "managedBy": "kueue.x-k8s.io/multikueue",
                "suspend": true,
            }),
        ))
        .unwrap();
    assert_eq!(admitted["spec"]["managedBy"], "kueue.x-k8s.io/multikueue");
    assert_eq!(admitted["spec"]["suspend"], true);

    // Runtimes get their schema defaults (MPI policy, JobSet replicas).
    let mut mpi_runtime = load(&upstream_dir().join("deepspeed_distributed.yaml")).remove(0);
    mpi_runtime["spec"]["mlPolicy"]["mpi"] = json!({});
    let runtime = hub.create(&mpi_runtime).unwrap();
    assert_eq!(
        runtime["spec"]["mlPolicy"]["mpi"],
        json!({
            "mpiImplementation": "OpenMPI",
            "numProcPerNode": 1,
            "runLauncherAsNode": false,
            "sshAuthMountPath": "/root/.ssh",
        })
    );
    for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"]
        .as_array()
        .unwrap()
    {
        assert_eq!(rjob["replicas"], 1, "{}", rjob["name"]);
    }
}

#[tokio::test]
async fn invalid_trainjobs_answer_422_with_field_causes() {
    let hub = Hub::new();
    hub.apply(&torch_runtime()).await;
    let torch = || json!({"name": "torch-distributed"});
    let long_name = "a".repeat(64);
    let cases = [
        (
            job(
                "j",
                json!({"runtimeRef": torch(), "trainer": {"numNodes": -1}}),
            ),
            vec![cause(
                "spec.trainer.numNodes",
                "FieldValueInvalid",
                "Invalid value: -1: spec.trainer.numNodes in body should be greater than or equal to 0",
            )],
        ),
        (
            job(
                "j",
                json!({"runtimeRef": torch(), "trainer": {"numProcPerNode": 0}}),
            ),
            vec![cause(
                "spec.trainer.numProcPerNode",
                "FieldValueInvalid",
                "Invalid value: \"integer\": numProcPerNode must be greater than or equal to 1",
            )],
        ),
        (
            job(
                "j",
                json!({"runtimeRef": torch(), "trainer": {"numNodes": "two"}}),
            ),
            vec![cause(
                "spec.trainer.numNodes",
                "FieldValueTypeInvalid",
                "Invalid value: \"string\": spec.trainer.numNodes in body must be of type integer: \"string\"",
            )],
        ),
        (
            job("j", json!({"runtimeRef": torch(), "managedBy": "me"})),
            vec![cause(
                "spec.managedBy",
                "FieldValueInvalid",
                "Invalid value: \"string\": ManagedBy must be trainer.kubeflow.org/trainjob-controller or kueue.x-k8s.io/multikueue if set",
            )],
        ),
        (
            job("Bad_Name", json!({"runtimeRef": torch()})),
            vec![cause(
                "<nil>",
                "FieldValueInvalid",
                "Invalid value: \"object\": metadata.name must match RFC 1035 DNS label format",
            )],
        ),
        (
            job(&long_name, json!({"runtimeRef": torch()})),
            vec![cause(
                "<nil>",
                "FieldValueInvalid",
                "Invalid value: \"object\": metadata.name must be no more than 63 characters",
            )],
        ),
        (
            job("j", json!({"runtimeRef": {}})),
            vec![cause(
                "spec.runtimeRef.name",
                "FieldValueRequired",
                "Required value",
            )],
        ),
        (
            job("j", json!({})),
            vec![cause(
                "spec.runtimeRef",
                "FieldValueRequired",
                "Required value",
            )],
        ),
        (
            job(
                "j",
                json!({"runtimeRef": torch(), "initializer": {"model": {"storageUri": "no-scheme"}}}),
            ),
            vec![cause(
                "spec.initializer.model.storageUri",
                "FieldValueInvalid",
                "Invalid value: \"string\": storageUri may be empty, or it must be a valid URI (scheme://...)",
            )],
        ),
        (
            job("j", json!({"runtimeRef": {"name": "nope"}})),
            vec![cause(
                "spec.runtimeRef",
                "FieldValueInvalid",
                "Invalid value: {\"apiGroup\":\"trainer.kubeflow.org\",\"kind\":\"ClusterTrainingRuntime\",\"name\":\"nope\"}: clustertrainingruntimes.trainer.kubeflow.org \"nope\" not found: specified clusterTrainingRuntime must be created before the TrainJob is created",
            )],
        ),
        (
            job(
                "j",
                json!({"runtimeRef": {"name": "torch-distributed", "kind": "TrainingRuntime"}}),
            ),
            vec![cause(
                "spec.runtimeRef",
                "FieldValueInvalid",
                "Invalid value: {\"apiGroup\":\"trainer.kubeflow.org\",\"kind\":\"TrainingRuntime\",\"name\":\"torch-distributed\"}: trainingruntimes.trainer.kubeflow.org \"torch-distributed\" not found: specified trainingRuntime must be created before the TrainJob is created",
            )],
        ),
        (
            // A PreExecution plugin's error is a cause like any other.
            job(
                "j",
                json!({"runtimeRef": torch(), "trainer": {"env": [{"name": "PET_NNODES", "value": "4"}]}}),
            ),
            vec![cause(
                "spec.trainer.env",
                "FieldValueInvalid",
                r#"Invalid value: [{"name":"PET_NNODES","value":"4"}]: must not have reserved envs, invalid envs configured: [PET_NNODES]"#,
            )],
        ),
    ];
    for (object, expected) in cases {
        let e = hub.create(&object).expect_err(&object.to_string());
        assert_eq!(causes(&e), expected, "{}", e.message);
        let name = object["metadata"]["name"].as_str().unwrap();
        assert!(
            e.message.starts_with(&format!(
                "TrainJob.trainer.kubeflow.org \"{name}\" is invalid: "
            )),
            "{}",
            e.message
        );
    }
}

#[tokio::test]
async fn trainjob_updates_keep_immutable_fields() {
    let hub = Hub::new();
    hub.apply(&torch_runtime()).await;
    let stored = hub
        .apply(&job(
            "upd",
            json!({
                "runtimeRef": {"name": "torch-distributed"},
                "trainer": {"numNodes": 2},
                "activeDeadlineSeconds": 600,
            }),
        ))
        .await;

    let immutable = |pointer: &str, value: Value, field: &str| {
        let mut new = stored.clone();
        *new.pointer_mut(pointer).unwrap() = value;
        let e = hub.update(&stored, &new).expect_err(field);
        let found = causes(&e);
        assert_eq!(found.len(), 1, "{}", e.message);
        assert_eq!(found[0].0, field);
        assert!(
            found[0].2.ends_with(": field is immutable"),
            "{}",
            found[0].2
        );
    };
    immutable("/spec/runtimeRef/name", json!("other"), "spec.runtimeRef");
    immutable("/spec/trainer/numNodes", json!(3), "spec.trainer");
    immutable(
        "/spec/activeDeadlineSeconds",
        json!(60),
        "spec.activeDeadlineSeconds",
    );
    immutable(
        "/spec/managedBy",
        json!("kueue.x-k8s.io/multikueue"),
        "spec.managedBy",
    );

    // Unchanged and mutable fields pass; omitted defaults come back.
    let mut new = stored.clone();
    new["spec"]["suspend"] = json!(true);
    new["spec"].as_object_mut().unwrap().remove("managedBy");
    new["metadata"]["labels"] = json!({"team": "a"});
    let admitted = hub.update(&stored, &new).unwrap();
    assert_eq!(
        admitted["spec"]["managedBy"],
        "trainer.kubeflow.org/trainjob-controller"
    );
}

#[tokio::test]
async fn runtime_patches_change_only_around_suspension() {
    let hub = Hub::new();
    hub.apply(&torch_runtime()).await;
    let patch = |manager: &str| {
        json!([{
            "manager": manager,
            "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [{
                "name": "node",
                "template": {"spec": {"template": {"spec": {"nodeSelector": {"pool": manager}}}}}
            }]}}}
        }])
    };
    let running = hub
        .apply(&job(
            "patched",
            json!({"runtimeRef": {"name": "torch-distributed"}, "runtimePatches": patch("example.com/a")}),
        ))
        .await;
    assert_eq!(running["spec"]["runtimePatches"][0]["time"], NOW);

    let mut changed = running.clone();
    changed["spec"]["runtimePatches"] = patch("example.com/b");
    let e = hub.update(&running, &changed).unwrap_err();
    assert_eq!(
        causes(&e),
        [cause(
            "spec.runtimePatches",
            "FieldValueForbidden",
            "Forbidden: RuntimePatches can only be modified when the TrainJob is suspended before or after the update",
        )]
    );

    // Suspending in the same update, or changing while suspended, is allowed.
    let mut suspending = changed.clone();
    suspending["spec"]["suspend"] = json!(true);
    let admitted = hub.update(&running, &suspending).unwrap();
    assert_eq!(admitted["spec"]["runtimePatches"][0]["time"], NOW);

    let mut suspended = running.clone();
    suspended["spec"]["suspend"] = json!(true);
    let mut resumed_with_new_patch = changed.clone();
    resumed_with_new_patch["spec"]["suspend"] = json!(false);
    hub.update(&suspended, &resumed_with_new_patch).unwrap();

    // While the JobSet still has active Jobs, even a suspended job waits.
    let mut draining = suspended.clone();
    draining["status"] = json!({"jobsStatus": [{"name": "node", "ready": 0, "succeeded": 0, "failed": 0, "active": 1, "suspended": 0}]});
    let mut new = changed.clone();
    new["spec"]["suspend"] = json!(true);
    let e = hub.update(&draining, &new).unwrap_err();
    assert_eq!(
        causes(&e)[0].2,
        "Forbidden: RuntimePatches cannot be modified when the JobSet's ReplicatedJob node is still active"
    );
}

#[tokio::test]
async fn updates_leaving_the_spec_alone_need_no_runtime() {
    let hub = Hub::new();
    hub.apply(&torch_runtime()).await;
    let stored = hub
        .apply(&job(
            "orphan",
            json!({"runtimeRef": {"name": "torch-distributed"}}),
        ))
        .await;
    hub.delete(Key::new(
        "trainer.kubeflow.org/clustertrainingruntimes",
        None,
        "torch-distributed",
    ))
    .await;
    let mut labelled = stored.clone();
    labelled["metadata"]["labels"] = json!({"team": "a"});
    hub.update(&stored, &labelled).unwrap();
    let mut suspended = stored.clone();
    suspended["spec"]["suspend"] = json!(true);
    let e = hub.update(&stored, &suspended).unwrap_err();
    assert!(causes(&e)[0].2.contains("not found"), "{}", e.message);
}

#[tokio::test]
async fn invalid_runtimes_answer_422() {
    let hub = Hub::new();
    let base = load(&upstream_dir().join("llama3_2_1B.yaml")).remove(0);
    let jobs = base["spec"]["template"]["spec"]["replicatedJobs"]
        .as_array()
        .unwrap()
        .clone();
    let index = |name: &str| jobs.iter().position(|j| j["name"] == name).unwrap();
    let (dataset, node) = (index("dataset-initializer"), index("node"));

    let mut replicas = base.clone();
    replicas["spec"]["template"]["spec"]["replicatedJobs"][dataset]["replicas"] = json!(2);
    let e = hub.create(&replicas).unwrap_err();
    assert_eq!(
        causes(&e),
        [cause(
            &format!("spec.template.spec.replicatedJobs[{dataset}].replicas"),
            "FieldValueInvalid",
            "Invalid value: 2: always must be 1",
        )]
    );
    assert!(e.message.starts_with(
        "ClusterTrainingRuntime.trainer.kubeflow.org \"torchtune-llama3.2-1b\" is invalid: "
    ));

    let mut container = base.clone();
    container["spec"]["template"]["spec"]["replicatedJobs"][node]["template"]["spec"]["template"]
        ["spec"]["containers"][0]["name"] = json!("trainer");
    let found = causes(&hub.create(&container).unwrap_err());
    assert_eq!(found.len(), 1);
    assert_eq!(
        found[0].0,
        format!("spec.template.spec.replicatedJobs[{node}].template.spec.template.spec.containers")
    );
    assert!(
        found[0]
            .2
            .ends_with(": must contain the required container for the ancestor: trainer")
    );

    // The same rules hold for namespaced runtimes.
    let mut namespaced = replicas.clone();
    namespaced["kind"] = json!("TrainingRuntime");
    namespaced["metadata"]["namespace"] = json!("team-a");
    assert_eq!(causes(&hub.create(&namespaced).unwrap_err()).len(), 1);

    let mut two_policies = torch_runtime();
    two_policies["spec"]["mlPolicy"]["mpi"] = json!({"numProcPerNode": 0});
    assert_eq!(
        causes(&hub.create(&two_policies).unwrap_err()),
        [
            cause(
                "spec.mlPolicy.mpi.numProcPerNode",
                "FieldValueInvalid",
                "Invalid value: \"integer\": NumProcPerNode in mpiPolicy must be >= 1",
            ),
            cause(
                "spec.mlPolicy",
                "FieldValueInvalid",
                "Invalid value: \"object\": Only one of the policy can be configured",
            ),
        ]
    );

    let mut bad_enum = load(&upstream_dir().join("deepspeed_distributed.yaml")).remove(0);
    bad_enum["spec"]["mlPolicy"]["mpi"]["mpiImplementation"] = json!("MPICH");
    assert_eq!(
        causes(&hub.create(&bad_enum).unwrap_err()),
        [cause(
            "spec.mlPolicy.mpi.mpiImplementation",
            "FieldValueNotSupported",
            "Unsupported value: \"MPICH\": supported values: \"OpenMPI\", \"\"",
        )]
    );
}

#[tokio::test]
async fn status_writes_check_the_status_only() {
    let hub = Hub::new();
    hub.apply(&torch_runtime()).await;
    let stored = hub
        .apply(&job(
            "st",
            json!({"runtimeRef": {"name": "torch-distributed"}}),
        ))
        .await;
    let mut new = stored.clone();
    // The spec of a status write is the stored one; it is not judged again.
    new["spec"]["trainer"] = json!({"numNodes": -1});
    new["status"] = json!({"conditions": [{
        "type": "Complete", "status": "True", "reason": "AllJobsCompleted",
        "message": "jobset completed successfully", "lastTransitionTime": NOW,
    }]});
    hub.admit_with(Operation::Update, Some("status"), &new, Some(&stored))
        .unwrap();

    new["status"] = json!({"trainerStatus": {"progressPercentage": 50}});
    let e = hub
        .admit_with(Operation::Update, Some("status"), &new, Some(&stored))
        .unwrap_err();
    assert_eq!(
        causes(&e),
        [cause(
            "status.trainerStatus",
            "FieldValueInvalid",
            "Invalid value: \"object\": lastUpdatedTime is required when trainerStatus is present",
        )]
    );
    new["status"] = json!({"conditions": [{"type": "Complete", "status": "Maybe", "reason": "R", "message": "", "lastTransitionTime": "now"}]});
    let found = causes(
        &hub.admit_with(Operation::Update, Some("status"), &new, Some(&stored))
            .unwrap_err(),
    );
    let fields: Vec<&str> = found.iter().map(|c| c.0.as_str()).collect();
    assert_eq!(
        fields,
        [
            "status.conditions[0].lastTransitionTime",
            "status.conditions[0].status",
        ],
        "{found:?}"
    );
}

#[tokio::test]
async fn deprecated_runtimes_are_warned_about() {
    let hub = Hub::new();
    let mut runtime = torch_runtime();
    runtime["metadata"]["labels"]["trainer.kubeflow.org/support"] = json!("deprecated");
    let (_, outcome) = hub
        .admit_with(Operation::Create, None, &runtime, None)
        .unwrap();
    assert_eq!(
        outcome.warnings,
        [
            "ClusterTrainingRuntime \"torch-distributed\" is deprecated and will be removed in a future release of Kubeflow Trainer. See runtime deprecation policy: https://trainer.kubeflow.org/en/latest/operator-guides/runtime.html#runtime-deprecation-policy"
        ]
    );
    hub.apply(&runtime).await;
    let (_, outcome) = hub
        .admit_with(
            Operation::Create,
            None,
            &job("old", json!({"runtimeRef": {"name": "torch-distributed"}})),
            None,
        )
        .unwrap();
    assert_eq!(outcome.warnings.len(), 1);
    assert!(
        outcome.warnings[0]
            .starts_with("Referenced ClusterTrainingRuntime \"torch-distributed\" is deprecated")
    );
}

#[tokio::test]
async fn other_resources_and_deletes_pass() {
    let hub = Hub::new();
    let mut pod_def = def("TrainJob");
    pod_def.group = String::new();
    pod_def.kind = "Pod".into();
    let user = UserInfo {
        name: "alice".into(),
        uid: "1".into(),
        groups: vec![],
    };
    let mut pod = json!({"kind": "Pod", "metadata": {"name": "Not A Label"}});
    let request = Request {
        operation: Operation::Create,
        resource: &pod_def,
        subresource: None,
        namespace: Some("default"),
        name: "Not A Label",
        old: None,
        user: &user,
        dry_run: false,
    };
    hub.admission.admit(&request, &mut pod).unwrap();
    let bad = job("Bad", json!({}));
    hub.admit_with(Operation::Delete, None, &bad, Some(&bad))
        .unwrap();
}

/// The constructor a server calls: the store and the hot-reloading plugin
/// registry of wasm components.
#[tokio::test]
async fn admission_runs_the_wasm_plugins_of_a_registry() {
    let host = host();
    let builtins = trainhub::builtin::load(&host).expect("built-ins load");
    let registry = Arc::new(Registry::new(host, builtins, None));
    let hub = Hub::with_plugins(registry);
    hub.apply(&torch_runtime()).await;
    let example = load(&upstream_dir().join("01-multi-node.yaml")).remove(0);
    hub.create(&example).unwrap();
    let bad = job(
        "env",
        json!({"runtimeRef": {"name": "torch-distributed"}, "trainer": {"env": [{"name": "PET_MASTER_PORT", "value": "1"}]}}),
    );
    let found = causes(&hub.create(&bad).unwrap_err());
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, "spec.trainer.env");
}

/// Only the policy's admin groups set a TrainJob's priority: a tenant's
/// create or change of `trainhub.kubeflow.org/priority` is 403 naming the
/// annotation; keeping an admin's value or dropping it is fine.
#[tokio::test]
async fn the_priority_annotation_is_for_admins_only() {
    let hub = Hub::new();
    hub.apply(&torch_runtime()).await;
    let def = def("TrainJob");
    let admit = |groups: &[&str], operation, object: &Value, old: Option<&Value>| {
        let user = UserInfo {
            name: "someone".into(),
            uid: "1".into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        };
        let request = Request {
            operation,
            resource: &def,
            subresource: None,
            namespace: Some("default"),
            name: "prio",
            old,
            user: &user,
            dry_run: false,
        };
        let mut admitted = object.clone();
        hub.admission
            .admit(&request, &mut admitted)
            .map(|_| admitted)
    };
    let mut prio = job("prio", json!({"runtimeRef": {"name": "torch-distributed"}}));
    prio["metadata"]["annotations"] = json!({"trainhub.kubeflow.org/priority": "100"});

    let e = admit(&["team-a"], Operation::Create, &prio, None).unwrap_err();
    assert_eq!((e.code, e.reason), (403, "Forbidden"), "{}", e.message);
    assert_eq!(
        e.message,
        "trainjobs.trainer.kubeflow.org \"prio\" is forbidden: only members of the admin groups (system:masters, trainhub:admins) may set the annotation trainhub.kubeflow.org/priority"
    );
    assert_eq!(
        e.causes[0].field,
        "metadata.annotations[trainhub.kubeflow.org/priority]"
    );

    // An admin sets it; the tenant may then keep it or drop it, not raise it.
    let stored = admit(&["trainhub:admins"], Operation::Create, &prio, None).unwrap();
    let mut relabelled = stored.clone();
    relabelled["metadata"]["labels"] = json!({"team": "a"});
    admit(&["team-a"], Operation::Update, &relabelled, Some(&stored)).unwrap();
    let mut raised = stored.clone();
    raised["metadata"]["annotations"]["trainhub.kubeflow.org/priority"] = json!("1000");
    let e = admit(&["team-a"], Operation::Update, &raised, Some(&stored)).unwrap_err();
    assert_eq!(e.code, 403, "{}", e.message);
    let mut dropped = stored.clone();
    dropped["metadata"]["annotations"] = json!({});
    admit(&["team-a"], Operation::Update, &dropped, Some(&stored)).unwrap();

    // Without the annotation nothing changes for tenants.
    let plain = job(
        "plain",
        json!({"runtimeRef": {"name": "torch-distributed"}}),
    );
    admit(&["team-a"], Operation::Create, &plain, None).unwrap();
}

/// A PreExecution call the plugin host could not run now (here: still
/// running at its wall-clock bound, the host's last resort) answers 429
/// with Retry-After, as kube-apiserver answers when overloaded; the same
/// plugin failing by its own fault (its CPU budget) answers 500.
#[tokio::test]
async fn an_overloaded_plugin_host_answers_429_with_retry_after() {
    use trainhub::plugins::Limits;
    let plugin = |limits: Limits| {
        host()
            .load(
                "misbehaving.wasm",
                &crate::common::wasm("trainhub_test_plugin_misbehaving"),
                &json!({ "mode": "loop", "phases": ["validate"] }),
                limits,
            )
            .expect("the misbehaving plugin loads")
    };
    let mut runtime = torch_runtime();
    runtime["metadata"]["labels"]["trainer.kubeflow.org/framework"] = json!("misbehaving");
    let trainjob = job(
        "deferred",
        json!({"runtimeRef": {"name": "torch-distributed"}}),
    );
    for (limits, code) in [
        (
            Limits {
                cpu: Duration::from_secs(60),
                wall: Duration::from_millis(200),
                ..Limits::default()
            },
            429,
        ),
        (
            Limits {
                cpu: Duration::from_millis(200),
                ..Limits::default()
            },
            500,
        ),
    ] {
        let snapshot = Snapshot::new(vec![
            plugin(limits) as Arc<dyn trainhub::plugins::pipeline::PhasePlugin>
        ]);
        let hub = Hub::with_plugins(Arc::new(FixedPlugins(Arc::new(snapshot))));
        hub.apply(&runtime).await;
        let e = hub.create(&trainjob).unwrap_err();
        assert_eq!(e.code, code, "{}", e.message);
        assert!(e.message.contains("misbehaving"), "{}", e.message);
        if code == 429 {
            assert_eq!(e.reason, "TooManyRequests");
            assert_eq!(e.retry_after_seconds, Some(1));
            assert!(e.message.contains("deferred"), "{}", e.message);
        } else {
            assert!(e.message.contains("CPU budget"), "{}", e.message);
            assert_eq!(e.retry_after_seconds, None);
        }
    }
}

/// What a TrainJob's runtime is kept as (and the plugins are given) leaves
/// out the bookkeeping of clients and the API server: a runtime installed
/// with `kubectl apply` carries a copy of itself in an annotation, and
/// `managedFields` mirror its fields.
#[tokio::test]
async fn a_runtime_is_kept_without_managed_fields_or_its_last_applied_copy() {
    use trainhub_apiserver::store::Op;
    let host = host();
    let builtins = trainhub::builtin::load(&host).expect("built-ins load");
    let hub = Hub::with_plugins(Arc::new(Registry::new(host, builtins, None)));
    let mut runtime = torch_runtime();
    let copy = runtime.to_string();
    runtime["metadata"]["annotations"] = json!({
        "kubectl.kubernetes.io/last-applied-configuration": copy,
        "team": "ml",
    });
    runtime["metadata"]["managedFields"] = json!([{
        "manager": "kubectl-client-side-apply", "operation": "Update",
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "fieldsType": "FieldsV1",
        "fieldsV1": {"f:spec": {"f:mlPolicy": {}}},
    }]);
    hub.apply(&runtime).await;
    let mut example = load(&upstream_dir().join("01-multi-node.yaml")).remove(0);
    example["metadata"]["uid"] = json!("3b1f0c9e-0000-4000-8000-00000000000a");
    let (_, outcome) = hub
        .admit_with(Operation::Create, None, &example, None)
        .unwrap();
    let Some(Op::Put { value: version, .. }) = outcome.also.first() else {
        panic!("expected the runtime version, got {:?}", outcome.also);
    };
    let meta = &version["runtime"]["metadata"];
    assert_eq!(meta["name"], "torch-distributed");
    assert!(meta.get("managedFields").is_none(), "{meta}");
    assert_eq!(meta["annotations"], json!({"team": "ml"}));
}

/// A TrainJob's create keeps, in the same transaction, the runtime and the
/// plugins (names and digests) it was admitted with: the runtime once per
/// version (written by the first create that needs it), the snapshot per
/// TrainJob; a dry run or an update keeps nothing. A snapshot naming a
/// plugin no longer loaded is refused with its name and digest.
#[tokio::test]
async fn a_create_keeps_the_runtime_and_plugins_it_was_admitted_with() {
    use trainhub_apiserver::store::Op;
    let host = host();
    let builtins = trainhub::builtin::load(&host).expect("built-ins load");
    let registry = Arc::new(Registry::new(host, builtins, None));
    let hub = Hub::with_plugins(registry.clone());
    hub.apply(&torch_runtime()).await;
    let mut example = load(&upstream_dir().join("01-multi-node.yaml")).remove(0);
    example["metadata"]["uid"] = json!("3b1f0c9e-0000-4000-8000-000000000001");
    let (_, outcome) = hub
        .admit_with(Operation::Create, None, &example, None)
        .unwrap();
    let [
        Op::Put {
            key: version_key,
            value: version,
        },
        Op::Put { key, value },
    ] = outcome.also.as_slice()
    else {
        panic!(
            "expected the runtime version and the snapshot, got {:?}",
            outcome.also
        );
    };
    assert_eq!(version_key.resource, trainhub::admission::RUNTIME_VERSIONS);
    assert_eq!(version_key.name.len(), 32, "{}", version_key.name);
    assert_eq!(version["runtime"]["metadata"]["name"], "torch-distributed");
    assert_eq!(key.resource, trainhub::admission::RUNTIME_SNAPSHOTS);
    assert_eq!(key.name, "3b1f0c9e-0000-4000-8000-000000000001");
    assert_eq!(value["runtimeVersion"], version_key.name.as_str());
    assert!(value.get("runtime").is_none(), "{value}");
    let plugins: Vec<(String, String)> = value["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_string(),
                p["digest"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert!(
        plugins
            .iter()
            .any(|(n, d)| n == "torch" && d.starts_with("sha256:")),
        "{plugins:?}"
    );
    let ids: Vec<trainhub::plugins::PluginId> = plugins
        .iter()
        .map(|(name, digest)| trainhub::plugins::PluginId {
            name: name.clone(),
            digest: digest.clone(),
        })
        .collect();
    assert_eq!(registry.pinned(&ids).unwrap().plugins().len(), ids.len());
    let gone = trainhub::plugins::PluginId {
        name: "torch".into(),
        digest: format!("sha256:{}", "0".repeat(64)),
    };
    let e = registry.pinned(&[gone]).err().unwrap();
    assert!(e.contains("torch") && e.contains("no longer loaded"), "{e}");

    let version_name = version_key.name.clone();
    hub.store.commit(outcome.also.clone()).await.unwrap();
    let stored = hub.apply(&example).await;
    let (_, outcome) = hub
        .admit_with(Operation::Update, None, &stored, Some(&stored))
        .unwrap();
    assert!(outcome.also.is_empty(), "{:?}", outcome.also);

    // The version stored, the next create of the same runtime writes its
    // snapshot only, naming the same version.
    let mut second = example.clone();
    second["metadata"]["name"] = json!("second");
    second["metadata"]["uid"] = json!("3b1f0c9e-0000-4000-8000-000000000002");
    let (_, outcome) = hub
        .admit_with(Operation::Create, None, &second, None)
        .unwrap();
    let [Op::Put { key, value }] = outcome.also.as_slice() else {
        panic!("expected the snapshot alone, got {:?}", outcome.also);
    };
    assert_eq!(key.resource, trainhub::admission::RUNTIME_SNAPSHOTS);
    assert_eq!(value["runtimeVersion"], version_name.as_str());
}
