//! The process backend, the embedded default: every pod of the built JobSet
//! runs as local processes on this machine, with the JobSet, Job and kubelet
//! semantics a training job relies on.
//!
//! # What runs
//!
//! The first object of a run is a `jobset.x-k8s.io/v1alpha2` JobSet; each
//! replicated job makes `replicas` Jobs of `completions` Indexed pods (at most
//! `parallelism` of them running at once). A pod runs its init containers one
//! after another, then its containers together, each as `command` + `args`
//! (`$(VAR)` references expanded as Kubernetes does). Images are ignored (said
//! once in the log); a container without a `command` cannot run and its pod
//! fails saying so. Sidecar init containers (`restartPolicy: Always`) are not
//! supported. `restartPolicy: OnFailure` acts like `Never`: a failed pod is
//! replaced, counting towards the Job's `backoffLimit` (default 6).
//!
//! Each process gets `PATH` ([`ProcessConfig::path_env`] or the agent's),
//! `HOME`, the run's extra env (`TRACEPARENT`, `OTEL_*`) unless the container
//! sets the name, the container's `envFrom` and `env` with `valueFrom`
//! resolved (`fieldRef`: `metadata.name|namespace|uid`,
//! `metadata.labels['k']`, `metadata.annotations['k']`, `spec.nodeName`,
//! `spec.serviceAccountName`, `status.podIP`/`hostIP` = 127.0.0.1;
//! `configMapKeyRef`/`secretKeyRef` to the run's own ConfigMaps and Secrets;
//! `resourceFieldRef` to the container's own limits and requests, an unset
//! limit reading the spoke's capacity as kubelet reads the node's),
//! and `JOB_COMPLETION_INDEX`. A source that is missing or unsupported fails
//! the pod, naming the env var. As a container runtime does, each process
//! also gets `HOSTNAME` (the pod's `spec.hostname`, `<jobset>-<rjob>-<job>-<pod>`)
//! unless its env sets it.
//!
//! # GPUs
//!
//! When the spoke has GPUs ([`ProcessConfig::gpus`], found by
//! [`devices::discover`]), a pod requesting `nvidia.com/gpu: N` or
//! `amd.com/gpu: N` gets N of that vendor's that no other pod holds, and
//! the pod annotation `trainhub.kubeflow.org/devices` naming them. Its
//! processes see only those: NVIDIA's as `CUDA_VISIBLE_DEVICES` and
//! `NVIDIA_VISIBLE_DEVICES` (their UUIDs), AMD's as `ROCR_VISIBLE_DEVICES`
//! (`GPU-<unique id>`, or the ROCr index where the unique id cannot tell
//! it apart) and `HIP_VISIBLE_DEVICES` (`0,…,N-1`: HIP counts what ROCr
//! shows). A pod requesting none of a vendor's GPUs sees none of them
//! (`""` and `void`; `""` and `""`); the variables of a vendor whose GPUs
//! the spoke did not find are not set. A pod whose GPUs are still held (a
//! replaced pod's processes are ending) stays Pending, unscheduled, until
//! they are freed; the GPUs are free again when its processes have ended.
//! Which pod holds which GPU is in the run's record. This is visibility,
//! not isolation: a process can still open any device. Pods carry the
//! labels and annotations of the JobSet and Job controllers
//! (`jobset.sigs.k8s.io/*`, `batch.kubernetes.io/job-completion-index`,
//! `job-name`).
//!
//! # Endpoints on one machine
//!
//! Every pod of a run is reachable at 127.0.0.1, and each run gets its own
//! ports, so that two runs of the same job do not collide:
//!
//! - pod DNS names of the run — `<jobset>-<rjob>-<job>-<pod>` bare, with
//!   `.<subdomain>` (`spec.network.subdomain`, default the JobSet's name),
//!   `.<subdomain>.<ns>`, `.<subdomain>.<ns>.svc` and
//!   `.<subdomain>.<ns>.svc.cluster.local` — are replaced by `127.0.0.1`
//!   wherever they stand as a whole name in env values, command arguments
//!   and ConfigMap files (an MPI hostfile), longest names first;
//! - every `containerPort` declared by any container of the JobSet gets one
//!   free local port per run attempt (bound on 127.0.0.1:0 to pick it), and
//!   an env value or argument equal to that port, ending in `=<port>`, or a
//!   `<pod host>:<port>` inside one, takes the local port instead.
//!
//! So `MASTER_ADDR=j-node-0-0.j` / `MASTER_PORT=29500` (trainhub's python
//! plugin) and `PET_MASTER_ADDR` / `PET_MASTER_PORT` (torch) become
//! `127.0.0.1` and the run's port. Limits: a port written any other way (in
//! a script, a config file) is not rewritten, and two pods of one run that
//! both listen on the same declared port collide.
//!
//! # Files
//!
//! A pod's directory is `<work_dir>/<namespace>/<jobset>-<generation>/<pod>/`:
//! the working directory of its processes (a container's `workingDir` is not
//! honoured), one `<container>.log` per container with stdout and stderr
//! interleaved as they arrive, and `volumes/<volume>/<key>` for each
//! ConfigMap or Secret volume (`items` honoured). The files are not mounted
//! at their `mountPath`: an env value or argument that names a path under
//! the `mountPath` of such a volume the container mounts (the whole value,
//! e.g. `KUBEFLOW_TRAINER_SERVER_TOKEN=/var/run/secrets/kubeflow/trainer/token`)
//! is given the copy's path instead (`subPath` honoured); a path written
//! anywhere else (inside a script, a config file) is not rewritten.
//!
//! # JobSet semantics
//!
//! `dependsOn` (Ready | Complete), `startupPolicy: InOrder`, `successPolicy`
//! (All | Any over target replicated jobs) and `failurePolicy` (`maxRestarts`,
//! rules with FailJobSet | RestartJobSet | RestartJobSetAndIgnoreMaxRestarts;
//! the RestartJob actions restart the whole set) as the JobSet controller
//! does; reasons and messages are upstream's. A restart kills every pod and
//! recreates all of them with fresh names. Capacity is reserved at admission
//! (gang, all or nothing) and released when the run ends or is stopped.
//!
//! Every process runs in its own process group; a container ends its group
//! when its main process exits, and a stop kills the groups with SIGKILL.
//!
//! # Isolation
//!
//! A tenant writes the commands its pods run, so each container runs in a
//! [sandbox]: its own uid per run when the spoke is root (`--run-as-user`),
//! mount and PID namespaces (and a user namespace when the spoke is not
//! root) that hide the spoke's work directory (other runs), its key and the
//! hub's data directory but for the pod's own directory, private `/tmp`,
//! `/var/tmp` and `/dev/shm`, no capabilities; cgroups with the container's
//! `resources.limits` of memory and cpu (an OOM kill is reported as
//! `OOMKilled`, exit code 137, as kubelet does); and the whole process tree
//! of a pod dies with it, `setsid` or not. Requests are not limits: they
//! only count against the declared capacity. A pod's directory is 0700 (its
//! run uid's); its logs are the spoke's, never read or written through a
//! symlink. What the machine does not allow is said once at start.

