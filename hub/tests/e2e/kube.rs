//! The hub with spokes on the Kubernetes backend, each against its own
//! stand-in API server (or kmock) with the simulator playing the cluster:
//! the JobSet a TrainJob becomes in the spoke's cluster, its status back at
//! the hub, deletion, failure, the MPI and Flux objects, and gang admission
//! against the nodes.

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::api::{Api, DynamicObject};
use serde_json::Value;
use tokio::task::JoinHandle;
use trainhub_apiserver::pki::Ca;
use trainhub_kube_standin::{
    ApiServer, Kmock, NodeSpec, SimConfig, Simulator, Standin, StandinConfig,
};
use trainhub_spoke::agent::{self, AgentConfig};
use trainhub_spoke::backend::kube::objects::Kind;
use trainhub_spoke::backend::kube::{KubeBackend, KubeConfig};
use trainhub_spoke::backend::{
    Backend, BackendError, BoxFuture, Capacity, HeldRun, LogStream, PodSetRequest, RunKey,
    RunReport, RunSpec,
};

use crate::common::{DevHub, tail, upstream_dir};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The kube backend, with every admission answer it gave.
struct Recorded {
    inner: Arc<KubeBackend>,
    admissions: Mutex<Vec<Result<(), BackendError>>>,
}

impl Backend for Recorded {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    fn capacity(&self) -> Vec<Capacity> {
        self.inner.capacity()
    }
    fn admit(&self, key: &RunKey, pod_sets: &[PodSetRequest]) -> Result<(), BackendError> {
        let answer = self.inner.admit(key, pod_sets);
        self.admissions.lock().unwrap().push(answer.clone());
        answer
    }
    fn withdraw(&self, key: &RunKey) {
        self.inner.withdraw(key)
    }
    fn start(&self, spec: RunSpec) -> BoxFuture<'_, Result<(), BackendError>> {
        self.inner.start(spec)
    }
    fn stop(&self, run_id: &str, generation: i64) -> BoxFuture<'_, ()> {
        self.inner.stop(run_id, generation)
    }
    fn runs(&self) -> Vec<HeldRun> {
        self.inner.runs()
    }
    fn report(&self, key: &RunKey) -> Option<RunReport> {
        self.inner.report(key)
    }
    fn logs(
        &self,
        run_id: &str,
        pod: &str,
        container: Option<&str>,
        follow: bool,
        tail_lines: Option<i64>,
    ) -> BoxFuture<'_, Result<LogStream, BackendError>> {
        self.inner.logs(run_id, pod, container, follow, tail_lines)
    }
}

/// A spoke in this process: a cluster (the stand-in or kmock), its
/// simulator, the kube backend and the agent.
struct KubeSpoke {
    server: ApiServer,
    sim: Option<Simulator>,
    backend: Arc<Recorded>,
    agent: JoinHandle<()>,
}

impl KubeSpoke {
    /// A spoke on a stand-in of `nodes` (none: the stand-in's default).
    async fn start(ca: &Ca, name: &str, grpc_port: u16, nodes: Vec<NodeSpec>) -> KubeSpoke {
        let mut config = StandinConfig::default();
        if !nodes.is_empty() {
            config.nodes = nodes;
        }
        let standin = Standin::start(config).await.unwrap();
        Self::start_on(ca, name, grpc_port, ApiServer::Standin(standin)).await
    }

