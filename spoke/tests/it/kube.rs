//! The kube backend against an API server: the stand-in and kmock, each
//! with the simulator playing the JobSet controller, scheduler and kubelet.
//! Every scenario runs against both servers.

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, DynamicObject, ListParams};
use serde_json::{Value, json};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use trainhub_kube_standin::{ApiServer, Kmock, SimConfig, Simulator, Standin, StandinConfig};
use trainhub_spoke::backend::kube::objects::{self, Kind};
use trainhub_spoke::backend::kube::{KubeBackend, KubeConfig};
use trainhub_spoke::backend::{Backend, BackendError, PodSetRequest, RunKey, RunReport, RunSpec};

const DEADLINE: Duration = Duration::from_secs(30);
const NS: &str = "ml";

/// The servers to run a scenario against, each with `config`: the stand-in
/// always, kmock when it can be started here (it needs `kmock` from PyPI);
/// a missing kmock is said on stderr, or fails the test where
/// `TRAINHUB_REQUIRE_KMOCK` is set (CI).
async fn servers(config: &StandinConfig) -> Vec<ApiServer> {
    let standin = Standin::start(config.clone()).await.unwrap();
    let mut all = vec![ApiServer::Standin(standin)];
    match Kmock::start(config.clone()).await {
        Ok(kmock) => all.push(ApiServer::Kmock(kmock)),
        Err(e) if std::env::var_os("TRAINHUB_REQUIRE_KMOCK").is_some() => {
            panic!("kmock is required here (TRAINHUB_REQUIRE_KMOCK is set): {e:#}")
        }
        Err(e) => eprintln!("kmock not available, scenario runs on the stand-in only: {e:#}"),
    }
    all
}

fn config() -> StandinConfig {
    let mut c = StandinConfig::default();
    c.namespaces.push(NS.into());
    c
}

struct Spoke {
    backend: Arc<KubeBackend>,
    reports: UnboundedReceiver<RunReport>,
}

async fn spoke(server: &ApiServer, config: KubeConfig) -> Spoke {
    // RUST_LOG=trainhub_kube_standin=debug shows the simulator's failures.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let (tx, reports) = unbounded_channel();
    let client = server.client().await.unwrap();
    let backend = KubeBackend::connect(
        client,
        KubeConfig {
            delete_wait: Duration::from_secs(20),
            sync_timeout: Duration::from_secs(20),
            ..config
        },
        tx,
    )
    .await
    .unwrap_or_else(|e| panic!("{}: connecting: {e}", server.name()));
    Spoke { backend, reports }
}

impl Spoke {
    /// The first report of `key` that satisfies `done`.
    async fn wait_for(
        &mut self,
        server: &str,
        key: &RunKey,
        what: &str,
        done: impl Fn(&RunReport) -> bool,
    ) -> RunReport {
        if let Some(r) = self.backend.report(key).filter(|r| done(r)) {
            return r;
        }
        let mut last = None;
        let found = tokio::time::timeout(DEADLINE, async {
            while let Some(report) = self.reports.recv().await {
                if &report.key != key {
                    continue;
                }
                if done(&report) {
                    return report;
                }
                last = Some(report);
            }
            panic!("report channel closed");
        })
        .await;
        match found {
            Ok(r) => r,
            Err(_) => {
                panic!("{server}: no report with {what} within {DEADLINE:?}; last: {last:#?}")
            }
        }
    }
}

fn key(run: &str, generation: i64) -> RunKey {
    RunKey {
        run_id: run.into(),
        generation,
    }
}

/// A JobSet of one replicated job `node` of `pods` pods, each asking for
/// `gpus` GPUs, with `env` in its container and `maxRestarts`.
fn jobset(name: &str, pods: u32, gpus: u32, env: Value, max_restarts: u32) -> Value {
    json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"},
            "ownerReferences": [{"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                "name": name, "uid": "tj-uid", "controller": true, "blockOwnerDeletion": true}],
        },
        "spec": {
            "failurePolicy": {"maxRestarts": max_restarts},
            "replicatedJobs": [{
                "name": "node",
                "replicas": 1,
                "template": {"spec": {
                    "parallelism": pods, "completions": pods, "backoffLimit": 0,
                    "completionMode": "Indexed",
                    "template": {"spec": {
                        "restartPolicy": "Never",
                        "containers": [{
                            "name": "node", "image": "pytorch/pytorch:2.7.1",
                            "command": ["torchrun", "train.py"],
                            "env": env,
                            "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": gpus.to_string()}},
                        }],
                    }},
                }},
            }],
        },
    })
}