pub mod cgroup;
pub mod devices;
mod ledger;
mod logs;
pub mod plan;
mod quantity;
pub mod records;
pub mod rewrite;
mod run;
pub mod sandbox;
pub mod state;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::mpsc::UnboundedSender;

pub use ledger::Ledger;
pub use logs::tail_start;
pub use quantity::{format_milli, parse_quantity_milli};
pub use sandbox::{DEFAULT_RUN_UIDS, RunAsUser, Sandbox, SandboxConfig, UidRange};

use super::{
    Backend, BackendError, BoxFuture, Capacity, HeldRun, LOST_FENCED, LOST_SPOKE_RESTARTED,
    LogStream, PodSetRequest, RunKey, RunReport, RunSpec, events,
};
use records::{PodRecord, RecordFile, RunRecord};
use run::Procs;
use state::{ContainerRef, RunState};

/// How the process backend is set up.
#[derive(Debug, Clone, Default)]
pub struct ProcessConfig {
    /// Where run directories go.
    pub work_dir: PathBuf,
    /// Resource name → allocatable milli-units.
    pub capacity: BTreeMap<String, i64>,
    /// `PATH` of the processes; None: the agent's.
    pub path_env: Option<OsString>,
    /// How pods are isolated from the platform and from each other.
    pub sandbox: SandboxConfig,
    /// The GPUs pods are given (see [`devices`]); none: no device env.
    pub gpus: Vec<devices::Gpu>,
}

