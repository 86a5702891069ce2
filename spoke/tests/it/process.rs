//! The process backend running real processes.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use serde_json::{Value, json};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use trainhub_spoke::backend::process::devices::{self, DEVICES_ANNOTATION, Gpu};
use trainhub_spoke::backend::process::{ProcessBackend, ProcessConfig, SandboxConfig};
use trainhub_spoke::backend::{Backend, BackendError, PodSetRequest, RunKey, RunReport, RunSpec};

const DEADLINE: Duration = Duration::from_secs(30);

struct Harness {
    backend: Arc<ProcessBackend>,
    reports: UnboundedReceiver<RunReport>,
    /// Reports received while waiting for another run's.
    held: VecDeque<RunReport>,
    dir: tempfile::TempDir,
    /// Where the backend's runs are started, when not the test's runtime.
    own: Option<OwnRuntime>,
}

/// A runtime of its own, on a thread, for the runs of a backend whose agent
/// the test kills: `kill` stops driving it for good, so none of its tasks
/// runs again and nothing of it is dropped, as SIGKILL leaves an agent.
struct OwnRuntime {
    handle: tokio::runtime::Handle,
    kill: Option<tokio::sync::oneshot::Sender<()>>,
}

impl OwnRuntime {
    fn new() -> OwnRuntime {
        let (kill, killed) = tokio::sync::oneshot::channel::<()>();
        let (handle_tx, handle_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            handle_tx.send(runtime.handle().clone()).unwrap();
            let _ = runtime.block_on(killed);
            loop {
                std::thread::park();
            }
        });
        OwnRuntime {
            handle: handle_rx.recv().unwrap(),
            kill: Some(kill),
        }
    }

    fn kill(&mut self) {
        if let Some(kill) = self.kill.take() {
            let _ = kill.send(());
        }
    }
}

fn harness(capacity: &[(&str, i64)]) -> Harness {
    harness_with(capacity, |_| SandboxConfig::default())
}

/// A backend with its work directory under `dir/work`, in the sandbox
/// `sandbox`. `dir` is not under /tmp (private to each container) and is
/// open to the run uids, as a shared host path would be: `dir/shared` is
/// where pods and the test meet.
fn harness_with(
    capacity: &[(&str, i64)],
    sandbox: impl FnOnce(&std::path::Path) -> SandboxConfig,
) -> Harness {
    harness_full(capacity, sandbox, Vec::new())
}

/// [`harness_with`], giving pods `gpus`.
fn harness_full(
    capacity: &[(&str, i64)],
    sandbox: impl FnOnce(&std::path::Path) -> SandboxConfig,
    gpus: Vec<Gpu>,
) -> Harness {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let sandbox = sandbox(dir.path());
    let (tx, reports) = unbounded_channel();
    let backend = ProcessBackend::new(
        ProcessConfig {
            work_dir: dir.path().join("work"),
            capacity: capacity.iter().map(|(r, m)| (r.to_string(), *m)).collect(),
            path_env: None,
            sandbox,
            gpus,
        },
        tx,
    )
    .unwrap();
    Harness {
        backend,
        reports,
        held: VecDeque::new(),
        dir,
        own: None,
    }
}

impl Harness {
    /// Starts a run, on the backend's own runtime if it has one.
    async fn start(&self, spec: RunSpec) -> Result<(), BackendError> {
        let backend = self.backend.clone();
        match &self.own {
            Some(own) => own
                .handle
                .spawn(async move { backend.start(spec).await })
                .await
                .unwrap(),
            None => backend.start(spec).await,
        }
    }

    /// The first report of `key` that satisfies `done`, within the deadline.
    async fn wait_for(
        &mut self,
        key: &RunKey,
        what: &str,
        done: impl Fn(&RunReport) -> bool,
    ) -> RunReport {
        let mut last = None;
        let mut others = VecDeque::new();
        while let Some(report) = self.held.pop_front() {
            if &report.key != key {
                others.push_back(report);
            } else if done(&report) {
                self.held = others.into_iter().chain(self.held.drain(..)).collect();
                return report;
            } else {
                last = Some(report);
            }
        }
        self.held = others;
        let found = tokio::time::timeout(DEADLINE, async {
            while let Some(report) = self.reports.recv().await {
                if &report.key != key {
                    self.held.push_back(report);
                } else if done(&report) {
                    return report;
                } else {
                    last = Some(report);
                }
            }
            panic!("report channel closed");
        })
        .await;
        match found {
            Ok(report) => report,
            Err(_) => panic!("no report with {what} within {DEADLINE:?}; last: {last:#?}"),
        }
    }
}

fn key(run: &str) -> RunKey {
    RunKey {
        run_id: run.into(),
        generation: 1,
    }
}

fn container(name: &str, command: Value, env: Value) -> Value {
    json!({"name": name, "image": "ignored:latest", "command": command, "env": env})
}

fn rjob(name: &str, pods: u32, containers: Value) -> Value {
    json!({"name": name, "replicas": 1, "template": {"spec": {
        "parallelism": pods, "completions": pods, "backoffLimit": 0,
        "template": {"spec": {"restartPolicy": "Never", "containers": containers}}}}})
}

fn jobset(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
           "metadata": {"name": name, "namespace": "team"}, "spec": spec})
}

fn run_spec(run: &str, name: &str, objects: Vec<Value>) -> RunSpec {
    RunSpec {
        key: key(run),
        namespace: "team".into(),
        name: name.into(),
        trainjob_uid: run.into(),
        objects,
        extra_env: vec![(
            "TRACEPARENT".into(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
        )],
    }
}

fn terminal(report: &RunReport) -> Option<&str> {
    report.jobset_status["terminalState"].as_str()
}

fn phases(report: &RunReport) -> Vec<String> {
    report
        .pods
        .iter()
        .map(|p| p["status"]["phase"].as_str().unwrap_or("").to_owned())
        .collect()
}

fn pod_named<'a>(report: &'a RunReport, hostname: &str) -> &'a Value {
    report
        .pods
        .iter()
        .find(|p| p["spec"]["hostname"] == hostname)
        .unwrap_or_else(|| panic!("no pod {hostname} in {:#?}", report.pods))
}

async fn read_log(
    backend: &ProcessBackend,
    run: &str,
    pod: &str,
    container: Option<&str>,
    follow: bool,
    tail: Option<i64>,
) -> String {
    let mut stream = backend
        .logs(run, pod, container, follow, tail)
        .await
        .unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(DEADLINE, async {
        while let Some(chunk) = stream.next().await {
            out.extend_from_slice(&chunk.unwrap());
        }
    })
    .await
    .expect("the log stream ends");
    String::from_utf8(out).unwrap()
}

/// Rank 0 serves on MASTER_ADDR:MASTER_PORT, rank 1 connects to it: the
/// trainhub python plugin's env, rewritten to this machine.
const RENDEZVOUS: &str = r#"
import os, socket, sys, time
addr, port, rank = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), int(os.environ["RANK"])
print("rank", rank, "addr", addr, "port", port, "index", os.environ["JOB_COMPLETION_INDEX"], flush=True)
assert addr == "127.0.0.1", addr
assert port != 29500, port
assert os.environ["TRACEPARENT"].startswith("00-")
if rank == 0:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port)); s.listen(1); s.settimeout(20)
    conn, _ = s.accept()
    data = conn.recv(100)
    print("got", data.decode(), flush=True)
    sys.exit(0 if data == b"hello from 1" else 1)