    /// A spoke on `server`, labelled `name=<name>`.
    async fn start_on(ca: &Ca, name: &str, grpc_port: u16, server: ApiServer) -> KubeSpoke {
        let sim = Simulator::start(server.client().await.unwrap(), SimConfig::default());
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let inner = KubeBackend::connect(server.client().await.unwrap(), KubeConfig::default(), tx)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let backend = Arc::new(Recorded {
            inner,
            admissions: Mutex::new(Vec::new()),
        });
        let issued = ca
            .issue_client(name, &[trainhub::grpc::SPOKE_GROUP])
            .unwrap();
        let mut agent_config = AgentConfig::new(
            format!("https://127.0.0.1:{grpc_port}"),
            ca.cert_pem().to_string(),
            issued.cert_pem,
            issued.key_pem,
        );
        agent_config.labels = [("name".to_string(), name.to_string())].into();
        agent_config.heartbeat = Duration::from_millis(300);
        agent_config.backoff_min = Duration::from_millis(100);
        agent_config.backoff_max = Duration::from_millis(500);
        let as_backend: Arc<dyn Backend> = backend.clone();
        let agent = tokio::spawn(agent::run(
            agent_config,
            as_backend,
            rx,
            std::future::pending(),
        ));
        KubeSpoke {
            server,
            sim: Some(sim),
            backend,
            agent,
        }
    }

    async fn jobset(&self, namespace: &str, name: &str) -> Option<Value> {
        self.object(Kind::JobSet, namespace, name).await
    }

    async fn object(&self, kind: Kind, namespace: &str, name: &str) -> Option<Value> {
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.server.client().await.unwrap(),
            namespace,
            &kind.api_resource(),
        );
        api.get_opt(name)
            .await
            .unwrap()
            .map(|o| serde_json::to_value(o).unwrap())
    }

    async fn shutdown(mut self) {
        self.agent.abort();
        if let Some(sim) = self.sim.take() {
            sim.stop().await;
        }
        self.server.shutdown().await;
    }
}

/// A hub with no process spokes and one kube spoke, `gpu-a`, on the
/// stand-in's default nodes.
async fn hub_and_kube_spoke() -> (DevHub, KubeSpoke) {
    let grpc = free_port();
    let port = grpc.to_string();
    let hub = DevHub::start_args(&["--spokes", "0", "--grpc-port", &port], |_| {});
    let spoke = KubeSpoke::start(&hub.ca(), "gpu-a", grpc, Vec::new()).await;
    (hub, spoke)
}

async fn eventually<T, F>(what: &str, hub: &DevHub, mut check: impl FnMut() -> F) -> T
where
    F: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; hub log:\n{}",
            tail(&hub.log(), 60)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn trainjob(hub: &DevHub, name: &str) -> Option<Value> {
    let out = hub.kubectl(&["get", "trainjob", name, "-o", "json"]);
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).ok())
        .flatten()
}

fn condition_true(trainjob: &Value, kind: &str) -> bool {
    trainjob["status"]["conditions"]
        .as_array()
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == kind && c["status"] == "True")
        })
}

/// The objects `trainctl render` prints for `file` with the built-in runtimes.
fn rendered(file: &str) -> Vec<Value> {
    let cache = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("wasm-cache");
    let out = Command::new(env!("CARGO_BIN_EXE_trainctl"))
        .args(["render", "-f", file, "-o", "json"])
        .env("TRAINHUB_CACHE_DIR", cache)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    list["items"].as_array().unwrap().clone()
}

/// The object of `kind` among `objects`.
fn of_kind(objects: &[Value], kind: &str) -> Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind)
        .cloned()
        .unwrap_or_else(|| panic!("no {kind} among {objects:#?}"))
}

/// The JobSet `trainctl render` prints for `file` with the built-in runtimes.
fn rendered_jobset(file: &str) -> Value {
    of_kind(&rendered(file), "JobSet")
}

/// A JobSet spec with the defaults its CRD schema gives (`groupName`,
/// `replicas`, ...), as the API server stores it.
fn with_schema_defaults(spec: Value) -> Value {
    let mut typed: trainhub_api::jobset::JobSetSpec = serde_json::from_value(spec).unwrap();
    typed.default_fields();
    serde_json::to_value(typed).unwrap()
}