/// Runs pods as local processes. See the [module documentation](self).
pub struct ProcessBackend {
    shared: Arc<Shared>,
    /// Held by a start until its run is in `runs`: a Start the hub sends
    /// again meanwhile finds it there, and never rewrites its record.
    starting: tokio::sync::Mutex<()>,
}

/// What the backend and its run tasks share.
pub(crate) struct Shared {
    config: ProcessConfig,
    sandbox: Arc<Sandbox>,
    node_name: String,
    base_env: Vec<(OsString, OsString)>,
    reports: UnboundedSender<RunReport>,
    inner: Mutex<Inner>,
    /// Bumped whenever GPUs are freed: pods waiting for them try again.
    devices_freed: tokio::sync::watch::Sender<u64>,
}

struct Inner {
    ledger: Ledger,
    devices: devices::DevicePool,
    runs: BTreeMap<RunKey, RunEntry>,
    images_noted: bool,
}

impl Inner {
    /// A uid of `range` that no run holds.
    fn free_uid(&self, range: UidRange) -> Result<u32, BackendError> {
        let used: BTreeSet<u32> = self.runs.values().filter_map(|e| e.uid).collect();
        (range.first..=range.last)
            .find(|u| !used.contains(u))
            .ok_or_else(|| {
                BackendError::Internal(format!(
                    "every run uid of --run-as-user {range} is taken by a run; widen the range"
                ))
            })
    }
}

struct RunEntry {
    dir: PathBuf,
    /// The run's own uid (and gid), when runs get one.
    uid: Option<u32>,
    task: Option<tokio::task::JoinHandle<()>>,
    procs: Arc<Procs>,
    report: Option<RunReport>,
    finished: bool,
    /// Every pod the run made, by name (pods of earlier attempts included).
    pods: BTreeMap<String, PodFiles>,
    /// Stopped without being asked (see [`HeldRun::lost`]).
    lost: Option<&'static str>,
    /// Its record on disk.
    record: Option<Arc<RecordFile>>,
    /// How long a stop waits after SIGTERM before SIGKILL.
    grace: Duration,
}

/// A run being fenced: its supervisor, processes and record.
type Fenced = (
    RunKey,
    Option<tokio::task::JoinHandle<()>>,
    Arc<Procs>,
    Option<Arc<RecordFile>>,
);

/// Kubernetes' default `terminationGracePeriodSeconds`.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(30);

/// The longest `terminationGracePeriodSeconds` of the run's pod templates
/// (Kubernetes' default 30 s when unset).
fn grace_of(plan: &plan::RunPlan) -> Duration {
    plan.replicated_jobs
        .iter()
        .map(|r| {
            r.pod_spec["terminationGracePeriodSeconds"]
                .as_u64()
                .map_or(DEFAULT_GRACE, Duration::from_secs)
        })
        .max()
        .unwrap_or(DEFAULT_GRACE)
}

/// How long a restarted backend waits for the processes of the previous
/// agent to be gone after SIGKILL.
const ORPHANS_GONE_WITHIN: Duration = Duration::from_secs(10);

