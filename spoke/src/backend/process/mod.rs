//! The process backend, the embedded default: every pod of the built
//! JobSet runs as local processes, with JobSet semantics where they matter.
//!
//! - Each container is a process (its command and args; the image is
//!   ignored, and a container without a command cannot run). Init
//!   containers run one after another, then the containers together.
//! - Environment: PATH (the spoke's, or as configured), HOME (the pod's
//!   directory), `JOB_COMPLETION_INDEX` and `HOSTNAME` as the Job
//!   controller and kubelet set them, the container's env with fieldRefs
//!   (`metadata.name`, `metadata.namespace`, labels, annotations such as the
//!   completion index, `status.podIP`) and ConfigMap/Secret key refs to the
//!   run's own objects resolved, and the run's extra env (`TRACEPARENT`).
//! - Endpoints on one machine: every pod DNS name of the run
//!   (`<jobset>-<rjob>-<job>-<index>.<subdomain>`, also with
//!   `.<namespace>[.svc[.cluster.local]]`) is rewritten to `127.0.0.1` in env
//!   values and args, and every declared containerPort gets a free local
//!   port for the run: an env value or arg equal to the port number, or
//!   `127.0.0.1:<port>`, takes the run's port. So torch's
//!   PET_MASTER_ADDR/PORT and the python plugin's MASTER_ADDR/PORT reach
//!   rank 0 of the same run, and two runs never collide. File paths (volume
//!   mountPaths, the MPI hostfile) are not remapped.
//! - Working directory per pod: `<work_dir>/<namespace>/<jobset>-<generation>/<pod>/`,
//!   with one log per container (`<container>.log`, stdout and stderr).
//! - JobSet: `dependsOn` (Ready | Complete), `successPolicy` (All | Any over
//!   target replicated jobs), `failurePolicy.maxRestarts` (a failed Job
//!   restarts every pod, under new names, until restarts are exhausted).
//! - Gang admission against the declared capacity: all pods fit or none.

pub mod plan;

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rand::Rng;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

pub use self::plan::parse_quantity_milli;
use self::plan::{Outcome, Phase, PodPlan, RunPlan};
use super::{
    Backend, BackendError, BoxFuture, Capacity, HeldRun, LogStream, PodSetRequest, RunKey,
    RunReport, RunSpec,
};

/// How the process backend runs.
#[derive(Debug, Clone)]
pub struct ProcessConfig {
    pub work_dir: PathBuf,
    /// Resource → allocatable milli-units.
    pub capacity: BTreeMap<String, i64>,
    /// PATH for the processes (default: the spoke's).
    pub path_env: Option<OsString>,
}

struct PodHandle {
    dir: PathBuf,
    containers: Vec<String>,
    finished: Arc<AtomicBool>,
}

struct Run {
    report: Option<RunReport>,
    finished: bool,
    pods: HashMap<String, PodHandle>,
    pgids: Arc<Mutex<Vec<u32>>>,
    supervisor: Option<JoinHandle<()>>,
    dir: PathBuf,
}

#[derive(Default)]
struct State {
    reserved: HashMap<RunKey, BTreeMap<String, i64>>,
    runs: HashMap<RunKey, Run>,
}

/// See the module documentation.
pub struct ProcessBackend {
    config: ProcessConfig,
    reports: mpsc::UnboundedSender<RunReport>,
    state: Mutex<State>,
    images_noted: AtomicBool,
    me: std::sync::Weak<ProcessBackend>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn suffix() -> String {
    let mut rng = rand::rng();
    (0..5)
        .map(|_| {
            let c = rng.random_range(0..36u8);
            char::from(if c < 10 { b'0' + c } else { b'a' + c - 10 })
        })
        .collect()
}

/// Kills a process group and everything in it.
fn kill_group(pgid: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
}

impl ProcessBackend {
    pub fn new(
        config: ProcessConfig,
        reports: mpsc::UnboundedSender<RunReport>,
    ) -> std::io::Result<Arc<Self>> {
        std::fs::create_dir_all(&config.work_dir)?;
        Ok(Arc::new_cyclic(|me| ProcessBackend {
            config,
            reports,
            state: Mutex::new(State::default()),
            images_noted: AtomicBool::new(false),
            me: me.clone(),
        }))
    }

