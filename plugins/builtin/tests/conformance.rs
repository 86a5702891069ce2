//! The built-in plugins against the Build-phase conformance vectors
//! (`shared/conformance.md`) and upstream Kubeflow Trainer's own manifests,
//! run natively through the SDK's harness in the host's phase order.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;

use serde_json::{Value, json};
use trainhub_builtin_plugins::{
    coscheduling::Coscheduling, flux::Flux, jax::Jax, jobset::JobSet, mpi::Mpi, plainml::PlainMl,
    python::Python, torch::Torch, volcano::Volcano, xgboost::Xgboost,
};
use trainhub_plugin_sdk::api::jobset::JobSetStatus;
use trainhub_plugin_sdk::api::trainer::{TrainJob, TrainJobStatus};
use trainhub_plugin_sdk::testing::{Harness, target};
use trainhub_plugin_sdk::{Failure, Plugin, Runtime, RuntimeInfo, Validation};

// ---------------------------------------------------------------------------
// The pipeline, as the host runs it.

/// The phases of one plugin, behind one object type.
trait Phases {
    fn validate(&self, job: &TrainJob, runtime: &Runtime) -> Validation;
    fn enforce_ml_policy(&self, info: RuntimeInfo, job: &TrainJob) -> Result<RuntimeInfo, Failure>;
    fn enforce_pod_group_policy(
        &self,
        info: RuntimeInfo,
        job: &TrainJob,
    ) -> Result<RuntimeInfo, Failure>;
    fn build(&self, info: &RuntimeInfo, job: &TrainJob) -> Result<Vec<Value>, Failure>;
}

impl<P: Plugin> Phases for Harness<P> {
    fn validate(&self, job: &TrainJob, runtime: &Runtime) -> Validation {
        Harness::validate(self, job, runtime)
    }
    fn enforce_ml_policy(&self, info: RuntimeInfo, job: &TrainJob) -> Result<RuntimeInfo, Failure> {
        Harness::enforce_ml_policy(self, info, job)
    }
    fn enforce_pod_group_policy(
        &self,
        info: RuntimeInfo,
        job: &TrainJob,
    ) -> Result<RuntimeInfo, Failure> {
        Harness::enforce_pod_group_policy(self, info, job)
    }
    fn build(&self, info: &RuntimeInfo, job: &TrainJob) -> Result<Vec<Value>, Failure> {
        Harness::build(self, info, job, &target("spoke-a"))
    }
}

/// The ML plugin the runtime's framework label selects, else its `mlPolicy`.
fn ml_plugin(runtime: &Runtime) -> Box<dyn Phases> {
    let policy = runtime.spec().ml_policy.clone().unwrap_or_default();
    if runtime.framework() == Some("python") {
        Box::new(Harness::<Python>::new())
    } else if policy.torch.is_some() {
        Box::new(Harness::<Torch>::new())
    } else if policy.mpi.is_some() {
        Box::new(Harness::<Mpi>::new())
    } else if policy.jax.is_some() {
        Box::new(Harness::<Jax>::new())
    } else if policy.xgboost.is_some() {
        Box::new(Harness::<Xgboost>::new())
    } else if policy.flux.is_some() {
        Box::new(Harness::<Flux>::new())
    } else {
        Box::new(Harness::<PlainMl>::new())
    }
}

/// The pod-group plugin the runtime's `podGroupPolicy` selects, if any.
fn pod_group_plugin(runtime: &Runtime) -> Option<Box<dyn Phases>> {
    let policy = runtime.spec().pod_group_policy.clone().unwrap_or_default();
    if policy.coscheduling.is_some() {
        Some(Box::new(Harness::<Coscheduling>::new()))
    } else if policy.volcano.is_some() {
        Some(Box::new(Harness::<Volcano>::new()))
    } else {
        None
    }
}

/// PreExecution: every applicable plugin's validation, merged.
fn validate(job: &TrainJob, runtime: &Runtime) -> Validation {
    let mut all = Harness::<JobSet>::new().validate(job, runtime);
    all.merge(ml_plugin(runtime).validate(job, runtime));
    if let Some(pg) = pod_group_plugin(runtime) {
        all.merge(pg.validate(job, runtime));
    }
    all
}

/// Build: runtime info, the ML policy, the pod-group policy, then every build.
fn build(job: &TrainJob, runtime: &Runtime) -> Vec<Value> {
    let jobset = Harness::<JobSet>::new();
    let ml = ml_plugin(runtime);
    let pg = pod_group_plugin(runtime);
    let info = jobset
        .runtime_info(job, runtime)
        .unwrap_or_else(|errors| panic!("runtime info: {errors:?}"));
    let info = ml
        .enforce_ml_policy(info, job)
        .unwrap_or_else(|f| panic!("enforce ML policy: {f}"));
    let info = match &pg {
        Some(pg) => pg
            .enforce_pod_group_policy(info, job)
            .unwrap_or_else(|f| panic!("enforce pod-group policy: {f}")),
        None => info,
    };
    let mut objects =
        Phases::build(&jobset, &info, job).unwrap_or_else(|f| panic!("build JobSet: {f}"));
    objects.extend(
        ml.build(&info, job)
            .unwrap_or_else(|f| panic!("build ML objects: {f}")),
    );
    if let Some(pg) = &pg {
        objects.extend(
            pg.build(&info, job)
                .unwrap_or_else(|f| panic!("build PodGroup: {f}")),
        );
    }
    objects
}

// ---------------------------------------------------------------------------
// Inputs and lookups.

fn shared_dir() -> PathBuf {
    std::env::var_os("TRAINHUB_SHARED_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"),
        PathBuf::from,
    )
}

/// The documents of an upstream manifest.
fn upstream(file: &str) -> Vec<Value> {
    let path = shared_dir().join("upstream/kubeflow-trainer").join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_multiple::<Value>(&text)
        .unwrap_or_else(|e| panic!("{file}: {e}"))
        .into_iter()
        .filter(|doc| !doc.is_null())
        .collect()
}

fn upstream_kind(file: &str, kind: &str) -> Value {
    upstream(file)
        .into_iter()
        .find(|doc| doc["kind"] == kind)
        .unwrap_or_else(|| panic!("{file} has no {kind}"))
}

fn job(value: Value) -> TrainJob {
    serde_json::from_value(value).unwrap()
}

fn runtime(value: Value) -> Runtime {
    serde_json::from_value(value).unwrap()
}

fn object<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} among {objects:#?}"))
}

fn rjob<'a>(jobset: &'a Value, name: &str) -> &'a Value {
    jobset["spec"]["replicatedJobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["name"] == name)
        .unwrap_or_else(|| panic!("no replicated job {name}"))
}

fn container<'a>(rjob: &'a Value, name: &str) -> &'a Value {
    rjob["template"]["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

fn env<'a>(container: &'a Value, name: &str) -> &'a Value {
    container["env"]
        .as_array()
        .unwrap_or_else(|| panic!("no env in {container}"))
        .iter()
        .find(|e| e["name"] == name)
        .unwrap_or_else(|| panic!("no env {name} in {container}"))
}

fn env_value<'a>(container: &'a Value, name: &str) -> &'a str {
    env(container, name)["value"].as_str().unwrap()
}

/// (parallelism, completions) of a replicated job.
fn counts(rjob: &Value) -> (i64, i64) {
    let spec = &rjob["template"]["spec"];
    (
        spec["parallelism"].as_i64().unwrap(),
        spec["completions"].as_i64().unwrap(),
    )
}

fn pod_labels(rjob: &Value) -> &Value {
    &rjob["template"]["spec"]["template"]["metadata"]["labels"]
}

/// A Secret's `data[key]`, decoded as UTF-8 text.
fn secret_text(secret: &Value, key: &str) -> String {
    use base64::Engine as _;
    let data = secret["data"][key].as_str().unwrap();
    String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(data)
            .unwrap(),
    )
    .unwrap()
}

fn error_fields(validation: &Validation) -> Vec<&str> {
    validation.errors.iter().map(|e| e.field.as_str()).collect()
}

const COMPLETION_INDEX: &str = "metadata.annotations['batch.kubernetes.io/job-completion-index']";

/// A replicated job with one container `container`, image `test:runtime`,
/// requesting one CPU.
fn standard_job(name: &str, ancestor: Option<&str>, container: &str) -> Value {
    let mut job = json!({
        "name": name,
        "template": {
            "spec": {
                "template": {
                    "spec": {
                        "containers": [{
                            "name": container,
                            "image": "test:runtime",
                            "resources": {"requests": {"cpu": "1"}},
                        }],
                    },
                },
            },
        },
    });
    if let Some(ancestor) = ancestor {
        job["template"]["metadata"] =
            json!({"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": ancestor}});
    }
    job
}

/// The three standard jobs: both initializers, then the trainer's `node`.
fn three_jobs() -> Vec<Value> {
    vec![
        standard_job(
            "dataset-initializer",
            Some("dataset-initializer"),
            "dataset-initializer",
        ),
        standard_job(
            "model-initializer",
            Some("model-initializer"),
            "model-initializer",
        ),
        standard_job("node", Some("trainer"), "node"),
    ]
}

fn training_runtime(spec: Value) -> Runtime {
    runtime(json!({
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainingRuntime",
        "metadata": {"name": "test-runtime", "namespace": "default", "labels": {"runtime-own": "label"}},
        "spec": spec,
    }))
}

fn test_job(name: &str, spec: Value) -> TrainJob {
    let mut value = json!({
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": "default", "uid": "uid-1234"},
        "spec": {"runtimeRef": {"name": "test-runtime", "kind": "TrainingRuntime", "apiGroup": "trainer.kubeflow.org"}},
    });
    if let (Some(target), Some(extra)) = (value["spec"].as_object_mut(), spec.as_object()) {
        target.extend(extra.clone());
    }
    job(value)
}

// ---------------------------------------------------------------------------
// Vector A: PlainML + coscheduling + runtime patch metadata.

