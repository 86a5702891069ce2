//! Dispatch: TrainJobs in the store go to spokes, and what spokes report
//! comes back as TrainJob status, pods and logs.
//!
//! - [`core`]: the decisions, a pure state machine (queue order,
//!   nomination, first admission wins, lost spokes, stale runs).
//! - this module: the runner that feeds it from the store and the spoke
//!   sessions and carries out its actions: placements committed to the
//!   store (before a winner is told to start), the Build phase for the
//!   winning spoke, reports mapped by the PostExecution plugins.
//! - [`crate::grpc`]: the spokes' gRPC sessions.
//!
//! TrainJob annotations read here (documented in the README):
//! `trainhub.kubeflow.org/priority` (an integer, higher first) and
//! `trainhub.kubeflow.org/spoke-selector` (a label selector over spoke
//! labels, e.g. `region=eu,gpu.product in (H100,A100)`). Written here, in
//! the same store write as the placement: `trainhub.kubeflow.org/spoke`
//! (the spoke running it; the SPOKE column) and the finalizer
//! [`FINALIZER`].

pub mod authority;
pub mod core;
mod observe;
pub mod queues;
pub mod quota;
mod snapshots;
mod writer;

use std::collections::{BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use jiff::Timestamp;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use trainhub_api::constants::{CONDITION_COMPLETE, CONDITION_FAILED, LABEL_JOBSET_NAME};
use trainhub_api::jobset::JobSetStatus;
use trainhub_api::trainer::TrainJob;
use trainhub_apiserver::selector::LabelSelector;
use trainhub_apiserver::server::{ByteStream, LogSource};
use trainhub_apiserver::status::ApiError;
use trainhub_apiserver::store::{Key, Op, Store};
use trainhub_builtin_plugins::quantity::Quantity;
use trainhub_plugin_sdk as sdk;
use trainhub_proto as pb;

use self::core::{Action, Dispatcher, JobInfo, JobKey, Placement, PodSetDemand, Verdict, Want};
use self::writer::{Edit, Write, update_status};
use crate::admission::TrainerAdmission;
use crate::api::{EVENTS, PODS, TRAINJOBS};
use crate::controller::lifecycle::{format_time, is_true, set_condition};
use crate::plugins::Pipeline;
use crate::plugins::registry::Registry;

/// Where placements are kept: one object per TrainJob, same namespace and
/// name, `{uid, spoke, generation}`. Not served by the API.
pub const PLACEMENTS: &str = "trainhub.kubeflow.org/placements";
pub const ANNOTATION_PRIORITY: &str = "trainhub.kubeflow.org/priority";
pub const ANNOTATION_SPOKE_SELECTOR: &str = "trainhub.kubeflow.org/spoke-selector";
/// On pods the hub shows: the spoke that runs them and their run.
pub const ANNOTATION_SPOKE: &str = "trainhub.kubeflow.org/spoke";
pub const ANNOTATION_RUN: &str = "trainhub.kubeflow.org/run";
/// The Failed reason when the Build phase cannot produce the objects.
pub const REASON_BUILD_FAILED: &str = "BuildFailed";
/// TrainJob condition type: a plugin call this TrainJob needs (Build,
/// PostExecution) could not run because the plugin host is overloaded, and
/// is retried with backoff; removed once the call succeeds.
pub const CONDITION_PLUGINS_DEFERRED: &str = "PluginsDeferred";
/// Reason of the `PluginsDeferred=True` condition (and its Warning event).
pub const REASON_PLUGIN_CALL_DEFERRED: &str = "PluginCallDeferred";
/// Enforced runtime infos kept for Build (see `Dispatch::enforced`).
const ENFORCED_KEPT: u64 = 1024;
/// Typed TrainJobs kept (see `Dispatch::typed`): 6 to 7 KiB each, a
/// bounded cost whatever the number of TrainJobs.
const TYPED_KEPT: u64 = 1024;
/// Backoff of a deferred plugin call: 1 s, doubling, at most 5 minutes.
const DEFER_FIRST: Duration = Duration::from_secs(1);
const DEFER_MAX: Duration = Duration::from_secs(300);
/// The finalizer a TrainJob gets with its first placement: a deleted
/// TrainJob stays (with `deletionTimestamp`) until its run is stopped on
/// its spoke, the spoke is declared lost, or the deletion timeout passes.
pub const FINALIZER: &str = "trainhub.kubeflow.org/run-cleanup";

/// How dispatch behaves.
#[derive(Debug, Clone, Copy)]
pub struct DispatchConfig {
    pub core: core::Config,
    /// How often time-driven decisions are taken.
    pub tick: Duration,
    /// A session from which nothing has arrived for this long is ended (a
    /// disconnect: the worker-lost timer starts), so a half-open
    /// connection (a partition) is noticed.
    pub spoke_silence: Duration,
    /// How often runtime versions no TrainJob uses are looked for (one
    /// goes at its second sweep unused; see [`snapshots`]).
    pub runtime_version_sweep: Duration,
}

impl Default for DispatchConfig {
    fn default() -> Self {
        DispatchConfig {
            core: core::Config::default(),
            tick: Duration::from_secs(1),
            spoke_silence: Duration::from_secs(30),
            runtime_version_sweep: Duration::from_secs(600),
        }
    }
}

/// The nesting of timers that keeps a run from running twice: a spoke's
/// fence-after (after which it stops its runs) must be set and strictly
/// shorter than the hub's worker-lost timeout (after which the hub places
/// them elsewhere).
///
/// # Errors
///
/// The rule broken, naming both values.
pub fn check_fence_after(fence_after_ms: i64, worker_lost_timeout_ms: u64) -> Result<(), String> {
    let lost = i64::try_from(worker_lost_timeout_ms).unwrap_or(i64::MAX);
    if fence_after_ms <= 0 || fence_after_ms >= lost {
        return Err(format!(
            "fence_after_ms {fence_after_ms} of the spoke must be more than 0 and strictly less than the hub's worker-lost timeout ({lost} ms): a spoke cut off from the hub must stop its runs before the hub places them elsewhere; set trainspoke --fence-after-seconds below the hub's --worker-lost-timeout-seconds"
        ));
    }
    Ok(())
}

/// Dispatch flags of `trainhub serve` and `trainhub dev`.
#[derive(Debug, Clone, clap::Args)]
pub struct DispatchArgs {
    /// How queued TrainJobs are offered to spokes.
    #[arg(long, value_enum, default_value_t = ModeArg::AllAtOnce)]
    pub dispatch_mode: ModeArg,
    /// Incremental: spokes added per round.
    #[arg(long, default_value_t = 3)]
    pub incremental_step: usize,
    /// Incremental: seconds per round.
    #[arg(long, default_value_t = 300)]
    pub incremental_round_seconds: u64,
    /// A spoke disconnected this long is given up and its TrainJobs requeued.
    /// Also armed at start for every placement on a spoke not connected.
    #[arg(long, default_value_t = 900)]
    pub worker_lost_timeout_seconds: u64,
    /// An offer a spoke has not answered this long is withdrawn and the
    /// TrainJob offered again.
    #[arg(long, default_value_t = 60)]
    pub offer_timeout_seconds: u64,
    /// A deleted TrainJob whose spoke has not confirmed the stop of its run
    /// is let go after this long [default: the worker-lost timeout].
    #[arg(long)]
    pub deletion_timeout_seconds: Option<u64>,
    /// AllAtOnce: offer each TrainJob to at most this many spokes at once,
    /// those with the most room for it first (a refusal frees a place);
    /// 0 offers to every eligible spoke.
    #[arg(long, default_value_t = 0)]
    pub dispatch_fanout: usize,
    /// A spoke session from which nothing (not even a heartbeat) has
    /// arrived for this many seconds is ended and counts as a disconnect,
    /// so a half-open connection starts the worker-lost timer.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub spoke_silence_seconds: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ModeArg {
    AllAtOnce,
    Incremental,
}

impl DispatchArgs {
    pub fn config(&self) -> DispatchConfig {
        let DispatchArgs {
            dispatch_mode,
            incremental_step,
            incremental_round_seconds,
            worker_lost_timeout_seconds,
            offer_timeout_seconds,
            deletion_timeout_seconds,
            dispatch_fanout,
            spoke_silence_seconds,
        } = self;
        let mode = match dispatch_mode {
            ModeArg::AllAtOnce => core::Mode::AllAtOnce,
            ModeArg::Incremental => core::Mode::Incremental {
                step: *incremental_step,
                round_ms: incremental_round_seconds.saturating_mul(1000),
            },
        };
        let lost_ms = worker_lost_timeout_seconds.saturating_mul(1000);
        let offer_ms = offer_timeout_seconds.saturating_mul(1000);
        let deletion_ms = deletion_timeout_seconds
            .unwrap_or(*worker_lost_timeout_seconds)
            .saturating_mul(1000);
        let shortest = lost_ms.min(offer_ms).min(deletion_ms);
        DispatchConfig {
            core: core::Config {
                mode,
                worker_lost_timeout_ms: lost_ms,
                fanout: *dispatch_fanout,
                offer_timeout_ms: offer_ms,
                deletion_timeout_ms: deletion_ms,
                ..core::Config::default()
            },
            // Tick often enough for short (test-sized) timeouts.
            tick: Duration::from_millis((shortest / 4).clamp(100, 1000)),
            spoke_silence: Duration::from_secs(*spoke_silence_seconds),
            ..DispatchConfig::default()
        }
    }
}

/// Sizes of what [`Dispatch`] holds in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footprint {
    pub sessions: usize,
    pub log_streams: usize,
    pub jobs_with_pods: usize,
    pub pods: usize,
    pub jobs_with_events: usize,
    pub events: usize,
    pub statuses: usize,
}

/// What a TrainJob asks for, and the enforced runtime info it comes from.
/// Why a pipeline step for a TrainJob failed; `transient` when a plugin
/// call could not run now (retried, see `Dispatch::defer`) rather than
/// failed.
#[derive(Debug)]
struct StepError {
    message: String,
    transient: bool,
}