    fn free(&self, state: &State) -> BTreeMap<String, i64> {
        let mut free = self.config.capacity.clone();
        for reserved in state.reserved.values() {
            for (r, m) in reserved {
                *free.entry(r.clone()).or_default() -= m;
            }
        }
        free
    }

    fn fits(&self, state: &State, demand: &BTreeMap<String, i64>) -> Result<(), BackendError> {
        let free = self.free(state);
        for (r, m) in demand {
            if *m <= 0 {
                continue;
            }
            if !self.config.capacity.contains_key(r) {
                return Err(BackendError::DoesNotFit(format!(
                    "{r} is requested but this spoke declares none"
                )));
            }
            let f = free.get(r).copied().unwrap_or(0);
            if *m > f {
                return Err(BackendError::DoesNotFit(format!(
                    "{r}: {m}m requested, {f}m free"
                )));
            }
        }
        Ok(())
    }

    fn emit(&self, key: &RunKey, report: RunReport) {
        {
            let mut state = lock(&self.state);
            let Some(run) = state.runs.get_mut(key) else {
                return;
            };
            run.finished = report.finished;
            run.report = Some(report.clone());
            if report.finished {
                state.reserved.remove(key);
            }
        }
        let _ = self.reports.send(report);
    }

    fn release_run(&self, run: Run) {
        for pod in run.pods.values() {
            pod.finished.store(true, Ordering::Release);
        }
        if let Some(s) = run.supervisor {
            s.abort();
        }
        for pgid in lock(&run.pgids).drain(..) {
            kill_group(pgid);
        }
        let _ = std::fs::remove_dir_all(&run.dir);
    }
}

impl Drop for ProcessBackend {
    fn drop(&mut self) {
        let runs: Vec<Run> = lock(&self.state).runs.drain().map(|(_, r)| r).collect();
        for run in runs {
            if let Some(s) = run.supervisor {
                s.abort();
            }
            for pgid in lock(&run.pgids).drain(..) {
                kill_group(pgid);
            }
        }
    }
}

/// What a pod's task tells the supervisor.
enum PodEvent {
    Running,
    Exited { code: i32, message: String },
}

struct PodState {
    plan_idx: (usize, usize),
    name: String,
    uid: String,
    created: String,
    phase: Phase,
    started: Option<String>,
    finished_at: Option<String>,
    exit: Option<(i32, String)>,
    finished: Arc<AtomicBool>,
}

impl PodState {
    fn to_pod(&self, plan: &PodPlan, namespace: &str) -> Value {
        let state = match (self.phase, &self.exit) {
            (_, Some((code, message))) => json!({"terminated": {
                "exitCode": code,
                "reason": if *code == 0 { "Completed" } else { "Error" },
                "message": message,
                "startedAt": self.started,
                "finishedAt": self.finished_at,
            }}),
            (Phase::Running, None) => json!({"running": {"startedAt": self.started}}),
            _ => json!({"waiting": {"reason": "PodInitializing"}}),
        };
        let image = |name: &str| {
            plan.spec["containers"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["name"] == name)
                .and_then(|c| c["image"].as_str())
                .unwrap_or_default()
                .to_string()
        };
        // Kubernetes clients require image and imageID on every status.
        let statuses: Vec<Value> = plan
            .containers
            .iter()
            .map(|c| {
                json!({
                    "name": c.name,
                    "image": image(&c.name),
                    "imageID": "",
                    "ready": self.phase == Phase::Running,
                    "restartCount": 0,
                    "started": self.phase == Phase::Running,
                    "state": state,
                })
            })
            .collect();
        let mut status = json!({
            "phase": self.phase.as_str(),
            "podIP": "127.0.0.1",
            "hostIP": "127.0.0.1",
            "containerStatuses": statuses,
        });
        if let Some(t) = &self.started {
            status["startTime"] = t.clone().into();
        }
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": self.name,
                "namespace": namespace,
                "uid": self.uid,
                "creationTimestamp": self.created,
                "labels": plan.labels,
                "annotations": plan.annotations,
            },
            "spec": plan.spec,
            "status": status,
        })
    }
}