fn hostfile(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": format!("{name}-mpi-hostfile"), "namespace": NS,
            "ownerReferences": [{"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                "name": name, "uid": "tj-uid", "controller": true, "blockOwnerDeletion": true}]},
        "data": {"hostfile": format!("{name}-node-0-0.{name} slots=1\n")},
    })
}

fn spec(key: &RunKey, namespace: &str, objects: Vec<Value>) -> RunSpec {
    RunSpec {
        key: key.clone(),
        namespace: namespace.into(),
        name: objects[0]["metadata"]["name"].as_str().unwrap().into(),
        trainjob_uid: key.run_id.clone(),
        objects,
        extra_env: Vec::new(),
    }
}

async fn get(server: &ApiServer, kind: Kind, namespace: &str, name: &str) -> Option<Value> {
    let client = server.client().await.unwrap();
    let api: Api<DynamicObject> = Api::namespaced_with(client, namespace, &kind.api_resource());
    api.get_opt(name)
        .await
        .unwrap_or_else(|e| panic!("{}: reading {name}: {e}", server.name()))
        .map(|o| serde_json::to_value(o).unwrap())
}

fn condition<'a>(report: &'a RunReport, kind: &str) -> Option<&'a Value> {
    report.jobset_status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind && c["status"] == "True")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_is_applied_as_built_and_completes() {
    for server in servers(&config()).await {
        let name = server.name();
        let sim = Simulator::start(server.client().await.unwrap(), SimConfig::default());
        let mut spoke = spoke(&server, KubeConfig::default()).await;
        let k = key("run-a", 1);
        let built = vec![jobset("train", 2, 1, json!([]), 0), hostfile("train")];
        spoke
            .backend
            .start(spec(&k, NS, built.clone()))
            .await
            .unwrap_or_else(|e| panic!("{name}: start: {e}"));

        let applied = get(&server, Kind::JobSet, NS, "train").await.unwrap();
        assert_eq!(
            applied["spec"]["replicatedJobs"], built[0]["spec"]["replicatedJobs"],
            "{name}"
        );
        assert_eq!(
            applied["spec"]["failurePolicy"], built[0]["spec"]["failurePolicy"],
            "{name}"
        );
        let labels = &applied["metadata"]["labels"];
        assert_eq!(labels[objects::LABEL_RUN_ID], "run-a", "{name}");
        assert_eq!(labels[objects::LABEL_GENERATION], "1", "{name}");
        assert_eq!(labels[objects::LABEL_TRAINJOB_UID], "run-a", "{name}");
        assert_eq!(
            labels["trainer.kubeflow.org/trainjob-ancestor-step"], "trainer",
            "{name}"
        );
        assert_eq!(
            applied["metadata"]["annotations"][objects::ANNOTATION_SPEC_HASH]
                .as_str()
                .map(str::len),
            Some(64),
            "{name}"
        );
        let uid = applied["metadata"]["uid"].as_str().unwrap();
        let cm = get(&server, Kind::ConfigMap, NS, "train-mpi-hostfile")
            .await
            .unwrap();
        assert_eq!(cm["data"], built[1]["data"], "{name}");
        assert_eq!(
            cm["metadata"]["ownerReferences"],
            json!([{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "train",
                    "uid": uid, "controller": true, "blockOwnerDeletion": true}]),
            "{name}"
        );

        let done = spoke.wait_for(name, &k, "finished", |r| r.finished).await;
        assert!(
            condition(&done, "Completed").is_some(),
            "{name}: {:#?}",
            done.jobset_status
        );
        let rjobs = &done.jobset_status["replicatedJobsStatus"];
        assert_eq!(rjobs[0]["name"], "node", "{name}");
        assert_eq!(rjobs[0]["succeeded"], 1, "{name}: {rjobs}");
        assert_eq!(done.pods.len(), 2, "{name}");
        assert!(
            done.pods
                .iter()
                .all(|p| p["status"]["phase"] == "Succeeded"),
            "{name}"
        );
        assert!(
            spoke
                .backend
                .runs()
                .iter()
                .any(|r| r.key == k && r.finished),
            "{name}"
        );
        sim.stop().await;
        server.shutdown().await;
    }
}

