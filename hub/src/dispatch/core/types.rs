//! The plain types dispatch decides over: TrainJobs and their demand,
//! placements, configuration, and the actions the runner carries out.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;
use trainhub_apiserver::selector::LabelSelector;

use crate::dispatch::quota::Toleration;

/// Milliseconds on a monotonic clock chosen by the caller.
pub type Millis = u64;

/// Resource name → milli-units.
pub type Resources = BTreeMap<String, i64>;

/// A TrainJob, by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobKey {
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for JobKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// `count` pods, each requesting `requests_milli`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodSetDemand {
    pub name: String,
    pub count: u32,
    pub requests_milli: Resources,
}

/// What the whole gang requests.
pub fn gang_total(pod_sets: &[PodSetDemand]) -> Resources {
    let mut total = Resources::new();
    for set in pod_sets {
        for (resource, milli) in &set.requests_milli {
            *total.entry(resource.clone()).or_default() +=
                milli.saturating_mul(i64::from(set.count));
        }
    }
    total
}

/// What the TrainJob asks of dispatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Want {
    /// Queued or running.
    Run,
    /// `spec.suspend`: not dispatched; a placed run is stopped.
    Suspend,
    /// Being deleted (`metadata.deletionTimestamp`): a placed run is
    /// stopped, and the TrainJob released ([`Action::Release`]) once that is
    /// confirmed or given up.
    Delete,
    /// Complete or Failed: the run stays on its spoke (its pods and logs
    /// remain readable) until the TrainJob is deleted.
    Finished,
}

/// A TrainJob as dispatch sees it.
#[derive(Debug, Clone)]
pub struct JobInfo {
    pub key: JobKey,
    pub uid: String,
    /// Higher first. For a TrainJob in a queue, the value of its
    /// WorkloadPriorityClass (`kueue.x-k8s.io/priority-class`; 0 without).
    pub priority: i32,
    /// Creation time (any monotonic order, e.g. Unix milliseconds).
    pub created: i64,
    /// Spokes whose labels match may take it; None: every spoke.
    pub selector: Option<LabelSelector>,
    /// Shared with the dispatcher's cache of computed demands, the offers
    /// and the queues' views: one copy per TrainJob generation.
    pub pod_sets: Arc<[PodSetDemand]>,
    pub want: Want,
    /// The queue of a TrainJob labelled `kueue.x-k8s.io/queue-name`: it is
    /// admitted by quota before it is offered. None: not managed by quota,
    /// dispatched as capacity allows.
    pub queue: Option<QueueRef>,
}

/// Where a TrainJob waits for quota, as the runner resolves it.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueRef {
    /// The LocalQueue named by its `kueue.x-k8s.io/queue-name` label (in
    /// its namespace).
    pub local_queue: String,
    /// The LocalQueue's ClusterQueue; None: no such LocalQueue.
    pub cluster_queue: Option<String>,
    /// The labels of its namespace, which the ClusterQueue's
    /// `namespaceSelector` must match.
    pub namespace_labels: Value,
    /// Its pods' tolerations: a flavor whose `NoSchedule`/`NoExecute`
    /// taints they (with the flavor's own tolerations) do not tolerate is
    /// not assigned.
    pub tolerations: Vec<Toleration>,
    /// The WorkloadPriorityClass its `kueue.x-k8s.io/priority-class` label
    /// names (its value is [`JobInfo::priority`]).
    pub priority_class: Option<String>,
    /// Why the runner holds it back whatever the quota (its LocalQueue is
    /// stopped, its priority class does not exist): it waits, inadmissible,
    /// with this message.
    pub hold: Option<String>,
    /// With `hold`: a run of it is stopped too, and it waits again (its
    /// LocalQueue's `stopPolicy` is `HoldAndDrain`).
    pub drain: bool,
}

/// The committed placement of a TrainJob, as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The spoke running generation `generation`; None: not placed.
    pub spoke: Option<String>,
    pub generation: i64,
}

/// How queued TrainJobs are offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Offer to every eligible spoke at once (MultiKueue's default).
    AllAtOnce,
    /// Offer to `step` more eligible spokes every `round_ms`.
    Incremental { step: usize, round_ms: Millis },
}

#[derive(Debug, Clone, Copy)]
pub struct Config {
    pub mode: Mode,
    /// A disconnected spoke is given up after this long, its runs requeued.
    pub worker_lost_timeout_ms: Millis,
    /// A spoke that refused an offer is asked again after this long (or as
    /// soon as its free capacity grows).
    pub retry_ms: Millis,
    /// AllAtOnce: at most this many offers of one TrainJob pending at once
    /// (a refusal frees a place), to the eligible spokes with the most room
    /// for it first, taking turns among equals; 0 offers to every eligible
    /// spoke, as MultiKueue does.
    pub fanout: usize,
    /// An offer not answered this long is withdrawn (and counts as refused).
    pub offer_timeout_ms: Millis,
    /// A deleted TrainJob whose spoke has not confirmed the stop of its run
    /// is released after this long.
    pub deletion_timeout_ms: Millis,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            mode: Mode::AllAtOnce,
            worker_lost_timeout_ms: 15 * 60 * 1000,
            retry_ms: 10_000,
            fanout: 0,
            offer_timeout_ms: 60_000,
            deletion_timeout_ms: 15 * 60 * 1000,
        }
    }
}

