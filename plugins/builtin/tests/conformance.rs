//! The built-in plugins against the Build-phase conformance vectors
//! (`shared/conformance.md`) and upstream Kubeflow Trainer's own manifests,
//! run natively through the SDK's harness in the host's phase order.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;

use serde_json::{Value, json};
use trainhub_builtin_plugins::{
    coscheduling::Coscheduling, jax::Jax, jobset::JobSet, mpi::Mpi, plainml::PlainMl,
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

#[test]
fn vector_b_torch_defaults_from_the_runtime() {
    let runtime = torch_runtime();
    let job = test_job("test-job", json!({}));
    let objects = build(&job, &runtime);
    let node_job = rjob(object(&objects, "JobSet"), "node");
    assert_eq!(counts(node_job), (100, 100));
    let node = container(node_job, "node");
    assert_eq!(env_value(node, "PET_NNODES"), "100");
    assert_eq!(env_value(node, "PET_NPROC_PER_NODE"), "1");
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
        let objects = build(&test_job("test-job", json!({})), &runtime);
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
    let decode = |key: &str| {
        use base64::Engine as _;
        let data = secret["data"][key].as_str().unwrap();
        String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(data)
                .unwrap(),
        )
        .unwrap()
    };
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

/// trainhub's own `python-distributed` runtime.
fn python_distributed() -> Runtime {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../manifests/runtimes/python-distributed.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    runtime(serde_saphyr::from_str(&text).unwrap())
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
    let group = object(&objects, "PodGroup");
    assert_eq!(group["apiVersion"], "scheduling.volcano.sh/v1beta1");
    assert_eq!(group["spec"]["minMember"], 4);
    assert_eq!(
        group["spec"]["minResources"],
        json!({"cpu": "4", "memory": "8Gi"})
    );
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

#[test]
fn reserved_env_names_are_rejected_per_entry() {
    let check = |runtime: Runtime, reserved: &str| {
        let job = test_job(
            "test-job",
            json!({"trainer": {"env": [{"name": "OK", "value": "1"}, {"name": reserved, "value": "x"}]}}),
        );
        let validation = validate(&job, &runtime);
        assert_eq!(
            error_fields(&validation),
            ["spec.trainer.env[1].name"],
            "{reserved}"
        );
        assert_eq!(validation.errors[0].value.as_deref(), Some(reserved));
    };
    check(torch_runtime(), "PET_NNODES");
    check(
        runtime(upstream_kind(
            "xgboost_distributed.yaml",
            "ClusterTrainingRuntime",
        )),
        "DMLC_NUM_WORKER",
    );
    check(
        runtime(upstream_kind(
            "deepspeed_distributed.yaml",
            "ClusterTrainingRuntime",
        )),
        "OMPI_MCA_orte_set_default_slots",
    );
    check(
        runtime(upstream_kind(
            "jax_distributed.yaml",
            "ClusterTrainingRuntime",
        )),
        "JAX_PROCESS_ID",
    );
    check(python_distributed(), "RANK");
    // Without the policy the name is free.
    let plain = training_runtime(json!({"template": {"spec": {"replicatedJobs": three_jobs()}}}));
    let job = test_job(
        "test-job",
        json!({"trainer": {"env": [{"name": "PET_NNODES", "value": "1"}]}}),
    );
    assert!(validate(&job, &plain).is_ok());
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
    assert!(torch.reserved_env.contains(&"PET_NNODES".to_string()));
    assert_eq!(Harness::<Mpi>::new().describe().frameworks, ["mpi"]);
    assert_eq!(Harness::<PlainMl>::new().describe().frameworks, ["plainml"]);
    assert_eq!(Harness::<Jax>::new().describe().frameworks, ["jax"]);
    let python = Harness::<Python>::new().describe();
    assert_eq!(python.frameworks, ["python"]);
    assert_eq!(
        python.reserved_env,
        ["WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT"]
    );
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