/// Runs one pod: init containers in turn, then the containers together.
async fn run_pod(
    plan: PodPlan,
    dir: PathBuf,
    path: OsString,
    pgids: Arc<Mutex<Vec<u32>>>,
    events: mpsc::UnboundedSender<PodEvent>,
) {
    for c in &plan.init_containers {
        let (code, message) = run_container(c, &dir, &path, &pgids).await;
        if code != 0 {
            let _ = events.send(PodEvent::Exited {
                code,
                message: format!("init container {}: {message}", c.name),
            });
            return;
        }
    }
    let _ = events.send(PodEvent::Running);
    let runs = plan
        .containers
        .iter()
        .map(|c| run_container(c, &dir, &path, &pgids));
    let results = futures_util::future::join_all(runs).await;
    let (code, message) = results
        .into_iter()
        .find(|(code, _)| *code != 0)
        .unwrap_or((0, String::new()));
    let _ = events.send(PodEvent::Exited { code, message });
}

/// Runs one container to its end: (exit code, message).
async fn run_container(
    c: &plan::ContainerPlan,
    dir: &Path,
    path: &OsString,
    pgids: &Mutex<Vec<u32>>,
) -> (i32, String) {
    let log = dir.join(format!("{}.log", c.name));
    let open = || {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
    };
    let (Ok(out), Ok(err)) = (open(), open()) else {
        return (1, format!("cannot open {}", log.display()));
    };
    let Some((program, args)) = c.argv.split_first() else {
        return (1, "no command".into());
    };
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .env_clear()
        .env("PATH", path)
        .env("HOME", dir)
        .envs(c.env.iter().map(|(k, v)| (k, v)))
        .current_dir(dir)
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .kill_on_drop(true);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            let message = format!("cannot start {program:?}: {e}");
            let _ = std::fs::write(&log, format!("{message}\n"));
            return (127, message);
        }
    };
    if let Some(pid) = child.id() {
        lock(pgids).push(pid);
    }
    match child.wait().await {
        Ok(status) => match status.code() {
            Some(code) => (
                code,
                if code == 0 {
                    String::new()
                } else {
                    format!("exit code {code}")
                },
            ),
            None => {
                use std::os::unix::process::ExitStatusExt;
                let signal = status.signal().unwrap_or(9);
                (128 + signal, format!("killed by signal {signal}"))
            }
        },
        Err(e) => (1, format!("waiting for the process: {e}")),
    }
}