#[test]
fn vector_a_plainml_coscheduling_and_patched_metadata() {
    let runtime = training_runtime(json!({
        "mlPolicy": {"numNodes": 100},
        "podGroupPolicy": {"coscheduling": {"scheduleTimeoutSeconds": 120}},
        "template": {
            "metadata": {
                "labels": {"conflictLabel": "overridden"},
                "annotations": {"conflictAnnotation": "overridden"},
            },
            "spec": {"replicatedJobs": three_jobs()},
        },
    }));
    let job = test_job(
        "test-job",
        json!({
            "suspend": true,
            "trainer": {"numNodes": 30},
            "runtimePatches": [{
                "manager": "test.io/manager",
                "trainingRuntimeSpec": {"template": {"metadata": {
                    "labels": {"conflictLabel": "override"},
                    "annotations": {"conflictAnnotation": "override"},
                }}},
            }],
        }),
    );
    let validation = validate(&job, &runtime);
    assert!(validation.is_ok(), "{:?}", validation.errors);

    let objects = build(&job, &runtime);
    assert_eq!(objects.len(), 2, "a JobSet and a PodGroup");
    let jobset = object(&objects, "JobSet");
    assert_eq!(jobset["apiVersion"], "jobset.x-k8s.io/v1alpha2");
    assert_eq!(jobset["metadata"]["name"], "test-job");
    assert_eq!(jobset["metadata"]["namespace"], "default");
    assert_eq!(
        jobset["metadata"]["labels"],
        json!({"conflictLabel": "override"})
    );
    assert_eq!(
        jobset["metadata"]["annotations"],
        json!({"conflictAnnotation": "override"})
    );
    assert_eq!(
        jobset["metadata"]["ownerReferences"],
        json!([{
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "name": "test-job",
            "uid": "uid-1234",
            "controller": true,
            "blockOwnerDeletion": true,
        }])
    );
    assert_eq!(jobset["spec"]["suspend"], true);
    assert_eq!(counts(rjob(jobset, "node")), (30, 30));
    for name in ["dataset-initializer", "model-initializer", "node"] {
        let rjob = rjob(jobset, name);
        assert_eq!(rjob["replicas"], 1, "{name}");
        assert_eq!(
            pod_labels(rjob)["scheduling.x-k8s.io/pod-group"],
            "test-job",
            "{name}"
        );
    }
    assert_eq!(counts(rjob(jobset, "dataset-initializer")), (1, 1));
    assert_eq!(counts(rjob(jobset, "model-initializer")), (1, 1));

    let group = object(&objects, "PodGroup");
    assert_eq!(group["apiVersion"], "scheduling.x-k8s.io/v1alpha1");
    assert_eq!(group["metadata"]["name"], "test-job");
    assert_eq!(group["metadata"]["ownerReferences"][0]["kind"], "TrainJob");
    assert_eq!(group["spec"]["minMember"], 32);
    assert_eq!(group["spec"]["minResources"], json!({"cpu": "32"}));
    assert_eq!(group["spec"]["scheduleTimeoutSeconds"], 120);
}

// ---------------------------------------------------------------------------
// Vector B: torch.

fn torch_runtime() -> Runtime {
    let mut jobs = three_jobs();
    jobs[2]["dependsOn"] = json!([
        {"name": "dataset-initializer", "status": "Complete"},
        {"name": "model-initializer", "status": "Complete"},
    ]);
    training_runtime(json!({
        "mlPolicy": {"numNodes": 100, "torch": {}},
        "template": {"spec": {"replicatedJobs": jobs}},
    }))
}

#[test]
fn vector_b_torch_with_nodes_and_processes() {
    let runtime = torch_runtime();
    let job = test_job(
        "test-job",
        json!({"trainer": {"numNodes": 30, "numProcPerNode": 3}}),
    );
    assert!(validate(&job, &runtime).is_ok());
    let objects = build(&job, &runtime);
    assert_eq!(objects.len(), 1);
    let jobset = object(&objects, "JobSet");
    let node_job = rjob(jobset, "node");
    assert_eq!(counts(node_job), (30, 30));
    assert_eq!(
        node_job["dependsOn"],
        json!([
            {"name": "dataset-initializer", "status": "Complete"},
            {"name": "model-initializer", "status": "Complete"},
        ])
    );
    let node = container(node_job, "node");
    assert_eq!(node["ports"], json!([{"containerPort": 29500}]));
    assert_eq!(env_value(node, "PET_NNODES"), "30");
    assert_eq!(env_value(node, "PET_NPROC_PER_NODE"), "3");
    assert_eq!(
        env(node, "PET_NODE_RANK")["valueFrom"],
        json!({"fieldRef": {"fieldPath": COMPLETION_INDEX}})
    );
    assert_eq!(
        env_value(node, "PET_MASTER_ADDR"),
        "test-job-node-0-0.test-job"
    );
    assert_eq!(env_value(node, "PET_MASTER_PORT"), "29500");
    assert!(
        jobset["spec"].get("suspend").is_none(),
        "suspend absent on the TrainJob stays absent"
    );
}

/// Upstream pkg/runtime/framework/plugins/torch/torch.go (EnforceMLPolicy):
/// the node count falls back to the runtime's; the trainer container gets
/// the `PET_*` env only when the TrainJob sets `spec.trainer`.
#[test]
fn vector_b_torch_defaults_from_the_runtime() {
    let runtime = torch_runtime();
    let job = test_job("test-job", json!({"trainer": {"image": "test:trainjob"}}));
    let objects = build(&job, &runtime);
    let node_job = rjob(object(&objects, "JobSet"), "node");
    assert_eq!(counts(node_job), (100, 100));
    let node = container(node_job, "node");
    assert_eq!(env_value(node, "PET_NNODES"), "100");
    assert_eq!(env_value(node, "PET_NPROC_PER_NODE"), "1");
}

/// Upstream pkg/runtime/framework/plugins/torch/torch.go: without
/// `spec.trainer` the trainer container is left as the runtime has it (no
/// env, no port); the count is the runtime's.
#[test]
fn torch_without_a_trainer_leaves_the_node_container_alone() {
    let objects = build(&test_job("test-job", json!({})), &torch_runtime());
    let node_job = rjob(object(&objects, "JobSet"), "node");
    assert_eq!(counts(node_job), (100, 100));
    let node = container(node_job, "node");
    assert!(node.get("env").is_none(), "{node}");
    assert!(node.get("ports").is_none(), "{node}");
}

#[test]
fn torch_auto_processes_follow_the_node_cpus_unless_it_has_gpus() {
    let with_resources = |resources: Value| {
        let mut node = standard_job("node", Some("trainer"), "node");
        node["template"]["spec"]["template"]["spec"]["containers"][0]["resources"] = resources;
        let runtime = training_runtime(json!({
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "template": {"spec": {"replicatedJobs": [node]}},
        }));
        let objects = build(&test_job("test-job", json!({"trainer": {}})), &runtime);
        env_value(
            container(rjob(object(&objects, "JobSet"), "node"), "node"),
            "PET_NPROC_PER_NODE",
        )
        .to_string()
    };
    assert_eq!(
        with_resources(json!({"requests": {"cpu": "1500m"}})),
        "2",
        "rounded up"
    );
    assert_eq!(
        with_resources(json!({"limits": {"cpu": "3"}})),
        "3",
        "the limit without a request"
    );
    assert_eq!(
        with_resources(json!({"requests": {"cpu": "4"}, "limits": {"nvidia.com/gpu": "2"}})),
        "auto",
        "a GPU leaves it to torchrun"
    );
    assert_eq!(with_resources(json!({})), "1", "at least one");
}

// ---------------------------------------------------------------------------
// Vector C: OpenMPI.

#[test]
fn vector_c_openmpi_hostfile_secret_and_launcher_env() {
    let runtime = training_runtime(json!({
        "mlPolicy": {"numNodes": 1, "mpi": {
            "numProcPerNode": 1,
            "mpiImplementation": "OpenMPI",
            "sshAuthMountPath": "/root/.ssh",
            "runLauncherAsNode": false,
        }},
        "template": {"spec": {"replicatedJobs": [
            standard_job("launcher", Some("trainer"), "node"),
            standard_job("node", None, "node"),
        ]}},
    }));
    let job = test_job(
        "test-job",
        json!({"trainer": {"numNodes": 2, "numProcPerNode": 8}}),
    );
    assert!(validate(&job, &runtime).is_ok());
    let objects = build(&job, &runtime);
    assert_eq!(objects.len(), 3, "JobSet, Secret, ConfigMap");

    let hostfile = object(&objects, "ConfigMap");
    assert_eq!(hostfile["apiVersion"], "v1");
    assert_eq!(hostfile["metadata"]["name"], "test-job-mpi-hostfile");
    assert_eq!(
        hostfile["metadata"]["ownerReferences"][0]["controller"],
        true
    );
    assert_eq!(
        hostfile["data"]["hostfile"],
        "test-job-node-0-0.test-job slots=8\ntest-job-node-0-1.test-job slots=8\n"
    );

    let secret = object(&objects, "Secret");
    assert_eq!(secret["metadata"]["name"], "test-job-mpi-ssh-auth");
    assert_eq!(secret["type"], "kubernetes.io/ssh-auth");
    assert_eq!(secret["immutable"], true);
    let decode = |key: &str| secret_text(secret, key);
    assert!(decode("ssh-privatekey").starts_with("-----BEGIN EC PRIVATE KEY-----\n"));
    assert!(decode("ssh-publickey").starts_with("ecdsa-sha2-nistp521 AAAA"));

    let jobset = object(&objects, "JobSet");
    assert_eq!(counts(rjob(jobset, "node")), (2, 2));
    assert_eq!(counts(rjob(jobset, "launcher")), (1, 1));
    let launcher = container(rjob(jobset, "launcher"), "node");
    assert_eq!(
        env_value(launcher, "OMPI_MCA_orte_default_hostfile"),
        "/etc/mpi/hostfile"
    );
    assert_eq!(
        env_value(launcher, "OMPI_MCA_orte_keep_fqdn_hostnames"),
        "true"
    );
    assert_eq!(env_value(launcher, "OMPI_MCA_orte_set_default_slots"), "8");
    assert_eq!(
        env_value(launcher, "OMPI_MCA_plm_rsh_args"),
        "-o ConnectionAttempts=10"
    );
    assert_eq!(
        launcher["volumeMounts"],
        json!([
            {"name": "mpi-ssh-auth", "mountPath": "/root/.ssh"},
            {"name": "mpi-hostfile", "mountPath": "/etc/mpi"},
        ])
    );
    let node = container(rjob(jobset, "node"), "node");
    assert_eq!(
        node["volumeMounts"],
        json!([{"name": "mpi-ssh-auth", "mountPath": "/root/.ssh"}])
    );
    assert!(
        node.get("env").is_none(),
        "OpenMPI env is for the launcher only"
    );

    let volumes =
        |name: &str| rjob(jobset, name)["template"]["spec"]["template"]["spec"]["volumes"].clone();
    assert_eq!(
        volumes("launcher"),
        json!([
            {"name": "mpi-ssh-auth", "secret": {
                "defaultMode": 256,
                "items": [
                    {"key": "ssh-privatekey", "mode": 416, "path": "id_rsa"},
                    {"key": "ssh-publickey", "mode": 420, "path": "id_rsa.pub"},
                    {"key": "ssh-publickey", "mode": 420, "path": "authorized_keys"},
                ],
                "secretName": "test-job-mpi-ssh-auth",
            }},
            {"name": "mpi-hostfile", "configMap": {
                "items": [{"key": "hostfile", "mode": 292, "path": "hostfile"}],
                "name": "test-job-mpi-hostfile",
            }},
        ])
    );
    assert_eq!(
        volumes("node").as_array().unwrap().len(),
        1,
        "no hostfile on the nodes"
    );
}

