//! Dispatch: TrainJobs in the store go to spokes, and what spokes report
//! comes back as TrainJob status, pods and logs.
//!
//! - [`core`]: the decisions, a pure state machine (queue order,
//!   nomination, first admission wins, lost spokes, stale runs).
//! - this module: the runner that feeds it from the store and the spoke
//!   sessions and carries out its actions: placements committed to the
//!   store (before a winner is told to start), the Build phase for the
//!   winning spoke, reports mapped by the PostExecution plugins. Here: the
//!   [`Dispatch`] runner, its configuration, and the loop that follows the
//!   store's TrainJobs; the rest of the runner, one job per file:
//!   - `intake`: from a stored TrainJob to the core's job (its demand,
//!     through the ML and pod-group policies), and deferred plugin calls;
//!   - `actions`: carrying out the core's actions (offers, stops,
//!     placements committed, Build and start, releases);
//!   - `sessions`: the spokes' sessions (hello, messages, cordons);
//!   - `reports`: what spokes report of their runs (pods, events, the
//!     TrainJob status), and the Events the hub records;
//!   - `logs`: pod log streams served from the spokes.
//! - [`crate::grpc`]: the spokes' gRPC sessions.
//!
//! TrainJob annotations read here (documented in the README):
//! `trainhub.kubeflow.org/priority` (an integer, higher first) and
//! `trainhub.kubeflow.org/spoke-selector` (a label selector over spoke
//! labels, e.g. `region=eu,gpu.product in (H100,A100)`). Written here, in
//! the same store write as the placement: `trainhub.kubeflow.org/spoke`
//! (the spoke running it; the SPOKE column) and the finalizer
//! [`FINALIZER`].

mod actions;
pub mod authority;
pub mod core;
mod intake;
mod logs;
mod observe;
pub mod queues;
pub mod quota;
mod reports;
mod sessions;
mod snapshots;
mod writer;