/// Drives one run: creates its pods in dependency order, follows them,
/// restarts on failure while allowed, and reports every change.
async fn supervise(
    backend: Arc<ProcessBackend>,
    key: RunKey,
    spec: RunSpec,
    plan: RunPlan,
    run_dir: PathBuf,
    pgids: Arc<Mutex<Vec<u32>>>,
) {
    let path = backend
        .config
        .path_env
        .clone()
        .or_else(|| std::env::var_os("PATH"))
        .unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    let mut restarts: i64 = 0;
    loop {
        let attempt = suffix();
        let mut pods: Vec<PodState> = Vec::new();
        let mut handles = HashMap::new();
        for (r, rjob) in plan.replicated_jobs.iter().enumerate() {
            for (p, pod) in rjob.pods.iter().enumerate() {
                let name = format!("{}-{attempt}", pod.base_name);
                let finished = Arc::new(AtomicBool::new(false));
                let dir = run_dir.join(&name);
                let _ = std::fs::create_dir_all(&dir);
                handles.insert(
                    name.clone(),
                    PodHandle {
                        dir,
                        containers: pod.containers.iter().map(|c| c.name.clone()).collect(),
                        finished: finished.clone(),
                    },
                );
                pods.push(PodState {
                    plan_idx: (r, p),
                    name,
                    uid: format!("{}-{}-{}", key.run_id, attempt, pods.len()),
                    created: now(),
                    phase: Phase::Pending,
                    started: None,
                    finished_at: None,
                    exit: None,
                    finished,
                });
            }
        }
        if let Some(run) = lock(&backend.state).runs.get_mut(&key) {
            run.pods = handles;
        }
        let (tx, mut rx) = mpsc::unbounded_channel::<(usize, PodEvent)>();
        let mut started = vec![false; plan.replicated_jobs.len()];
        let mut tasks: Vec<JoinHandle<()>> = Vec::new();
        let outcome = loop {
            let phases = phases_by_rjob(&plan, &pods);
            // Start what may start.
            for (r, rjob) in plan.replicated_jobs.iter().enumerate() {
                if started[r]
                    || !rjob.depends_on.iter().all(|(dep, status)| {
                        phases.get(dep).is_some_and(|p| plan::reached(p, status))
                    })
                {
                    continue;
                }
                started[r] = true;
                for (i, pod) in pods
                    .iter_mut()
                    .enumerate()
                    .filter(|(_, p)| p.plan_idx.0 == r)
                {
                    let pod_plan = rjob.pods[pod.plan_idx.1].clone();
                    if let Some(error) = &pod_plan.error {
                        pod.phase = Phase::Failed;
                        pod.exit = Some((1, error.clone()));
                        pod.finished_at = Some(now());
                        pod.finished.store(true, Ordering::Release);
                        continue;
                    }
                    let (ptx, mut prx) = mpsc::unbounded_channel();
                    let tx = tx.clone();
                    tasks.push(tokio::spawn(async move {
                        while let Some(e) = prx.recv().await {
                            let _ = tx.send((i, e));
                        }
                    }));
                    tasks.push(tokio::spawn(run_pod(
                        pod_plan,
                        run_dir.join(&pod.name),
                        path.clone(),
                        pgids.clone(),
                        ptx,
                    )));
                }
            }
            let phases = phases_by_rjob(&plan, &pods);
            let outcome = plan::outcome(&plan, &phases);
            if outcome != Outcome::Running {
                break outcome;
            }
            backend.emit(&key, report(&key, &spec, &plan, &pods, restarts, None));
            let Some((i, event)) = rx.recv().await else {
                break Outcome::JobFailed("(lost)".into());
            };
            let pod = &mut pods[i];
            match event {
                PodEvent::Running => {
                    pod.phase = Phase::Running;
                    pod.started = Some(now());
                }
                PodEvent::Exited { code, message } => {
                    pod.phase = if code == 0 {
                        Phase::Succeeded
                    } else {
                        Phase::Failed
                    };
                    pod.started.get_or_insert_with(now);
                    pod.finished_at = Some(now());
                    pod.exit = Some((code, message));
                    pod.finished.store(true, Ordering::Release);
                }
            }
        };
        let failed = matches!(outcome, Outcome::JobFailed(_));
        if failed && restarts < plan.max_restarts {
            for pgid in lock(&pgids).drain(..) {
                kill_group(pgid);
            }
            for t in tasks {
                t.abort();
            }
            restarts += 1;
            tracing::info!(run = %key.run_id, restarts, "a job failed: restarting the JobSet");
            continue;
        }
        // Pods still running when the JobSet ends are stopped.
        for pgid in lock(&pgids).drain(..) {
            kill_group(pgid);
        }
        for pod in &pods {
            pod.finished.store(true, Ordering::Release);
        }
        let at = now();
        backend.emit(
            &key,
            report(&key, &spec, &plan, &pods, restarts, Some((&outcome, &at))),
        );
        return;
    }
}

fn phases_by_rjob(plan: &RunPlan, pods: &[PodState]) -> BTreeMap<String, Vec<Phase>> {
    let mut phases: BTreeMap<String, Vec<Phase>> = BTreeMap::new();
    for pod in pods {
        phases
            .entry(plan.replicated_jobs[pod.plan_idx.0].name.clone())
            .or_default()
            .push(pod.phase);
    }
    phases
}

fn report(
    key: &RunKey,
    spec: &RunSpec,
    plan: &RunPlan,
    pods: &[PodState],
    restarts: i64,
    terminal: Option<(&Outcome, &str)>,
) -> RunReport {
    let mut by_job: BTreeMap<String, Vec<(i64, Phase)>> = BTreeMap::new();
    let mut objects = Vec::new();
    for pod in pods {
        let rjob = &plan.replicated_jobs[pod.plan_idx.0];
        let pod_plan = &rjob.pods[pod.plan_idx.1];
        by_job
            .entry(rjob.name.clone())
            .or_default()
            .push((pod_plan.job_index, pod.phase));
        objects.push(pod.to_pod(pod_plan, &spec.namespace));
    }
    RunReport {
        key: key.clone(),
        jobset_status: plan::jobset_status(&by_job, restarts, terminal),
        pods: objects,
        finished: terminal.is_some(),
    }
}

/// Free local ports for the declared container ports.
fn local_ports(jobset: &Value) -> Result<BTreeMap<i64, u16>, BackendError> {
    let mut ports = BTreeMap::new();
    let mut held = Vec::new();
    for port in plan::declared_ports(jobset) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")
            .map_err(|e| BackendError::Internal(format!("no free local port: {e}")))?;
        let local = listener
            .local_addr()
            .map_err(|e| BackendError::Internal(e.to_string()))?
            .port();
        ports.insert(port, local);
        held.push(listener);
    }
    Ok(ports)
}