#[test]
fn mpi_ssh_keys_differ_between_builds() {
    let runtime = runtime(upstream_kind(
        "deepspeed_distributed.yaml",
        "ClusterTrainingRuntime",
    ));
    let job = job(upstream_kind("01-multi-node.yaml", "TrainJob"));
    let key = |objects: Vec<Value>| object(&objects, "Secret")["data"]["ssh-privatekey"].clone();
    assert_ne!(key(build(&job, &runtime)), key(build(&job, &runtime)));
}

#[test]
fn mpi_run_launcher_as_node_lists_the_launcher_in_the_hostfile() {
    let runtime = runtime(upstream_kind(
        "deepspeed_distributed.yaml",
        "ClusterTrainingRuntime",
    ));
    let mut job = job(upstream_kind("01-multi-node.yaml", "TrainJob"));
    job.spec.runtime_ref.name = "deepspeed-distributed".into();
    assert_eq!(job.spec.trainer.as_ref().unwrap().num_nodes, Some(3));
    assert!(validate(&job, &runtime).is_ok());
    let objects = build(&job, &runtime);
    let jobset = object(&objects, "JobSet");
    assert_eq!(counts(rjob(jobset, "node")), (2, 2), "numNodes - 1");
    assert_eq!(counts(rjob(jobset, "launcher")), (1, 1));
    assert_eq!(
        object(&objects, "ConfigMap")["data"]["hostfile"],
        "multi-node-example-node-0-0.multi-node-example slots=1\n\
         multi-node-example-node-0-1.multi-node-example slots=1\n\
         multi-node-example-launcher-0-0.multi-node-example slots=1\n"
    );
    // The SSH keys go where the runtime's sshd reads them.
    let node = container(rjob(jobset, "node"), "node");
    assert_eq!(node["volumeMounts"][0]["mountPath"], "/home/mpiuser/.ssh");
    // The TrainJob's command runs on the launcher, the trainer step.
    let launcher = container(rjob(jobset, "launcher"), "node");
    assert_eq!(launcher["command"][0], "torchrun");
    assert_eq!(node["command"], json!(["/usr/sbin/sshd"]));
}

#[test]
fn mpi_with_one_node_and_launcher_as_node_runs_one_node_pod() {
    let runtime = runtime(upstream_kind(
        "deepspeed_distributed.yaml",
        "ClusterTrainingRuntime",
    ));
    let job = test_job("one", json!({"trainer": {"numNodes": 1}}));
    let objects = build(&job, &runtime);
    assert_eq!(counts(rjob(object(&objects, "JobSet"), "node")), (1, 1));
}

// ---------------------------------------------------------------------------
// Vector D: XGBoost with GPUs.

#[test]
fn vector_d_xgboost_with_gpus() {
    let runtime = runtime(upstream_kind(
        "xgboost_distributed.yaml",
        "ClusterTrainingRuntime",
    ));
    let job = test_job(
        "gpu-job",
        json!({"trainer": {
            "numNodes": 2,
            "resourcesPerNode": {"requests": {"cpu": "8", "memory": "32Gi", "example.com/gpu": "4"}},
        }}),
    );
    assert!(validate(&job, &runtime).is_ok());
    let objects = build(&job, &runtime);
    let node_job = rjob(object(&objects, "JobSet"), "node");
    assert_eq!(counts(node_job), (2, 2));
    let node = container(node_job, "node");
    assert_eq!(
        env_value(node, "DMLC_TRACKER_URI"),
        "gpu-job-node-0-0.gpu-job"
    );
    assert_eq!(env_value(node, "DMLC_TRACKER_PORT"), "29500");
    assert_eq!(
        env(node, "DMLC_TASK_ID")["valueFrom"],
        json!({"fieldRef": {"fieldPath": COMPLETION_INDEX}})
    );
    assert_eq!(env_value(node, "DMLC_NUM_WORKER"), "8");
    assert_eq!(node["ports"], json!([{"containerPort": 29500}]));
    assert_eq!(
        node["resources"]["requests"],
        json!({"cpu": "8", "example.com/gpu": "4", "memory": "32Gi"})
    );
}

#[test]
fn jax_sets_the_coordinator() {
    let runtime = runtime(upstream_kind(
        "jax_distributed.yaml",
        "ClusterTrainingRuntime",
    ));
    let job = test_job("jax-job", json!({"trainer": {"numNodes": 4}}));
    let objects = build(&job, &runtime);
    let node = container(rjob(object(&objects, "JobSet"), "node"), "node");
    assert_eq!(env_value(node, "JAX_NUM_PROCESSES"), "4");
    assert_eq!(
        env_value(node, "JAX_COORDINATOR_ADDRESS"),
        "jax-job-node-0-0.jax-job:29500"
    );
    assert_eq!(
        env(node, "JAX_PROCESS_ID")["valueFrom"],
        json!({"fieldRef": {"fieldPath": COMPLETION_INDEX}})
    );
}

/// A runtime trainhub ships, from `manifests/runtimes/`.
fn shipped_runtime(file: &str) -> Runtime {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../manifests/runtimes")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    runtime(serde_saphyr::from_str(&text).unwrap())
}

/// trainhub's own `python-distributed` runtime.
fn python_distributed() -> Runtime {
    shipped_runtime("python-distributed.yaml")
}

#[test]
fn python_sets_the_env_init_variables_and_port() {
    let runtime = python_distributed();
    let job = test_job(
        "lr",
        json!({"runtimeRef": {"name": "python-distributed", "kind": "ClusterTrainingRuntime"},
               "trainer": {"numNodes": 3, "env": [{"name": "EPOCHS", "value": "40"}]}}),
    );
    assert!(validate(&job, &runtime).is_ok());
    let objects = build(&job, &runtime);
    let node_job = rjob(object(&objects, "JobSet"), "node");
    assert_eq!(counts(node_job), (3, 3));
    let node = container(node_job, "node");
    let names: Vec<&str> = node["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["EPOCHS", "WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT"]
    );
    assert_eq!(env_value(node, "WORLD_SIZE"), "3");
    assert_eq!(
        env(node, "RANK")["valueFrom"],
        json!({"fieldRef": {"fieldPath": COMPLETION_INDEX}})
    );
    assert_eq!(env_value(node, "MASTER_ADDR"), "lr-node-0-0.lr");
    assert_eq!(env_value(node, "MASTER_PORT"), "29500");
    assert_eq!(node["ports"], json!([{"containerPort": 29500}]));
}

// ---------------------------------------------------------------------------
// Vector E: Flux (upstream `runtime/framework/plugins/flux/flux.go` and its
// `templates/init.sh`, `templates/entrypoint.sh`, `templates/broker.toml`;
// runtime and TrainJob from `examples/flux/flux-runtime.yaml` and
// `examples/flux/lammps-train-job.yaml`).

fn flux_distributed() -> Runtime {
    shipped_runtime("flux-distributed.yaml")
}

/// `examples/flux/lammps-train-job.yaml`, in the default namespace.
fn lammps_job() -> TrainJob {
    test_job(
        "lammps-flux",
        json!({
            "runtimeRef": {"name": "flux-distributed", "kind": "ClusterTrainingRuntime"},
            "trainer": {
                "numNodes": 2,
                "numProcPerNode": 4,
                "image": "ghcr.io/converged-computing/metric-lammps:latest",
                "command": ["lmp", "-v", "x", "4", "-v", "y", "4", "-v", "z", "4", "-in", "in.reaxc.hns", "-nocite"],
                "env": [{"name": "FLUX_VIEW_IMAGE", "value": "ghcr.io/converged-computing/flux-view-ubuntu:tag-jammy"}],
            },
        }),
    )
}

fn data_text(object: &Value, key: &str) -> String {
    object["data"][key]
        .as_str()
        .unwrap_or_else(|| panic!("no {key} in {object}"))
        .to_string()
}