/// The runs an earlier agent left in `work_dir`'s records: finished runs
/// kept as they were (their logs stay readable); every other run's
/// processes that still live killed (their process groups, SIGKILL) and
/// waited for, and the run kept as lost, never restarted here.
///
/// The GPUs of a pod whose processes outlive SIGKILL stay held in `pool`
/// (and in the record): they may still be in use.
fn recover(
    work_dir: &std::path::Path,
    sandbox: &Arc<Sandbox>,
    pool: &mut devices::DevicePool,
) -> BTreeMap<RunKey, RunEntry> {
    let mut runs = BTreeMap::new();
    for file in records::load(work_dir) {
        let record = file.get();
        let key = record.key();
        let file = Arc::new(file);
        let pods = record
            .pod_files
            .iter()
            .map(|p| {
                (
                    p.name.clone(),
                    PodFiles {
                        dir: p.dir.clone(),
                        containers: p.containers.clone(),
                        ended: p.containers.iter().cloned().collect(),
                        gone: true,
                    },
                )
            })
            .collect();
        let (report, lost) = if record.finished {
            let report = RunReport {
                key: key.clone(),
                jobset_status: record.status.clone().unwrap_or_default(),
                pods: record.pods.clone(),
                finished: true,
                events: Vec::new(),
            };
            (Some(report), None)
        } else {
            let live = record
                .processes
                .iter()
                .filter(|p| records::alive(p))
                .count();
            let left = records::kill_and_wait(&record.processes, ORPHANS_GONE_WITHIN);
            let survivors = hold_survivors(pool, &record, &left);
            if let Some(cgroups) = sandbox.cgroups() {
                record
                    .processes
                    .iter()
                    .for_each(|p| cgroups.remove_pod(&p.pod));
            }
            let reason = if record.lost.as_deref() == Some(LOST_FENCED) {
                LOST_FENCED
            } else {
                LOST_SPOKE_RESTARTED
            };
            if !left.is_empty() {
                tracing::error!(run = %key.run_id, generation = key.generation, pids = ?left, "processes of the previous agent are still alive after SIGKILL");
            }
            tracing::warn!(
                run = %key.run_id,
                generation = key.generation,
                killed = live,
                reason,
                "a run of the previous agent was not finished: its processes are killed and the run is lost; the hub places it again"
            );
            if let Err(err) = file.update(|r| {
                r.lost = Some(reason.to_owned());
                r.processes.clear();
                r.devices.retain(|pod, _| survivors.contains(pod));
            }) {
                tracing::warn!(run = %key.run_id, %err, "could not write a lost run's record");
            }
            (None, Some(reason))
        };
        runs.insert(
            key,
            RunEntry {
                dir: record.dir.clone(),
                uid: None,
                task: None,
                procs: Arc::new(Procs::new(Arc::clone(sandbox), None)),
                report,
                finished: record.finished,
                pods,
                lost,
                record: Some(file),
                grace: DEFAULT_GRACE,
            },
        );
    }
    runs
}

/// Holds in `pool` the GPUs of the pods of `record` whose processes
/// (`left`, pids) are still alive; their uids.
fn hold_survivors(
    pool: &mut devices::DevicePool,
    record: &RunRecord,
    left: &[u32],
) -> BTreeSet<String> {
    let survivors: BTreeSet<String> = record
        .processes
        .iter()
        .filter(|p| left.contains(&p.pid))
        .map(|p| p.pod.clone())
        .collect();
    for pod in &survivors {
        if let Some(held) = record.devices.get(pod) {
            tracing::error!(pod, devices = ?held, "GPUs of a process that outlived SIGKILL stay held");
            pool.hold(pod, held);
        }
    }
    survivors
}

struct PodFiles {
    dir: PathBuf,
    /// Containers, then init containers: the first is the default.
    containers: Vec<String>,
    ended: BTreeSet<String>,
    gone: bool,
}

impl ProcessBackend {
    /// A backend that keeps its runs under `config.work_dir` (created if
    /// missing, made 0700) and sends every run report on `reports`. Its
    /// sandbox is set up from what the machine allows, and said in one log
    /// line (a warning when runs are not isolated).
    ///
    /// The runs an earlier agent left (see [`records`]) are taken back:
    /// finished ones as they were, the others killed and kept as lost.
    /// Processes of an earlier agent are never adopted: they are not this
    /// agent's children, so it could neither wait for them nor learn how
    /// they ended.
    ///
    /// # Errors
    ///
    /// The work directory cannot be created.
    pub fn new(
        config: ProcessConfig,
        reports: UnboundedSender<RunReport>,
    ) -> std::io::Result<Arc<Self>> {
        std::fs::create_dir_all(&config.work_dir)?;
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&config.work_dir, std::fs::Permissions::from_mode(0o700))?;
        }
        let sandbox = Arc::new(Sandbox::new(&config.sandbox, &config.work_dir));
        say_once(&sandbox);
        let node_name = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "localhost".to_owned());
        let mut base_env = Vec::new();
        if let Some(path) = config.path_env.clone().or_else(|| std::env::var_os("PATH")) {
            base_env.push((OsString::from("PATH"), path));
        }
        if let Some(home) = std::env::var_os("HOME") {
            base_env.push((OsString::from("HOME"), home));
        }
        let ledger = Ledger::new(config.capacity.clone());
        let mut pool = devices::DevicePool::new(&config.gpus);
        let runs = recover(&config.work_dir, &sandbox, &mut pool);
        Ok(Arc::new(Self {
            starting: tokio::sync::Mutex::new(()),
            shared: Arc::new(Shared {
                config,
                sandbox,
                node_name,
                base_env,
                reports,
                inner: Mutex::new(Inner {
                    ledger,
                    devices: pool,
                    runs,
                    images_noted: false,
                }),
                devices_freed: tokio::sync::watch::Sender::new(0),
            }),
        }))
    }
}