use std::collections::{BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::mpsc;
use trainhub_api::constants::{CONDITION_COMPLETE, CONDITION_FAILED, LABEL_JOBSET_NAME};
use trainhub_api::trainer::TrainJob;
use trainhub_apiserver::limits::encoded_weight;
use trainhub_apiserver::recent::Recent;
use trainhub_apiserver::store::{Key, Op, Store};
use trainhub_plugin_sdk as sdk;
use trainhub_proto as pb;

use self::core::{Dispatcher, JobKey, Placement, PodSetDemand};
use self::intake::{Deferral, Step};
use self::logs::LogStream;
use self::writer::Write;
use crate::admission::TrainerAdmission;
use crate::api::{PODS, TRAINJOBS};
use crate::controller::lifecycle::is_true;
use crate::plugins::registry::Registry;

pub use self::intake::milli;
pub use self::logs::{LOG_BUFFER_CHUNKS, LeaderLogs, SpokeLogs, leader_log_source};
pub use self::reports::MAX_EVENTS_PER_TRAINJOB;

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
const ENFORCED_KEPT: usize = 1024;
/// Pod sets kept (see `Dispatch::demand`): a few hundred bytes each.
const DEMAND_KEPT: usize = 65_536;
/// Typed TrainJobs kept (see `Dispatch::typed`): 6 to 7 KiB each, a
/// bounded cost whatever the number of TrainJobs.
const TYPED_KEPT: usize = 1024;
/// What the typed TrainJobs kept, and the enforced runtime infos kept,
/// may weigh each (their size as JSON): tenants choose how large their
/// TrainJobs are, so a count alone does not bound these caches. One over
/// 1/32 of this is made again when it is needed.
const TYPED_BYTES: usize = 16 << 20;
/// What the pod sets kept may weigh (see [`demand_weight`]).
const DEMAND_BYTES: usize = 32 << 20;

/// The weight of a TrainJob's pod sets in [`Dispatch::demand`]: about the
/// bytes they hold.
fn demand_weight(sets: &Arc<[PodSetDemand]>) -> usize {
    sets.iter()
        .map(|set| {
            64 + set.name.len()
                + (set.requests_milli.keys())
                    .map(|name| 48 + name.len())
                    .sum::<usize>()
        })
        .sum()
}

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

struct Session {
    id: u64,
    tx: mpsc::UnboundedSender<pb::HubMessage>,
    /// Ends the session's stream, with the reason (a newer session of the
    /// same spoke replaced it).
    close: tokio::sync::watch::Sender<Option<String>>,
    labels: Vec<(String, String)>,
    allocatable: Vec<(String, i64)>,
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
    demand: Recent<(String, i64), Arc<[PodSetDemand]>>,
    /// The enforced runtime info those pod sets came from, which Build
    /// starts from. It holds the runtime's templates (kilobytes per
    /// TrainJob), so only the most recently enforced are kept; a TrainJob
    /// placed after its entry went runs the whole pipeline at Build.
    enforced: Recent<(String, i64), Arc<sdk::RuntimeInfo>>,
    /// Pods shown per TrainJob, and the hash of what each last was.
    pods: Mutex<HashMap<JobKey, HashMap<String, u64>>>,
    /// Events written per TrainJob (its own and its pods'), removed with it.
    events: Mutex<HashMap<JobKey, BTreeSet<String>>>,
    /// Hash of the last JobSet status mapped per run.
    statuses: Mutex<HashMap<String, u64>>,
    /// Typed TrainJobs by (uid, generation, hash of labels and annotations).
    typed: Recent<(String, i64, u64), Arc<TrainJob>>,
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

/// Feeds a JSON value to `h` as it is, without printing it first (what
/// `to_string` and a hash of the text cost: an allocation and a copy of
/// every byte). Objects hash in their keys' order, which is sorted, so
/// equal objects hash alike.
fn hash_json(v: &Value, h: &mut impl Hasher) {
    match v {
        Value::Null => h.write_u8(0),
        Value::Bool(b) => {
            h.write_u8(1);
            b.hash(h);
        }
        Value::Number(n) => {
            h.write_u8(2);
            n.hash(h);
        }
        Value::String(s) => {
            h.write_u8(3);
            s.hash(h);
        }
        Value::Array(items) => {
            h.write_u8(4);
            h.write_usize(items.len());
            for item in items {
                hash_json(item, h);
            }
        }
        Value::Object(map) => {
            h.write_u8(5);
            h.write_usize(map.len());
            for (k, item) in map {
                k.hash(h);
                hash_json(item, h);
            }
        }
    }
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
        // Dispatch reads back nearly every write of a TrainJob (the queue
        // publisher, status merges, placements) and each TrainJob's runtime
        // snapshot at intake, most of them within moments: kept decoded
        // from the write, they are not decoded again.
        store.keep_written(TRAINJOBS);
        store.keep_written(crate::admission::RUNTIME_SNAPSHOTS);
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
            demand: Recent::with_budget(DEMAND_KEPT, DEMAND_BYTES, demand_weight),
            enforced: Recent::with_budget(
                ENFORCED_KEPT,
                TYPED_BYTES,
                crate::plugins::Weigh::weight,
            ),
            pods: Mutex::new(HashMap::new()),
            events: Mutex::new(HashMap::new()),
            statuses: Mutex::new(HashMap::new()),
            typed: Recent::with_budget(TYPED_KEPT, TYPED_BYTES, encoded_weight),
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
        // A TrainJob's state is what its latest version says: one changed
        // again since (a lagging follower, a burst of writes) is skipped,
        // undecoded, for the change that follows.
        let store = self.store.clone();
        let latest = move |key: &Key, rv| store.revision_of(key) == Some(rv);
        loop {
            match watch.live.recv_latest(&latest).await {
                Ok(event) => self.on_event(&event),
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

    fn self_arc(&self) -> Option<Arc<Dispatch>> {
        self.me.upgrade()
    }
}