impl From<String> for StepError {
    fn from(message: String) -> Self {
        StepError {
            message,
            transient: false,
        }
    }
}

impl From<crate::plugins::PipelineError> for StepError {
    fn from(e: crate::plugins::PipelineError) -> Self {
        StepError {
            transient: e.is_transient(),
            message: e.to_string(),
        }
    }
}

/// The pipeline steps dispatch runs for a TrainJob, each deferred (and
/// retried) on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Step {
    /// The ML and pod-group policies (the TrainJob's demand).
    Enforce,
    /// The objects for the winning spoke.
    Build,
    /// PostExecution: the TrainJob status from the JobSet status.
    Status,
}

/// A TrainJob's plugin calls of one step deferred in a row (their backoff), and
/// whether a retry is already scheduled (one at a time: a deferral writes
/// the TrainJob's status, whose watch event must not schedule another).
#[derive(Debug, Default)]
struct Deferral {
    attempts: u32,
    pending: bool,
}

struct Demand {
    pod_sets: Vec<PodSetDemand>,
    info: sdk::RuntimeInfo,
}

struct Session {
    id: u64,
    tx: mpsc::UnboundedSender<pb::HubMessage>,
    /// Ends the session's stream, with the reason (a newer session of the
    /// same spoke replaced it).
    close: tokio::sync::watch::Sender<Option<String>>,
    labels: Vec<(String, String)>,
    allocatable: Vec<(String, i64)>,
}

/// Chunks buffered per log stream for its reader: with chunks of at most
/// [`pb::limits::MAX_LOG_CHUNK_BYTES`], 4 MiB. A reader that falls further
/// behind is dropped, with an error at the end of what it was sent.
pub const LOG_BUFFER_CHUNKS: usize = 64;
/// Events remembered per TrainJob (to remove them with it); a spoke's
/// events past this are refused.
pub const MAX_EVENTS_PER_TRAINJOB: usize = 10_000;

/// An open log stream: the spoke and the session it was asked of (only
/// they may write to it), and its reader's buffer.
struct LogStream {
    spoke: String,
    session: u64,
    tx: mpsc::Sender<Bytes>,
    /// Why the stream ended early; the reader gets it after the buffered
    /// data.
    ended: Arc<Mutex<Option<String>>>,
}

/// A new log stream id: 128 random bits, hex (not guessable, so one
/// spoke cannot write into a stream another spoke serves).
fn log_stream_id() -> Result<String, ApiError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|e| ApiError::internal(format!("no randomness for a log stream id: {e}")))?;
    Ok(hex::encode(bytes))
}

/// The dispatch runner. Cheap to share.
pub struct Dispatch {
    store: Arc<dyn Store>,
    admission: Arc<TrainerAdmission>,
    plugins: Arc<Registry>,
    config: DispatchConfig,
    state: Mutex<Dispatcher>,
    sessions: Mutex<HashMap<String, Session>>,
    next_id: std::sync::atomic::AtomicU64,
    logs: Mutex<HashMap<String, LogStream>>,
    /// Pod sets per TrainJob (uid, metadata.generation): what it queues
    /// with.
    demand: moka::sync::Cache<(String, i64), Arc<Vec<PodSetDemand>>>,
    /// The enforced runtime info those pod sets came from, which Build
    /// starts from. It holds the runtime's templates (kilobytes per
    /// TrainJob), so only the most recently enforced are kept; a TrainJob
    /// placed after its entry went runs the whole pipeline at Build.
    enforced: moka::sync::Cache<(String, i64), Arc<sdk::RuntimeInfo>>,
    /// Pods shown per TrainJob, and the hash of what each last was.
    pods: Mutex<HashMap<JobKey, HashMap<String, u64>>>,
    /// Events written per TrainJob (its own and its pods'), removed with it.
    events: Mutex<HashMap<JobKey, BTreeSet<String>>>,
    /// Hash of the last JobSet status mapped per run.
    statuses: Mutex<HashMap<String, u64>>,
    /// Typed TrainJobs by (uid, generation, hash of labels and annotations).
    typed: moka::sync::Cache<(String, i64, u64), Arc<TrainJob>>,
    /// Deferred plugin calls per TrainJob uid and step.
    deferred: Mutex<HashMap<(String, Step), Deferral>>,
    writer: mpsc::UnboundedSender<Write>,
    writer_rx: Mutex<Option<mpsc::UnboundedReceiver<Write>>>,
    epoch: Instant,
    me: std::sync::Weak<Dispatch>,
    /// Spans and latency metrics.
    observe: observe::Observer,
    /// The spokes' sessions and certificates, for their `Spoke` objects.
    spokes: Arc<crate::spokes::Registry>,
    /// Set once [`Dispatch::run`] has loaded the TrainJobs and their
    /// placements from the store.
    loaded: tokio::sync::watch::Sender<bool>,
    /// LocalQueues, priority classes and namespace labels, to resolve a
    /// TrainJob's queue.
    queues: std::sync::RwLock<queues::Index>,
    /// What was last published on Kueue's objects.
    published: Mutex<queues::Published>,
    /// Evictions not yet shown on their Workloads.
    evictions: Mutex<HashMap<JobKey, queues::Eviction>>,
    /// The spokes' labels and capacity as quota was last derived from
    /// them (hashed).
    spokes_seen: Mutex<u64>,
    /// What the trainer's pods get to post their progress with, if the
    /// hub offers it.
    trainer_status: std::sync::OnceLock<Arc<crate::trainer_status::Reporting>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn hash_of(v: &impl Hash) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    v.hash(&mut h);
    h.finish()
}

fn job_key(namespace: &str, name: &str) -> JobKey {
    JobKey {
        namespace: namespace.to_string(),
        name: name.to_string(),
    }
}

impl Dispatch {
    pub fn new(
        store: Arc<dyn Store>,
        admission: Arc<TrainerAdmission>,
        plugins: Arc<Registry>,
        config: DispatchConfig,
    ) -> Arc<Self> {
        let (writer, writer_rx) = mpsc::unbounded_channel();
        Arc::new_cyclic(|me| Dispatch {
            me: me.clone(),
            admission,
            plugins,
            config,
            state: Mutex::new(Dispatcher::new(config.core)),
            sessions: Mutex::new(HashMap::new()),
            next_id: std::sync::atomic::AtomicU64::new(1),
            logs: Mutex::new(HashMap::new()),
            demand: moka::sync::Cache::new(65_536),
            enforced: crate::memory::lru(ENFORCED_KEPT),
            pods: Mutex::new(HashMap::new()),
            events: Mutex::new(HashMap::new()),
            statuses: Mutex::new(HashMap::new()),
            typed: crate::memory::lru(TYPED_KEPT),
            deferred: Mutex::new(HashMap::new()),
            writer,
            writer_rx: Mutex::new(Some(writer_rx)),
            epoch: Instant::now(),
            observe: observe::Observer::default(),
            spokes: crate::spokes::Registry::new(store.clone()),
            store,
            loaded: tokio::sync::watch::Sender::new(false),
            queues: std::sync::RwLock::default(),
            published: Mutex::default(),
            evictions: Mutex::default(),
            spokes_seen: Mutex::default(),
            trainer_status: std::sync::OnceLock::new(),
        })
    }

    /// Gives every trainer pod built from now on what it needs to post
    /// its TrainJob's `trainerStatus` (see [`crate::trainer_status`]).
    pub fn report_trainer_status(&self, reporting: Arc<crate::trainer_status::Reporting>) {
        let _ = self.trainer_status.set(reporting);
    }

    fn now(&self) -> core::Millis {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Sets the metrics that mirror dispatch state (TrainJobs by state,
    /// queue depth, spokes), before a scrape. The dispatcher is locked only
    /// to copy what it knows, not while the TrainJobs are counted.
    pub fn refresh_metrics(&self) {
        let m = crate::metrics::hub();
        let (connected, queued, placed) = {
            let state = lock(&self.state);
            (
                state.connected_spokes(),
                state.queue_depth(),
                state.placed_jobs(),
            )
        };
        m.connected_spokes
            .set(i64::try_from(connected).unwrap_or(i64::MAX));
        m.queue_depth.set(i64::try_from(queued).unwrap_or(i64::MAX));
        let (trainjobs, _) = self.store.list(TRAINJOBS, None);
        let mut counts: HashMap<&str, i64> = HashMap::new();
        for object in &trainjobs {
            let v = &object.value;
            let status = &v["status"];
            let name = if is_true(status, CONDITION_COMPLETE) {
                "Complete"
            } else if is_true(status, CONDITION_FAILED) {
                "Failed"
            } else if v["spec"]["suspend"] == true {
                "Suspended"
            } else if placed.contains(&job_key(&object.key.namespace, &object.key.name)) {
                "Running"
            } else {
                "Queued"
            };
            *counts.entry(name).or_default() += 1;
        }
        for state in ["Queued", "Running", "Suspended", "Complete", "Failed"] {
            m.trainjobs
                .get_or_create(&trainhub_telemetry::metrics::labels([("state", state)]))
                .set(counts.get(state).copied().unwrap_or(0));
        }
        self.observe.refresh_spokes();
    }

    /// Resolves once every write queued before the call is committed (or
    /// failed): a barrier for tests.
    pub async fn settled(&self) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let _ = self.writer.send(Write {
            done: Some(Box::new(move |_| {
                let _ = tx.send(());
            })),
            ..Write::default()
        });
        let _ = rx.await;
    }

    /// What the runner holds per spoke, run and stream, for tests that
    /// show it stays bounded.
    pub fn footprint(&self) -> Footprint {
        let pods = lock(&self.pods);
        let events = lock(&self.events);
        Footprint {
            sessions: lock(&self.sessions).len(),
            log_streams: lock(&self.logs).len(),
            jobs_with_pods: pods.len(),
            pods: pods.values().map(HashMap::len).sum(),
            jobs_with_events: events.len(),
            events: events.values().map(BTreeSet::len).sum(),
            statuses: lock(&self.statuses).len(),
        }
    }

    /// Resolves once [`Dispatch::run`] knows every TrainJob and placement
    /// the store held when it started. Spoke sessions must wait for it: a
    /// hello listing a run that dispatch does not know yet would be told to
    /// stop it (not placed on this spoke), which would kill a running job
    /// that a new leader should adopt.
    pub async fn loaded(&self) {
        let mut rx = self.loaded.subscribe();
        let _ = rx.wait_for(|l| *l).await;
    }

    /// Connected spokes and queued TrainJobs, for metrics and tests.
    pub fn stats(&self) -> (usize, usize) {
        let state = lock(&self.state);
        (state.connected_spokes(), state.queue_depth())
    }

    /// Runs until `shutdown`: loads placements and TrainJobs, follows
    /// TrainJob changes, writes, and takes time-driven decisions.
    pub async fn run(self: Arc<Self>, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let writer = lock(&self.writer_rx).take().map(|rx| {
            let this = self.clone();
            tokio::spawn(async move { writer::run(this.store.as_ref(), rx).await })
        });
        let ticker = {
            let this = self.clone();
            tokio::spawn(async move {
                let mut interval = tokio::time::interval(this.config.tick);
                interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    interval.tick().await;
                    let actions = lock(&this.state).tick(this.now());
                    this.execute(actions);
                }
            })
        };
        self.load_pods();
        // Quota objects first, so TrainJobs of queues resolve as loaded.
        self.reload_queues();
        let quota_tasks = [
            tokio::spawn(self.clone().follow_queues()),
            tokio::spawn(self.clone().publish_queues()),
            tokio::spawn(
                self.clone()
                    .sweep_runtime_versions(self.config.runtime_version_sweep),
            ),
        ];
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                () = self.follow_trainjobs() => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        ticker.abort();
        for task in quota_tasks {
            task.abort();
        }
        if let Some(w) = writer {
            w.abort();
        }
    }