impl Backend for ProcessBackend {
    fn kind(&self) -> &'static str {
        "process"
    }

    fn capacity(&self) -> Vec<Capacity> {
        let state = lock(&self.state);
        let free = self.free(&state);
        self.config
            .capacity
            .iter()
            .map(|(r, a)| Capacity {
                resource: r.clone(),
                allocatable_milli: *a,
                free_milli: free.get(r).copied().unwrap_or(0),
            })
            .collect()
    }

    fn admit(&self, key: &RunKey, pod_sets: &[PodSetRequest]) -> Result<(), BackendError> {
        let mut state = lock(&self.state);
        if state.reserved.contains_key(key) || state.runs.contains_key(key) {
            return Ok(());
        }
        let mut demand: BTreeMap<String, i64> = BTreeMap::new();
        for set in pod_sets {
            for (r, m) in &set.requests_milli {
                *demand.entry(r.clone()).or_default() += m.saturating_mul(i64::from(set.count));
            }
        }
        self.fits(&state, &demand)?;
        state.reserved.insert(key.clone(), demand);
        Ok(())
    }

    fn withdraw(&self, key: &RunKey) {
        let mut state = lock(&self.state);
        if !state.runs.contains_key(key) {
            state.reserved.remove(key);
        }
    }

    fn start(&self, spec: RunSpec) -> BoxFuture<'_, Result<(), BackendError>> {
        Box::pin(async move {
            let key = spec.key.clone();
            let Some(jobset) = spec.objects.first() else {
                return Err(BackendError::Invalid("no objects to run".into()));
            };
            if jobset["kind"] != "JobSet" {
                return Err(BackendError::Invalid(format!(
                    "objects[0] is a {}, not a JobSet",
                    jobset["kind"].as_str().unwrap_or("document without kind")
                )));
            }
            let ports = local_ports(jobset)?;
            let plan = plan::plan(
                &spec.namespace,
                jobset,
                &spec.objects,
                &spec.extra_env,
                &ports,
            )
            .map_err(BackendError::Invalid)?;
            if !self.images_noted.swap(true, Ordering::Relaxed) {
                tracing::info!(
                    "the process backend ignores container images: it runs each container's command on this machine"
                );
            }
            let run_dir = self
                .config
                .work_dir
                .join(&spec.namespace)
                .join(format!("{}-{}", spec.name, key.generation));
            let pgids = Arc::new(Mutex::new(Vec::new()));
            {
                let mut state = lock(&self.state);
                if state.runs.contains_key(&key) {
                    return Ok(());
                }
                if !state.reserved.contains_key(&key) {
                    self.fits(&state, &plan.demand)?;
                    state.reserved.insert(key.clone(), plan.demand.clone());
                }
                state.runs.insert(
                    key.clone(),
                    Run {
                        report: None,
                        finished: false,
                        pods: HashMap::new(),
                        pgids: pgids.clone(),
                        supervisor: None,
                        dir: run_dir.clone(),
                    },
                );
            }
            // ConfigMaps and Secrets of the run, as files.
            for o in spec.objects.iter().skip(1) {
                let kind = o["kind"].as_str().unwrap_or_default();
                if kind == "ConfigMap" || kind == "Secret" {
                    let name = o["metadata"]["name"].as_str().unwrap_or("unnamed");
                    let dir = run_dir.join("volumes").join(name);
                    let _ = std::fs::create_dir_all(&dir);
                    for (k, v) in o["data"].as_object().into_iter().flatten() {
                        if let Some(v) = v.as_str()
                            && !k.contains('/')
                        {
                            let _ = std::fs::write(dir.join(k), v);
                        }
                    }
                }
            }
            let Some(me) = self.me.upgrade() else {
                return Ok(());
            };
            let task = tokio::spawn(supervise(me, key.clone(), spec, plan, run_dir, pgids));
            if let Some(run) = lock(&self.state).runs.get_mut(&key) {
                run.supervisor = Some(task);
            }
            Ok(())
        })
    }

    fn stop(&self, run_id: &str, generation: i64) -> BoxFuture<'_, ()> {
        let run_id = run_id.to_string();
        Box::pin(async move {
            let runs: Vec<Run> = {
                let mut state = lock(&self.state);
                state
                    .reserved
                    .retain(|k, _| !(k.run_id == run_id && k.generation <= generation));
                let keys: Vec<RunKey> = state
                    .runs
                    .keys()
                    .filter(|k| k.run_id == run_id && k.generation <= generation)
                    .cloned()
                    .collect();
                keys.iter().filter_map(|k| state.runs.remove(k)).collect()
            };
            for run in runs {
                self.release_run(run);
            }
        })
    }

    fn runs(&self) -> Vec<HeldRun> {
        let state = lock(&self.state);
        let mut held: Vec<HeldRun> = state
            .runs
            .iter()
            .map(|(k, r)| HeldRun {
                key: k.clone(),
                finished: r.finished,
            })
            .collect();
        held.extend(
            state
                .reserved
                .keys()
                .filter(|k| !state.runs.contains_key(*k))
                .map(|k| HeldRun {
                    key: k.clone(),
                    finished: false,
                }),
        );
        held
    }

    fn report(&self, key: &RunKey) -> Option<RunReport> {
        lock(&self.state)
            .runs
            .get(key)
            .and_then(|r| r.report.clone())
    }

    fn logs(
        &self,
        run_id: &str,
        pod: &str,
        container: Option<&str>,
        follow: bool,
        tail_lines: Option<i64>,
    ) -> BoxFuture<'_, Result<LogStream, BackendError>> {
        let found = {
            let state = lock(&self.state);
            state
                .runs
                .iter()
                .filter(|(k, _)| k.run_id == run_id)
                .find_map(|(_, r)| r.pods.get(pod))
                .map(|p| {
                    let container = container
                        .map(String::from)
                        .or_else(|| p.containers.first().cloned())
                        .unwrap_or_default();
                    let known = p.containers.contains(&container);
                    (
                        p.dir.join(format!("{container}.log")),
                        p.finished.clone(),
                        known,
                        container,
                    )
                })
        };
        let pod = pod.to_string();
        Box::pin(async move {
            let Some((path, finished, known, container)) = found else {
                return Err(BackendError::NotFound(format!("pod {pod}")));
            };
            if !known {
                return Err(BackendError::NotFound(format!(
                    "container {container} in pod {pod}"
                )));
            }
            let text = tokio::fs::read(&path).await.unwrap_or_default();
            let start = match tail_lines {
                Some(n) if n >= 0 => tail_offset(&text, usize::try_from(n).unwrap_or(usize::MAX)),
                _ => 0,
            };
            let first = bytes::Bytes::copy_from_slice(&text[start..]);
            let offset = text.len() as u64;
            if !follow {
                let stream = futures_util::stream::iter([Ok(first)]);
                return Ok(Box::pin(stream) as LogStream);
            }
            let stream = futures_util::stream::unfold(
                (Some(first), offset, path, finished, false),
                |(first, offset, path, finished, done)| async move {
                    if let Some(first) = first {
                        return Some((Ok(first), (None, offset, path, finished, false)));
                    }
                    if done {
                        return None;
                    }
                    loop {
                        let ended = finished.load(Ordering::Acquire);
                        let data = read_from(&path, offset).await;
                        if !data.is_empty() {
                            let next = offset + data.len() as u64;
                            return Some((
                                Ok(bytes::Bytes::from(data)),
                                (None, next, path, finished, false),
                            ));
                        }
                        if ended {
                            return None;
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
            );
            Ok(Box::pin(stream) as LogStream)
        })
    }
}

async fn read_from(path: &Path, offset: u64) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncSeekExt};
    let Ok(mut file) = tokio::fs::File::open(path).await else {
        return Vec::new();
    };
    if file.seek(std::io::SeekFrom::Start(offset)).await.is_err() {
        return Vec::new();
    }
    let mut data = Vec::new();
    let _ = file.read_to_end(&mut data).await;
    data
}

/// The byte offset where the last `n` lines of `text` begin.
fn tail_offset(text: &[u8], n: usize) -> usize {
    if n == 0 {
        return text.len();
    }
    let body = text.strip_suffix(b"\n").unwrap_or(text);
    let mut seen = 0;
    for (i, b) in body.iter().enumerate().rev() {
        if *b == b'\n' {
            seen += 1;
            if seen == n {
                return i + 1;
            }
        }
    }
    0
}

#[cfg(test)]
mod tests;