/// The sandbox's start line, once per process for the same line (`trainhub
/// dev` starts several local spokes alike).
fn say_once(sandbox: &Sandbox) {
    static SAID: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
    let line = sandbox.describe();
    if !SAID
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(line.clone())
    {
        return;
    }
    if sandbox.hides_files() && sandbox.kills_trees() {
        tracing::info!("{line}");
    } else {
        tracing::warn!("{line}");
    }
}

impl ProcessBackend {
    /// The isolation its pods run in.
    pub fn sandbox(&self) -> &Sandbox {
        &self.shared.sandbox
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes in what a run's state now is: its report (sent if it changed),
    /// its pods' files, and on its end the release of its capacity.
    fn observe(&self, key: &RunKey, state: &RunState, dir: &std::path::Path) {
        let report = RunReport {
            key: key.clone(),
            jobset_status: state.status_json(),
            pods: state.pods_json(&self.node_name),
            finished: state.terminal_state().is_some(),
            events: Vec::new(),
        };
        let mut inner = self.lock();
        if report.finished {
            inner.ledger.release(key);
        }
        let Some(entry) = inner.runs.get_mut(key) else {
            return;
        };
        let plan = state.plan();
        let mut current = BTreeSet::new();
        for pod in state.pods() {
            current.insert(pod.name.clone());
            let r = &plan.replicated_jobs[pod.rjob];
            let files = entry
                .pods
                .entry(pod.name.clone())
                .or_insert_with(|| PodFiles {
                    dir: dir.join(&pod.name),
                    containers: r
                        .containers
                        .iter()
                        .chain(&r.init_containers)
                        .map(|c| c.name.clone())
                        .collect(),
                    ended: BTreeSet::new(),
                    gone: false,
                });
            files.gone = pod.deleted;
            let refs = (0..r.containers.len())
                .map(ContainerRef::Main)
                .chain((0..r.init_containers.len()).map(ContainerRef::Init));
            for (name, c) in files.containers.clone().iter().zip(refs) {
                if pod.container_ended(c) {
                    files.ended.insert(name.clone());
                }
            }
        }
        for (name, files) in entry.pods.iter_mut() {
            if !current.contains(name) {
                files.gone = true;
            }
        }
        let newly_finished = report.finished && !entry.finished;
        entry.finished = report.finished;
        if newly_finished && let Some(file) = entry.record.clone() {
            let pod_files: Vec<PodRecord> = entry
                .pods
                .iter()
                .map(|(name, p)| PodRecord {
                    name: name.clone(),
                    dir: p.dir.clone(),
                    containers: p.containers.clone(),
                })
                .collect();
            let (status, pods) = (report.jobset_status.clone(), report.pods.clone());
            if let Err(err) = file.update(|r| {
                r.finished = true;
                r.processes.clear();
                r.status = Some(status);
                r.pods = pods;
                r.pod_files = pod_files;
            }) {
                tracing::warn!(run = %key.run_id, %err, "could not write a finished run's record");
            }
        }
        if !entry.report.as_ref().is_some_and(|r| r.same_state(&report)) {
            let before = entry.report.as_ref().map(|r| r.pods.as_slice());
            let mut report = report;
            report.events = events::pod_events(
                before.unwrap_or_default(),
                &report.pods,
                &self.node_name,
                &state::time(jiff::Timestamp::now()),
            );
            entry.report = Some(report.clone());
            drop(inner);
            let _ = self.reports.send(report);
        }
    }

    /// A container has ended or never will (its pod, run or backend is gone).
    fn container_ended(&self, key: &RunKey, pod: &str, container: &str) -> bool {
        let inner = self.lock();
        let Some(entry) = inner.runs.get(key) else {
            return true;
        };
        entry.finished
            || entry.lost.is_some()
            || entry
                .pods
                .get(pod)
                .is_none_or(|p| p.gone || p.ended.contains(container))
    }
}

/// A path component from the hub: a namespace or a name.
fn plain_component(field: &str, value: &str) -> Result<(), BackendError> {
    if value.is_empty() || value == "." || value == ".." || value.contains(['/', '\0']) {
        return Err(BackendError::Invalid(format!(
            "{field}: {value:?} cannot name a directory; it must be a Kubernetes name"
        )));
    }
    Ok(())
}

impl Backend for ProcessBackend {
    fn kind(&self) -> &'static str {
        "process"
    }