    /// Remembers the pods shown before a restart, so that those no longer
    /// reported are removed.
    fn load_pods(&self) {
        let (pods, _) = self.store.list(PODS, None);
        let mut shown = lock(&self.pods);
        for pod in pods {
            let meta = &pod.value["metadata"];
            if meta["annotations"][ANNOTATION_RUN].is_null() {
                continue;
            }
            let Some(job) = meta["labels"][LABEL_JOBSET_NAME].as_str() else {
                continue;
            };
            shown
                .entry(job_key(&pod.key.namespace, job))
                .or_default()
                .insert(pod.key.name.clone(), 0);
        }
    }

    /// Lists TrainJobs (with their placements) and follows changes until the
    /// watch breaks; the dispatcher keeps its state across passes.
    async fn follow_trainjobs(&self) {
        let (placements, _) = self.store.list(PLACEMENTS, None);
        let mut stored: HashMap<JobKey, (String, Placement)> = placements
            .iter()
            .filter_map(|o| {
                let v = &o.value;
                Some((
                    job_key(&o.key.namespace, &o.key.name),
                    (
                        v["uid"].as_str()?.to_string(),
                        Placement {
                            spoke: v["spoke"].as_str().map(String::from),
                            generation: v["generation"].as_i64()?,
                        },
                    ),
                ))
            })
            .collect();
        // Listed before the TrainJobs: a snapshot is committed with its
        // TrainJob, so one whose TrainJob is not listed after is an orphan.
        let (snapshots, _) = self.store.list(crate::admission::RUNTIME_SNAPSHOTS, None);
        let (objects, rv) = self.store.list(TRAINJOBS, None);
        self.sweep_snapshots(&snapshots, &objects);
        let mut watch = match self.store.watch(TRAINJOBS, None, Some(rv)) {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(error = %e, "dispatch: watching TrainJobs");
                return;
            }
        };
        let mut seen = BTreeSet::new();
        for object in objects {
            let key = job_key(&object.key.namespace, &object.key.name);
            seen.insert(key.clone());
            let placement = stored
                .remove(&key)
                .filter(|(uid, _)| object.value["metadata"]["uid"].as_str() == Some(uid))
                .map(|(_, p)| p);
            self.upsert(&object.value, placement);
        }
        // Placements whose TrainJob is gone (deleted while the hub was down).
        for (key, _) in stored {
            if !seen.contains(&key) {
                let actions = lock(&self.state).remove_job(&key);
                self.execute(actions);
                self.write(vec![Op::Remove {
                    key: Key::new(PLACEMENTS, Some(&key.namespace), &key.name),
                }]);
            }
        }
        for event in std::mem::take(&mut watch.replay) {
            self.on_event(&event);
        }
        self.loaded.send_replace(true);
        loop {
            match watch.live.recv().await {
                Ok(event) if event.object.rv > watch.replayed_up_to && watch.matches(&event) => {
                    self.on_event(&event);
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
    }

    fn on_event(&self, event: &trainhub_apiserver::store::Event) {
        use trainhub_apiserver::store::EventType;
        let key = job_key(&event.object.key.namespace, &event.object.key.name);
        match event.kind {
            EventType::Deleted => {
                if let Some(uid) = event.object.value["metadata"]["uid"].as_str() {
                    self.observe.forget(uid);
                    self.write(vec![Op::Remove {
                        key: crate::admission::snapshot_key(&key.namespace, uid),
                    }]);
                }
                let actions = lock(&self.state).remove_job(&key);
                self.execute(actions);
            }
            _ => self.upsert(&event.object.value, None),
        }
    }

    fn upsert(&self, object: &Value, placement: Option<Placement>) {
        if placement.as_ref().is_some_and(|p| p.spoke.is_some()) {
            self.observe.resumed(object);
        }
        let Some(info) = self.job_info(object) else {
            return;
        };
        let actions = lock(&self.state).upsert_job(info, placement, self.now());
        self.execute(actions);
    }

    /// What dispatch needs of a stored TrainJob. A TrainJob whose pod sets
    /// cannot be computed is marked Failed.
    fn job_info(&self, object: &Value) -> Option<JobInfo> {
        let meta = &object["metadata"];
        let namespace = meta["namespace"].as_str()?;
        let name = meta["name"].as_str()?;
        let uid = meta["uid"].as_str()?.to_string();
        let status = &object["status"];
        // A deferral's condition written after the call already succeeded
        // (their writes race) is removed when its own write comes back.
        if is_true(status, CONDITION_PLUGINS_DEFERRED)
            && !lock(&self.deferred).keys().any(|(u, _)| *u == uid)
        {
            self.clear_deferred_condition(namespace, name, &uid);
        }
        let managed_elsewhere = object["spec"]["managedBy"]
            .as_str()
            .is_some_and(|m| m != trainhub_api::constants::MANAGED_BY_TRAINJOB_CONTROLLER);
        let want = if !meta["deletionTimestamp"].is_null() {
            Want::Delete
        } else if is_true(status, CONDITION_COMPLETE) || is_true(status, CONDITION_FAILED) {
            Want::Finished
        } else if object["spec"]["suspend"] == true || managed_elsewhere {
            Want::Suspend
        } else {
            Want::Run
        };
        let annotations = &meta["annotations"];
        let queue_ref = self
            .queues
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .resolve(object);
        let priority = match &queue_ref {
            Some((_, priority)) => *priority,
            None => annotations[ANNOTATION_PRIORITY]
                .as_str()
                .and_then(|p| p.trim().parse().ok())
                .unwrap_or(0),
        };
        let selector = match annotations[ANNOTATION_SPOKE_SELECTOR].as_str() {
            Some(s) => match LabelSelector::parse(s) {
                Ok(sel) => Some(sel),
                Err(e) => {
                    self.fail(
                        namespace,
                        name,
                        "InvalidSpokeSelector",
                        &format!("annotation {ANNOTATION_SPOKE_SELECTOR}: {}", e.message),
                    );
                    return None;
                }
            },
            None => None,
        };
        let created = meta["creationTimestamp"]
            .as_str()
            .and_then(|t| t.parse::<Timestamp>().ok())
            .map_or(0, |t| t.as_millisecond());
        let queue = if want == Want::Run {
            self.observe.queued(&uid, object, name)
        } else {
            self.observe.forget(&uid);
            tracing::Span::none()
        };
        let _queued = queue.enter();
        let pod_sets = if want == Want::Run {
            let generation = meta["generation"].as_i64().unwrap_or(0);
            let cache_key = (uid.clone(), generation);
            match self.demand.get(&cache_key) {
                Some(pod_sets) => {
                    // Computed meanwhile (say, by a call that started after
                    // one that was deferred): that step is done.
                    self.undefer(namespace, name, &uid, Step::Enforce);
                    pod_sets.as_ref().clone()
                }
                None => match self.compute_demand(object) {
                    Ok(d) => {
                        self.undefer(namespace, name, &uid, Step::Enforce);
                        let pod_sets = d.pod_sets.clone();
                        self.demand.insert(cache_key.clone(), Arc::new(d.pod_sets));
                        self.enforced.insert(cache_key, Arc::new(d.info));
                        pod_sets
                    }
                    Err(e) if e.transient => {
                        let key = Key::new(TRAINJOBS, Some(namespace), name);
                        let (ns, n) = (namespace.to_string(), name.to_string());
                        let retry_uid = uid.clone();
                        self.defer(
                            namespace,
                            name,
                            &uid,
                            Step::Enforce,
                            &e.message,
                            move |this| {
                                // Placements are committed before they are acted
                                // on, so the stored one is the TrainJob's own.
                                let Some(object) = this.store.get(&key) else {
                                    return;
                                };
                                if object.value["metadata"]["uid"].as_str() != Some(&retry_uid) {
                                    return;
                                }
                                let placement = this.stored_placement(&ns, &n, &retry_uid);
                                this.upsert(&object.value, placement);
                            },
                        );
                        // Placed on a spoke (say, after a hub restart): it
                        // stays known as placed meanwhile, so its run is not
                        // stopped as a stranger's; the retry fills its
                        // demand in.
                        if self
                            .stored_placement(namespace, name, &uid)
                            .is_some_and(|p| p.spoke.is_some())
                        {
                            Vec::new()
                        } else {
                            return None;
                        }
                    }
                    Err(e) => {
                        self.fail(namespace, name, REASON_BUILD_FAILED, &e.message);
                        return None;
                    }
                },
            }
        } else {
            Vec::new()
        };
        Some(JobInfo {
            key: job_key(namespace, name),
            uid,
            priority,
            created,
            selector,
            pod_sets,
            want,
            queue: queue_ref.map(|(q, _)| q),
        })
    }

    /// The typed TrainJob, its runtime and its plugins. The typed TrainJob
    /// is read once per spec generation and metadata (status is not what
    /// the plugins are given it for).
    fn pipeline_for(
        &self,
        object: &Value,
    ) -> Result<(Arc<TrainJob>, Arc<sdk::Runtime>, Pipeline), String> {
        let meta = &object["metadata"];
        let cache_key = (
            meta["uid"].as_str().unwrap_or_default().to_string(),
            meta["generation"].as_i64().unwrap_or(0),
            hash_of(&(meta["labels"].to_string(), meta["annotations"].to_string())),
        );
        let job = match self.typed.get(&cache_key) {
            Some(job) => job,
            None => {
                let job: TrainJob = serde_json::from_value(object.clone())
                    .map_err(|e| format!("the stored TrainJob cannot be read: {e}"))?;
                let job = Arc::new(job);
                self.typed.insert(cache_key, job.clone());
                job
            }
        };
        // The runtime and plugins it was admitted with (see
        // `TrainerAdmission::pinned`); one without a snapshot gets one now.
        let pinned = self.admission.pinned(&job)?;
        let runtime = pinned.runtime.clone();
        let pipeline = match &pinned.plugins {
            Some(ids) => Pipeline::select(&self.plugins.pinned(ids)?, &runtime),
            None => Pipeline::select(&self.plugins.snapshot(), &runtime),
        }
        .map_err(|e| e.to_string())?;
        if pinned.plugins.is_none()
            && let (Some(namespace), Some(name), Some(uid)) = (
                job.metadata.namespace.as_deref(),
                job.metadata.name.as_deref(),
                job.metadata.uid.as_deref(),
            )
        {
            let ops = crate::admission::snapshot_ops(
                self.store.as_ref(),
                namespace,
                name,
                uid,
                &runtime,
                None,
                &pipeline.plugin_ids(),
            )?;
            self.write(ops);
        }
        Ok((job, runtime, pipeline))
    }

    /// Pod sets with counts and per-pod requests, after the ML and pod
    /// group policies.
    fn compute_demand(&self, object: &Value) -> Result<Demand, StepError> {
        let (job, runtime, pipeline) = self.pipeline_for(object)?;
        let info = pipeline.enforce(&job, &runtime).map_err(StepError::from)?;
        let pod_sets = info
            .pod_sets
            .iter()
            .map(|set| {
                let mut requests = core::Resources::new();
                for container in &set.containers {
                    for q in &container.requests {
                        let milli = milli(&q.value).map_err(|e| {
                            format!(
                                "pod set {}: container {}: {}: {e}",
                                set.name, container.name, q.name
                            )
                        })?;
                        *requests.entry(q.name.clone()).or_default() += milli;
                    }
                }
                Ok(PodSetDemand {
                    name: set.name.clone(),
                    count: set.count,
                    requests_milli: requests,
                })
            })
            .collect::<Result<_, String>>()?;
        Ok(Demand { pod_sets, info })
    }

    /// Removes the runtime snapshots of TrainJobs that are gone (deleted
    /// while the hub was down). Idempotent.
    fn sweep_snapshots(
        &self,
        snapshots: &[trainhub_apiserver::store::Object],
        trainjobs: &[trainhub_apiserver::store::Object],
    ) {
        let gone = snapshots::orphans(snapshots, trainjobs);
        if !gone.is_empty() {
            self.write(gone);
        }
    }

    /// Every `interval`: the runtime versions no snapshot names (see
    /// [`snapshots`]), and snapshots left by a TrainJob deleted while its
    /// removal could not be written.
    async fn sweep_runtime_versions(self: Arc<Self>, interval: Duration) {
        let mut unreferenced = std::collections::HashSet::new();
        loop {
            tokio::time::sleep(interval).await;
            let this = self.clone();
            let before = std::mem::take(&mut unreferenced);
            let swept = tokio::task::spawn_blocking(move || {
                let (versions, _) = this.store.list(crate::admission::RUNTIME_VERSIONS, None);
                let (snapshots, _) = this.store.list(crate::admission::RUNTIME_SNAPSHOTS, None);
                let (trainjobs, _) = this.store.list(TRAINJOBS, None);
                this.sweep_snapshots(&snapshots, &trainjobs);
                let current = this.admission.current_runtime_versions();
                let (remove, now) =
                    snapshots::unused_versions(&versions, &snapshots, &current, &before);
                if !remove.is_empty() {
                    tracing::info!(
                        versions = remove.len(),
                        "removing runtime versions no TrainJob uses"
                    );
                    this.write(remove);
                }
                now
            })
            .await;
            unreferenced = swept.unwrap_or_default();
        }
    }

    /// The placement stored for a TrainJob, if it is this uid's.
    fn stored_placement(&self, namespace: &str, name: &str, uid: &str) -> Option<Placement> {
        let stored = self
            .store
            .get(&Key::new(PLACEMENTS, Some(namespace), name))?;
        let v = &stored.value;
        (v["uid"].as_str() == Some(uid)).then(|| Placement {
            spoke: v["spoke"].as_str().map(String::from),
            generation: v["generation"].as_i64().unwrap_or(0),
        })
    }

    /// A plugin call for this TrainJob could not run now (the host is
    /// overloaded): sets the `PluginsDeferred` condition, records a Warning
    /// event, and runs `retry` after the TrainJob's backoff (1 s, doubling
    /// per deferral in a row, at most 5 minutes). `retry` re-reads what it
    /// needs, so a TrainJob changed or deleted meanwhile is not acted on
    /// stale.
    fn defer(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        step: Step,
        message: &str,
        retry: impl FnOnce(Arc<Dispatch>) + Send + 'static,
    ) {
        let Some(this) = self.self_arc() else { return };
        let attempt = {
            let mut deferred = lock(&self.deferred);
            let d = deferred.entry((uid.to_string(), step)).or_default();
            if d.pending {
                return;
            }
            d.pending = true;
            d.attempts = d.attempts.saturating_add(1);
            d.attempts
        };
        let backoff = DEFER_FIRST
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(16))
            .min(DEFER_MAX);
        let message = format!("{message}; retrying in {}s", backoff.as_secs());
        tracing::warn!(trainjob = %format!("{namespace}/{name}"), attempt, message, "plugin call deferred");
        let job = job_key(namespace, name);
        let event = trainjob_event(
            &job,
            Some(uid),
            "Warning",
            REASON_PLUGIN_CALL_DEFERRED,
            &message,
        );
        self.record_events(&job, vec![event]);
        let key = Key::new(TRAINJOBS, Some(namespace), name);
        let uid = uid.to_string();
        tokio::spawn(async move {
            update_status(this.store.as_ref(), &key, |status| {
                set_condition(
                    status,
                    CONDITION_PLUGINS_DEFERRED,
                    "True",
                    REASON_PLUGIN_CALL_DEFERRED,
                    &message,
                    &format_time(Timestamp::now()),
                );
                true
            })
            .await;
            tokio::time::sleep(backoff).await;
            match lock(&this.deferred).get_mut(&(uid, step)) {
                Some(d) => d.pending = false,
                // A call succeeded meanwhile: nothing to retry.
                None => return,
            }
            retry(this);
        });
    }

    /// A plugin call of `step` for this TrainJob succeeded: if that step
    /// was deferred its backoff restarts, and once no step is, the
    /// `PluginsDeferred` condition goes.
    fn undefer(&self, namespace: &str, name: &str, uid: &str, step: Step) {
        {
            let mut deferred = lock(&self.deferred);
            if deferred.remove(&(uid.to_string(), step)).is_none()
                || deferred.keys().any(|(u, _)| u == uid)
            {
                return;
            }
        }
        self.clear_deferred_condition(namespace, name, uid);
    }

    /// Removes the `PluginsDeferred` condition, unless a step of the
    /// TrainJob is deferred again by the time it is written.
    fn clear_deferred_condition(&self, namespace: &str, name: &str, uid: &str) {
        let Some(this) = self.self_arc() else { return };
        let key = Key::new(TRAINJOBS, Some(namespace), name);
        let uid = uid.to_string();
        tokio::spawn(async move {
            update_status(this.store.as_ref(), &key, |status| {
                if lock(&this.deferred).keys().any(|(u, _)| *u == uid) {
                    return false;
                }
                let Some(conditions) = status["conditions"].as_array_mut() else {
                    return false;
                };
                let before = conditions.len();
                conditions.retain(|c| c["type"] != CONDITION_PLUGINS_DEFERRED);
                conditions.len() != before
            })
            .await;
        });
    }

    /// Marks a TrainJob Failed with `reason`.
    fn fail(&self, namespace: &str, name: &str, reason: &str, message: &str) {
        tracing::warn!(trainjob = %format!("{namespace}/{name}"), reason, message, "TrainJob failed");
        let job = job_key(namespace, name);
        let event = trainjob_event(&job, None, "Warning", reason, message);
        self.record_events(&job, vec![event]);
        let key = Key::new(TRAINJOBS, Some(namespace), name);
        let store = self.store.clone();
        let (reason, message) = (reason.to_string(), message.to_string());
        tokio::spawn(async move {
            update_status(store.as_ref(), &key, |status| {
                if is_true(status, CONDITION_FAILED) {
                    return false;
                }
                set_condition(
                    status,
                    CONDITION_FAILED,
                    "True",
                    &reason,
                    &message,
                    &format_time(Timestamp::now()),
                );
                true
            })
            .await;
        });
    }

    fn write(&self, ops: Vec<Op>) {
        let _ = self.writer.send(Write {
            ops,
            ..Write::default()
        });
    }

    /// Carries out the dispatcher's actions.
    fn execute(&self, actions: Vec<Action>) {
        for action in actions {
            match action {
                Action::Offer {
                    spoke,
                    job,
                    run_id,
                    generation,
                    pod_sets,
                } => self.send(
                    &spoke,
                    pb::hub_message::Message::Offer(pb::Offer {
                        generation,
                        namespace: job.namespace,
                        name: job.name,
                        pod_sets: pod_sets
                            .into_iter()
                            .map(|p| pb::PodSet {
                                name: p.name,
                                count: p.count,
                                requests_milli: p.requests_milli.into_iter().collect(),
                            })
                            .collect(),
                        trace_context: self.observe.offered(&run_id, &spoke, generation),
                        run_id,
                    }),
                ),
                Action::Withdraw {
                    spoke,
                    run_id,
                    generation,
                } => {
                    self.observe.withdrawn(&run_id, &spoke, generation);
                    self.send(
                        &spoke,
                        pb::hub_message::Message::Withdraw(pb::Withdraw { run_id, generation }),
                    )
                }
                Action::Stop {
                    spoke,
                    run_id,
                    generation,
                    reason,
                } => {
                    lock(&self.statuses).remove(&run_id);
                    self.send(
                        &spoke,
                        pb::hub_message::Message::Stop(pb::Stop {
                            run_id,
                            generation,
                            reason: reason.to_string(),
                        }),
                    )
                }
                Action::Commit { job, placement } => self.commit_placement(job, placement),
                Action::Forget { job } => {
                    let mut ops = vec![Op::Remove {
                        key: Key::new(PLACEMENTS, Some(&job.namespace), &job.name),
                    }];
                    let pods = lock(&self.pods).remove(&job).unwrap_or_default();
                    ops.extend(pods.into_keys().map(|pod| Op::Remove {
                        key: Key::new(PODS, Some(&job.namespace), &pod),
                    }));
                    let events = lock(&self.events).remove(&job).unwrap_or_default();
                    ops.extend(events.into_iter().map(|event| Op::Remove {
                        key: Key::new(EVENTS, Some(&job.namespace), &event),
                    }));
                    self.write(ops);
                }
                Action::Start {
                    spoke,
                    job,
                    run_id,
                    generation,
                } => self.start(spoke, job, run_id, generation),
                Action::Release { job, uid } => self.release(job, uid),
                Action::Event {
                    job,
                    uid,
                    warning,
                    reason,
                    message,
                } => {
                    let kind = if warning { "Warning" } else { "Normal" };
                    let event = trainjob_event(&job, Some(&uid), kind, reason, &message);
                    self.record_events(&job, vec![event]);
                }
                // Only TrainJobs in a queue are evicted; queues are not
                // wired yet.
                Action::Evicted {
                    job,
                    uid,
                    reason,
                    message,
                    preemption,
                } => {
                    // The Preempted condition says what the Evicted one
                    // does, as Kueue's do.
                    let preempted = preemption.map(|p| (p.reason, message.clone()));
                    let eviction = queues::Eviction {
                        uid,
                        reason,
                        message,
                        preempted,
                    };
                    lock(&self.evictions).insert(job, eviction);
                }
            }
        }
    }

    /// Removes [`FINALIZER`] from the deleted TrainJob `uid`; with it the
    /// last finalizer, the TrainJob goes (as the API server does when an
    /// update removes the last finalizer of a deleting object). Idempotent:
    /// a TrainJob without the finalizer, or another object under the same
    /// name, is left alone.
    fn release(&self, job: JobKey, uid: String) {
        tracing::info!(trainjob = %job, "TrainJob released: the hub's finalizer goes (its run finished, or was stopped or given up)");
        let _ = self.writer.send(Write {
            edit: Some((
                Key::new(TRAINJOBS, Some(&job.namespace), &job.name),
                Edit::Release { uid },
            )),
            ..Write::default()
        });
    }

    fn commit_placement(&self, job: JobKey, placement: Placement) {
        let Some(uid) = self
            .store
            .get(&Key::new(TRAINJOBS, Some(&job.namespace), &job.name))
            .and_then(|o| o.value["metadata"]["uid"].as_str().map(String::from))
        else {
            return;
        };
        let value = json!({
            "uid": uid.clone(),
            "spoke": placement.spoke,
            "generation": placement.generation,
            "time": format_time(Timestamp::now()),
        });
        let key = Key::new(PLACEMENTS, Some(&job.namespace), &job.name);
        // The spoke annotation and the finalizer go in the same commit.
        let edit = (
            Key::new(TRAINJOBS, Some(&job.namespace), &job.name),
            Edit::Placed {
                uid: uid.clone(),
                spoke: placement.spoke.clone(),
            },
        );
        let done: Option<Box<dyn FnOnce(bool) + Send>> = if placement.spoke.is_some() {
            let this = self.self_arc();
            Some(Box::new(move |ok| {
                if let Some(this) = this {
                    if ok && let Some(spoke) = &placement.spoke {
                        this.observe.placed(&uid, spoke, placement.generation);
                        let event = trainjob_event(
                            &job,
                            Some(&uid),
                            "Normal",
                            core::reason::PLACED,
                            &format!(
                                "Placed on spoke {spoke} (placement {})",
                                placement.generation
                            ),
                        );
                        this.record_events(&job, vec![event]);
                    }
                    let actions = lock(&this.state).committed(&job, &placement, ok, this.now());
                    this.execute(actions);
                }
            }))
        } else {
            None
        };
        let _ = self.writer.send(Write {
            ops: vec![Op::Put { key, value }],
            merge: None,
            edit: Some(edit),
            done,
        });
    }

    /// Builds the objects for `spoke` and sends them.
    fn start(&self, spoke: String, job: JobKey, run_id: String, generation: i64) {
        let Some(this) = self.self_arc() else { return };
        tokio::spawn(async move {
            let Some(object) =
                this.store
                    .get(&Key::new(TRAINJOBS, Some(&job.namespace), &job.name))
            else {
                return;
            };
            let target = {
                let sessions = lock(&this.sessions);
                let Some(session) = sessions.get(&spoke) else {
                    // Gone meanwhile: the next hello starts it again.
                    return;
                };
                sdk::Target {
                    name: spoke.clone(),
                    labels: session
                        .labels
                        .iter()
                        .map(|(k, v)| sdk::KeyValue {
                            key: k.clone(),
                            value: v.clone(),
                        })
                        .collect(),
                    resources: session
                        .allocatable
                        .iter()
                        .map(|(name, milli)| sdk::Quantity {
                            name: name.clone(),
                            value: format!("{milli}m"),
                        })
                        .collect(),
                }
            };
            let span = this.observe.build(&run_id, &spoke, generation);
            let built = {
                let this = this.clone();
                let value = object.value.clone();
                let span = span.clone();
                tokio::task::spawn_blocking(move || {
                    let _build = span.enter();
                    let (job, runtime, pipeline) = this.pipeline_for(&value)?;
                    let generation = value["metadata"]["generation"].as_i64().unwrap_or(0);
                    let uid = value["metadata"]["uid"].as_str().unwrap_or_default();
                    let built = match this.enforced.get(&(uid.to_string(), generation)) {
                        Some(info) => pipeline.build_enforced(&job, info.as_ref().clone(), &target),
                        None => pipeline.build(&job, &runtime, &target),
                    };
                    let mut rendered = built.map_err(StepError::from)?;
                    if let Some(reporting) = this.trainer_status.get() {
                        let meta = &value["metadata"];
                        let namespace = meta["namespace"].as_str().unwrap_or_default();
                        let name = meta["name"].as_str().unwrap_or_default();
                        reporting
                            .add_to(&mut rendered.objects, namespace, name, uid)
                            .map_err(|e| StepError {
                                message: format!("the trainer's status token: {e}"),
                                transient: true,
                            })?;
                    }
                    Ok::<_, StepError>(rendered)
                })
                .await
                .unwrap_or_else(|e| Err(format!("the build task failed: {e}").into()))
            };
            let uid = object.value["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if built.is_ok() {
                this.undefer(&job.namespace, &job.name, &uid, Step::Build);
            }
            match built {
                Ok(rendered) => {
                    let objects_json = rendered.objects.iter().map(Value::to_string).collect();
                    this.send(
                        &spoke,
                        pb::hub_message::Message::Start(pb::Start {
                            run_id,
                            generation,
                            namespace: job.namespace.clone(),
                            name: job.name.clone(),
                            trainjob_uid: object.value["metadata"]["uid"]
                                .as_str()
                                .unwrap_or_default()
                                .to_string(),
                            objects_json,
                            trace_context: trainhub_telemetry::propagation::inject(&span),
                        }),
                    );
                }
                Err(e) if e.transient => {
                    let (namespace, name) = (job.namespace.clone(), job.name.clone());
                    let retry_uid = uid.clone();
                    this.defer(
                        &namespace,
                        &name,
                        &uid,
                        Step::Build,
                        &e.message,
                        move |this| {
                            // Only while this run is still the placement the
                            // store holds: never a Start for a superseded run.
                            let current =
                                this.stored_placement(&job.namespace, &job.name, &retry_uid);
                            if current.is_some_and(|p| {
                                p.generation == generation && p.spoke.as_deref() == Some(&spoke)
                            }) {
                                this.start(spoke, job, run_id, generation);
                            }
                        },
                    );
                }
                Err(e) => this.fail(&job.namespace, &job.name, REASON_BUILD_FAILED, &e.message),
            }
        });
    }

    fn self_arc(&self) -> Option<Arc<Dispatch>> {
        self.me.upgrade()
    }

    fn send(&self, spoke: &str, message: pb::hub_message::Message) {
        if let Some(session) = lock(&self.sessions).get(spoke) {
            let _ = session.tx.send(pb::HubMessage {
                message: Some(message),
            });
        }
    }

    // ------------------------------------------------------------ spokes

    /// The spokes' sessions and certificates.
    pub fn spokes(&self) -> &Arc<crate::spokes::Registry> {
        &self.spokes
    }

    /// Cordons or uncordons a spoke (its `Spoke.spec.unschedulable`).
    pub fn set_unschedulable(&self, spoke: &str, unschedulable: bool) {
        let actions = lock(&self.state).set_unschedulable(spoke, unschedulable, self.now());
        self.execute(actions);
    }

    /// What dispatch knows of each spoke, for the `Spoke` objects' status.
    pub fn spoke_views(&self) -> std::collections::BTreeMap<String, core::SpokeView> {
        lock(&self.state).spoke_views()
    }

    /// Ends the open session of `spoke`, if any, telling it `reason`; the
    /// spoke is then disconnected (its runs follow the worker-lost path).
    pub fn close_session(&self, spoke: &str, reason: &str) {
        if let Some(session) = lock(&self.sessions).get(spoke) {
            let _ = session.close.send(Some(reason.to_string()));
        }
    }

    /// Ends every open session, telling each spoke `reason` (this replica
    /// stopped leading: the spokes go to the new leader).
    pub fn close_all_sessions(&self, reason: &str) {
        for session in lock(&self.sessions).values() {
            let _ = session.close.send(Some(reason.to_string()));
        }
    }

    // ------------------------------------------------------------ sessions

    /// How long a session may stay silent before it is ended.
    pub fn spoke_silence(&self) -> Duration {
        self.config.spoke_silence
    }

    /// Whether a spoke's hello may open a session: its fence-after must be
    /// set and strictly shorter than the worker-lost timeout, so that a
    /// spoke cut off from the hub stops its runs before the hub places
    /// them elsewhere.
    ///
    /// # Errors
    ///
    /// The rule broken, naming both values (a FailedPrecondition).
    pub fn check_hello(&self, hello: &pb::Hello) -> Result<(), String> {
        check_fence_after(
            hello.fence_after_ms,
            self.config.core.worker_lost_timeout_ms,
        )
    }

    /// A spoke said hello on a new stream. Returns the session id that its
    /// later calls carry.
    ///
    /// One live session per spoke: a newer session of the same spoke
    /// replaces it, and the older one is closed (`close` gets the reason;
    /// its stream ends), its pending offers count as refused and its log
    /// streams end. A spoke only opens a session after its previous one
    /// ended on its side, so what the old stream still carried is stale.
    pub fn connect(
        &self,
        spoke: &str,
        hello: pb::Hello,
        tx: mpsc::UnboundedSender<pb::HubMessage>,
        close: tokio::sync::watch::Sender<Option<String>>,
    ) -> u64 {
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut labels: Vec<(String, String)> = hello.labels.into_iter().collect();
        labels.sort();
        let labels_json = Value::Object(
            labels
                .iter()
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect(),
        );
        let capacity = capacity_of(&hello.capacity);
        self.observe.spoke_seen(spoke, &capacity, true);
        let replaced = lock(&self.sessions).insert(
            spoke.to_string(),
            Session {
                id,
                tx,
                close,
                labels,
                allocatable: capacity.iter().map(|(r, a, _)| (r.clone(), *a)).collect(),
            },
        );
        if let Some(old) = replaced {
            tracing::warn!(
                spoke,
                session = old.id,
                by = id,
                "a newer session of the spoke replaced its open one, which is closed"
            );
            let _ = old.close.send(Some(format!(
                "session replaced by a newer session of spoke {spoke:?} (one live session per spoke)"
            )));
            self.end_logs(spoke, old.id, "the spoke's session was replaced");
            let actions = lock(&self.state).spoke_disconnected(spoke, self.now());
            self.execute(actions);
        }
        for lost in hello.runs.iter().filter(|r| r.lost) {
            tracing::warn!(spoke, run = %lost.run_id, generation = lost.generation, reason = %lost.reason, "the spoke reports a run lost");
            let actions = lock(&self.state).run_lost(
                spoke,
                &lost.run_id,
                lost.generation,
                &lost.reason,
                self.now(),
            );
            self.execute(actions);
        }
        let held: Vec<(String, i64)> = hello
            .runs
            .iter()
            .map(|r| (r.run_id.clone(), r.generation))
            .collect();
        tracing::info!(spoke, backend = %hello.backend, runs = held.len(), "spoke connected");
        let actions =
            lock(&self.state).spoke_connected(spoke, labels_json, capacity, &held, self.now());
        self.execute(actions);
        id
    }

    /// The stream of session `id` ended.
    pub fn disconnect(&self, spoke: &str, id: u64) {
        {
            let mut sessions = lock(&self.sessions);
            if sessions.get(spoke).is_none_or(|s| s.id != id) {
                return;
            }
            sessions.remove(spoke);
        }
        self.end_logs(spoke, id, "the spoke disconnected");
        tracing::warn!(spoke, "spoke disconnected");
        let actions = lock(&self.state).spoke_disconnected(spoke, self.now());
        self.execute(actions);
    }

    /// One message of session `session` of a spoke.
    ///
    /// Reports and heartbeats of a session that a newer one has replaced are
    /// dropped: the spoke switched to the new session only after putting a
    /// fresh report of every run it holds on it, so whatever the old session
    /// still carries is older than what the hub has (or is about to have)
    /// from the new one, and taking it would set a TrainJob's status back.
    /// Admission answers still count (a late one is withdrawn like any
    /// other); log chunks go only to streams the same session was asked to
    /// serve, and a replaced session's streams have ended.
    ///
    /// Never waits: a chunk for a log reader that is not keeping up drops
    /// that reader, not the session.
    pub fn on_message(&self, spoke: &str, session: u64, message: pb::spoke_message::Message) {
        use pb::spoke_message::Message;
        if matches!(message, Message::Report(_) | Message::Heartbeat(_))
            && lock(&self.sessions)
                .get(spoke)
                .is_none_or(|s| s.id != session)
        {
            match &message {
                Message::Report(report) => {
                    tracing::info!(spoke, session, run = %report.run_id, seq = report.seq, "dropped a report of a replaced session");
                }
                _ => tracing::debug!(spoke, session, "dropped a heartbeat of a replaced session"),
            }
            return;
        }
        match message {
            Message::Hello(_) => {
                tracing::warn!(spoke, "second hello on one stream ignored");
            }
            Message::Heartbeat(hb) => {
                // The spoke's proof that the hub hears it (it fences itself
                // when these stop).
                self.send(
                    spoke,
                    pb::hub_message::Message::HeartbeatAck(pb::HeartbeatAck {
                        worker_lost_timeout_ms: i64::try_from(
                            self.config.core.worker_lost_timeout_ms,
                        )
                        .unwrap_or(i64::MAX),
                    }),
                );
                let capacity = capacity_of(&hb.capacity);
                self.observe.spoke_seen(spoke, &capacity, false);
                if let Some(s) = lock(&self.sessions).get_mut(spoke) {
                    s.allocatable = capacity.iter().map(|(r, a, _)| (r.clone(), *a)).collect();
                }
                let reservations: Vec<(String, i64)> = hb
                    .reservations
                    .iter()
                    .map(|r| (r.run_id.clone(), r.generation))
                    .collect();
                let actions =
                    lock(&self.state).spoke_heartbeat(spoke, capacity, &reservations, self.now());
                self.execute(actions);
            }
            Message::Admit(answer) => {
                if !answer.admitted {
                    tracing::debug!(spoke, run = %answer.run_id, reason = %answer.reason, "offer refused");
                }
                let actions = lock(&self.state).admit_answer(
                    spoke,
                    &answer.run_id,
                    answer.generation,
                    answer.admitted,
                    self.now(),
                );
                self.execute(actions);
            }
            Message::Report(report) => self.on_report(spoke, report),
            Message::Log(chunk) => self.on_log_chunk(spoke, session, chunk),
            Message::Stopped(stopped) => {
                tracing::debug!(spoke, run = %stopped.run_id, generation = stopped.generation, "run stopped");
                let actions =
                    lock(&self.state).run_stopped(spoke, &stopped.run_id, stopped.generation);
                self.execute(actions);
            }
        }
    }

    /// A chunk of a log stream: handed to its reader without waiting. Only
    /// the session the stream was asked of may write to it; a reader whose
    /// buffer is full is dropped (its stream ends with an error, the spoke
    /// is told to stop), so no reader ever holds up the session.
    fn on_log_chunk(&self, spoke: &str, session: u64, chunk: pb::LogChunk) {
        use tokio::sync::mpsc::error::TrySendError;
        let mut logs = lock(&self.logs);
        let Some(stream) = logs.get(&chunk.request_id) else {
            // Cancelled meanwhile, or never asked for.
            tracing::debug!(spoke, "a log chunk for no open stream dropped");
            return;
        };
        if stream.spoke != spoke || stream.session != session {
            tracing::warn!(
                spoke,
                session,
                "refused a log chunk for a stream this session was not asked to serve"
            );
            return;
        }
        let mut ended = None;
        let mut cancel = false;
        if !chunk.data.is_empty() {
            match stream.tx.try_send(Bytes::from(chunk.data)) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) => {
                    tracing::info!(spoke, "dropped a log stream whose reader fell behind");
                    ended = Some(format!(
                        "the log reader fell behind: more than {LOG_BUFFER_CHUNKS} chunks waited to be read, so the stream was closed; read the log again"
                    ));
                    cancel = true;
                }
                Err(TrySendError::Closed(_)) => cancel = true,
            }
        }
        if ended.is_none() && !chunk.error.is_empty() {
            ended = Some(chunk.error);
        }
        if !(chunk.eof || cancel || ended.is_some()) {
            return;
        }
        let Some(stream) = logs.remove(&chunk.request_id) else {
            return;
        };
        drop(logs);
        if let Some(error) = ended {
            *lock(&stream.ended) = Some(error);
        }
        if cancel && !chunk.eof {
            self.send(
                spoke,
                pb::hub_message::Message::LogRequest(pb::LogRequest {
                    request_id: chunk.request_id,
                    cancel: true,
                    ..Default::default()
                }),
            );
        }
    }

    /// Ends the log streams that session `session` of `spoke` served.
    fn end_logs(&self, spoke: &str, session: u64, why: &str) {
        let ended: Vec<LogStream> = {
            let mut logs = lock(&self.logs);
            let ids: Vec<String> = logs
                .iter()
                .filter(|(_, s)| s.spoke == spoke && s.session == session)
                .map(|(id, _)| id.clone())
                .collect();
            ids.iter().filter_map(|id| logs.remove(id)).collect()
        };
        for stream in ended {
            *lock(&stream.ended) = Some(why.to_string());
        }
    }

    /// A run report: taken if the run is placed on this spoke, else refused
    /// (and the run stopped: it must not run there). Of a taken report,
    /// only the pods and events of that run are written (see
    /// [`authority`]); the others are refused and logged with the spoke's
    /// name.
    fn on_report(&self, spoke: &str, report: pb::RunReport) {
        let verdict = lock(&self.state).check_run(spoke, &report.run_id, report.generation);
        let key = match verdict {
            Verdict::Accept(key) => key,
            Verdict::Stale | Verdict::Foreign => {
                if verdict == Verdict::Foreign {
                    tracing::warn!(
                        spoke,
                        run = %report.run_id,
                        generation = report.generation,
                        "refused a report on a run not placed on this spoke"
                    );
                }
                self.send(
                    spoke,
                    pb::hub_message::Message::Stop(pb::Stop {
                        run_id: report.run_id,
                        generation: report.generation,
                        reason: "not placed on this spoke".into(),
                    }),
                );
                return;
            }
        };
        self.observe.reported(&report.run_id, spoke);
        self.show_pods(spoke, &key, &report);
        self.record_spoke_events(spoke, &key, &report);
        let status_hash = hash_of(&report.jobset_status_json);
        let changed =
            lock(&self.statuses).insert(report.run_id.clone(), status_hash) != Some(status_hash);
        if changed
            && let Err(message) = self.map_status(&key, &report.run_id, &report.jobset_status_json)
        {
            tracing::warn!(trainjob = %key, message, "mapping the run's status");
        }
    }

    /// Refuses an object a spoke reported: logged with the spoke's name.
    fn refuse(&self, spoke: &str, job: &JobKey, run_id: &str, what: &str, why: &str) {
        tracing::warn!(
            spoke,
            trainjob = %job,
            run = run_id,
            refused = why,
            "refused {what} a spoke reported: a spoke writes only the objects of the runs placed on it"
        );
    }

    /// Whether the object at `key` in the store, if any, is someone else's
    /// than run `run_id` (another run's, or the hub's own).
    fn owned_by_other(&self, key: &Key, run_id: &str) -> Option<String> {
        let existing = self.store.get(key)?;
        let run = existing.value["metadata"]["annotations"][ANNOTATION_RUN].as_str();
        match run.map(|r| r.rsplit_once('.').map_or(r, |(id, _)| id)) {
            Some(id) if id == run_id => None,
            Some(id) => Some(format!("{key} exists and belongs to run {id}")),
            None => Some(format!("{key} exists and was not written by a spoke")),
        }
    }

    /// Why `name` belongs to another TrainJob of the namespace than `job`:
    /// a longer TrainJob name that it matches by its pod sets.
    fn other_owner(&self, name: &str, job: &JobKey) -> Option<String> {
        let state = lock(&self.state);
        let ours = state.pod_set_names(job).unwrap_or_default();
        if authority::of_pod_sets(name, &job.name, &ours) {
            return None;
        }
        authority::longer_owners(name, &job.name).find_map(|other| {
            let other_key = job_key(&job.namespace, other);
            let sets = state.pod_set_names(&other_key)?;
            authority::of_pod_sets(name, other, &sets)
                .then(|| format!("{name:?} is a pod name of TrainJob {other_key}"))
        })
    }

    /// Writes the Events of a report into the TrainJob's namespace, each
    /// marked with the run (a spoke's events keep their names, so a resent
    /// one is rewritten, not duplicated).
    fn record_spoke_events(&self, spoke: &str, job: &JobKey, report: &pb::RunReport) {
        let run = format!("{}.{}", report.run_id, report.generation);
        let mut taken = Vec::new();
        for raw in &report.events_json {
            let Ok(mut event) = serde_json::from_str::<Value>(raw) else {
                self.refuse(spoke, job, &report.run_id, "an event", "not JSON");
                continue;
            };
            let name = match authority::check_event(&event, job) {
                Ok(name) => name,
                Err(why) => {
                    self.refuse(spoke, job, &report.run_id, "an event", &why);
                    continue;
                }
            };
            let involved = event["involvedObject"]["name"].as_str().unwrap_or_default();
            if let Some(why) = self.other_owner(involved, job) {
                self.refuse(spoke, job, &report.run_id, "an event", &why);
                continue;
            }
            let known = lock(&self.events)
                .get(job)
                .map(|names| (names.contains(&name), names.len()));
            if known.is_some_and(|(_, n)| n >= MAX_EVENTS_PER_TRAINJOB)
                && !known.is_some_and(|(k, _)| k)
            {
                let why = format!(
                    "the TrainJob has {MAX_EVENTS_PER_TRAINJOB} events, the most a TrainJob keeps"
                );
                self.refuse(spoke, job, &report.run_id, "an event", &why);
                break;
            }
            if !known.is_some_and(|(k, _)| k)
                && let Some(why) = self.owned_by_other(
                    &Key::new(EVENTS, Some(&job.namespace), &name),
                    &report.run_id,
                )
            {
                self.refuse(spoke, job, &report.run_id, "an event", &why);
                continue;
            }
            event["apiVersion"] = "v1".into();
            event["kind"] = "Event".into();
            if !event["metadata"]["annotations"].is_object() {
                event["metadata"]["annotations"] = json!({});
            }
            event["metadata"]["annotations"][ANNOTATION_SPOKE] = spoke.into();
            event["metadata"]["annotations"][ANNOTATION_RUN] = run.clone().into();
            taken.push(event);
        }
        self.record_events(job, taken);
    }

    /// Writes Events into the TrainJob's namespace.
    fn record_events(&self, job: &JobKey, events: Vec<Value>) {
        let mut ops = Vec::new();
        let mut written = lock(&self.events);
        let names = written.entry(job.clone()).or_default();
        for mut event in events {
            let Some(name) = event["metadata"]["name"].as_str().map(String::from) else {
                continue;
            };
            event["metadata"]["namespace"] = job.namespace.clone().into();
            if event["involvedObject"].is_object() {
                event["involvedObject"]["namespace"] = job.namespace.clone().into();
            }
            if let Some(m) = event["metadata"].as_object_mut() {
                m.remove("resourceVersion");
            }
            names.insert(name.clone());
            ops.push(Op::Put {
                key: Key::new(EVENTS, Some(&job.namespace), &name),
                value: event,
            });
        }
        drop(written);
        if !ops.is_empty() {
            self.write(ops);
        }
    }

    /// Writes the pods a report shows, removes those it no longer shows.
    /// A pod that is not the run's (see [`authority`]), or whose name
    /// another run's pod holds, is refused.
    fn show_pods(&self, spoke: &str, key: &JobKey, report: &pb::RunReport) {
        let mut candidates = Vec::new();
        let mut present = BTreeSet::new();
        let shown_before: HashMap<String, u64> =
            lock(&self.pods).get(key).cloned().unwrap_or_default();
        for raw in &report.pods_json {
            let Ok(pod) = serde_json::from_str::<Value>(raw) else {
                self.refuse(spoke, key, &report.run_id, "a pod", "not JSON");
                continue;
            };
            let name = match authority::check_pod(&pod, key) {
                Ok(name) => name,
                Err(why) => {
                    self.refuse(spoke, key, &report.run_id, "a pod", &why);
                    continue;
                }
            };
            if let Some(why) = self.other_owner(&name, key) {
                self.refuse(spoke, key, &report.run_id, "a pod", &why);
                continue;
            }
            let hash = hash_of(&(spoke, report.generation, raw));
            if shown_before.get(&name) == Some(&hash) {
                present.insert(name);
                continue;
            }
            if !shown_before.contains_key(&name)
                && let Some(why) = self
                    .owned_by_other(&Key::new(PODS, Some(&key.namespace), &name), &report.run_id)
            {
                self.refuse(spoke, key, &report.run_id, "a pod", &why);
                continue;
            }
            present.insert(name.clone());
            candidates.push((name, hash, pod));
        }
        let mut ops = Vec::new();
        let mut pods = lock(&self.pods);
        let shown = pods.entry(key.clone()).or_default();
        for (name, hash, mut pod) in candidates {
            shown.insert(name.clone(), hash);
            pod["apiVersion"] = "v1".into();
            pod["kind"] = "Pod".into();
            let meta = &mut pod["metadata"];
            meta["namespace"] = key.namespace.clone().into();
            if !meta["annotations"].is_object() {
                meta["annotations"] = json!({});
            }
            meta["annotations"][ANNOTATION_SPOKE] = spoke.into();
            meta["annotations"][ANNOTATION_RUN] =
                format!("{}.{}", report.run_id, report.generation).into();
            if meta["labels"][LABEL_JOBSET_NAME].is_null() {
                if !meta["labels"].is_object() {
                    meta["labels"] = json!({});
                }
                meta["labels"][LABEL_JOBSET_NAME] = key.name.clone().into();
            }
            if let Some(m) = meta.as_object_mut() {
                m.remove("resourceVersion");
            }
            // The spoke is where the pod runs: `kubectl get pods -o wide`
            // shows it as the node.
            if pod["spec"].is_object() && pod["spec"]["nodeName"].is_null() {
                pod["spec"]["nodeName"] = spoke.into();
            }
            ops.push(Op::Put {
                key: Key::new(PODS, Some(&key.namespace), &name),
                value: pod,
            });
        }
        let gone: Vec<String> = shown
            .keys()
            .filter(|n| !present.contains(*n))
            .cloned()
            .collect();
        for name in gone {
            shown.remove(&name);
            ops.push(Op::Remove {
                key: Key::new(PODS, Some(&key.namespace), &name),
            });
        }
        drop(pods);
        if !ops.is_empty() {
            self.write(ops);
        }
    }

    /// PostExecution: the TrainJob's status from the JobSet status, merged
    /// by the writer in the order reports arrived. A deferred call is
    /// retried with backoff for as long as no newer status of the run came.
    fn map_status(
        &self,
        key: &JobKey,
        run_id: &str,
        jobset_status_json: &str,
    ) -> Result<(), String> {
        if jobset_status_json.is_empty() {
            return Ok(());
        }
        let observed: JobSetStatus = serde_json::from_str(jobset_status_json)
            .map_err(|e| format!("the JobSet status reported is not readable: {e}"))?;
        let store_key = Key::new(TRAINJOBS, Some(&key.namespace), &key.name);
        let Some(object) = self.store.get(&store_key) else {
            return Ok(());
        };
        let (job, _, pipeline) = self.pipeline_for(&object.value)?;
        let uid = object.value["metadata"]["uid"].as_str().unwrap_or_default();
        let span = self.observe.status(uid);
        let mapped = match span.in_scope(|| pipeline.status(&job, &observed)) {
            Ok(mapped) => {
                self.undefer(&key.namespace, &key.name, uid, Step::Status);
                mapped
            }
            Err(e) if e.is_transient() => {
                let hash = hash_of(&jobset_status_json);
                let (retry_key, retry_uid, run_id, json) = (
                    key.clone(),
                    uid.to_string(),
                    run_id.to_string(),
                    jobset_status_json.to_string(),
                );
                self.defer(
                    &key.namespace,
                    &key.name,
                    uid,
                    Step::Status,
                    &e.to_string(),
                    move |this| {
                        let latest = lock(&this.statuses).get(&run_id) == Some(&hash);
                        if !latest {
                            // A newer status of the run came and was mapped.
                            let (ns, name) = (&retry_key.namespace, &retry_key.name);
                            this.undefer(ns, name, &retry_uid, Step::Status);
                            return;
                        }
                        if let Err(message) = this.map_status(&retry_key, &run_id, &json) {
                            tracing::warn!(trainjob = %retry_key, message, "mapping the run's status");
                        }
                    },
                );
                return Ok(());
            }
            Err(e) => return Err(e.to_string()),
        };
        let Some(mapped) = mapped else {
            return Ok(());
        };
        self.observe.status_mapped(uid, &span, &mapped);
        let mut mapped = serde_json::to_value(&mapped).map_err(|e| e.to_string())?;
        // The plugin was given the TrainJob as it was typed (cached per
        // generation and metadata); conditions it returns as it was given
        // them are not its news, and would set back conditions others
        // (quota) wrote since.
        let given = serde_json::to_value(&job.status).unwrap_or_default();
        if let (Some(out), Some(given)) = (
            mapped["conditions"].as_array_mut(),
            given["conditions"].as_array(),
        ) {
            out.retain(|c| !given.contains(c));
        }
        let _ = self.writer.send(Write {
            merge: Some((store_key, mapped)),
            ..Write::default()
        });
        Ok(())
    }

    /// A log stream of a pod the hub shows, from the spoke that runs it.
    pub(crate) fn open_logs(
        &self,
        pod: &Value,
        container: Option<&str>,
        follow: bool,
        tail_lines: Option<i64>,
    ) -> Result<ByteStream, ApiError> {
        let meta = &pod["metadata"];
        let name = meta["name"].as_str().unwrap_or_default();
        let spoke = meta["annotations"][ANNOTATION_SPOKE]
            .as_str()
            .unwrap_or_default();
        let run = meta["annotations"][ANNOTATION_RUN]
            .as_str()
            .unwrap_or_default();
        let run_id = run.rsplit_once('.').map_or(run, |(id, _)| id);
        let container = container
            .map(String::from)
            .or_else(|| {
                pod["spec"]["containers"][0]["name"]
                    .as_str()
                    .map(String::from)
            })
            .unwrap_or_default();
        let session = lock(&self.sessions)
            .get(spoke)
            .map(|s| (s.id, s.tx.clone()));
        let Some((session, tx)) = session else {
            return Err(ApiError::unavailable(format!(
                "the logs of pod {name:?} are on spoke {spoke:?}, which is not connected"
            )));
        };
        let request_id = log_stream_id()?;
        let (chunk_tx, chunk_rx) = mpsc::channel(LOG_BUFFER_CHUNKS);
        let ended = Arc::new(Mutex::new(None));
        lock(&self.logs).insert(
            request_id.clone(),
            LogStream {
                spoke: spoke.to_string(),
                session,
                tx: chunk_tx,
                ended: ended.clone(),
            },
        );
        let _ = tx.send(pb::HubMessage {
            message: Some(pb::hub_message::Message::LogRequest(pb::LogRequest {
                request_id: request_id.clone(),
                run_id: run_id.to_string(),
                pod: name.to_string(),
                container,
                follow,
                tail_lines: tail_lines.unwrap_or(-1),
                cancel: false,
            })),
        });
        let guard = LogGuard {
            request_id,
            run_id: run_id.to_string(),
            tx,
            logs: self.self_arc(),
        };
        // The buffered chunks, then the reason the stream ended early, if
        // it did.
        let stream =
            futures_util::stream::unfold(Some((chunk_rx, guard, ended)), |state| async move {
                let (mut rx, guard, ended) = state?;
                match rx.recv().await {
                    Some(bytes) => Some((Ok(bytes), Some((rx, guard, ended)))),
                    None => {
                        let error = lock(&ended).take()?;
                        Some((Err(std::io::Error::other(error)), None))
                    }
                }
            });
        Ok(Box::pin(stream))
    }
}