#[test]
fn vector_e_flux_lammps_installer_volumes_and_wrapped_command() {
    let runtime = flux_distributed();
    let job = lammps_job();
    assert!(validate(&job, &runtime).is_ok());
    let objects = build(&job, &runtime);
    assert_eq!(objects.len(), 3, "JobSet, ConfigMap, Secret");

    let jobset = object(&objects, "JobSet");
    let node_job = rjob(jobset, "node");
    assert_eq!(counts(node_job), (2, 2));
    let pod = &node_job["template"]["spec"]["template"]["spec"];
    assert_eq!(
        pod["initContainers"],
        json!([{
            "name": "flux-installer",
            "image": "ghcr.io/converged-computing/flux-view-ubuntu:tag-jammy",
            "command": ["/bin/bash", "/etc/flux-config/init.sh"],
            "volumeMounts": [
                {"name": "flux-install", "mountPath": "/mnt/flux"},
                {"name": "lammps-flux-flux-entrypoint", "mountPath": "/etc/flux-config", "readOnly": true},
            ],
        }])
    );
    assert_eq!(
        pod["volumes"],
        json!([
            {"name": "spack-install", "emptyDir": {}},
            {"name": "flux-install", "emptyDir": {}},
            {"name": "lammps-flux-flux-entrypoint", "configMap": {"name": "lammps-flux-flux-entrypoint", "defaultMode": 493}},
            {"name": "shared-memory", "emptyDir": {"medium": "Memory"}},
            {"name": "flux-curve", "secret": {"secretName": "lammps-flux-flux-curve", "defaultMode": 256}},
        ])
    );
    let node = container(node_job, "node");
    assert_eq!(
        node["image"],
        "ghcr.io/converged-computing/metric-lammps:latest"
    );
    assert_eq!(
        node["command"],
        json!([
            "/bin/bash",
            "/etc/flux-config/entrypoint.sh",
            "lmp -v x 4 -v y 4 -v z 4 -in in.reaxc.hns -nocite",
        ])
    );
    assert!(node.get("args").is_none());
    assert_eq!(
        node["volumeMounts"],
        json!([
            {"name": "flux-install", "mountPath": "/mnt/flux"},
            {"name": "spack-install", "mountPath": "/opt/software"},
            {"name": "lammps-flux-flux-entrypoint", "mountPath": "/etc/flux-config", "readOnly": true},
            {"name": "flux-curve", "mountPath": "/curve", "readOnly": true},
            {"name": "shared-memory", "mountPath": "/dev/shm", "readOnly": true},
        ])
    );
    assert_eq!(
        env_value(node, "FLUX_VIEW_IMAGE"),
        "ghcr.io/converged-computing/flux-view-ubuntu:tag-jammy"
    );

    let scripts = object(&objects, "ConfigMap");
    assert_eq!(scripts["apiVersion"], "v1");
    assert_eq!(scripts["metadata"]["name"], "lammps-flux-flux-entrypoint");
    assert_eq!(scripts["metadata"]["namespace"], "default");
    let owner = &scripts["metadata"]["ownerReferences"][0];
    assert_eq!(owner["kind"], "TrainJob");
    assert_eq!(owner["name"], "lammps-flux");
    assert_eq!(owner["uid"], "uid-1234");
    assert_eq!(owner["controller"], true);
    let keys: Vec<&String> = scripts["data"].as_object().unwrap().keys().collect();
    assert_eq!(keys, ["entrypoint.sh", "init.sh"]);

    let init = data_text(scripts, "init.sh");
    assert!(init.contains("installRoot=/mnt/flux/config\n"), "{init}");
    assert!(init.contains(
        "echo \"lammps-flux-node-0-[0-1]\" > \"${installRoot}/etc/flux/system/hostlist\""
    ));
    assert!(init.contains("cp -R \"${view}\"/* \"${viewroot}/view\""));
    assert!(init.contains("cp -R /opt/software \"${viewroot}/\""));
    for line in [
        "[access]\nallow-guest-user = true\nallow-root-owner = true\n",
        "[resource]\npath = \"/mnt/flux/config/etc/flux/system/R\"\n",
        "[bootstrap]\ncurve_cert = \"/mnt/flux/config/etc/curve/curve.cert\"\ndefault_port = 8050\n",
        "default_bind = \"tcp://eth0:%p\"\n",
        "default_connect = \"tcp://%h.lammps-flux.default.svc.cluster.local:%p\"\n",
        "hosts = [{ host = \"lammps-flux-node-0-[0-1]\" }]\n",
        "[archive]\ndbpath = \"/mnt/flux/config/var/lib/flux/job-archive.sqlite\"\nperiod = \"1m\"\nbusytimeout = \"50s\"\n",
        "[sched-fluxion-qmanager]\nqueue-policy = \"fcfs\"\n",
    ] {
        assert!(init.contains(line), "broker.toml lacks {line:?}:\n{init}");
    }

    let entrypoint = data_text(scripts, "entrypoint.sh");
    for line in [
        "flux R encode --hosts=\"${hosts}\" --cores=0-3 > /tmp/R",
        "mainHost=\"lammps-flux-node-0-0\"",
        "flags=\"-N 2 -n 8\"",
        "cp /curve/curve.cert \"${curvepath}\"",
        "cp -R ${viewbase}/software/* /opt/software/",
        "flux start -o --config ${cfg} ${brokerOptions} flux run ${flags} ${command}",
        "flux broker --config-path ${cfg} ${brokerOptions}",
        "sleep 15",
    ] {
        assert!(
            entrypoint.contains(line),
            "entrypoint lacks {line:?}:\n{entrypoint}"
        );
    }

    let secret = object(&objects, "Secret");
    assert_eq!(secret["metadata"]["name"], "lammps-flux-flux-curve");
    assert_eq!(
        secret["metadata"]["ownerReferences"][0]["name"],
        "lammps-flux"
    );
    assert!(
        secret.get("type").is_none(),
        "an Opaque Secret, as upstream"
    );
    let cert = secret_text(secret, "curve.cert");
    let key = |field: &str| {
        let prefix = format!("    {field} = \"");
        let start = cert.find(&prefix).unwrap() + prefix.len();
        cert[start..].split('"').next().unwrap().to_string()
    };
    assert!(
        cert.contains("metadata\n    name = \"lammps-flux\"\ncurve\n"),
        "{cert}"
    );
    assert_eq!(key("public-key").len(), 40);
    assert_eq!(key("secret-key").len(), 40);

    let again = build(&job, &runtime);
    assert_ne!(
        secret_text(object(&again, "Secret"), "curve.cert"),
        cert,
        "a fresh key pair per build"
    );
}

#[test]
fn flux_gpus_and_broker_settings_from_the_env() {
    // `examples/flux/lammps-train-gpus.yaml`: one process and one GPU per node.
    let mut doc = serde_json::to_value(flux_distributed()).unwrap();
    doc["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        ["containers"][0]["env"] = json!([
        {"name": "FLUX_QUEUE_POLICY", "value": "easy"},
        {"name": "FLUX_NETWORK_DEVICE", "value": "eth1"},
    ]);
    let runtime = runtime(doc);
    let job = test_job(
        "lammps-gpu",
        json!({
            "runtimeRef": {"name": "flux-distributed", "kind": "ClusterTrainingRuntime"},
            "trainer": {
                "numNodes": 2,
                "numProcPerNode": 1,
                "command": ["lmp_gpu", "-k", "on", "g", "8"],
                "resourcesPerNode": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}},
                "env": [
                    {"name": "FLUX_NETWORK_DEVICE", "value": "ib0"},
                    {"name": "FLUX_VIEW_IMAGE", "value": "ghcr.io/converged-computing/flux-view-rocky:tag-9"},
                ],
            },
        }),
    );
    let objects = build(&job, &runtime);
    let scripts = object(&objects, "ConfigMap");
    let entrypoint = data_text(scripts, "entrypoint.sh");
    assert!(entrypoint.contains("flux R encode --hosts=\"${hosts}\" --cores=0 --gpu=0 > /tmp/R"));
    assert!(
        entrypoint.contains("flags=\"-N 2 -n 2 -g 1\""),
        "{entrypoint}"
    );
    let init = data_text(scripts, "init.sh");
    assert!(
        init.contains("default_bind = \"tcp://ib0:%p\"\n"),
        "the TrainJob's env wins"
    );
    assert!(
        init.contains("queue-policy = \"easy\"\n"),
        "the runtime's env counts"
    );
    let pod = &rjob(object(&objects, "JobSet"), "node")["template"]["spec"]["template"]["spec"];
    assert_eq!(
        pod["initContainers"][0]["image"],
        "ghcr.io/converged-computing/flux-view-rocky:tag-9"
    );
}

#[test]
fn flux_moves_the_trainjob_args_into_the_command_and_keeps_the_runtime_args() {
    let runtime = training_runtime(json!({
        "mlPolicy": {"numNodes": 3, "flux": {"numProcPerNode": 2}},
        "template": {"spec": {"replicatedJobs": [{
            "name": "node",
            "template": {
                "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                "spec": {"template": {"spec": {"containers": [{
                    "name": "node", "image": "app", "command": ["python3"], "args": ["--from-runtime"],
                }]}}},
            },
        }]}},
    }));
    let job = test_job(
        "args",
        json!({"trainer": {"args": ["train.py", "--epochs", "10"]}}),
    );
    let objects = build(&job, &runtime);
    let node_job = rjob(object(&objects, "JobSet"), "node");
    assert_eq!(counts(node_job), (3, 3), "the runtime's numNodes");
    let node = container(node_job, "node");
    assert_eq!(
        node["command"],
        json!([
            "/bin/bash",
            "/etc/flux-config/entrypoint.sh",
            "python3 train.py --epochs 10"
        ])
    );
    assert_eq!(node["args"], json!(["--from-runtime"]));
    let entrypoint = data_text(object(&objects, "ConfigMap"), "entrypoint.sh");
    assert!(entrypoint.contains("flags=\"-N 3 -n 6\""), "{entrypoint}");

    // Without `spec.trainer` (where upstream dereferences nil), the
    // runtime's command is wrapped and its count used.
    let objects = build(&test_job("plain", json!({})), &runtime);
    let node = container(rjob(object(&objects, "JobSet"), "node"), "node");
    assert_eq!(
        node["command"],
        json!(["/bin/bash", "/etc/flux-config/entrypoint.sh", "python3"])
    );
    assert_eq!(node["args"], json!(["--from-runtime"]));
}

#[test]
fn flux_reserves_the_installer_init_container() {
    let mut doc = serde_json::to_value(flux_distributed()).unwrap();
    doc["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        ["initContainers"] = json!([{"name": "flux-installer", "image": "mine"}]);
    let runtime = runtime(doc);
    let validation = validate(&lammps_job(), &runtime);
    assert_eq!(error_fields(&validation), ["spec.trainer.initContainers"]);
    assert_eq!(
        validation.errors[0].value.as_deref(),
        Some("flux-installer")
    );
    assert_eq!(
        validation.errors[0].detail,
        "InitContainer 'flux-installer' is reserved"
    );
}

// ---------------------------------------------------------------------------
// Upstream manifests.

#[test]
fn every_upstream_runtime_builds_the_multi_node_example() {
    let mut runtimes = Vec::new();
    for file in [
        "torch_distributed.yaml",
        "deepspeed_distributed.yaml",
        "jax_distributed.yaml",
        "xgboost_distributed.yaml",
        "llama3_2_1B.yaml",
        "04-volcano-integration.yaml",
    ] {
        runtimes.push((file, upstream_kind(file, "ClusterTrainingRuntime")));
    }
    runtimes.push((
        "05-multi-step.yaml",
        upstream_kind("05-multi-step.yaml", "TrainingRuntime"),
    ));
    for (file, runtime_doc) in runtimes {
        let runtime = runtime(runtime_doc);
        let mut job = job(upstream_kind("01-multi-node.yaml", "TrainJob"));
        job.spec.runtime_ref.name = runtime.name().to_string();
        job.spec.runtime_ref.kind = Some(runtime.kind().to_string());
        let validation = validate(&job, &runtime);
        assert!(validation.is_ok(), "{file}: {:?}", validation.errors);
        let objects = build(&job, &runtime);
        let jobset = object(&objects, "JobSet");
        assert_eq!(jobset["metadata"]["name"], "multi-node-example", "{file}");
        assert!(
            jobset["metadata"].get("labels").is_none(),
            "{file}: the runtime's own labels are not copied"
        );
        let trainer = jobset["spec"]["replicatedJobs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|j| {
                j["template"]["metadata"]["labels"]["trainer.kubeflow.org/trainjob-ancestor-step"]
                    == "trainer"
            })
            .unwrap_or_else(|| panic!("{file}: no trainer job"));
        assert_eq!(
            container(trainer, "node")["command"][0],
            "torchrun",
            "{file}"
        );
        // Every object is complete and owned by the TrainJob.
        for object in &objects {
            assert!(
                object["apiVersion"].is_string() && object["kind"].is_string(),
                "{file}: {object}"
            );
            assert_eq!(
                object["metadata"]["ownerReferences"][0]["name"], "multi-node-example",
                "{file}"
            );
        }
    }
}