    fn capacity(&self) -> Vec<Capacity> {
        self.shared.lock().ledger.capacity()
    }

    fn admit(&self, key: &RunKey, pod_sets: &[PodSetRequest]) -> Result<(), BackendError> {
        let mut inner = self.shared.lock();
        if inner.runs.contains_key(key) {
            return Ok(());
        }
        inner.ledger.admit(key, pod_sets)
    }

    fn withdraw(&self, key: &RunKey) {
        let mut inner = self.shared.lock();
        if !inner.runs.contains_key(key) {
            inner.ledger.release(key);
        }
    }

    fn start(&self, spec: RunSpec) -> BoxFuture<'_, Result<(), BackendError>> {
        Box::pin(async move {
            let _starting = self.starting.lock().await;
            if self.shared.lock().runs.contains_key(&spec.key) {
                return Ok(());
            }
            plain_component("namespace", &spec.namespace)?;
            let plan = plan::plan_run(&spec.namespace, &spec.name, &spec.objects)
                .map_err(BackendError::Invalid)?;
            plain_component("objects[0].metadata.name", &plan.name)?;
            let plan = Arc::new(plan);
            let dir = self
                .shared
                .config
                .work_dir
                .join(&spec.namespace)
                .join(format!("{}-{}", plan.name, spec.key.generation));
            let record = {
                let work_dir = self.shared.config.work_dir.clone();
                let record = RunRecord {
                    run_id: spec.key.run_id.clone(),
                    generation: spec.key.generation,
                    namespace: spec.namespace.clone(),
                    name: spec.name.clone(),
                    dir: dir.clone(),
                    processes: Vec::new(),
                    finished: false,
                    lost: None,
                    status: None,
                    pods: Vec::new(),
                    pod_files: Vec::new(),
                    devices: BTreeMap::new(),
                };
                // Before anything starts: an agent killed from here on
                // leaves a record that its successor acts on.
                tokio::task::spawn_blocking(move || RecordFile::create(&work_dir, record))
                    .await
                    .map_err(|e| BackendError::Internal(format!("writing the run record: {e}")))?
                    .map_err(|e| {
                        BackendError::Internal(format!("cannot write the run record: {e}"))
                    })?
            };
            let record = Arc::new(record);
            let grace = grace_of(&plan);
            let procs = Arc::new(Procs::new(
                Arc::clone(&self.shared.sandbox),
                Some(Arc::clone(&record)),
            ));
            let uid;
            {
                let mut inner = self.shared.lock();
                if inner.runs.contains_key(&spec.key) {
                    return Ok(());
                }
                let admitted = (|| {
                    let uid = match self.shared.sandbox.run_uids() {
                        Some(range) => Some(inner.free_uid(range)?),
                        None => None,
                    };
                    if !inner.ledger.holds(&spec.key) {
                        inner.ledger.admit(&spec.key, &plan.pod_sets())?;
                    }
                    Ok::<_, BackendError>(uid)
                })();
                uid = match admitted {
                    Ok(uid) => uid,
                    Err(e) => {
                        record.remove();
                        return Err(e);
                    }
                };
                let uses_images = plan.replicated_jobs.iter().any(|r| {
                    r.containers
                        .iter()
                        .chain(&r.init_containers)
                        .any(|c| c.image.is_some())
                });
                if uses_images && !inner.images_noted {
                    inner.images_noted = true;
                    tracing::info!(
                        "the process backend ignores container images: it runs each container's command and args as a local process"
                    );
                }
                inner.runs.insert(
                    spec.key.clone(),
                    RunEntry {
                        dir: dir.clone(),
                        uid,
                        task: None,
                        procs: Arc::clone(&procs),
                        report: None,
                        finished: false,
                        pods: BTreeMap::new(),
                        lost: None,
                        record: Some(Arc::clone(&record)),
                        grace,
                    },
                );
            }
            if let Err(err) = tokio::fs::create_dir_all(&dir).await {
                let mut inner = self.shared.lock();
                inner.runs.remove(&spec.key);
                inner.ledger.release(&spec.key);
                record.remove();
                return Err(BackendError::Internal(format!(
                    "cannot create the run directory {}: {err}",
                    dir.display()
                )));
            }
            let task = tokio::spawn(run::supervise(run::RunContext {
                shared: Arc::clone(&self.shared),
                key: spec.key.clone(),
                plan,
                dir,
                uid,
                extra_env: spec.extra_env,
                procs: Arc::clone(&procs),
            }));
            let mut inner = self.shared.lock();
            match inner.runs.get_mut(&spec.key) {
                Some(entry) => entry.task = Some(task),
                // Stopped meanwhile.
                None => {
                    task.abort();
                    procs.kill_all();
                }
            }
            Ok(())
        })
    }

    fn stop(&self, run_id: &str, generation: i64) -> BoxFuture<'_, ()> {
        let run_id = run_id.to_owned();
        Box::pin(async move {
            let matches = |k: &RunKey| k.run_id == run_id && k.generation <= generation;
            let victims: Vec<RunEntry> = {
                let mut inner = self.shared.lock();
                let keys: Vec<RunKey> = inner
                    .ledger
                    .keys()
                    .into_iter()
                    .chain(inner.runs.keys().cloned())
                    .filter(|k| matches(k))
                    .collect();
                keys.iter()
                    .filter_map(|k| {
                        inner.ledger.release(k);
                        inner.runs.remove(k)
                    })
                    .collect()
            };
            for mut entry in victims {
                if let Some(task) = entry.task.take() {
                    task.abort();
                    let _ = task.await;
                }
                entry.procs.terminate_all(entry.grace).await;
                remove_dir(&entry.dir).await;
                if let Some(record) = &entry.record {
                    record.remove();
                }
            }
        })
    }

    fn runs(&self) -> Vec<HeldRun> {
        self.shared
            .lock()
            .runs
            .iter()
            .map(|(key, entry)| HeldRun {
                key: key.clone(),
                finished: entry.finished,
                lost: entry.lost,
            })
            .collect()
    }

    fn reservations(&self) -> Vec<RunKey> {
        let inner = self.shared.lock();
        inner
            .ledger
            .keys()
            .into_iter()
            .filter(|k| !inner.runs.contains_key(k))
            .collect()
    }

    /// Kills (SIGKILL, no grace: the hub may place the runs elsewhere soon)
    /// every run that has not finished and keeps it as lost (`Fenced`), in
    /// memory and in its record; its directory and logs stay.
    fn fence(&self) -> BoxFuture<'_, Vec<RunKey>> {
        Box::pin(async move {
            let fenced: Vec<Fenced> = {
                let mut inner = self.shared.lock();
                let keys: Vec<RunKey> = inner
                    .runs
                    .iter()
                    .filter(|(_, e)| !e.finished && e.lost.is_none())
                    .map(|(k, _)| k.clone())
                    .collect();
                keys.into_iter()
                    .filter_map(|k| {
                        inner.ledger.release(&k);
                        let entry = inner.runs.get_mut(&k)?;
                        entry.lost = Some(LOST_FENCED);
                        Some((
                            k,
                            entry.task.take(),
                            Arc::clone(&entry.procs),
                            entry.record.clone(),
                        ))
                    })
                    .collect()
            };
            let mut keys = Vec::new();
            for (key, task, procs, record) in fenced {
                if let Some(task) = task {
                    task.abort();
                    let _ = task.await;
                }
                procs.kill_all();
                if let Some(record) = record
                    && let Err(err) = record.update(|r| {
                        r.lost = Some(LOST_FENCED.to_owned());
                        r.processes.clear();
                    })
                {
                    tracing::warn!(run = %key.run_id, %err, "could not write a fenced run's record");
                }
                keys.push(key);
            }
            keys
        })
    }

    fn report(&self, key: &RunKey) -> Option<RunReport> {
        self.shared.lock().runs.get(key)?.report.clone()
    }

    fn logs(
        &self,
        run_id: &str,
        pod: &str,
        container: Option<&str>,
        follow: bool,
        tail_lines: Option<i64>,
    ) -> BoxFuture<'_, Result<LogStream, BackendError>> {
        let lookup = || -> Result<logs::LogRequest, BackendError> {
            let tail_lines = super::tail_lines(tail_lines)?;
            let inner = self.shared.lock();
            let (key, files) = super::run_with_pod(&inner.runs, run_id, pod, |e| e.pods.get(pod))?;
            let container = super::pick_container(&files.containers, container, pod)?;
            Ok(logs::LogRequest {
                shared: Arc::clone(&self.shared),
                key: key.clone(),
                pod: pod.to_owned(),
                path: files.dir.join(format!("{container}.log")),
                container,
                follow,
                tail_lines,
            })
        };
        let request = lookup();
        Box::pin(async move { request?.open().await })
    }
}