/// The environment the hub adds to every container for tracing, which a
/// render does not have.
fn without_hub_additions(mut spec: Value) -> Value {
    // What the hub adds to a run beside the plugins' build: the trace
    // context, and the trainer-status endpoint (docs/trainer-status.md).
    let added_env = |n: &str| {
        n == "TRACEPARENT" || n.starts_with("OTEL_") || n.starts_with("KUBEFLOW_TRAINER_SERVER_")
    };
    let status_volume = trainhub::trainer_status::VOLUME;
    let retain = |list: &mut Value, keep: &dyn Fn(&Value) -> bool| {
        if let Some(items) = list.as_array_mut() {
            items.retain(keep);
            if items.is_empty() {
                *list = Value::Null;
            }
        }
    };
    if let Some(rjobs) = spec["replicatedJobs"].as_array_mut() {
        for rjob in rjobs {
            let pod = &mut rjob["template"]["spec"]["template"]["spec"];
            for list in ["containers", "initContainers"] {
                for c in pod[list].as_array_mut().into_iter().flatten() {
                    retain(&mut c["env"], &|e| {
                        !added_env(e["name"].as_str().unwrap_or_default())
                    });
                    retain(&mut c["volumeMounts"], &|m| m["name"] != status_volume);
                    strip_null(c, &["env", "volumeMounts"]);
                }
            }
            retain(&mut pod["volumes"], &|v| v["name"] != status_volume);
            strip_null(pod, &["volumes"]);
        }
    }
    spec
}