else:
    for _ in range(200):
        try:
            c = socket.create_connection((addr, port), timeout=1); break
        except OSError:
            time.sleep(0.05)
    else:
        sys.exit(2)
    c.sendall(b"hello from 1"); c.close()
"#;

fn rendezvous_jobset(name: &str) -> Value {
    let env = json!([
        {"name": "MASTER_ADDR", "value": format!("{name}-node-0-0.{name}")},
        {"name": "MASTER_PORT", "value": "29500"},
        {"name": "WORLD_SIZE", "value": "2"},
        {"name": "RANK", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
    ]);
    let mut node = container("node", json!(["python3", "-c", RENDEZVOUS]), env);
    node["ports"] = json!([{"containerPort": 29500}]);
    node["resources"] = json!({"requests": {"cpu": "1"}});
    jobset(
        name,
        json!({"replicatedJobs": [rjob("node", 2, json!([node]))]}),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pods_rendezvous_over_tcp_and_complete() {
    let mut h = harness(&[("cpu", 4000)]);
    let k = key("rdzv");
    // Two runs of the same job at once do not collide on the port.
    let mut other = run_spec("rdzv-2", "other", vec![rendezvous_jobset("other")]);
    other.key.generation = 1;
    h.backend
        .start(run_spec("rdzv", "train", vec![rendezvous_jobset("train")]))
        .await
        .unwrap();
    h.backend.start(other).await.unwrap();
    assert_eq!(
        h.backend.capacity()[0].free_milli,
        0,
        "both gangs are admitted on start"
    );

    let done = h.wait_for(&k, "a terminal state", |r| r.finished).await;
    assert_eq!(
        terminal(&done),
        Some("Completed"),
        "{:#}",
        done.jobset_status
    );
    let status = &done.jobset_status;
    assert_eq!(status["conditions"][0]["type"], "Completed");
    assert_eq!(status["conditions"][0]["status"], "True");
    assert_eq!(status["conditions"][0]["reason"], "AllJobsCompleted");
    assert_eq!(status["restarts"], 0);
    // One Job of two pods: replicatedJobsStatus counts Jobs.
    assert_eq!(
        status["replicatedJobsStatus"],
        json!([{"name": "node", "ready": 0, "succeeded": 1, "failed": 0, "active": 0, "suspended": 0}])
    );
    assert_eq!(phases(&done), vec!["Succeeded", "Succeeded"]);
    let pod0 = pod_named(&done, "train-node-0-0");
    let name = pod0["metadata"]["name"].as_str().unwrap();
    assert!(
        name.starts_with("train-node-0-0-") && name.len() == "train-node-0-0-".len() + 5,
        "{name}"
    );
    assert_eq!(pod0["metadata"]["namespace"], "team");
    assert_eq!(
        pod0["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-name"],
        "train"
    );
    assert_eq!(
        pod0["metadata"]["labels"]["jobset.sigs.k8s.io/replicatedjob-name"],
        "node"
    );
    assert_eq!(
        pod0["metadata"]["labels"]["jobset.sigs.k8s.io/job-index"],
        "0"
    );
    assert_eq!(pod0["metadata"]["labels"]["job-name"], "train-node-0");
    assert_eq!(
        pod0["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"],
        "0"
    );
    assert_eq!(pod0["spec"]["subdomain"], "train");
    assert_eq!(pod0["status"]["podIP"], "127.0.0.1");
    let terminated = &pod0["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(terminated["exitCode"], 0);
    assert_eq!(terminated["reason"], "Completed");
    assert!(terminated["startedAt"].is_string() && terminated["finishedAt"].is_string());
    assert_eq!(h.backend.report(&k), Some(done.clone()));

    let log = read_log(&h.backend, "rdzv", name, None, false, None).await;
    assert!(
        log.contains("rank 0 addr 127.0.0.1") && log.contains("got hello from 1"),
        "{log}"
    );

    let other = h
        .wait_for(&key("rdzv-2"), "a terminal state", |r| r.finished)
        .await;
    assert_eq!(terminal(&other), Some("Completed"));
    assert_eq!(
        h.backend.capacity()[0].free_milli,
        4000,
        "finished runs release their capacity"
    );
    let held = h.backend.runs();
    assert_eq!(held.len(), 2);
    assert!(held.iter().all(|r| r.finished));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_pod_restarts_once_then_fails_the_jobset() {
    let mut h = harness(&[]);
    let k = key("fail");
    let mut js = jobset(
        "f",
        json!({
            "failurePolicy": {"maxRestarts": 1},
            "replicatedJobs": [rjob("node", 2, json!([container("c", json!(["sh", "-c", "if [ \"$JOB_COMPLETION_INDEX\" = 1 ]; then echo boom >&2; exit 3; fi; sleep 1000"]), json!([]))]))],
        }),
    );
    js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["name"] =
        json!("c");
    h.backend
        .start(run_spec("fail", "f", vec![js]))
        .await
        .unwrap();

    let restarted = h
        .wait_for(&k, "restarts = 1", |r| r.jobset_status["restarts"] == 1)
        .await;
    let first_names: Vec<Value> = restarted
        .pods
        .iter()
        .map(|p| p["metadata"]["name"].clone())
        .collect();
    assert_eq!(
        restarted.pods.len(),
        2,
        "the old pods are gone, two fresh ones"
    );
    let done = h.wait_for(&k, "a terminal state", |r| r.finished).await;
    let status = &done.jobset_status;
    assert_eq!(terminal(&done), Some("Failed"), "{status:#}");
    assert_eq!(status["restarts"], 1);
    assert_eq!(status["conditions"][0]["type"], "Failed");
    assert_eq!(status["conditions"][0]["reason"], "ReachedMaxRestarts");
    assert_eq!(
        status["conditions"][0]["message"],
        "jobset failed due to reaching max number of restarts (first failed job: f-node-0)"
    );
    assert_eq!(status["replicatedJobsStatus"][0]["failed"], 1);
    // The failed pod of the second attempt stays; the sleeping one was deleted.
    assert_eq!(phases(&done), vec!["Failed"]);
    let failed = &done.pods[0];
    assert!(
        first_names.contains(&failed["metadata"]["name"]),
        "pods of the second attempt"
    );
    assert_eq!(
        failed["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"],
        "1"
    );
    let terminated = &failed["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(
        (terminated["exitCode"].clone(), terminated["reason"].clone()),
        (json!(3), json!("Error"))
    );
    let log = read_log(
        &h.backend,
        "fail",
        failed["metadata"]["name"].as_str().unwrap(),
        Some("c"),
        false,
        None,
    )
    .await;
    assert_eq!(log, "boom\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_waits_for_the_initializer() {
    let mut h = harness(&[]);
    let k = key("deps");
    let mark = h.dir.path().join("shared/initialized");
    let env = json!([{"name": "MARK", "value": mark.to_str().unwrap()}]);
    let init = rjob(
        "initializer",
        1,
        json!([container(
            "i",
            json!(["sh", "-c", "sleep 0.3; echo ok > \"$MARK\""]),
            env.clone()
        )]),
    );
    let mut node = rjob(
        "node",
        2,
        json!([container(
            "n",
            json!(["sh", "-c", "test -f \"$MARK\""]),
            env
        )]),
    );
    node["dependsOn"] = json!([{"name": "initializer", "status": "Complete"}]);
    h.backend
        .start(run_spec(
            "deps",
            "d",
            vec![jobset("d", json!({"replicatedJobs": [init, node]}))],
        ))
        .await
        .unwrap();

    let running = h
        .wait_for(&k, "the initializer running", |r| {
            phases(r).first().map(String::as_str) == Some("Running")
        })
        .await;
    assert_eq!(
        phases(&running),
        vec!["Running", "Pending", "Pending"],
        "node pods wait"
    );
    assert_eq!(
        running.jobset_status["replicatedJobsStatus"][1]["active"],
        0
    );
    let done = h.wait_for(&k, "a terminal state", |r| r.finished).await;
    assert_eq!(
        terminal(&done),
        Some("Completed"),
        "{:#}",
        done.jobset_status
    );
    assert_eq!(phases(&done), vec!["Succeeded"; 3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gang_admission_is_all_or_nothing() {
    let h = harness(&[("cpu", 2000), ("nvidia.com/gpu", 1000)]);
    let gang = |count, cpu, gpu| {
        vec![PodSetRequest {
            name: "node".into(),
            count,
            requests_milli: BTreeMap::from([
                ("cpu".to_string(), cpu),
                ("nvidia.com/gpu".to_string(), gpu),
            ]),
        }]
    };
    h.backend.admit(&key("a"), &gang(2, 500, 0)).unwrap();
    h.backend.admit(&key("a"), &gang(2, 500, 0)).unwrap();
    let err = h.backend.admit(&key("b"), &gang(2, 500, 1000)).unwrap_err();
    assert_eq!(
        err,
        BackendError::DoesNotFit("nvidia.com/gpu: the gang requests 2, 1 of 1 is free".into())
    );
    let err = h
        .backend
        .admit(
            &key("b"),
            &[PodSetRequest {
                name: "x".into(),
                count: 1,
                requests_milli: [("memory".to_string(), 1)].into(),
            }],
        )
        .unwrap_err();
    assert!(
        matches!(&err, BackendError::DoesNotFit(m) if m.starts_with("memory:")),
        "{err}"
    );
    let free: Vec<i64> = h.backend.capacity().iter().map(|c| c.free_milli).collect();
    assert_eq!(free, vec![1000, 1000], "nothing of b was reserved");

    // A start that was not admitted admits from the JobSet's requests.
    let mut c = container("c", json!(["true"]), json!([]));
    c["resources"] = json!({"limits": {"cpu": "600m"}});
    let js = jobset(
        "big",
        json!({"replicatedJobs": [rjob("node", 2, json!([c]))]}),
    );
    let err = h
        .backend
        .start(run_spec("c", "big", vec![js]))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        BackendError::DoesNotFit("cpu: the gang requests 1200m, 1 of 2 is free".into())
    );
    assert!(h.backend.runs().is_empty());

    h.backend.withdraw(&key("a"));
    assert_eq!(h.backend.capacity()[0].free_milli, 2000);
    h.backend.withdraw(&key("unknown"));

    let err = h
        .backend
        .start(run_spec(
            "d",
            "x",
            vec![json!({"apiVersion": "batch/v1", "kind": "Job"})],
        ))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, BackendError::Invalid(m) if m.contains("must be jobset.x-k8s.io/v1alpha2 JobSet")),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_kills_the_whole_process_tree() {
    let mut h = harness(&[("cpu", 1000)]);
    let k = key("sleepy");
    // A grandchild in a session of its own: not in the pod's process group.
    let marker = unique_sleep();
    let mut c = container(
        "c",
        json!([
            "sh",
            "-c",
            format!("setsid sleep {marker} & echo child started; sleep 1000")
        ]),
        json!([]),
    );
    c["resources"] = json!({"requests": {"cpu": "1"}});
    let js = jobset(
        "s",
        json!({"replicatedJobs": [rjob("node", 1, json!([c]))]}),
    );
    h.backend
        .start(run_spec("sleepy", "s", vec![js.clone()]))
        .await
        .unwrap();
    h.backend
        .start(run_spec("sleepy", "s", vec![js]))
        .await
        .unwrap();
    let running = h
        .wait_for(&k, "a running pod", |r| phases(r) == ["Running"])
        .await;
    let pod = running.pods[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let pod_dir = h.dir.path().join("work/team/s-1").join(&pod);
    assert!(pod_dir.join("c.log").exists());

    // The backgrounded sleep's pid, once the log says it started.
    let (child, mut stream) = child_pid(&h.backend, "sleepy", &pod, &marker).await;
    assert!(alive(child));

    h.backend.stop("sleepy", 1).await;
    gone(child).await;
    assert!(!pod_dir.exists(), "the run directory is deleted");
    assert!(h.backend.runs().is_empty());
    assert_eq!(h.backend.report(&k), None);
    assert_eq!(h.backend.capacity()[0].free_milli, 1000);
    // The followed log ends once the run is gone.
    tokio::time::timeout(DEADLINE, async { while stream.next().await.is_some() {} })
        .await
        .unwrap();
    h.backend.stop("sleepy", 1).await;
}

/// An argument for `sleep` that no other process has: a long sleep whose
/// process the test finds by its command line (the pid a sandboxed shell
/// sees is its PID namespace's, not this one's).
fn unique_sleep() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "1000.{}{:03}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The pid (in this PID namespace) of the process running `sleep MARKER`.
fn pid_of_sleep(marker: &str) -> Option<u32> {
    let wanted = format!("sleep\0{marker}\0");
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            (cmdline == wanted.as_bytes() && alive(pid)).then_some(pid)
        })
}

/// Follows a pod's log until it says `child started`, then finds the
/// `sleep MARKER` it started.
async fn child_pid(
    backend: &ProcessBackend,
    run: &str,
    pod: &str,
    marker: &str,
) -> (u32, trainhub_spoke::backend::LogStream) {
    let mut stream = backend.logs(run, pod, None, true, None).await.unwrap();
    let mut text = String::new();
    let pid = tokio::time::timeout(DEADLINE, async {
        loop {
            if text.contains("child started\n")
                && let Some(pid) = pid_of_sleep(marker)
            {
                return pid;
            }
            if !text.contains("child started\n") {
                let chunk = stream.next().await.unwrap().unwrap();
                text.push_str(std::str::from_utf8(&chunk).unwrap());
            } else {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no `sleep {marker}` after the log said {text:?}"));
    (pid, stream)
}

async fn gone(pid: u32) {
    tokio::time::timeout(DEADLINE, async {
        while alive(pid) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("process {pid} is still alive"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_backend_leaves_no_processes() {
    let mut h = harness(&[]);
    let marker = unique_sleep();
    let c = container(
        "c",
        json!([
            "sh",
            "-c",
            format!("setsid sleep {marker} & echo child started; sleep 1000")
        ]),
        json!([]),
    );
    let js = jobset(
        "s",
        json!({"replicatedJobs": [rjob("node", 1, json!([c]))]}),
    );
    h.backend
        .start(run_spec("dropped", "s", vec![js]))
        .await
        .unwrap();
    let running = h
        .wait_for(&key("dropped"), "a running pod", |r| {
            phases(r) == ["Running"]
        })
        .await;
    let pod = running.pods[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let (child, stream) = child_pid(&h.backend, "dropped", &pod, &marker).await;
    drop(stream);
    assert!(alive(child));
    drop(h.backend);
    gone(child).await;
}

/// A process that exists and is not a zombie.
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_tail_and_follow() {
    let mut h = harness(&[]);
    let k = key("logs");
    let script = "echo one; echo two; echo three; read x < \"$GATE\" ; echo four; echo err >&2";
    let gate = h.dir.path().join("shared/gate");
    assert!(
        std::process::Command::new("mkfifo")
            .args(["-m", "0666"])
            .arg(&gate)
            .status()
            .unwrap()
            .success()
    );
    let env = json!([{"name": "GATE", "value": gate.to_str().unwrap()}]);
    let js = jobset(
        "l",
        json!({"replicatedJobs": [rjob("node", 1, json!([container("main", json!(["sh", "-c", script]), env)]))]}),
    );
    h.backend
        .start(run_spec("logs", "l", vec![js]))
        .await
        .unwrap();
    let running = h
        .wait_for(&k, "a running pod", |r| phases(r) == ["Running"])
        .await;
    let pod = running.pods[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();

    // Follow the whole log until the first lines are there, then follow the last two
    // lines while the process still runs; open the gate; both streams end when the
    // container does.
    let mut whole = h
        .backend
        .logs("logs", &pod, Some("main"), true, None)
        .await
        .unwrap();
    let mut all = String::new();
    tokio::time::timeout(DEADLINE, async {
        while !all.contains("three\n") {
            all.push_str(std::str::from_utf8(&whole.next().await.unwrap().unwrap()).unwrap());
        }
    })
    .await
    .unwrap();
    let mut stream = h
        .backend
        .logs("logs", &pod, Some("main"), true, Some(2))
        .await
        .unwrap();
    std::fs::write(&gate, "go\n").unwrap();
    let mut seen = String::new();
    tokio::time::timeout(DEADLINE, async {
        while let Some(chunk) = stream.next().await {
            seen.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
        }
        while let Some(chunk) = whole.next().await {
            all.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
        }
    })
    .await
    .expect("the followed streams end with the container");
    assert_eq!(all, "one\ntwo\nthree\nfour\nerr\n");
    assert_eq!(seen, "two\nthree\nfour\nerr\n");

    let done = h.wait_for(&k, "a terminal state", |r| r.finished).await;
    assert_eq!(terminal(&done), Some("Completed"));
    assert_eq!(
        read_log(&h.backend, "logs", &pod, None, false, Some(1)).await,
        "err\n"
    );
    assert_eq!(
        read_log(&h.backend, "logs", &pod, None, false, Some(0)).await,
        ""
    );
    assert_eq!(
        read_log(&h.backend, "logs", &pod, None, true, None).await,
        "one\ntwo\nthree\nfour\nerr\n"
    );

    let not_found = |r: Result<_, BackendError>| match r {
        Err(BackendError::NotFound(m)) => m,
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("found"),
    };
    assert_eq!(
        not_found(h.backend.logs("nope", &pod, None, false, None).await),
        "run \"nope\""
    );
    assert_eq!(
        not_found(h.backend.logs("logs", "nope", None, false, None).await),
        "pod \"nope\" of run \"logs\""
    );
    assert_eq!(
        not_found(h.backend.logs("logs", &pod, Some("x"), false, None).await),
        format!("container \"x\" of pod \"{pod}\"")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_without_a_command_fails_its_pod() {
    let mut h = harness(&[]);
    let k = key("nocmd");
    let js = jobset(
        "n",
        json!({"replicatedJobs": [rjob("node", 1, json!([{"name": "c", "image": "python:3"}]))]}),
    );
    h.backend
        .start(run_spec("nocmd", "n", vec![js]))
        .await
        .unwrap();
    let done = h.wait_for(&k, "a terminal state", |r| r.finished).await;
    assert_eq!(terminal(&done), Some("Failed"));
    assert_eq!(done.jobset_status["conditions"][0]["reason"], "FailedJobs");
    let message = done.pods[0]["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("container \"c\" has no command"),
        "{message}"
    );
}

fn running_as_root() -> bool {
    trainhub_spoke::backend::process::sandbox::effective_uid() == Some(0)
}

/// What a pod can print from a shell script, once it finished.
async fn run_script(
    h: &mut Harness,
    run: &str,
    script: &str,
    resources: Value,
) -> (RunReport, String) {
    let mut c = container("c", json!(["sh", "-c", script]), json!([]));
    c["resources"] = resources;
    let js = jobset(
        run,
        json!({"replicatedJobs": [rjob("node", 1, json!([c]))]}),
    );
    h.backend.start(run_spec(run, run, vec![js])).await.unwrap();
    let done = h
        .wait_for(&key(run), "a terminal state", |r| r.finished)
        .await;
    let pod = done.pods[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let log = read_log(&h.backend, run, &pod, None, false, None).await;
    (done, log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_sees_neither_the_spokes_secrets_nor_other_runs() {
    use std::os::unix::fs::PermissionsExt as _;
    let mut h = harness_with(&[], |dir| {
        let keys = dir.join("keys");
        std::fs::create_dir(&keys).unwrap();
        std::fs::write(keys.join("spoke.key"), "KEY-SECRET-41\n").unwrap();
        std::fs::set_permissions(
            keys.join("spoke.key"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        // Readable by all, and still out of reach: hidden, not just closed.
        std::fs::write(dir.join("token.csv"), "TOKEN-SECRET-42\n").unwrap();
        SandboxConfig {
            hide: vec![keys, dir.join("token.csv")],
            ..SandboxConfig::default()
        }
    });
    assert!(
        h.backend.sandbox().hides_files(),
        "{}",
        h.backend.sandbox().describe()
    );
    let dir = h.dir.path().to_owned();

    // The victim: a file in its own directory, and a file in /tmp.
    let victim = "echo VICTIM-SECRET-43 > mine.txt; echo VICTIM-TMP-44 > /tmp/t.txt; id -u; echo ready; sleep 1000";
    let c = container("c", json!(["sh", "-c", victim]), json!([]));
    let js = jobset(
        "v",
        json!({"replicatedJobs": [rjob("node", 1, json!([c]))]}),
    );
    h.backend
        .start(run_spec("victim", "v", vec![js]))
        .await
        .unwrap();
    let running = h
        .wait_for(&key("victim"), "a running pod", |r| {
            phases(r) == ["Running"]
        })
        .await;
    let victim_pod = running.pods[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let victim_dir = dir.join("work/team/v-1").join(&victim_pod);
    let mut stream = h
        .backend
        .logs("victim", &victim_pod, None, true, None)
        .await
        .unwrap();
    let mut victim_log = String::new();
    tokio::time::timeout(DEADLINE, async {
        while !victim_log.contains("ready\n") {
            victim_log
                .push_str(std::str::from_utf8(&stream.next().await.unwrap().unwrap()).unwrap());
        }
    })
    .await
    .expect("the victim is ready");
    assert!(victim_dir.join("mine.txt").exists());

    let thief = format!(
        "for f in {keys}/spoke.key {token} {mine} ../../v-1/{victim_pod}/mine.txt /tmp/t.txt; do \
           cat \"$f\" 2>&1 || echo \"refused $f\"; done; \
         echo \"runs: $(ls {work}/team 2>&1 | tr '\\n' ' ')\"; ls -a {keys} 2>&1; id -u; echo finished",
        keys = dir.join("keys").display(),
        token = dir.join("token.csv").display(),
        mine = victim_dir.join("mine.txt").display(),
        work = dir.join("work").display(),
    );
    let (done, log) = run_script(&mut h, "thief", &thief, json!({})).await;
    assert_eq!(terminal(&done), Some("Completed"), "{log}");
    assert!(log.ends_with("finished\n"), "{log}");
    for secret in [
        "KEY-SECRET-41",
        "TOKEN-SECRET-42",
        "VICTIM-SECRET-43",
        "VICTIM-TMP-44",
    ] {
        assert!(!log.contains(secret), "{secret} leaked:\n{log}");
    }
    assert_eq!(log.matches("refused ").count(), 5, "{log}");
    assert!(log.contains("No such file or directory"), "{log}");
    // The work directory shows the thief's own run only.
    assert!(log.contains("runs: thief-1 \n"), "{log}");
    if running_as_root() {
        let uid = |text: &str| -> u32 {
            text.lines()
                .find_map(|l| l.parse().ok())
                .unwrap_or_else(|| panic!("no uid in {text:?}"))
        };
        let range = trainhub_spoke::backend::process::DEFAULT_RUN_UIDS;
        let (victim_uid, thief_uid) = (uid(&victim_log), uid(&log));
        assert!(
            (range.first..=range.last).contains(&victim_uid),
            "{victim_uid}"
        );
        assert!(
            (range.first..=range.last).contains(&thief_uid),
            "{thief_uid}"
        );
        assert_ne!(victim_uid, thief_uid, "each run has its own uid");
        use std::os::unix::fs::MetadataExt as _;
        let meta = std::fs::metadata(&victim_dir).unwrap();
        assert_eq!((meta.uid(), meta.mode() & 0o777), (victim_uid, 0o700));
    }
    h.backend.stop("victim", 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_replaced_by_a_symlink_is_not_followed() {
    let mut h = harness(&[]);
    let secret = h.dir.path().join("secret.txt");
    std::fs::write(&secret, "SPOKE-SECRET-45\n").unwrap();
    let script = format!(
        "echo before; rm c.log; ln -s {} c.log; echo after",
        secret.display()
    );
    let (done, _) = {
        let mut c = container("c", json!(["sh", "-c", script]), json!([]));
        c["resources"] = json!({});
        let js = jobset(
            "sym",
            json!({"replicatedJobs": [rjob("node", 1, json!([c]))]}),
        );
        h.backend
            .start(run_spec("sym", "sym", vec![js]))
            .await
            .unwrap();
        (
            h.wait_for(&key("sym"), "a terminal state", |r| r.finished)
                .await,
            (),
        )
    };
    assert_eq!(terminal(&done), Some("Completed"));
    let pod = done.pods[0]["metadata"]["name"].as_str().unwrap();
    match h.backend.logs("sym", pod, None, false, None).await {
        Err(BackendError::Internal(message)) => {
            assert!(message.contains("symlink"), "{message}");
        }
        Err(other) => panic!("{other}"),
        Ok(mut stream) => {
            let mut text = Vec::new();
            while let Some(chunk) = stream.next().await {
                text.extend_from_slice(&chunk.unwrap());
            }
            panic!("the symlink was read: {:?}", String::from_utf8_lossy(&text));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_hog_is_oom_killed_by_its_limit() {
    let mut h = harness(&[("cpu", 4000), ("memory", 4 << 40)]);
    if h.backend.sandbox().cgroups().is_none() {
        assert!(
            !running_as_root(),
            "root, yet no cgroups: {}",
            h.backend.sandbox().describe()
        );
        eprintln!("skipped: not root, no cgroups to limit memory with");
        return;
    }
    let hog = "echo start; python3 -c 'x = bytearray(512 * 1024 * 1024); x[::4096] = b\"x\" * len(x[::4096]); print(\"survived\")'";
    let (done, log) = run_script(
        &mut h,
        "hog",
        hog,
        json!({"limits": {"memory": "64Mi", "cpu": "500m"}}),
    )
    .await;
    assert_eq!(terminal(&done), Some("Failed"), "{log}");
    assert!(!log.contains("survived"), "{log}");
    let pod = &done.pods[0];
    assert_eq!(pod["status"]["phase"], "Failed");
    let terminated = &pod["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(terminated["reason"], "OOMKilled", "{pod:#}");
    assert_eq!(terminated["exitCode"], 137);

    // Under the limit, the same container runs; its cpu quota is its limit.
    let fine = "python3 -c 'x = bytearray(16 * 1024 * 1024); print(\"fits\")'; cat /sys/fs/cgroup/cpu/$(sed -n 's/^[0-9]*:cpu:\\(.*\\)/\\1/p' /proc/self/cgroup)/cpu.cfs_quota_us 2>/dev/null || cat /sys/fs/cgroup/$(sed -n 's/^0::\\(.*\\)/\\1/p' /proc/self/cgroup)/cpu.max";
    let (done, log) = run_script(
        &mut h,
        "fits",
        fine,
        json!({"limits": {"memory": "256Mi", "cpu": "500m"}, "requests": {"memory": "1Mi"}}),
    )
    .await;
    assert_eq!(terminal(&done), Some("Completed"), "{log}");
    assert!(log.starts_with("fits\n"), "{log}");
    assert!(
        log.contains("50000"),
        "cpu 500m is half of a 100000 us period: {log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_container_leaves_nothing_behind() {
    let mut h = harness(&[]);
    let marker = unique_sleep();
    // The main process exits at once; its setsid grandchild would live on
    // without a sandbox.
    let script = format!("setsid sleep {marker} & echo child started");
    let (done, log) = run_script(&mut h, "quick", &script, json!({})).await;
    assert_eq!(terminal(&done), Some("Completed"), "{log}");
    if !h.backend.sandbox().kills_trees() {
        eprintln!("skipped: {}", h.backend.sandbox().describe());
        return;
    }
    tokio::time::timeout(DEADLINE, async {
        while pid_of_sleep(&marker).is_some() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the grandchild dies with its container");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_groups_of_a_killed_spoke_are_cleaned_up_at_the_next_start() {
    // cgroup v1 as on this machine: the memory hierarchy at its usual place.
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let Some(path) = own
        .lines()
        .find_map(|l| l.split_once(":memory:").map(|(_, p)| p.to_owned()))
    else {
        eprintln!("skipped: no cgroup v1 memory hierarchy");
        return;
    };
    let parent = std::path::Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/'));
    // A pid above pid_max: a backend that no longer exists.
    let stale = parent.join("trainhub-4000000000-0");
    if std::fs::create_dir_all(stale.join("pod/c")).is_err() {
        assert!(!running_as_root(), "root, yet no cgroup v1 memory group");
        eprintln!("skipped: cgroups are not writable");
        return;
    }
    let marker = unique_sleep();
    let mut orphan = std::process::Command::new("sleep")
        .arg(&marker)
        .spawn()
        .unwrap();
    std::fs::write(stale.join("pod/c/cgroup.procs"), orphan.id().to_string()).unwrap();
    let h = harness(&[]);
    assert!(h.backend.sandbox().cgroups().is_some());
    let status = tokio::time::timeout(DEADLINE, async {
        loop {
            if let Some(status) = orphan.try_wait().unwrap() {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the orphan is killed");
    use std::os::unix::process::ExitStatusExt as _;
    assert_eq!(status.signal(), Some(9));
    assert!(!stale.exists(), "the stale group is removed");
}

/// A second backend over the same work directory, as a restarted agent
/// makes. The first is killed as SIGKILL kills an agent: its runtime is no
/// longer driven and it is forgotten, not dropped (no clean-up runs).
fn restart(h: &mut Harness) -> Arc<ProcessBackend> {
    if let Some(own) = h.own.as_mut() {
        own.kill();
    }
    h.own = Some(OwnRuntime::new());
    let (tx, reports) = unbounded_channel();
    let backend = ProcessBackend::new(
        ProcessConfig {
            work_dir: h.dir.path().join("work"),
            capacity: [("cpu".to_string(), 1000)].into(),
            path_env: None,
            sandbox: SandboxConfig::default(),
            gpus: Vec::new(),
        },
        tx,
    )
    .unwrap();
    let old = std::mem::replace(&mut h.backend, backend.clone());
    std::mem::forget(old);
    h.reports = reports;
    h.held.clear();
    backend
}

/// A run whose pod starts `sleep MARKER` in its process group and waits;
/// the sleep's pid once it runs.
async fn start_sleeper(h: &mut Harness, run: &str, generation: i64) -> u32 {
    let marker = unique_sleep();
    let mut c = container(
        "c",
        json!([
            "sh",
            "-c",
            format!("sleep {marker} & echo child started; wait")
        ]),
        json!([]),
    );
    c["resources"] = json!({"requests": {"cpu": "1"}});
    let js = jobset(
        "s",
        json!({"replicatedJobs": [rjob("node", 1, json!([c]))]}),
    );
    let mut spec = run_spec(run, "s", vec![js]);
    spec.key.generation = generation;
    let k = spec.key.clone();
    h.start(spec).await.unwrap();
    let running = h
        .wait_for(&k, "a running pod", |r| phases(r) == ["Running"])
        .await;
    let pod = running.pods[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let (pid, _) = child_pid(&h.backend, run, &pod, &marker).await;
    pid
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_backend_kills_the_orphans_and_reports_the_run_lost() {
    use trainhub_spoke::backend::{HeldRun, LOST_SPOKE_RESTARTED};
    let mut h = harness(&[("cpu", 1000)]);
    h.own = Some(OwnRuntime::new());
    let orphan = start_sleeper(&mut h, "orphaned", 1).await;
    assert!(alive(orphan));

    let backend = restart(&mut h);
    gone(orphan).await;
    let lost = vec![HeldRun {
        key: key("orphaned"),
        finished: false,
        lost: Some(LOST_SPOKE_RESTARTED),
    }];
    assert_eq!(backend.runs(), lost);
    assert_eq!(
        backend.capacity()[0].free_milli,
        1000,
        "a lost run holds no capacity"
    );
    // A Start re-sent for the lost run changes nothing.
    let c = container("c", json!(["true"]), json!([]));
    let js = jobset(
        "s",
        json!({"replicatedJobs": [rjob("node", 1, json!([c]))]}),
    );
    h.start(run_spec("orphaned", "s", vec![js])).await.unwrap();
    assert_eq!(backend.runs(), lost, "not started again");
    assert_eq!(backend.report(&key("orphaned")), None);

    // The next placement starts in a fresh directory.
    let second = start_sleeper(&mut h, "orphaned", 2).await;
    assert!(h.dir.path().join("work/team/s-2").is_dir());
    // A second restart finds it too, and still knows the first as lost.
    let backend = restart(&mut h);
    gone(second).await;
    let mut runs = backend.runs();
    runs.sort_by_key(|r| r.key.generation);
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert!(runs.iter().all(|r| r.lost == Some(LOST_SPOKE_RESTARTED)));

    // Stopped by the hub: forgotten, also by the next agent.
    backend.stop("orphaned", 2).await;
    assert!(backend.runs().is_empty());
    let backend = restart(&mut h);
    assert!(backend.runs().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_run_survives_a_restart_with_its_logs() {
    let mut h = harness(&[("cpu", 1000)]);
    let (done, log) = run_script(&mut h, "done", "echo hello from before", json!({})).await;
    assert_eq!(terminal(&done), Some("Completed"), "{log}");
    let pod = done.pods[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let backend = restart(&mut h);
    let runs = backend.runs();
    assert_eq!(runs.len(), 1);
    assert!(runs[0].finished && runs[0].lost.is_none(), "{runs:?}");
    assert_eq!(backend.report(&key("done")).map(|r| r.finished), Some(true));
    let log = read_log(&backend, "done", &pod, None, false, None).await;
    assert_eq!(log, "hello from before\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_kills_the_runs_and_keeps_them_lost_across_a_restart() {
    use trainhub_spoke::backend::LOST_FENCED;
    let mut h = harness(&[("cpu", 1000)]);
    let pid = start_sleeper(&mut h, "fenced", 1).await;
    let fenced = h.backend.fence().await;
    assert_eq!(fenced, vec![key("fenced")]);
    gone(pid).await;
    assert_eq!(h.backend.runs()[0].lost, Some(LOST_FENCED));
    assert_eq!(h.backend.capacity()[0].free_milli, 1000);
    assert!(h.backend.fence().await.is_empty(), "fenced once");
    let backend = restart(&mut h);
    assert_eq!(backend.runs()[0].lost, Some(LOST_FENCED));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_sends_sigterm_then_sigkill_after_the_grace_period() {
    let mut h = harness(&[]);
    let marker = unique_sleep();
    let c = container(
        "c",
        json!([
            "sh",
            "-c",
            format!("trap '' TERM; sleep {marker} & echo child started; wait")
        ]),
        json!([]),
    );
    let mut js = jobset(
        "s",
        json!({"replicatedJobs": [rjob("node", 1, json!([c]))]}),
    );
    js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] =
        json!(1);
    h.backend
        .start(run_spec("stubborn", "s", vec![js]))
        .await
        .unwrap();
    let running = h
        .wait_for(&key("stubborn"), "a running pod", |r| {
            phases(r) == ["Running"]
        })
        .await;
    let pod = running.pods[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let (pid, _) = child_pid(&h.backend, "stubborn", &pod, &marker).await;
    let started = std::time::Instant::now();
    h.backend.stop("stubborn", 1).await;
    let took = started.elapsed();
    gone(pid).await;
    assert!(
        took >= Duration::from_millis(900),
        "SIGTERM is ignored, so the stop waits the grace period: {took:?}"
    );
    assert!(took < Duration::from_secs(10), "then SIGKILL: {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_are_listed_until_started_or_withdrawn() {
    let h = harness(&[("cpu", 2000)]);
    let demand = [PodSetRequest {
        name: "node".into(),
        count: 1,
        requests_milli: [("cpu".to_string(), 1000)].into(),
    }];
    h.backend.admit(&key("r1"), &demand).unwrap();
    h.backend.admit(&key("r2"), &demand).unwrap();
    assert_eq!(h.backend.reservations(), vec![key("r1"), key("r2")]);
    h.backend.withdraw(&key("r1"));
    assert_eq!(h.backend.reservations(), vec![key("r2")]);
}

/// An `nvidia-smi` that answers the GPU query with four A100s, in a
/// directory of its own: that directory is the `PATH` to discover with.
fn fake_nvidia_smi() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt as _;
    let bin = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let script = bin.path().join("nvidia-smi");
    std::fs::write(
        &script,
        "#!/bin/sh\n\
         [ \"$*\" = '--query-gpu=index,uuid,name,memory.total --format=csv,noheader' ] || exit 2\n\
         for i in 0 1 2 3; do echo \"$i, GPU-fake-$i, NVIDIA A100-SXM4-80GB, 81920 MiB\"; done\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

/// A pod that requests `gpus` of `resource`, prints `print` (shell
/// words: its hostname and GPU env), and waits (at most 30 s) for `go` to
/// exist.
fn device_pod(resource: &str, gpus: u32, print: &str, go: &std::path::Path) -> Value {
    let script = format!(
        "echo \"{print}\"\n\
         i=0; while [ ! -e {go} ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done",
        go = go.display()
    );
    let mut c = container("c", json!(["sh", "-c", script]), json!([]));
    if gpus > 0 {
        c["resources"] = json!({"limits": {resource: gpus.to_string()}});
    }
    c
}

/// A pod that requests `gpus` NVIDIA GPUs (see [`device_pod`]).
fn gpu_pod(gpus: u32, go: &std::path::Path) -> Value {
    let print = "host=$HOSTNAME cuda=$CUDA_VISIBLE_DEVICES nvidia=$NVIDIA_VISIBLE_DEVICES";
    device_pod("nvidia.com/gpu", gpus, print, go)
}

/// A backend giving pods `gpus` and declaring `gpus_milli` of
/// `nvidia.com/gpu`, and the file that lets [`gpu_pod`]s end.
fn gpu_harness(gpus: Vec<Gpu>, gpus_milli: i64) -> (Harness, std::path::PathBuf) {
    let capacity = [("cpu", 100_000), ("nvidia.com/gpu", gpus_milli)];
    let h = harness_full(&capacity, |_| SandboxConfig::default(), gpus);
    let go = h.dir.path().join("shared/go");
    (h, go)
}

/// Starts run `name`: `pods` pods of `gpus` GPUs each (see [`gpu_pod`]).
async fn start_gpu_run(h: &Harness, name: &str, pods: u32, gpus: u32, go: &std::path::Path) {
    start_pods(h, name, pods, gpu_pod(gpus, go)).await;
}

/// Starts run `name`: `pods` pods of container `pod`.
async fn start_pods(h: &Harness, name: &str, pods: u32, pod: Value) {
    let js = jobset(
        name,
        json!({"replicatedJobs": [rjob("node", pods, json!([pod]))]}),
    );
    h.start(run_spec(name, name, vec![js])).await.unwrap();
}

/// Runs `two` (two pods of `pod(2)`, two GPUs each) and, once they run,
/// `cpu` (one pod of `pod(0)`, no GPU) beside them; the report of `two`'s
/// running pods, once `cpu`'s runs too and holds no GPU.
async fn two_gpu_pods_and_a_cpu_pod(h: &mut Harness, pod: impl Fn(u32) -> Value) -> RunReport {
    start_pods(h, "two", 2, pod(2)).await;
    let running = h
        .wait_for(&key("two"), "two running pods", |r| {
            phases(r) == ["Running", "Running"]
        })
        .await;
    start_pods(h, "cpu", 1, pod(0)).await;
    let cpu_running = h
        .wait_for(&key("cpu"), "a running pod", |r| phases(r) == ["Running"])
        .await;
    assert!(devices_of(&cpu_running.pods[0]).is_empty());
    running
}

/// Lets the pods of [`two_gpu_pods_and_a_cpu_pod`] end (`go`): each pod of
/// `two`, completed, with its log, and the log of `cpu`'s pod.
async fn their_logs(h: &mut Harness, go: &std::path::Path) -> (Vec<(Value, String)>, String) {
    std::fs::write(go, "").unwrap();
    let done = h
        .wait_for(&key("two"), "a terminal state", |r| r.finished)
        .await;
    assert_eq!(terminal(&done), Some("Completed"));
    let mut logs = Vec::new();
    for pod in done.pods {
        let name = pod["metadata"]["name"].as_str().unwrap().to_owned();
        let log = read_log(&h.backend, "two", &name, None, false, None).await;
        logs.push((pod, log));
    }
    let cpu_done = h
        .wait_for(&key("cpu"), "a terminal state", |r| r.finished)
        .await;
    let name = cpu_done.pods[0]["metadata"]["name"].as_str().unwrap();
    let cpu_log = read_log(&h.backend, "cpu", name, None, false, None).await;
    (logs, cpu_log)
}

fn devices_of(pod: &Value) -> Vec<String> {
    pod["metadata"]["annotations"][DEVICES_ANNOTATION]
        .as_str()
        .map(|d| d.split(',').map(str::to_owned).collect())
        .unwrap_or_default()
}

/// Discovery through a fake `nvidia-smi` on PATH, then runs that hold all
/// four GPUs, a CPU-only pod beside them, and a run that gets the GPUs
/// once they are freed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpus_from_a_fake_nvidia_smi_are_handed_to_pods_one_holder_each() {
    let bin = fake_nvidia_smi();
    let found = devices::discover(Some(bin.path().as_os_str()), &bin.path().join("no-sys"));
    assert_eq!(found.capacity.get("nvidia.com/gpu"), Some(&4000));
    assert!(found.capacity.get("cpu").is_some_and(|c| *c >= 1000));
    assert!(found.capacity.contains_key("memory"));
    assert!(!found.capacity.contains_key("amd.com/gpu"));
    assert_eq!(
        found.labels,
        BTreeMap::from([(
            "nvidia.com/gpu.product".to_owned(),
            "NVIDIA-A100-SXM4-80GB".to_owned()
        )])
    );
    assert_eq!(found.gpus.len(), 4);

    let (mut h, go) = gpu_harness(found.gpus, 4000);
    let running = two_gpu_pods_and_a_cpu_pod(&mut h, |n| gpu_pod(n, &go)).await;
    let mut held: Vec<String> = running.pods.iter().flat_map(devices_of).collect();
    held.sort();
    assert_eq!(
        held,
        ["GPU-fake-0", "GPU-fake-1", "GPU-fake-2", "GPU-fake-3"],
        "two pods of two GPUs each, none shared"
    );

    let (logs, cpu_log) = their_logs(&mut h, &go).await;
    for (pod, log) in &logs {
        let host = pod["spec"]["hostname"].as_str().unwrap();
        let devices = devices_of(pod).join(",");
        assert_eq!(
            log.trim(),
            format!("host={host} cuda={devices} nvidia={devices}"),
            "{pod:#}"
        );
    }
    assert_eq!(cpu_log.trim(), "host=cpu-node-0-0 cuda= nvidia=void");

    start_gpu_run(&h, "all", 1, 4, &go).await;
    let all_done = h
        .wait_for(&key("all"), "a terminal state", |r| r.finished)
        .await;
    assert_eq!(terminal(&all_done), Some("Completed"));
    assert_eq!(
        devices_of(&all_done.pods[0]).len(),
        4,
        "freed devices are given again"
    );
}

/// The run records of the backend, as JSON.
fn records(h: &Harness) -> Vec<Value> {
    let dir = h.dir.path().join("work/.runs");
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| serde_json::from_slice(&std::fs::read(e.unwrap().path()).unwrap()).unwrap())
        .collect()
}

/// More GPUs declared than found: a second run is admitted, but its pod
/// waits, unscheduled, until the first run's pod frees the GPUs. While a pod
/// holds GPUs its run's record says which.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_waits_for_gpus_another_pod_holds() {
    let bin = fake_nvidia_smi();
    let found = devices::discover(Some(bin.path().as_os_str()), &bin.path().join("no-sys"));
    let (mut h, go) = gpu_harness(found.gpus, 8000);
    start_gpu_run(&h, "first", 1, 4, &go).await;
    let running = h
        .wait_for(&key("first"), "a running pod", |r| phases(r) == ["Running"])
        .await;
    let held = devices_of(&running.pods[0]);
    assert_eq!(held.len(), 4);
    let uid = running.pods[0]["metadata"]["uid"].as_str().unwrap();
    let recorded: Vec<Value> = records(&h)
        .into_iter()
        .filter_map(|r| r["devices"].get(uid).cloned())
        .collect();
    assert_eq!(recorded, [json!(held)], "the record holds the assignment");

    start_gpu_run(&h, "second", 1, 4, &go).await;
    let waiting = h
        .wait_for(&key("second"), "a pending pod", |r| {
            phases(r) == ["Pending"]
        })
        .await;
    assert_eq!(
        waiting.pods[0]["status"]["conditions"][0],
        json!({"type": "PodScheduled", "status": "False"})
    );
    assert!(devices_of(&waiting.pods[0]).is_empty());

    std::fs::write(&go, "").unwrap();
    let done = h
        .wait_for(&key("second"), "a terminal state", |r| r.finished)
        .await;
    assert_eq!(terminal(&done), Some("Completed"));
    let mut got = devices_of(&done.pods[0]);
    got.sort();
    assert_eq!(got, held, "the freed GPUs, once the first pod ended");
    let first = records(&h)
        .into_iter()
        .find(|r| r["run_id"] == "first")
        .unwrap();
    assert_eq!(first["devices"], json!({}), "freed GPUs leave the record");
}

/// A sysfs with the KFD topology of a machine of four AMD GPUs (nodes 2,
/// 3, 10 and 11 after CPU nodes 0 and 1; node 11 without a unique id, node
/// 10 with its `product_name` in sysfs) and a `rocm-smi` that answers the
/// product query for them, in a directory of its own (the `PATH`):
/// `(sys, bin)`.
fn fake_amd_machine() -> (tempfile::TempDir, tempfile::TempDir) {
    use std::os::unix::fs::PermissionsExt as _;
    let sys = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let nodes = sys.path().join("class/kfd/kfd/topology/nodes");
    let gpus = [(2, 0x1001_u64), (3, 0x1002), (10, 0x1003), (11, 0)];
    for cpu in [0, 1] {
        let dir = nodes.join(cpu.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("properties"), "cpu_cores_count 64\nsimd_count 0\n").unwrap();
        std::fs::write(dir.join("gpu_id"), "0\n").unwrap();
    }
    for (node, uid) in gpus {
        let dir = nodes.join(node.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        let unique = if uid == 0 {
            String::new()
        } else {
            format!("unique_id {uid}\n")
        };
        let properties = format!(
            "simd_count 1216\nvendor_id 4098\ndrm_render_minor {}\n{unique}",
            126 + node
        );
        std::fs::write(dir.join("properties"), properties).unwrap();
        std::fs::write(dir.join("gpu_id"), format!("{}\n", 1000 + node)).unwrap();
    }
    let device = sys.path().join("class/drm/renderD136/device");
    std::fs::create_dir_all(&device).unwrap();
    std::fs::write(device.join("product_name"), "AMD Instinct MI300X\n").unwrap();

    let bin = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let script = bin.path().join("rocm-smi");
    std::fs::write(
        &script,
        "#!/bin/sh\n\
         [ \"$*\" = '--showuniqueid --showproductname --json' ] || exit 2\n\
         echo 'WARNING: a line rocm-smi prints before its JSON'\n\
         echo '{\"card0\": {\"Unique ID\": \"0x1001\", \"Card Series\": \"AMD Instinct MI300X\"}, \
         \"card1\": {\"Unique ID\": \"0x1002\", \"Card Series\": \"AMD Instinct MI300X\"}, \
         \"card2\": {\"Unique ID\": \"0x1003\", \"Card Series\": \"AMD Instinct MI300X\"}, \
         \"card3\": {\"Unique ID\": \"N/A\", \"Card Series\": \"AMD Instinct MI300X\"}}'\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    (sys, bin)
}

/// A pod that requests `gpus` AMD GPUs and prints its ROCm env (and
/// whether CUDA's is set at all); see [`device_pod`].
fn amd_pod(gpus: u32, go: &std::path::Path) -> Value {
    let print =
        "rocr=$ROCR_VISIBLE_DEVICES hip=$HIP_VISIBLE_DEVICES cuda=${CUDA_VISIBLE_DEVICES-unset}";
    device_pod("amd.com/gpu", gpus, print, go)
}

/// Discovery through a fake sysfs and a fake `rocm-smi` on PATH, then two
/// pods of two AMD GPUs each and a CPU-only pod beside them; while a pod
/// holds GPUs its run's record says which.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amd_gpus_from_sysfs_and_rocm_smi_are_handed_to_pods_one_holder_each() {
    let (sys, bin) = fake_amd_machine();
    let found = devices::discover(Some(bin.path().as_os_str()), sys.path());
    assert_eq!(found.capacity.get("amd.com/gpu"), Some(&4000));
    assert!(!found.capacity.contains_key("nvidia.com/gpu"));
    assert_eq!(
        found.labels,
        BTreeMap::from([(
            "amd.com/gpu.product-name".to_owned(),
            "AMD_Instinct_MI300X".to_owned()
        )]),
        "AMD's node labeller's label and spelling"
    );
    let ids: Vec<&str> = found.gpus.iter().map(|g| g.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "GPU-0000000000001001",
            "GPU-0000000000001002",
            "GPU-0000000000001003",
            "3"
        ],
        "in node order (10 after 3); without a unique id, by ROCr index"
    );

    let capacity = [("cpu", 100_000), ("amd.com/gpu", 4000)];
    let mut h = harness_full(&capacity, |_| SandboxConfig::default(), found.gpus);
    let go = h.dir.path().join("shared/go");
    let running = two_gpu_pods_and_a_cpu_pod(&mut h, |n| amd_pod(n, &go)).await;
    let mut held: Vec<String> = running.pods.iter().flat_map(devices_of).collect();
    held.sort();
    assert_eq!(
        held,
        [
            "3",
            "GPU-0000000000001001",
            "GPU-0000000000001002",
            "GPU-0000000000001003"
        ],
        "two pods of two GPUs each, none shared"
    );
    let mut recorded: Vec<Value> = records(&h)
        .into_iter()
        .flat_map(|r| r["devices"].as_object().cloned().unwrap_or_default())
        .map(|(_, devices)| devices)
        .collect();
    recorded.sort_by_key(|d| d.to_string());
    let mut expected: Vec<Value> = running.pods.iter().map(|p| json!(devices_of(p))).collect();
    expected.sort_by_key(|d| d.to_string());
    assert_eq!(recorded, expected, "the record holds the assignments");

    let (logs, cpu_log) = their_logs(&mut h, &go).await;
    for (pod, log) in &logs {
        let devices = devices_of(pod).join(",");
        assert_eq!(
            log.trim(),
            format!("rocr={devices} hip=0,1 cuda=unset"),
            "ROCr by id, HIP by index into what ROCr shows: {pod:#}"
        );
    }
    assert_eq!(cpu_log.trim(), "rocr= hip= cuda=unset", "none visible");
    let two = records(&h)
        .into_iter()
        .find(|r| r["run_id"] == "two")
        .unwrap();
    assert_eq!(two["devices"], json!({}), "freed GPUs leave the record");
}