/// Reasons of the Events dispatch records on a TrainJob (UpperCamelCase, as
/// Kubernetes spells event reasons).
pub mod reason {
    /// Placed on a spoke (recorded once the placement is committed).
    pub const PLACED: &str = "Placed";
    /// Requeued: its spoke stayed disconnected for the worker-lost timeout.
    pub const SPOKE_LOST: &str = "SpokeLost";
    /// An offer went unanswered for the offer timeout and was withdrawn.
    pub const OFFER_EXPIRED: &str = "OfferExpired";
    /// Requeued: the spoke that admitted it no longer holds the admission.
    pub const ADMISSION_LOST: &str = "AdmissionLost";
    /// Suspended: its run was stopped, or its offers withdrawn.
    pub const SUSPENDED: &str = "Suspended";
    /// Resumed after a suspension: queued again.
    pub const RESUMED: &str = "Resumed";
    /// Deleted: its run was stopped on its spoke.
    pub const STOPPING: &str = "Stopping";
    /// Requeued: its spoke fenced itself (cut off from the hub for its
    /// fence-after) and stopped the run.
    pub const FENCED: &str = "Fenced";
    /// Requeued: its spoke's agent restarted and killed the run it found.
    pub const SPOKE_RESTARTED: &str = "SpokeRestarted";
    /// Requeued: its spoke lost the run for another reason it gave.
    pub const RUN_LOST: &str = "RunLost";
    /// Evicted and requeued to make room for another workload.
    pub const PREEMPTED: &str = "Preempted";
    /// Evicted and requeued: its ClusterQueue is stopped (`HoldAndDrain`).
    pub const CLUSTER_QUEUE_STOPPED: &str = "ClusterQueueStopped";
    /// Evicted and requeued: its LocalQueue is stopped (`HoldAndDrain`).
    pub const LOCAL_QUEUE_STOPPED: &str = "LocalQueueStopped";
}

/// Something for the runner to do. Sends are best effort (a lost message is
/// repaired by the next hello); commits are acknowledged with
/// [`Dispatcher::committed`](super::Dispatcher::committed).
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Offer {
        spoke: String,
        job: JobKey,
        run_id: String,
        generation: i64,
        pod_sets: Arc<[PodSetDemand]>,
    },
    Withdraw {
        spoke: String,
        run_id: String,
        generation: i64,
    },
    /// Persist the placement; answer with [`Dispatcher::committed`](super::Dispatcher::committed).
    Commit { job: JobKey, placement: Placement },
    /// Remove the placement of a TrainJob that is gone.
    Forget { job: JobKey },
    /// Build the objects for `spoke` and send them.
    Start {
        spoke: String,
        job: JobKey,
        run_id: String,
        generation: i64,
    },
    Stop {
        spoke: String,
        run_id: String,
        generation: i64,
        reason: &'static str,
    },
    /// Remove the hub's finalizer from TrainJob `uid`: its run is stopped
    /// (or given up), or finished.
    Release { job: JobKey, uid: String },
    /// Record an Event on the TrainJob.
    Event {
        job: JobKey,
        uid: String,
        warning: bool,
        reason: &'static str,
        message: String,
    },
    /// Kueue's eviction of an admitted TrainJob: its run is stopped (an
    /// [`Action::Stop`] comes first) and it is queued again under a new
    /// generation (an [`Action::Commit`] of no spoke). The runner sets its
    /// Workload's `Evicted` condition with `reason`
    /// ([`crate::dispatch::quota::reason::PREEMPTED`] or
    /// [`crate::dispatch::quota::reason::CLUSTER_QUEUE_STOPPED`]) and
    /// `message`, and for a preemption its `Preempted` condition with the
    /// preemption's reason.
    Evicted {
        job: JobKey,
        uid: String,
        reason: &'static str,
        message: String,
        preemption: Option<PreemptedBy>,
    },
}

/// Who preempted a TrainJob, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreemptedBy {
    pub preemptor: JobKey,
    pub preemptor_uid: String,
    /// [`crate::dispatch::quota::reason::IN_CLUSTER_QUEUE`] or
    /// [`crate::dispatch::quota::reason::IN_COHORT_RECLAMATION`].
    pub reason: &'static str,
}

/// Why a spoke says a run is lost, as the protocol spells it.
pub const LOST_FENCED: &str = "Fenced";
pub const LOST_SPOKE_RESTARTED: &str = "SpokeRestarted";

/// Whether a spoke's report about a run is taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The run is the TrainJob's current placement on this spoke.
    Accept(JobKey),
    /// A run this spoke holds but that is no longer placed there (an older
    /// generation, or a TrainJob that is gone): ignore it; it is stopped.
    Stale,
    /// The spoke reports on a run that was never placed on it: refuse.
    Foreign,
}