/// Removes `keys` of `object` whose value is null.
fn strip_null(object: &mut Value, keys: &[&str]) {
    if let Some(map) = object.as_object_mut() {
        for key in keys {
            if map.get(*key).is_some_and(Value::is_null) {
                map.remove(*key);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torch_trainjob_runs_as_the_rendered_jobset_on_a_kube_spoke() {
    let (hub, spoke) = hub_and_kube_spoke().await;
    let file = upstream_dir().join("01-multi-node.yaml");
    let file = file.to_str().unwrap();
    hub.kubectl_ok(&["apply", "-f", file]);

    let (h, s) = (&hub, &spoke);
    let applied = eventually("the JobSet in the spoke's cluster", h, move || {
        s.jobset("default", "multi-node-example")
    })
    .await;
    let rendered = rendered_jobset(file);
    // The hub told the trainer's pods where to post their progress.
    let node = &applied["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"];
    let env: Vec<&str> = node["containers"][0]["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert!(env.contains(&"KUBEFLOW_TRAINER_SERVER_URL"), "{env:?}");
    assert_eq!(
        node["volumes"][0]["secret"]["secretName"],
        "multi-node-example-trainer-status"
    );
    assert_eq!(
        without_hub_additions(applied["spec"].clone()),
        without_hub_additions(with_schema_defaults(rendered["spec"].clone())),
        "the applied JobSet differs from the rendered one"
    );
    let labels = applied["metadata"]["labels"].as_object().unwrap();
    for (k, v) in rendered["metadata"]["labels"]
        .as_object()
        .into_iter()
        .flatten()
    {
        assert_eq!(labels.get(k), Some(v), "label {k}");
    }

    let done = eventually("the TrainJob Complete", h, move || async move {
        trainjob(h, "multi-node-example").filter(|t| condition_true(t, "Complete"))
    })
    .await;
    let jobs = done["status"]["jobsStatus"].as_array().unwrap();
    let node = jobs.iter().find(|j| j["name"] == "node").unwrap();
    assert_eq!(node["succeeded"], 1, "{jobs:?}");
    assert_eq!(node["failed"], 0, "{jobs:?}");

    hub.kubectl_ok(&["delete", "trainjob", "multi-node-example"]);
    eventually("the JobSet deleted", h, move || async move {
        s.jobset("default", "multi-node-example")
            .await
            .is_none()
            .then_some(())
    })
    .await;
    spoke.shutdown().await;
}

const GANG: &str = r#"
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata:
  name: gang
spec:
  runtimeRef:
    name: torch-distributed
  trainer:
    numNodes: 2
    command: ["torchrun", "train.py"]
    resourcesPerNode:
      requests:
        cpu: "3"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_that_fits_no_node_of_a_spoke_lands_on_one_that_can_hold_it() {
    let grpc = free_port();
    let port = grpc.to_string();
    let hub = DevHub::start_args(&["--spokes", "0", "--grpc-port", &port], |_| {});
    let ca = hub.ca();
    // 8 CPUs in all, but no node can hold a pod of 3.
    let small: Vec<NodeSpec> = (0..4)
        .map(|i| NodeSpec::new(&format!("small-{i}"), &[("cpu", "2"), ("memory", "8Gi")]))
        .collect();
    let narrow = KubeSpoke::start(&ca, "narrow", grpc, small).await;
    hub.kubectl_stdin(&["apply", "-f", "-"], Some(GANG));
    let n = &narrow;
    eventually(
        "the narrow spoke refusing the gang",
        &hub,
        move || async move {
            n.backend
                .admissions
                .lock()
                .unwrap()
                .iter()
                .any(|a| matches!(a, Err(BackendError::DoesNotFit(_))))
                .then_some(())
        },
    )
    .await;

    let wide = KubeSpoke::start(&ca, "wide", grpc, Vec::new()).await;
    let w = &wide;
    eventually("the JobSet on the wide spoke", &hub, move || {
        w.jobset("default", "gang")
    })
    .await;
    assert!(narrow.jobset("default", "gang").await.is_none());
    assert!(
        narrow
            .backend
            .admissions
            .lock()
            .unwrap()
            .iter()
            .all(Result::is_err),
        "the narrow spoke admitted the gang"
    );
    narrow.shutdown().await;
    wide.shutdown().await;
}

const MPI: &str = r#"
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata:
  name: mpi
spec:
  runtimeRef:
    name: deepspeed-distributed
  trainer:
    numNodes: 2
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mpi_trainjob_brings_its_hostfile_and_ssh_secret_to_the_spoke() {
    let (hub, spoke) = hub_and_kube_spoke().await;
    hub.kubectl_stdin(&["apply", "-f", "-"], Some(MPI));
    let (h, s) = (&hub, &spoke);
    let jobset = eventually("the JobSet in the spoke's cluster", h, move || {
        s.jobset("default", "mpi")
    })
    .await;
    // The spoke creates them after the JobSet, which owns them (their
    // owner references need its uid): they may come a moment later.
    let hostfile = eventually("the hostfile ConfigMap", h, move || {
        s.object(Kind::ConfigMap, "default", "mpi-mpi-hostfile")
    })
    .await;
    let lines: Vec<&str> = hostfile["data"]["hostfile"]
        .as_str()
        .expect("data.hostfile")
        .lines()
        .collect();
    assert_eq!(lines.len(), 2, "one line per node: {lines:?}");
    assert!(lines.iter().all(|l| l.contains("slots=")), "{lines:?}");
    let secret = eventually("the SSH Secret", h, move || {
        s.object(Kind::Secret, "default", "mpi-mpi-ssh-auth")
    })
    .await;
    assert_eq!(secret["type"], "kubernetes.io/ssh-auth");
    assert!(secret["data"]["ssh-privatekey"].is_string(), "{secret:#}");
    assert!(secret["data"]["ssh-publickey"].is_string(), "{secret:#}");
    // Both belong to the JobSet, so they go with it.
    for owned in [&hostfile, &secret] {
        let owner = &owned["metadata"]["ownerReferences"][0];
        assert_eq!(owner["kind"], "JobSet", "{owned:#}");
        assert_eq!(owner["uid"], jobset["metadata"]["uid"], "{owned:#}");
    }
    eventually("the TrainJob Complete", h, move || async move {
        trainjob(h, "mpi").filter(|t| condition_true(t, "Complete"))
    })
    .await;
    spoke.shutdown().await;
}

const FAILING: &str = r#"
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata:
  name: failing
spec:
  runtimeRef:
    name: torch-distributed
  trainer:
    numNodes: 2
    command: ["torchrun", "train.py"]
    env:
      - name: STANDIN_EXIT_CODE
        value: "3"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_failing_past_the_jobsets_restarts_fails_the_trainjob() {
    let (hub, spoke) = hub_and_kube_spoke().await;
    hub.kubectl_stdin(&["apply", "-f", "-"], Some(FAILING));
    let h = &hub;
    let failed = eventually("the TrainJob Failed", h, move || async move {
        trainjob(h, "failing").filter(|t| condition_true(t, "Failed"))
    })
    .await;
    assert!(!condition_true(&failed, "Complete"), "{failed:#}");
    let jobs = failed["status"]["jobsStatus"].as_array().unwrap();
    let node = jobs.iter().find(|j| j["name"] == "node").unwrap();
    assert!(node["failed"].as_i64().unwrap_or(0) >= 1, "{jobs:?}");
    spoke.shutdown().await;
}

/// Upstream's `examples/flux/lammps-train-job.yaml` (LAMMPS on two nodes of
/// four processes under Flux), named `name` and placed on the spoke
/// labelled `name=<spoke>`.
fn lammps_flux(name: &str, spoke: &str) -> String {
    format!(
        r#"
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata:
  name: {name}
  annotations:
    trainhub.kubeflow.org/spoke-selector: name={spoke}
spec:
  runtimeRef:
    name: flux-distributed
  trainer:
    numNodes: 2
    numProcPerNode: 4
    image: ghcr.io/converged-computing/metric-lammps:latest
    command: ["lmp", "-v", "x", "4", "-v", "y", "4", "-v", "z", "4", "-in", "in.reaxc.hns", "-nocite"]
    env:
      - name: FLUX_VIEW_IMAGE
        value: ghcr.io/converged-computing/flux-view-ubuntu:tag-jammy
"#
    )
}

/// What lands in a spoke's cluster for the Flux TrainJob `name` is what
/// upstream builds (upstream `pkg/runtime/framework/plugins/flux/flux.go`):
/// the JobSet as `trainctl render` prints it, with the `flux-installer` init
/// container and the five volumes in upstream's order; the ConfigMap
/// `<name>-flux-entrypoint` with `init.sh` and `entrypoint.sh` as rendered;
/// the immutable Secret `<name>-flux-curve` with its `curve.cert` (a key
/// pair of its own: the render's differs). Both belong to the JobSet in the cluster, and the TrainJob
/// completes.
async fn flux_objects_land_as_built(hub: &DevHub, spoke: &KubeSpoke, name: &str, file: &str) {
    let server = spoke.server.name();
    let (h, s) = (hub, spoke);
    let jobset = eventually("the Flux JobSet in the spoke's cluster", h, move || {
        s.jobset("default", name)
    })
    .await;
    let built = rendered(file);
    let rendered_jobset = of_kind(&built, "JobSet");
    assert_eq!(
        without_hub_additions(jobset["spec"].clone()),
        without_hub_additions(with_schema_defaults(rendered_jobset["spec"].clone())),
        "{server}: the applied JobSet differs from the rendered one"
    );
    let pod = &jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"];
    assert_eq!(
        pod["initContainers"][0]["name"], "flux-installer",
        "{server}: {pod:#}"
    );
    assert_eq!(
        pod["initContainers"][0]["command"],
        serde_json::json!(["/bin/bash", "/etc/flux-config/init.sh"]),
        "{server}"
    );
    let scripts = format!("{name}-flux-entrypoint");
    let curve = format!("{name}-flux-curve");
    // Upstream's five volumes in upstream's order, then the hub's own.
    assert_eq!(
        pod["volumes"],
        serde_json::json!([
            {"name": "spack-install", "emptyDir": {}},
            {"name": "flux-install", "emptyDir": {}},
            {"name": scripts, "configMap": {"name": scripts, "defaultMode": 493}},
            {"name": "shared-memory", "emptyDir": {"medium": "Memory"}},
            {"name": "flux-curve", "secret": {"secretName": curve, "defaultMode": 256}},
            // The hub's, for the trainer's progress (docs/trainer-status.md).
            {"name": "kubeflow-trainer-token", "secret": {"secretName": format!("{name}-trainer-status")}},
        ]),
        "{server}"
    );

    let config_map = spoke
        .object(Kind::ConfigMap, "default", &scripts)
        .await
        .unwrap_or_else(|| panic!("{server}: no ConfigMap {scripts}"));
    assert_eq!(
        config_map["data"],
        of_kind(&built, "ConfigMap")["data"],
        "{server}: the scripts as rendered"
    );
    let secret = spoke
        .object(Kind::Secret, "default", &curve)
        .await
        .unwrap_or_else(|| panic!("{server}: no Secret {curve}"));
    assert_eq!(secret["immutable"], true, "{server}: {secret:#}");
    assert!(
        secret["type"].is_null() || secret["type"] == "Opaque",
        "{server}: {secret:#}"
    );
    let keys = |s: &Value| -> Vec<String> {
        s["data"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, _)| k.clone())
            .collect()
    };
    assert_eq!(keys(&secret), ["curve.cert"], "{server}: {secret:#}");
    assert_eq!(
        keys(&secret),
        keys(&of_kind(&built, "Secret")),
        "{server}: a fresh key pair, under the rendered key"
    );
    for owned in [&config_map, &secret] {
        let owner = &owned["metadata"]["ownerReferences"][0];
        assert_eq!(owner["kind"], "JobSet", "{server}: {owned:#}");
        assert_eq!(
            owner["uid"], jobset["metadata"]["uid"],
            "{server}: {owned:#}"
        );
    }
    eventually("the Flux TrainJob Complete", h, move || async move {
        trainjob(h, name).filter(|t| condition_true(t, "Complete"))
    })
    .await;
}

/// A Flux TrainJob on a kube spoke against the stand-in, and one against
/// kmock (when it can be started here: it needs `kmock` from PyPI through
/// `TRAINHUB_PYTHON`; required where `TRAINHUB_REQUIRE_KMOCK` is set).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flux_trainjob_lands_on_the_kube_spokes_as_upstream_builds_it() {
    let grpc = free_port();
    let port = grpc.to_string();
    let hub = DevHub::start_args(&["--spokes", "0", "--grpc-port", &port], |_| {});
    let ca = hub.ca();
    let mut spokes = vec![KubeSpoke::start(&ca, "standin", grpc, Vec::new()).await];
    match Kmock::start(StandinConfig::default()).await {
        Ok(kmock) => {
            spokes.push(KubeSpoke::start_on(&ca, "kmock", grpc, ApiServer::Kmock(kmock)).await)
        }
        Err(e) if std::env::var_os("TRAINHUB_REQUIRE_KMOCK").is_some() => {
            panic!("kmock is required here (TRAINHUB_REQUIRE_KMOCK is set): {e:#}")
        }
        Err(e) => eprintln!("kmock not available, the Flux job runs on the stand-in only: {e:#}"),
    }
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut files = Vec::new();
    for spoke in &spokes {
        let spoke_name = spoke.server.name();
        let name = format!("lammps-{spoke_name}");
        let yaml = lammps_flux(&name, spoke_name);
        let file = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&file, &yaml).unwrap();
        hub.kubectl_stdin(&["apply", "-f", "-"], Some(&yaml));
        files.push((name, file));
    }
    for (spoke, (name, file)) in spokes.iter().zip(&files) {
        flux_objects_land_as_built(&hub, spoke, name, file.to_str().unwrap()).await;
    }
    for spoke in spokes {
        spoke.shutdown().await;
    }
}