fn failing_env() -> Value {
    json!([{"name": "STANDIN_EXIT_CODE", "value": "3"}])
}

fn long_env(ms: u64) -> Value {
    json!([{"name": "STANDIN_RUN_MS", "value": ms.to_string()}])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_failing_past_max_restarts_fails_the_run() {
    for server in servers(&config()).await {
        let name = server.name();
        let sim = Simulator::start(server.client().await.unwrap(), SimConfig::default());
        let mut spoke = spoke(&server, KubeConfig::default()).await;
        let k = key("run-f", 1);
        let built = vec![jobset("failing", 1, 0, failing_env(), 1)];
        spoke.backend.start(spec(&k, NS, built)).await.unwrap();
        let done = spoke.wait_for(name, &k, "finished", |r| r.finished).await;
        let failed = condition(&done, "Failed");
        assert!(failed.is_some(), "{name}: {:#?}", done.jobset_status);
        assert_eq!(
            done.jobset_status["restarts"], 1,
            "{name}: {:#?}",
            done.jobset_status
        );
        sim.stop().await;
        server.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_deletes_the_jobset_and_its_pods() {
    for server in servers(&config()).await {
        let name = server.name();
        let sim = Simulator::start(server.client().await.unwrap(), SimConfig::default());
        let mut spoke = spoke(&server, KubeConfig::default()).await;
        let k = key("run-s", 1);
        let built = vec![
            jobset("stopped", 2, 0, long_env(60_000), 0),
            hostfile("stopped"),
        ];
        spoke.backend.start(spec(&k, NS, built)).await.unwrap();
        spoke
            .wait_for(name, &k, "two running pods", |r| {
                r.pods.len() == 2 && r.pods.iter().all(|p| p["status"]["phase"] == "Running")
            })
            .await;
        spoke.backend.stop("run-s", 1).await;
        assert!(spoke.backend.runs().iter().all(|r| r.key != k), "{name}");
        // Foreground deletion: the JobSet goes once the garbage collector
        // has removed its Jobs and pods.
        let pods: Api<k8s_openapi::api::core::v1::Pod> =
            Api::namespaced(server.client().await.unwrap(), NS);
        let selector = ListParams::default().labels("jobset.sigs.k8s.io/jobset-name=stopped");
        let gone = tokio::time::timeout(DEADLINE, async {
            loop {
                let left = pods.list(&selector).await.unwrap().items.len();
                let jobset = get(&server, Kind::JobSet, NS, "stopped").await;
                let cm = get(&server, Kind::ConfigMap, NS, "stopped-mpi-hostfile").await;
                // kmock has no garbage collector (the simulator removes
                // Jobs and pods whose owner went, not ConfigMaps): the
                // ConfigMap's removal through its owner reference is
                // checked on the stand-in.
                let cm_gone = cm.is_none() || matches!(server, ApiServer::Kmock(_));
                if left == 0 && jobset.is_none() && cm_gone {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        assert!(
            gone.is_ok(),
            "{name}: the JobSet, its pods or its ConfigMap are still there"
        );
        sim.stop().await;
        server.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_deletes_the_runs_jobsets_and_names_them() {
    for server in servers(&config()).await {
        let name = server.name();
        let sim = Simulator::start(server.client().await.unwrap(), SimConfig::default());
        let mut spoke = spoke(&server, KubeConfig::default()).await;
        let k = key("run-f", 1);
        let built = vec![jobset("fenced", 1, 0, long_env(60_000), 0)];
        spoke.backend.start(spec(&k, NS, built)).await.unwrap();
        spoke
            .wait_for(name, &k, "a running pod", |r| {
                r.pods.len() == 1 && r.pods[0]["status"]["phase"] == "Running"
            })
            .await;
        assert_eq!(spoke.backend.fence().await, vec![k.clone()], "{name}");
        assert!(spoke.backend.runs().is_empty(), "{name}");
        assert!(
            spoke.backend.fence().await.is_empty(),
            "{name}: fenced once"
        );
        let gone = tokio::time::timeout(DEADLINE, async {
            while get(&server, Kind::JobSet, NS, "fenced").await.is_some() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        assert!(
            gone.is_ok(),
            "{name}: the fenced run's JobSet is still there"
        );
        sim.stop().await;
        server.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_backend_holds_its_runs_without_applying_again() {
    for server in servers(&config()).await {
        let name = server.name();
        let sim = Simulator::start(server.client().await.unwrap(), SimConfig::default());
        let k = key("run-r", 2);
        let built = vec![jobset("restarted", 1, 1, long_env(1_500), 0)];
        let first = spoke(&server, KubeConfig::default()).await;
        first
            .backend
            .start(spec(&k, NS, built.clone()))
            .await
            .unwrap();
        let before = get(&server, Kind::JobSet, NS, "restarted").await.unwrap();
        drop(first);

        let mut second = spoke(&server, KubeConfig::default()).await;
        assert!(
            second
                .backend
                .runs()
                .iter()
                .any(|r| r.key == k && !r.finished),
            "{name}: {:?}",
            second.backend.runs()
        );
        second.backend.start(spec(&k, NS, built)).await.unwrap();
        let after = get(&server, Kind::JobSet, NS, "restarted").await.unwrap();
        // Not the resourceVersion: the simulator's status writes move it.
        // A re-apply of the same spec is a no-op on any API server; what
        // must not happen is a re-rendered or re-marked JobSet.
        for field in ["spec", "metadata"] {
            let strip = |v: &Value| {
                let mut v = v[field].clone();
                if let Some(meta) = v.as_object_mut() {
                    meta.remove("resourceVersion");
                }
                v
            };
            assert_eq!(
                strip(&before),
                strip(&after),
                "{name}: the JobSet's {field} changed when the restarted backend took the run"
            );
        }
        assert_eq!(
            before["metadata"]["managedFields"], after["metadata"]["managedFields"],
            "{name}"
        );
        let done = second.wait_for(name, &k, "finished", |r| r.finished).await;
        assert!(
            condition(&done, "Completed").is_some(),
            "{name}: {:#?}",
            done.jobset_status
        );
        sim.stop().await;
        server.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_continue_after_watches_break_and_history_is_compacted() {
    for server in servers(&config()).await {
        let name = server.name();
        let sim = Simulator::start(server.client().await.unwrap(), SimConfig::default());
        let mut spoke = spoke(&server, KubeConfig::default()).await;
        let k = key("run-w", 1);
        let built = vec![jobset("watched", 1, 0, long_env(1_500), 0)];
        spoke.backend.start(spec(&k, NS, built)).await.unwrap();
        spoke
            .wait_for(name, &k, "a running pod", |r| {
                r.pods.iter().any(|p| p["status"]["phase"] == "Running")
            })
            .await;
        server.compact().await.unwrap();
        server.close_watches().await.unwrap();
        let done = spoke.wait_for(name, &k, "finished", |r| r.finished).await;
        assert!(
            condition(&done, "Completed").is_some(),
            "{name}: {:#?}",
            done.jobset_status
        );
        sim.stop().await;
        server.shutdown().await;
    }
}

fn request(name: &str, count: u32, cpu: i64, gpus: i64) -> PodSetRequest {
    PodSetRequest {
        name: name.into(),
        count,
        requests_milli: [
            ("cpu".to_string(), cpu * 1000),
            ("nvidia.com/gpu".to_string(), gpus * 1000),
        ]
        .into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_is_admitted_only_if_every_pod_fits_on_a_node() {
    for server in servers(&config()).await {
        let name = server.name();
        let spoke = spoke(&server, KubeConfig::default()).await;
        let gpus = spoke
            .backend
            .capacity()
            .into_iter()
            .find(|c| c.resource == "nvidia.com/gpu")
            .unwrap_or_else(|| panic!("{name}: no GPU capacity"));
        assert_eq!(gpus.allocatable_milli, 16_000, "{name}");
        // 16 GPUs in total, 8 per node: two pods of 6 fit, three do not.
        let too_big = spoke
            .backend
            .admit(&key("big", 1), &[request("node", 3, 1, 6)]);
        assert!(
            matches!(too_big, Err(BackendError::DoesNotFit(_))),
            "{name}: {too_big:?}"
        );
        spoke
            .backend
            .admit(&key("fits", 1), &[request("node", 2, 1, 6)])
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        // The reservation holds: a second such gang no longer fits.
        let second = spoke
            .backend
            .admit(&key("second", 1), &[request("node", 1, 1, 6)]);
        assert!(
            matches!(second, Err(BackendError::DoesNotFit(_))),
            "{name}: {second:?}"
        );
        spoke.backend.withdraw(&key("fits", 1));
        spoke
            .backend
            .admit(&key("second", 1), &[request("node", 1, 1, 6)])
            .unwrap_or_else(|e| panic!("{name}: after withdraw: {e}"));
        assert_eq!(
            spoke.backend.gpu_product().0.as_deref(),
            Some("NVIDIA-A100-SXM4-80GB"),
            "{name}"
        );
        server.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_kueue_the_jobset_waits_suspended_until_kueue_admits_it() {
    for server in servers(&config()).await {
        let name = server.name();
        let sim = Simulator::start(server.client().await.unwrap(), SimConfig::default());
        let kueue = KubeConfig {
            kueue_queue: Some("team-a".into()),
            ..KubeConfig::default()
        };
        let mut spoke = spoke(&server, kueue).await;
        let k = key("run-q", 1);
        spoke
            .backend
            .admit(&k, &[request("node", 64, 64, 64)])
            .unwrap_or_else(|e| panic!("{name}: Kueue decides, not the spoke: {e}"));
        let built = vec![jobset("queued", 1, 0, json!([]), 0)];
        spoke.backend.start(spec(&k, NS, built)).await.unwrap();
        let applied = get(&server, Kind::JobSet, NS, "queued").await.unwrap();
        assert_eq!(applied["spec"]["suspend"], true, "{name}");
        assert_eq!(
            applied["metadata"]["labels"][objects::LABEL_KUEUE_QUEUE],
            "team-a",
            "{name}"
        );
        // Kueue admits the workload: it unsuspends the JobSet.
        let api: Api<DynamicObject> = Api::namespaced_with(
            server.client().await.unwrap(),
            NS,
            &Kind::JobSet.api_resource(),
        );
        api.patch(
            "queued",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"suspend": false}})),
        )
        .await
        .unwrap_or_else(|e| panic!("{name}: unsuspending: {e}"));
        let done = spoke.wait_for(name, &k, "finished", |r| r.finished).await;
        assert!(
            condition(&done, "Completed").is_some(),
            "{name}: {:#?}",
            done.jobset_status
        );
        sim.stop().await;
        server.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_are_read_from_the_pods_with_tail() {
    for server in servers(&config()).await {
        let name = server.name();
        let sim = Simulator::start(server.client().await.unwrap(), SimConfig::default());
        let mut spoke = spoke(&server, KubeConfig::default()).await;
        let k = key("run-l", 1);
        let env = json!([{"name": "STANDIN_LOG", "value": "epoch 1 loss 0.9\nepoch 2 loss 0.5\n"}]);
        spoke
            .backend
            .start(spec(&k, NS, vec![jobset("logged", 1, 0, env, 0)]))
            .await
            .unwrap();
        let done = spoke.wait_for(name, &k, "finished", |r| r.finished).await;
        let pod = done.pods[0]["metadata"]["name"]
            .as_str()
            .unwrap()
            .to_string();
        let read = |tail: Option<i64>| {
            let backend = spoke.backend.clone();
            let pod = pod.clone();
            async move {
                let mut stream = backend
                    .logs("run-l", &pod, None, false, tail)
                    .await
                    .unwrap_or_else(|e| panic!("{name}: logs of {pod}: {e}"));
                let mut text = Vec::new();
                while let Some(chunk) = futures_util::StreamExt::next(&mut stream).await {
                    text.extend_from_slice(&chunk.unwrap());
                }
                String::from_utf8(text).unwrap()
            }
        };
        assert_eq!(
            read(None).await,
            "epoch 1 loss 0.9\nepoch 2 loss 0.5\n",
            "{name}"
        );
        assert_eq!(read(Some(1)).await, "epoch 2 loss 0.5\n", "{name}");
        let missing = spoke
            .backend
            .logs("run-l", "no-such-pod", None, false, None)
            .await;
        assert!(matches!(missing, Err(BackendError::NotFound(_))), "{name}");
        sim.stop().await;
        server.shutdown().await;
    }
}