/// Cancels a log request on the spoke when its reader goes away.
struct LogGuard {
    request_id: String,
    run_id: String,
    tx: mpsc::UnboundedSender<pb::HubMessage>,
    logs: Option<Arc<Dispatch>>,
}

impl Drop for LogGuard {
    fn drop(&mut self) {
        let open = self
            .logs
            .as_ref()
            .is_some_and(|d| lock(&d.logs).remove(&self.request_id).is_some());
        if open {
            let _ = self.tx.send(pb::HubMessage {
                message: Some(pb::hub_message::Message::LogRequest(pb::LogRequest {
                    request_id: self.request_id.clone(),
                    run_id: self.run_id.clone(),
                    cancel: true,
                    ..Default::default()
                })),
            });
        }
    }
}

/// The pod log source the API server serves `pods/log` from.
pub struct SpokeLogs(pub Arc<Dispatch>);

impl LogSource for SpokeLogs {
    fn logs(
        &self,
        pod: &Value,
        container: Option<&str>,
        follow: bool,
        tail_lines: Option<i64>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<ByteStream, ApiError>> + Send>>
    {
        let result = self.0.open_logs(pod, container, follow, tail_lines);
        Box::pin(async move { result })
    }
}

/// The pod log source of a hub replica: the spokes' sessions live on the
/// leader, so a replica serves logs while it leads and refuses with 503
/// (retry later, or ask the leader) while it follows.
pub struct LeaderLogs(pub tokio::sync::watch::Receiver<Option<Arc<Dispatch>>>);

impl LogSource for LeaderLogs {
    fn logs(
        &self,
        pod: &Value,
        container: Option<&str>,
        follow: bool,
        tail_lines: Option<i64>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<ByteStream, ApiError>> + Send>>
    {
        let current = self.0.borrow().clone();
        let result = match current {
            Some(dispatch) => dispatch.open_logs(pod, container, follow, tail_lines),
            None => Err(ApiError::new(
                503,
                "ServiceUnavailable",
                "pod logs are streamed by the leading hub replica, where the spokes' sessions are; this replica follows: retry (a load balancer in front of the replicas tries another)",
            )),
        };
        Box::pin(async move { result })
    }
}

/// The log source of a replica that serves logs while `current` holds the
/// dispatch of its term.
pub fn leader_log_source(
    current: tokio::sync::watch::Receiver<Option<Arc<Dispatch>>>,
) -> Arc<dyn LogSource> {
    Arc::new(LeaderLogs(current))
}

impl Dispatch {
    /// The log source for the API server.
    pub fn log_source(self: &Arc<Self>) -> Arc<dyn LogSource> {
        Arc::new(SpokeLogs(self.clone()))
    }
}

/// An Event the hub records on a TrainJob.
fn trainjob_event(
    job: &JobKey,
    uid: Option<&str>,
    kind: &str,
    reason: &str,
    message: &str,
) -> Value {
    let now = Timestamp::now();
    let mut involved = json!({
        "apiVersion": format!("{}/v1alpha1", trainhub_api::constants::TRAINER_GROUP),
        "kind": "TrainJob",
        "name": job.name,
        "namespace": job.namespace,
    });
    if let Some(uid) = uid {
        involved["uid"] = uid.into();
    }
    let time = format_time(now);
    json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": format!("{}.{:016x}", job.name, hash_of(&(reason, message, now.as_nanosecond()))),
        },
        "involvedObject": involved,
        "type": kind,
        "reason": reason,
        "message": message,
        "source": {"component": "trainhub"},
        "reportingComponent": "trainhub",
        "firstTimestamp": time,
        "lastTimestamp": time,
        "count": 1,
    })
}

fn capacity_of(capacity: &[pb::Capacity]) -> Vec<(String, i64, i64)> {
    capacity
        .iter()
        .map(|c| (c.resource.clone(), c.allocatable_milli, c.free_milli))
        .collect()
}

/// A Kubernetes quantity in milli-units, rounded up.
pub fn milli(text: &str) -> Result<i64, String> {
    let q = Quantity::parse(text).map_err(|e| e.0)?;
    let nanos = q.nanos();
    let milli = nanos.div_euclid(1_000_000) + i128::from(nanos.rem_euclid(1_000_000) != 0);
    i64::try_from(milli).map_err(|_| format!("quantity {text:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_become_milli_units_rounded_up() {
        assert_eq!(milli("2").unwrap(), 2000);
        assert_eq!(milli("500m").unwrap(), 500);
        assert_eq!(milli("1Gi").unwrap(), 1_073_741_824_000);
        assert_eq!(milli("1n").unwrap(), 1);
        assert!(milli("two").is_err());
    }
}