#[test]
fn the_multi_node_example_on_torch_distributed() {
    let runtime = runtime(upstream_kind(
        "torch_distributed.yaml",
        "ClusterTrainingRuntime",
    ));
    let job = job(upstream_kind("01-multi-node.yaml", "TrainJob"));
    let objects = build(&job, &runtime);
    let node_job = rjob(object(&objects, "JobSet"), "node");
    assert_eq!(counts(node_job), (3, 3));
    let node = container(node_job, "node");
    assert_eq!(
        node["image"],
        "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"
    );
    assert_eq!(node["command"].as_array().unwrap().len(), 5);
    assert_eq!(env_value(node, "PET_NNODES"), "3");
    assert_eq!(
        env_value(node, "PET_MASTER_ADDR"),
        "multi-node-example-node-0-0.multi-node-example"
    );
}

#[test]
fn volcano_groups_every_pod_under_one_annotation() {
    let runtime = runtime(upstream_kind(
        "04-volcano-integration.yaml",
        "ClusterTrainingRuntime",
    ));
    let job = job(upstream_kind("04-volcano-integration.yaml", "TrainJob"));
    let objects = build(&job, &runtime);
    let node_job = rjob(object(&objects, "JobSet"), "node");
    assert_eq!(
        node_job["template"]["spec"]["template"]["metadata"]["annotations"]["scheduling.k8s.io/group-name"],
        "volcano-example"
    );
    assert_eq!(
        object(&objects, "PodGroup")["apiVersion"],
        "scheduling.volcano.sh/v1beta1"
    );
    assert_eq!(
        group_totals(&objects),
        (json!(4), json!({"cpu": "4", "memory": "8Gi"}))
    );
}

/// The PodGroup's `minMember` and `minResources`.
fn group_totals(objects: &[Value]) -> (Value, Value) {
    let spec = &object(objects, "PodGroup")["spec"];
    (spec["minMember"].clone(), spec["minResources"].clone())
}

#[test]
fn runtime_patches_land_on_the_node_pod_template() {
    let runtime = runtime(upstream_kind(
        "torch_distributed.yaml",
        "ClusterTrainingRuntime",
    ));
    let mut job = job(upstream_kind("02-runtime-patches.yaml", "TrainJob"));
    // A second manager patches the pod template's own metadata.
    let mut patches = job.spec.runtime_patches.take().unwrap();
    patches.push(
        serde_json::from_value(json!({
            "manager": "kueue.x-k8s.io/manager",
            "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [{
                "name": "node",
                "template": {"spec": {"template": {"metadata": {
                    "labels": {"kueue.x-k8s.io/podset": "node"},
                    "annotations": {"example.io/note": "patched"},
                }}}},
            }]}}},
        }))
        .unwrap(),
    );
    job.spec.runtime_patches = Some(patches);
    let validation = validate(&job, &runtime);
    assert!(validation.is_ok(), "{:?}", validation.errors);

    let objects = build(&job, &runtime);
    let jobset = object(&objects, "JobSet");
    assert_eq!(
        jobset["metadata"]["labels"],
        json!({"cost-center": "research", "team": "ml-platform"})
    );
    assert_eq!(
        jobset["metadata"]["annotations"],
        json!({"prometheus.io/port": "8080", "prometheus.io/scrape": "true"})
    );
    let node_job = rjob(jobset, "node");
    let pod = &node_job["template"]["spec"]["template"];
    assert_eq!(pod["spec"]["serviceAccountName"], "training-sa");
    assert_eq!(
        pod["spec"]["nodeSelector"],
        json!({"node-type": "training"})
    );
    assert_eq!(
        pod["spec"]["tolerations"],
        json!([{"key": "training-workload", "operator": "Equal", "value": "true", "effect": "NoSchedule"}])
    );
    assert_eq!(pod["metadata"]["labels"]["kueue.x-k8s.io/podset"], "node");
    assert_eq!(pod["metadata"]["annotations"]["example.io/note"], "patched");
    // The trainer's overrides still apply on top.
    let node = container(node_job, "node");
    assert_eq!(counts(node_job), (2, 2));
    assert_eq!(env_value(node, "CUSTOM_VAR"), "custom-value");
    assert_eq!(env_value(node, "PYTHONUNBUFFERED"), "1");
    assert_eq!(
        node["resources"]["limits"],
        json!({"cpu": "4", "memory": "8Gi"})
    );
    assert_eq!(
        node["resources"]["requests"],
        json!({"cpu": "2", "memory": "4Gi"})
    );
    assert_eq!(
        env_value(node, "PET_NPROC_PER_NODE"),
        "2",
        "from the TrainJob's CPU request"
    );
}