/// Deletes a run directory; a process killed a moment ago may still add a
/// file, so a failure is retried.
async fn remove_dir(dir: &std::path::Path) {
    for attempt in 0..3 {
        match tokio::fs::remove_dir_all(dir).await {
            Ok(()) => return,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return,
            Err(err) if attempt == 2 => {
                tracing::warn!(dir = %dir.display(), %err, "could not delete a run directory");
            }
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
        }
    }
}

impl Drop for ProcessBackend {
    /// Leaves no processes behind: every run task ends and every process
    /// group is killed.
    fn drop(&mut self) {
        let inner = self.shared.lock();
        for entry in inner.runs.values() {
            if let Some(task) = &entry.task {
                task.abort();
            }
            entry.procs.kill_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use devices::{Gpu, Vendor};

    /// A restarted spoke keeps held, from the record, the GPUs (of either
    /// vendor) of a pod whose processes outlived SIGKILL, and only those.
    #[test]
    fn the_gpus_of_surviving_pods_stay_held_after_a_restart() {
        let gpu = |vendor, index: u32, id: &str| Gpu {
            vendor,
            index,
            id: id.to_owned(),
            ..Gpu::default()
        };
        let mut pool = devices::DevicePool::new(&[
            gpu(Vendor::Nvidia, 0, "GPU-n0"),
            gpu(Vendor::Amd, 0, "GPU-00000000000000A0"),
            gpu(Vendor::Amd, 1, "1"),
        ]);
        let process = |pod: &str, pid| records::ProcessRecord {
            pod: pod.to_owned(),
            pid,
            pgid: pid,
            start_time: 1,
        };
        let record = RunRecord {
            run_id: "r".into(),
            generation: 1,
            namespace: "ns".into(),
            name: "j".into(),
            dir: "/w/ns/j-1".into(),
            processes: vec![process("survivor", 7), process("killed", 8)],
            finished: false,
            lost: None,
            status: None,
            pods: Vec::new(),
            pod_files: Vec::new(),
            devices: BTreeMap::from([
                (
                    "survivor".to_owned(),
                    vec!["1".to_owned(), "GPU-n0".to_owned()],
                ),
                ("killed".to_owned(), vec!["GPU-00000000000000A0".to_owned()]),
            ]),
        };
        let survivors = hold_survivors(&mut pool, &record, &[7]);
        assert_eq!(survivors, BTreeSet::from(["survivor".to_owned()]));
        let amd = BTreeMap::from([(Vendor::Amd, 1)]);
        assert_eq!(
            pool.assign("new", &amd),
            Some(BTreeMap::from([(
                Vendor::Amd,
                vec!["GPU-00000000000000A0".to_owned()]
            )])),
            "the killed pod's GPU is free, the survivor's is not"
        );
        assert_eq!(pool.assign("more", &amd), None);
        assert_eq!(
            pool.assign("nvidia", &BTreeMap::from([(Vendor::Nvidia, 1)])),
            None,
            "the survivor's NVIDIA GPU is held too"
        );
    }
}