#[test]
fn initializers_get_the_storage_uri_env_and_secret() {
    let mut jobs = three_jobs();
    for job in &mut jobs[..2] {
        job["template"]["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] =
            json!([{"name": "initializer", "mountPath": "/workspace"}]);
    }
    let runtime = training_runtime(json!({
        "mlPolicy": {"numNodes": 1, "torch": {}},
        "template": {"spec": {"replicatedJobs": jobs}},
    }));
    let job = test_job(
        "init-job",
        json!({"initializer": {
            "dataset": {"storageUri": "hf://tatsu-lab/alpaca", "env": [{"name": "A", "value": "1"}], "secretRef": {"name": "hf-secret"}},
            "model": {"storageUri": "hf://meta-llama/Llama-3.2-1B-Instruct"},
        }}),
    );
    assert!(validate(&job, &runtime).is_ok());
    let objects = build(&job, &runtime);
    let jobset = object(&objects, "JobSet");
    let dataset = container(rjob(jobset, "dataset-initializer"), "dataset-initializer");
    assert_eq!(env_value(dataset, "STORAGE_URI"), "hf://tatsu-lab/alpaca");
    assert_eq!(env_value(dataset, "A"), "1");
    assert_eq!(
        dataset["envFrom"],
        json!([{"secretRef": {"name": "hf-secret"}}])
    );
    let model = container(rjob(jobset, "model-initializer"), "model-initializer");
    assert_eq!(
        env_value(model, "STORAGE_URI"),
        "hf://meta-llama/Llama-3.2-1B-Instruct"
    );
    assert!(model.get("envFrom").is_none());
}

// ---------------------------------------------------------------------------
// Validation.

/// Upstream torch.go and mpi.go (Validate): one error on `spec.trainer.env`
/// naming the reserved names set; xgboost.go: each entry forbidden; jax.go
/// reserves nothing.
#[test]
fn reserved_env_names_are_rejected_as_upstream_reports_them() {
    let job_setting = |name: &str| {
        test_job(
            "test-job",
            json!({"trainer": {"env": [{"name": "OK", "value": "1"}, {"name": name, "value": "x"}]}}),
        )
    };
    let whole_list = |runtime: Runtime, reserved: &str| {
        let validation = validate(&job_setting(reserved), &runtime);
        assert_eq!(
            error_fields(&validation),
            ["spec.trainer.env"],
            "{reserved}"
        );
        assert_eq!(
            validation.errors[0].detail,
            format!("must not have reserved envs, invalid envs configured: [{reserved}]")
        );
    };
    whole_list(torch_runtime(), "PET_NNODES");
    whole_list(
        runtime(upstream_kind(
            "deepspeed_distributed.yaml",
            "ClusterTrainingRuntime",
        )),
        "OMPI_MCA_orte_set_default_slots",
    );
    whole_list(python_distributed(), "RANK");

    let xgboost = runtime(upstream_kind(
        "xgboost_distributed.yaml",
        "ClusterTrainingRuntime",
    ));
    let validation = validate(&job_setting("DMLC_NUM_WORKER"), &xgboost);
    assert_eq!(error_fields(&validation), ["spec.trainer.env[1]"]);
    assert_eq!(
        validation.errors[0].kind,
        trainhub_plugin_sdk::ErrorKind::Forbidden
    );
    assert_eq!(
        validation.errors[0].detail,
        "DMLC_NUM_WORKER is reserved for the XGBoost runtime"
    );

    let jax = runtime(upstream_kind(
        "jax_distributed.yaml",
        "ClusterTrainingRuntime",
    ));
    let validation = validate(&job_setting("JAX_PROCESS_ID"), &jax);
    assert!(validation.is_ok(), "{:?}", validation.errors);

    // Without the policy the name is free.
    let plain = training_runtime(json!({"template": {"spec": {"replicatedJobs": three_jobs()}}}));
    assert!(validate(&job_setting("PET_NNODES"), &plain).is_ok());
}

#[test]
fn runtime_patches_must_name_what_the_runtime_has() {
    let runtime = torch_runtime();
    let patch = |replicated_job: Value| {
        test_job(
            "test-job",
            json!({"runtimePatches": [{
                "manager": "example.io/team",
                "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [replicated_job]}}},
            }]}),
        )
    };
    let fields = |job: &TrainJob| {
        let validation = validate(job, &runtime);
        error_fields(&validation)
            .into_iter()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        fields(&patch(json!({"name": "missing"}))),
        ["spec.runtimePatches[0].trainingRuntimeSpec.template.spec.replicatedJobs[0].name"]
    );
    let prefix = "spec.runtimePatches[0].trainingRuntimeSpec.template.spec.replicatedJobs[0].template.spec.template.spec";
    assert_eq!(
        fields(&patch(
            json!({"name": "node", "template": {"spec": {"template": {"spec": {
                "containers": [{"name": "sidecar"}],
            }}}}})
        )),
        [format!("{prefix}.containers[0].name")]
    );
    assert_eq!(
        fields(&patch(
            json!({"name": "node", "template": {"spec": {"template": {"spec": {
                "containers": [{"name": "node", "env": [{"name": "X", "value": "1"}]}],
            }}}}})
        )),
        [format!("{prefix}.containers[0].env")]
    );
    let mut job = patch(json!({"name": "node"}));
    job.spec.runtime_patches.as_mut().unwrap()[0].manager = "no-domain".into();
    assert_eq!(fields(&job), ["spec.runtimePatches[0].manager"]);
}

#[test]
fn initializers_need_their_job_container_and_volume() {
    let runtime = training_runtime(json!({
        "mlPolicy": {"numNodes": 1, "torch": {}},
        "template": {"spec": {"replicatedJobs": three_jobs()}},
    }));
    let job = test_job(
        "test-job",
        json!({"initializer": {"dataset": {"storageUri": "hf://x/y"}}}),
    );
    let validation = validate(&job, &runtime);
    assert!(
        error_fields(&validation).is_empty(),
        "{:?}",
        validation.errors
    );
    assert!(
        validation.warnings[0].contains("volumeMount with name - initializer"),
        "{:?}",
        validation.warnings
    );

    let torch = self::runtime(upstream_kind(
        "torch_distributed.yaml",
        "ClusterTrainingRuntime",
    ));
    let validation = validate(&job, &torch);
    assert!(
        validation.errors[0]
            .detail
            .contains("must have dataset-initializer job"),
        "{:?}",
        validation.errors
    );
}

#[test]
fn a_trainer_needs_a_node_container() {
    let runtime = training_runtime(json!({
        "mlPolicy": {"numNodes": 1},
        "template": {"spec": {"replicatedJobs": [standard_job("node", Some("trainer"), "main")]}},
    }));
    let job = test_job("test-job", json!({"trainer": {"image": "x"}}));
    let validation = validate(&job, &runtime);
    assert_eq!(error_fields(&validation), ["spec.runtimeRef"]);
}

#[test]
fn malformed_inputs_fail_instead_of_panicking() {
    // A JSON TrainJob the plugin cannot read is a validation error.
    let validation = trainhub_plugin_sdk::guest::validate::<JobSet>(
        &trainhub_plugin_sdk::Context {
            settings: "{}".into(),
        },
        "{\"spec\": 7}",
        "{}",
    );
    assert!(!validation.errors.is_empty());
    // A broken info is a failure, not a trap.
    let runtime = torch_runtime();
    let job = test_job("test-job", json!({}));
    let mut info = Harness::<JobSet>::new()
        .runtime_info(&job, &runtime)
        .unwrap();
    info.ml_policy = "not json".into();
    assert!(
        Harness::<Torch>::new()
            .enforce_ml_policy(info.clone(), &job)
            .is_err()
    );
    info.template = "7".into();
    assert!(
        Harness::<JobSet>::new()
            .build(&info, &job, &target("t"))
            .is_err()
    );
    let mut info = Harness::<JobSet>::new()
        .runtime_info(&job, &runtime)
        .unwrap();
    info.pod_sets[2].containers[0].requests[0].value = "lots".into();
    let mut with_group = info.clone();
    with_group.pod_group_policy = Some("{\"coscheduling\": {}}".into());
    assert!(
        Harness::<Coscheduling>::new()
            .build(&with_group, &job, &target("t"))
            .is_err()
    );
    info.pod_sets[2].containers[0]
        .env
        .push(trainhub_plugin_sdk::EnvVar {
            name: "BAD".into(),
            value: None,
            value_from: Some("[".into()),
        });
    assert!(
        Harness::<JobSet>::new()
            .build(&info, &job, &target("t"))
            .is_err()
    );
}

// ---------------------------------------------------------------------------
// Status mapping.

fn condition(type_: &str, status: &str, reason: &str, message: &str, time: &str) -> Value {
    json!({"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": time})
}

fn status_of(job: &TrainJob, observed: Value) -> Option<TrainJobStatus> {
    let observed: JobSetStatus = serde_json::from_value(observed).unwrap();
    Harness::<JobSet>::new().status(job, &observed).unwrap()
}

fn conditions(status: &TrainJobStatus) -> Value {
    serde_json::to_value(status).unwrap()["conditions"].clone()
}

#[test]
fn a_completed_jobset_completes_the_trainjob() {
    let job = test_job("test-job", json!({}));
    let status = status_of(
        &job,
        json!({
            "conditions": [condition("Completed", "True", "AllJobsCompleted", "jobset completed successfully", "2026-01-01T00:10:00Z")],
            "replicatedJobsStatus": [{"name": "node", "ready": 0, "succeeded": 2, "failed": 0, "active": 0, "suspended": 0}],
        }),
    )
    .unwrap();
    assert_eq!(
        conditions(&status),
        json!([condition(
            "Complete",
            "True",
            "AllJobsCompleted",
            "jobset completed successfully",
            "2026-01-01T00:10:00Z"
        )])
    );
    assert_eq!(
        serde_json::to_value(&status).unwrap()["jobsStatus"],
        json!([{"name": "node", "ready": 0, "succeeded": 2, "failed": 0, "active": 0, "suspended": 0}])
    );
}

#[test]
fn a_failed_jobset_fails_the_trainjob_and_keeps_other_conditions() {
    let mut job = test_job("test-job", json!({}));
    job.status = Some(
        serde_json::from_value(json!({"conditions": [
            condition("Example", "True", "Mine", "left alone", "2026-01-01T00:00:00Z"),
        ]}))
        .unwrap(),
    );
    let status = status_of(
        &job,
        json!({"conditions": [
            condition("Failed", "True", "FailedJobs", "jobset failed due to one or more job failures", "2026-01-01T00:05:00Z"),
            condition("Completed", "False", "", "", "2026-01-01T00:05:00Z"),
        ]}),
    )
    .unwrap();
    assert_eq!(
        conditions(&status),
        json!([
            condition(
                "Example",
                "True",
                "Mine",
                "left alone",
                "2026-01-01T00:00:00Z"
            ),
            condition(
                "Failed",
                "True",
                "FailedJobs",
                "jobset failed due to one or more job failures",
                "2026-01-01T00:05:00Z"
            ),
        ])
    );
}

#[test]
fn suspension_and_resumption_flip_the_suspended_condition() {
    let mut job = test_job("test-job", json!({"suspend": true}));
    let suspended = status_of(
        &job,
        json!({"conditions": [condition("Suspended", "True", "SuspendedJobs", "jobset is suspended", "2026-01-01T00:01:00Z")]}),
    )
    .unwrap();
    assert_eq!(
        conditions(&suspended),
        json!([condition(
            "Suspended",
            "True",
            "Suspended",
            "TrainJob is suspended",
            "2026-01-01T00:01:00Z"
        )])
    );

    // Observed again while still suspended: nothing to write.
    job.status = Some(suspended.clone());
    assert_eq!(
        status_of(
            &job,
            json!({"conditions": [condition("Suspended", "True", "SuspendedJobs", "jobset is suspended", "2026-01-01T00:03:00Z")]}),
        ),
        None
    );

    // Resumed: the condition flips, with a new transition time.
    job.spec.suspend = Some(false);
    let resumed = status_of(
        &job,
        json!({"conditions": [condition("Suspended", "False", "ResumeJobs", "jobset is resumed", "2026-01-01T00:07:00Z")]}),
    )
    .unwrap();
    assert_eq!(
        conditions(&resumed),
        json!([condition(
            "Suspended",
            "False",
            "Resumed",
            "TrainJob is resumed",
            "2026-01-01T00:07:00Z"
        )])
    );

    // A job never suspended gets no Suspended condition.
    let fresh = test_job("test-job", json!({}));
    assert_eq!(status_of(&fresh, json!({})), None);
}

#[test]
fn a_deadline_failure_set_by_the_host_is_kept() {
    let mut job = test_job("test-job", json!({}));
    job.status = Some(
        serde_json::from_value(json!({"conditions": [
            condition("Failed", "True", "DeadlineExceeded", "TrainJob exceeded its active deadline", "2026-01-01T00:02:00Z"),
        ]}))
        .unwrap(),
    );
    let status = status_of(
        &job,
        json!({"conditions": [condition("Failed", "True", "FailedJobs", "jobset failed", "2026-01-01T00:09:00Z")]}),
    );
    assert_eq!(
        status, None,
        "the deadline condition stays as the host wrote it"
    );
}

// ---------------------------------------------------------------------------
// Descriptors.

#[test]
fn descriptors_declare_what_each_plugin_handles() {
    let jobset = Harness::<JobSet>::new().describe();
    assert_eq!(jobset.name, "jobset");
    assert!(jobset.frameworks.is_empty());
    let torch = Harness::<Torch>::new().describe();
    assert_eq!(torch.frameworks, ["torch"]);
    assert_eq!(Harness::<Mpi>::new().describe().frameworks, ["mpi"]);
    assert_eq!(Harness::<PlainMl>::new().describe().frameworks, ["plainml"]);
    assert_eq!(Harness::<Jax>::new().describe().frameworks, ["jax"]);
    assert_eq!(Harness::<Python>::new().describe().frameworks, ["python"]);
    // The built-ins report reserved env themselves, in upstream's shape, so
    // they declare none for the host to report a second time.
    for reserved in [
        torch.reserved_env,
        Harness::<Mpi>::new().describe().reserved_env,
        Harness::<Jax>::new().describe().reserved_env,
        Harness::<Xgboost>::new().describe().reserved_env,
        Harness::<Python>::new().describe().reserved_env,
    ] {
        assert!(reserved.is_empty(), "{reserved:?}");
    }
    assert_eq!(Harness::<Xgboost>::new().describe().frameworks, ["xgboost"]);
    assert_eq!(
        Harness::<Coscheduling>::new().describe().pod_group_policies,
        ["coscheduling"]
    );
    assert_eq!(
        Harness::<Volcano>::new().describe().pod_group_policies,
        ["volcano"]
    );
}

#[test]
fn endpoints_use_the_template_subdomain() {
    let runtime = training_runtime(json!({
        "mlPolicy": {"numNodes": 1, "mpi": {}},
        "template": {"spec": {
            "network": {"subdomain": "mesh"},
            "replicatedJobs": [
                standard_job("launcher", Some("trainer"), "node"),
                standard_job("node", None, "node"),
            ],
        }},
    }));
    let job = test_job("test-job", json!({"trainer": {"numNodes": 2}}));
    let objects = build(&job, &runtime);
    assert_eq!(
        object(&objects, "ConfigMap")["data"]["hostfile"],
        "test-job-node-0-0.mesh slots=1\ntest-job-node-0-1.mesh slots=1\n"
    );
    assert_eq!(
        object(&objects, "JobSet")["spec"]["network"],
        json!({"subdomain": "mesh"})
    );
}

// ---------------------------------------------------------------------------
// Upstream's behaviour where trainhub used to differ (issue 21). Each vector
// names the upstream file it follows, at kubeflow/trainer 8c0f5059 (v2.3.0).

fn env_names(container: &Value) -> Vec<&str> {
    container["env"]
        .as_array()
        .map(|env| env.iter().filter_map(|e| e["name"].as_str()).collect())
        .unwrap_or_default()
}

/// A runtime of one trainer job `node` whose `node` container is `node`
/// (merged over the standard one) under `ml_policy`.
fn one_node_runtime(ml_policy: Value, node: Value) -> Runtime {
    let mut job = standard_job("node", Some("trainer"), "node");
    let container = &mut job["template"]["spec"]["template"]["spec"]["containers"][0];
    if let (Some(target), Some(extra)) = (container.as_object_mut(), node.as_object()) {
        target.extend(extra.clone());
    }
    training_runtime(json!({
        "mlPolicy": ml_policy,
        "template": {"spec": {"replicatedJobs": [job]}},
    }))
}

fn node_of(objects: &[Value]) -> &Value {
    container(rjob(object(objects, "JobSet"), "node"), "node")
}

/// Upstream jax.go and xgboost.go (EnforceMLPolicy): the trainer container
/// is touched only when the TrainJob sets `spec.trainer`.
#[test]
fn jax_and_xgboost_without_a_trainer_inject_nothing() {
    for file in ["jax_distributed.yaml", "xgboost_distributed.yaml"] {
        let runtime = runtime(upstream_kind(file, "ClusterTrainingRuntime"));
        let objects = build(&test_job("test-job", json!({})), &runtime);
        let node = node_of(&objects);
        assert_eq!(env_names(node), Vec::<&str>::new(), "{file}");
        assert!(node.get("ports").is_none(), "{file}: {node}");
    }
}

/// Upstream mpi.go (EnforceMLPolicy): the launcher's OpenMPI env and the SSH
/// and hostfile volumes do not depend on `spec.trainer`.
#[test]
fn mpi_without_a_trainer_still_configures_the_launcher() {
    let runtime = runtime(upstream_kind(
        "deepspeed_distributed.yaml",
        "ClusterTrainingRuntime",
    ));
    let objects = build(&test_job("test-job", json!({})), &runtime);
    let launcher = container(rjob(object(&objects, "JobSet"), "launcher"), "node");
    assert_eq!(env_value(launcher, "OMPI_MCA_orte_set_default_slots"), "1");
    assert_eq!(
        object(&objects, "ConfigMap")["data"]["hostfile"],
        "test-job-node-0-0.test-job slots=1\ntest-job-launcher-0-0.test-job slots=1\n"
    );
}

/// Upstream torch.go: `envInjection` targets get the `PET_*` env, master
/// included, whether or not the TrainJob sets `spec.trainer`.
#[test]
fn torch_env_injection_targets_do_not_need_a_trainer() {
    let mut node = standard_job("node", Some("trainer"), "node");
    node["template"]["spec"]["template"]["spec"]["initContainers"] =
        json!([{"name": "preflight", "image": "test:preflight"}]);
    let runtime = training_runtime(json!({
        "mlPolicy": {"numNodes": 2, "torch": {"envInjection": {"targets": [
            {"jobName": "node", "containerNames": ["preflight"]},
        ]}}},
        "template": {"spec": {"replicatedJobs": [node]}},
    }));
    let job = test_job("test-job", json!({}));
    assert!(validate(&job, &runtime).is_ok());
    let objects = build(&job, &runtime);
    let pod = &rjob(object(&objects, "JobSet"), "node")["template"]["spec"]["template"]["spec"];
    let preflight = &pod["initContainers"][0];
    assert_eq!(
        env_names(preflight),
        [
            "PET_NNODES",
            "PET_NPROC_PER_NODE",
            "PET_NODE_RANK",
            "PET_MASTER_ADDR",
            "PET_MASTER_PORT"
        ]
    );
    assert!(pod["containers"][0].get("env").is_none());
}

/// Upstream pkg/apply/apply.go (UpsertPort, byContainerPortOrName): the
/// framework's port replaces, in place, a port of the same number or the
/// same name, and two unnamed ports share a name.
#[test]
fn the_framework_port_replaces_an_unnamed_runtime_port() {
    let ports_after = |ports: Value| {
        let runtime = one_node_runtime(json!({"numNodes": 1, "jax": {}}), json!({"ports": ports}));
        let objects = build(&test_job("test-job", json!({"trainer": {}})), &runtime);
        node_of(&objects)["ports"].clone()
    };
    assert_eq!(
        ports_after(json!([{"containerPort": 8080}])),
        json!([{"containerPort": 29500}])
    );
    assert_eq!(
        ports_after(json!([
            {"containerPort": 8080, "protocol": "UDP"},
            {"name": "metrics", "containerPort": 9090},
        ])),
        json!([{"containerPort": 29500}, {"name": "metrics", "containerPort": 9090}]),
        "replaced in place, the named port kept"
    );
    assert_eq!(
        ports_after(json!([{"name": "metrics", "containerPort": 9090}])),
        json!([{"name": "metrics", "containerPort": 9090}, {"containerPort": 29500}]),
        "a named port of another number stays, the framework's is appended"
    );
    assert_eq!(
        ports_after(json!([{"name": "rdzv", "containerPort": 29500, "hostPort": 29500}])),
        json!([{"containerPort": 29500}]),
        "the same number is replaced whole"
    );
}

/// The `node` container built from a one-job runtime under `ml_policy`
/// whose `node` container sets `A=runtime`, for a TrainJob (valid) setting
/// `trainer.env`.
fn node_with_env(ml_policy: Value, trainer_env: Value) -> Value {
    let runtime = one_node_runtime(
        ml_policy,
        json!({"env": [{"name": "A", "value": "runtime"}]}),
    );
    let job = test_job("test-job", json!({"trainer": {"env": trainer_env}}));
    let validation = validate(&job, &runtime);
    assert!(validation.is_ok(), "{:?}", validation.errors);
    node_of(&build(&job, &runtime)).clone()
}

/// Upstream jax.go (Validate reserves nothing) and jobset/builder.go
/// (Trainer): the TrainJob's env is upserted last, so its entries replace
/// the injected ones in place and its new names come after them.
#[test]
fn jax_env_from_the_trainjob_replaces_the_injected_in_place() {
    let node = node_with_env(
        json!({"numNodes": 1, "jax": {}}),
        json!([
            {"name": "B", "value": "$(JAX_PROCESS_ID)"},
            {"name": "JAX_PROCESS_ID", "value": "7"},
            {"name": "A", "value": "trainjob"},
        ]),
    );
    assert_eq!(
        env_names(&node),
        [
            "A",
            "JAX_NUM_PROCESSES",
            "JAX_PROCESS_ID",
            "JAX_COORDINATOR_ADDRESS",
            "B"
        ]
    );
    assert_eq!(env_value(&node, "A"), "trainjob");
    assert_eq!(env_value(&node, "JAX_PROCESS_ID"), "7");
    assert!(env(&node, "JAX_PROCESS_ID").get("valueFrom").is_none());
}

/// Upstream torch.go: the TrainJob's env is merged before the `PET_*` env,
/// so its new names come first (the reserved names cannot be set).
#[test]
fn torch_env_from_the_trainjob_comes_before_pet() {
    let node = node_with_env(
        json!({"numNodes": 1, "torch": {}}),
        json!([{"name": "B", "value": "1"}, {"name": "A", "value": "trainjob"}]),
    );
    assert_eq!(
        env_names(&node),
        [
            "A",
            "B",
            "PET_NNODES",
            "PET_NPROC_PER_NODE",
            "PET_NODE_RANK",
            "PET_MASTER_ADDR",
            "PET_MASTER_PORT"
        ]
    );
    assert_eq!(env_value(&node, "A"), "trainjob");
}

/// Upstream mpi.go and jobset/builder.go (Trainer): the launcher gets the
/// OpenMPI env, then the TrainJob's; with runLauncherAsNode the `node` job's
/// `node` container gets the TrainJob's env too.
#[test]
fn mpi_launcher_env_is_openmpi_then_the_trainjobs() {
    let mut runtime_doc = upstream_kind("deepspeed_distributed.yaml", "ClusterTrainingRuntime");
    let jobs = runtime_doc["spec"]["template"]["spec"]["replicatedJobs"]
        .as_array_mut()
        .unwrap();
    for rjob in jobs.iter_mut() {
        rjob["template"]["spec"]["template"]["spec"]["containers"][0]["env"] =
            json!([{"name": "A", "value": "runtime"}]);
    }
    let runtime = runtime(runtime_doc);
    let job = test_job(
        "test-job",
        json!({"trainer": {"numNodes": 2, "env": [{"name": "B", "value": "1"}]}}),
    );
    assert!(validate(&job, &runtime).is_ok());
    let objects = build(&job, &runtime);
    let jobset = object(&objects, "JobSet");
    assert_eq!(
        env_names(container(rjob(jobset, "launcher"), "node")),
        [
            "A",
            "OMPI_MCA_orte_default_hostfile",
            "OMPI_MCA_orte_keep_fqdn_hostnames",
            "OMPI_MCA_orte_set_default_slots",
            "OMPI_MCA_plm_rsh_args",
            "B"
        ]
    );
    assert_eq!(
        env_names(container(rjob(jobset, "node"), "node")),
        ["A", "B"]
    );
}

/// Upstream pkg/runtime/runtime.go (WithPodSet: SinglePodRequests =
/// resourcehelpers.PodRequests, k8s.io/component-helpers v0.36.3
/// resource/helpers.go) summed by coscheduling/coscheduling.go (Build):
/// containers and sidecars, or an init container with the sidecars declared
/// before it when more, plus the pod's overhead, times the pod count.
#[test]
fn coscheduling_min_resources_count_sidecars_init_containers_and_overhead() {
    let mut node = standard_job("node", Some("trainer"), "node");
    let pod = &mut node["template"]["spec"]["template"]["spec"];
    pod["containers"][0]["resources"] = json!({"requests": {"cpu": "1", "memory": "1Gi"}});
    let init = |name: &str, sidecar: bool, requests: Value| {
        let mut c =
            json!({"name": name, "image": "test:init", "resources": {"requests": requests}});
        if sidecar {
            c["restartPolicy"] = json!("Always");
        }
        c
    };
    pod["initContainers"] = json!([
        init("sidecar-a", true, json!({"cpu": "1"})),
        init("init-x", false, json!({"cpu": "3", "memory": "4Gi"})),
        init("sidecar-b", true, json!({"cpu": "2", "memory": "1Gi"})),
        init("init-y", false, json!({"cpu": "2"})),
    ]);
    pod["overhead"] = json!({"cpu": "500m", "memory": "128Mi"});
    let runtime = training_runtime(json!({
        "mlPolicy": {"numNodes": 2},
        "podGroupPolicy": {"coscheduling": {}},
        "template": {"spec": {"replicatedJobs": [node]}},
    }));
    let objects = build(&test_job("test-job", json!({})), &runtime);
    // cpu per pod: containers 1 + sidecars 1 + 2 = 4; init-y with the
    // sidecars before it 2 + 3 = 5 wins; + 0.5 overhead = 5.5, times 2.
    // memory: 1Gi + 1Gi = 2Gi; init-x alone 4Gi wins; + 128Mi, times 2.
    assert_eq!(
        group_totals(&objects),
        (json!(2), json!({"cpu": "11", "memory": "8448Mi"}))
    );
}

/// Upstream runtime.go (PodRequests): pod-level requests replace the
/// containers' sum for cpu and memory; the TrainJob's resourcesPerNode is
/// counted for the trainer (core/trainingruntime.go merges it first).
#[test]
fn coscheduling_min_resources_take_pod_level_requests_and_resources_per_node() {
    let mut node = standard_job("node", Some("trainer"), "node");
    node["template"]["spec"]["template"]["spec"]["resources"] = json!({"requests": {"cpu": "4"}});
    let runtime = training_runtime(json!({
        "mlPolicy": {"numNodes": 1},
        "podGroupPolicy": {"coscheduling": {}},
        "template": {"spec": {"replicatedJobs": [node]}},
    }));
    let job = test_job(
        "test-job",
        json!({"trainer": {"numNodes": 3, "resourcesPerNode": {"requests": {"cpu": "2", "example.com/gpu": "1"}}}}),
    );
    let objects = build(&job, &runtime);
    assert_eq!(
        group_totals(&objects),
        (json!(3), json!({"cpu": "12", "example.com/gpu": "3"}))
    );
}

/// Upstream torch.go, jax.go, plainml.go: `trainer.numNodes: 0` is kept (the
/// API allows 0); upstream's MPI keeps at least one `node` pod when the
/// launcher runs as a node.
#[test]
fn zero_nodes_are_kept_as_upstream_keeps_them() {
    let job = test_job("zero", json!({"trainer": {"numNodes": 0}}));
    let objects = build(&job, &torch_runtime());
    let node_job = rjob(object(&objects, "JobSet"), "node");
    assert_eq!(counts(node_job), (0, 0));
    assert_eq!(env_value(container(node_job, "node"), "PET_NNODES"), "0");

    let mpi = runtime(upstream_kind(
        "deepspeed_distributed.yaml",
        "ClusterTrainingRuntime",
    ));
    let objects = build(&job, &mpi);
    assert_eq!(counts(rjob(object(&objects, "JobSet"), "node")), (1, 1));
}

/// Upstream runtime.go (FindPodSetByAncestor) and torch.go: the trainer is
/// the job labelled `trainjob-ancestor-step: trainer`; a job merely named
/// `node` is not, and gets no env.
#[test]
fn the_trainer_is_found_by_its_ancestor_label_only() {
    let runtime = training_runtime(json!({
        "mlPolicy": {"numNodes": 2, "torch": {}},
        "template": {"spec": {"replicatedJobs": [standard_job("node", None, "node")]}},
    }));
    let job = test_job("test-job", json!({"trainer": {"numNodes": 4}}));
    let validation = validate(&job, &runtime);
    assert_eq!(error_fields(&validation), ["spec.runtimeRef"]);
    assert!(
        validation.errors[0]
            .detail
            .contains("trainer.kubeflow.org/trainjob-ancestor-step=trainer"),
        "{:?}",
        validation.errors
    );
    let objects = build(&job, &runtime);
    let node_job = rjob(object(&objects, "JobSet"), "node");
    assert_eq!(counts(node_job), (1, 1), "the template's parallelism");
    assert!(container(node_job, "node").get("env").is_none());
}

// TorchTune: upstream torch/torch.go (EnforceMLPolicy) and
// torch/torchtune.go, on trainhub's shipped torchtune-llama3.2-1b runtime.

fn torchtune_runtime() -> Runtime {
    shipped_runtime("llama3-2-1B.yaml")
}

fn torchtune_job(trainer: Value) -> TrainJob {
    let mut spec = json!({
        "runtimeRef": {"name": "torchtune-llama3.2-1b", "kind": "ClusterTrainingRuntime"},
        "trainer": {"command": ["tune", "run"]},
    });
    if let (Some(target), Some(extra)) = (spec["trainer"].as_object_mut(), trainer.as_object()) {
        target.extend(extra.clone());
    }
    test_job("tune", spec)
}

/// The command upstream builds for the shipped runtime's `tune run` with
/// more than one process: rendezvous on the first node, the distributed
/// full fine-tuning recipe with `config`, and the runtime's paths.
fn distributed_tune_command(config: &str) -> Value {
    json!([
        "tune",
        "run",
        "--rdzv_endpoint=tune-node-0-0.tune:29500",
        "full_finetune_distributed",
        "--config",
        config,
        "output_dir=/workspace/output",
        "tokenizer.path=/workspace/model/original/tokenizer.model",
        "checkpointer.checkpoint_dir=/workspace/model",
    ])
}

#[test]
fn torchtune_single_node_runs_the_distributed_recipe_on_two_gpus() {
    let runtime = torchtune_runtime();
    let job = torchtune_job(json!({"args": ["epochs=2", "batch_size=8"]}));
    let validation = validate(&job, &runtime);
    assert!(validation.is_ok(), "{:?}", validation.errors);
    let objects = build(&job, &runtime);
    let node = node_of(&objects);
    assert_eq!(
        node["command"],
        distributed_tune_command("llama3_2/1B_full")
    );
    assert_eq!(node["args"], json!(["epochs=2", "batch_size=8"]));
    assert_eq!(
        env_names(node),
        ["PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK"],
        "no PET_MASTER_* with TorchTune"
    );
    assert_eq!(env_value(node, "PET_NPROC_PER_NODE"), "auto");
    assert_eq!(node["ports"], json!([{"containerPort": 29500}]));
}

#[test]
fn torchtune_on_one_gpu_runs_the_single_device_recipe() {
    let job = torchtune_job(json!({
        "resourcesPerNode": {"limits": {"nvidia.com/gpu": "1"}},
        "args": ["model.lora_attn_modules=[q_proj,v_proj]"],
    }));
    let objects = build(&job, &torchtune_runtime());
    let command = node_of(&objects)["command"].clone();
    assert_eq!(
        command.as_array().unwrap()[2..5],
        [
            json!("lora_finetune_single_device"),
            json!("--config"),
            json!("llama3_2/1B_lora_single_device")
        ],
        "no rendezvous on one device: {command}"
    );
}

#[test]
fn torchtune_multi_node_is_refused_for_llama3_2_1b_but_built_as_upstream() {
    let runtime = torchtune_runtime();
    let job = torchtune_job(json!({"numNodes": 2, "args": ["output_dir=/elsewhere"]}));
    let validation = validate(&job, &runtime);
    assert_eq!(
        error_fields(&validation),
        ["spec.trainer.numNodes", "spec.trainer.args[0]"]
    );
    assert_eq!(
        validation.errors[0].detail,
        "must be 1 for llama3_2/1B model"
    );
    assert_eq!(
        validation.errors[1].detail,
        "must not set immutable config \"output_dir\" in trainer args; it is managed by the runtime"
    );
    // The build itself does what upstream's EnforceMLPolicy does.
    let objects = build(&job, &runtime);
    let node_job = rjob(object(&objects, "JobSet"), "node");
    assert_eq!(counts(node_job), (2, 2));
    assert_eq!(
        container(node_job, "node")["command"],
        distributed_tune_command("llama3_2/1B_full_multinode")
    );
}

#[test]
fn torchtune_qlora_checks_follow_the_model() {
    let runtime = torchtune_runtime();
    let job = torchtune_job(json!({"args": ["model.quantize_base=True"]}));
    let validation = validate(&job, &runtime);
    assert_eq!(
        error_fields(&validation),
        [
            "spec.trainer.numProcPerNode",
            "spec.trainer.resourcesPerNode"
        ],
        "two GPUs: distributed QLoRA, which the 1B model does not offer"
    );
    let mut unsupported = torchtune_job(json!({}));
    unsupported.spec.runtime_ref.name = "torchtune-mistral-7b".into();
    let validation = validate(&unsupported, &runtime);
    assert_eq!(error_fields(&validation), ["spec.runtimeRef.name"]);
    assert_eq!(
        validation.errors[0].detail,
        "must have a supported pretrained model, invalid model configured: mistral/7B"
    );
}

#[test]
fn a_runtime_command_that_is_not_tune_run_keeps_torchrun_env() {
    let job = torchtune_job(json!({"command": ["tune", "run", "--help"]}));
    let objects = build(&job, &torchtune_runtime());
    let node = node_of(&objects);
    assert_eq!(node["command"], json!(["tune", "run", "--help"]));
    assert_eq!(env_value(node, "PET_MASTER_PORT"), "29500");
}
