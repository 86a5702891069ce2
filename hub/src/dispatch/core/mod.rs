//! Dispatch decisions as a pure state machine: events in, [`Action`]s out,
//! no I/O and no clock (time is passed in), so every rule is unit-tested.
//!
//! The semantics are MultiKueue's: a queued TrainJob is offered to the
//! eligible spokes (all at once, or a few more every round); the first
//! spoke to admit wins, the placement is committed to the store before the
//! winner is told to start, and every other offer is withdrawn. A spoke
//! that stays disconnected for `worker_lost_timeout` is given up and its
//! runs requeued under a new generation; if it comes back, the runs it still
//! holds are stale and stopped, so a TrainJob never runs on two spokes.
//!
//! Every run is named by `(run_id, generation)`: the TrainJob's uid and the
//! number of its placement. Offers, starts and stops carry both; answers
//! and reports about another generation than the current one are stale.
//!
//! Nothing stays stuck and no capacity leaks:
//! - a placement loaded at start-up on a spoke that is not connected arms
//!   the worker-lost timer from the load, as a disconnect would;
//! - an offer not answered within `offer_timeout` is withdrawn and the job
//!   nominated again;
//! - every heartbeat lists the spoke's reservations: one the hub no longer
//!   offers is withdrawn again, one it still offers counts as the admission
//!   it never heard, one of a placement whose Start was lost gets the Start
//!   again; an admission the hub is acting on that the spoke no longer
//!   holds (it never started) is forgotten and the job nominated again;
//! - a deleted TrainJob (its finalizer holds it) has its run stopped, and is
//!   released once the spoke confirms, once the spoke is declared lost, or
//!   after `deletion_timeout`.
//!
//! A TrainJob in a queue (`JobInfo::queue`) is admitted by quota first, as
//! Kueue admits a workload ([`crate::dispatch::quota`]; `quota.rs` here):
//! it is offered only with its quota reserved, only to the spokes that
//! provide its flavors, and may preempt others to get in.
//!
//! The files: `types.rs` (what goes in and out), `queue.rs` (dispatch
//! order, nomination), `placement.rs` (which spokes may take a job),
//! `jobs.rs` (TrainJob events), `answers.rs` (answers of spokes and of the
//! store), `spokes.rs` (spoke events), `timers.rs` (time passing),
//! `quota.rs` (quota in dispatch), `quota_status.rs` (read-only views of
//! quota: why a job waits, queue status numbers), `workloads.rs` (the
//! jobs of queues as their Workloads show them). This file: the
//! dispatcher's state and its read-only queries.

mod answers;
mod jobs;
mod placement;
mod queue;
mod quota;
mod quota_status;
#[cfg(test)]
mod quota_tests;
mod spokes;
#[cfg(test)]
mod tests;
mod timers;
mod types;
mod workloads;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::Value;

use self::placement::Spoke;
pub use self::placement::provides;
use self::queue::{Queue, QueueKey};
pub use self::types::*;
pub use self::workloads::{QueueState, QueuedJob};
use crate::dispatch::quota::Quotas;

#[derive(Debug, Clone, PartialEq, Eq)]
enum OfferState {
    Pending { at: Millis },
    Refused { at: Millis },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// Not wanted to run and not placed.
    Idle,
    /// Waiting for a spoke to admit it.
    Queued {
        offers: BTreeMap<String, OfferState>,
        /// Incremental: when the current round began and how many spokes
        /// may be nominated so far.
        round_started: Millis,
        quota: usize,
    },
    /// A spoke admitted; the placement is being written.
    Committing { spoke: String },
    /// Placed and (being) started.
    Placed { spoke: String },
    /// Deleted while placed: its run is being stopped on `spoke`, since
    /// `since`.
    Deleting { spoke: String, since: Millis },
}

#[derive(Debug, Clone)]
struct Job {
    info: JobInfo,
    generation: i64,
    phase: Phase,
    /// When the current generation was last told to start.
    started_at: Option<Millis>,
    /// Made idle by a suspension (so queuing it again is a resumption).
    suspended: bool,
    /// Finished on its spoke and released: nothing left to fence, so a
    /// deletion need not wait for the spoke.
    released: bool,
    /// Committing: heartbeats of the admitting spoke since the admission
    /// that did not list it.
    missed_heartbeats: u8,
}

impl Job {
    fn queue_key(&self) -> QueueKey {
        (
            Reverse(self.info.priority),
            self.info.created,
            self.info.key.clone(),
        )
    }

    fn placed_on(&self) -> Option<&str> {
        match &self.phase {
            Phase::Placed { spoke } | Phase::Committing { spoke } => Some(spoke),
            _ => None,
        }
    }

    /// The ClusterQueue of a job in a queue (None: unmanaged, or its
    /// LocalQueue does not exist).
    fn cluster_queue(&self) -> Option<&str> {
        self.info.queue.as_ref()?.cluster_queue.as_deref()
    }
}

/// The dispatcher's state. Feed it events; carry out the actions it returns.
#[derive(Debug)]
pub struct Dispatcher {
    config: Config,
    /// Boxed: a table sized for its jobs holds a pointer per slot, not a
    /// whole job.
    jobs: HashMap<JobKey, Box<Job>>,
    by_uid: HashMap<String, JobKey>,
    /// Queued jobs in dispatch order.
    queue: Queue,
    spokes: BTreeMap<String, Spoke>,
    /// Advances with every nomination, so that spokes with equal room take
    /// turns at the head of a limited fan-out.
    turn: usize,
    /// Cordoned spokes (`Spoke.spec.unschedulable`): offered nothing new;
    /// kept across reconnects.
    unschedulable: BTreeSet<String>,
    /// Quota configuration and reservations of the jobs in a queue.
    quotas: Quotas,
    /// Why each job in a queue without a reservation waits.
    waiting: HashMap<JobKey, (&'static str, String)>,
    /// A job whose preemption found no victims searches again after this.
    preempt_after: HashMap<JobKey, Millis>,
}

/// What the dispatcher knows of one spoke, for its `Spoke` status.
#[derive(Debug, Clone, PartialEq)]
pub struct SpokeView {
    pub labels: Value,
    pub allocatable: Resources,
    pub free: Resources,
    /// When it disconnected; None while connected.
    pub disconnected_at: Option<Millis>,
    /// TrainJobs placed on it (committing or placed) that have not
    /// finished.
    pub running: usize,
    /// The ResourceFlavors whose node labels its labels match.
    pub flavors: Vec<String>,
    /// Quota held on it by admitted TrainJobs: (ClusterQueue, flavor,
    /// resource) → milli-units.
    pub queue_usage: BTreeMap<(String, String, String), i64>,
}

impl Dispatcher {
    pub fn new(config: Config) -> Self {
        Dispatcher {
            config,
            jobs: HashMap::new(),
            by_uid: HashMap::new(),
            queue: Queue::default(),
            spokes: BTreeMap::new(),
            turn: 0,
            unschedulable: BTreeSet::new(),
            quotas: Quotas::default(),
            waiting: HashMap::new(),
            preempt_after: HashMap::new(),
        }
    }

    /// The spokes the dispatcher knows (connected, or disconnected and not
    /// yet given up), by name.
    pub fn spoke_views(&self) -> BTreeMap<String, SpokeView> {
        let mut running: HashMap<&str, usize> = HashMap::new();
        for job in self.jobs.values() {
            if let Some(spoke) = job.placed_on()
                && job.info.want == Want::Run
            {
                *running.entry(spoke).or_default() += 1;
            }
        }
        let mut usage: HashMap<&str, BTreeMap<(String, String, String), i64>> = HashMap::new();
        for (_, r) in self.quotas.reservations() {
            let Some((spoke, _)) = &r.admitted else {
                continue;
            };
            let on = usage.entry(spoke.as_str()).or_default();
            for ((flavor, resource), milli) in &r.assignment.usage {
                *on.entry((r.cluster_queue.clone(), flavor.clone(), resource.clone()))
                    .or_default() += milli;
            }
        }
        let flavors = &self.quotas.config().flavors;
        self.spokes
            .iter()
            .map(|(name, s)| {
                (
                    name.clone(),
                    SpokeView {
                        labels: s.labels.clone(),
                        allocatable: s.allocatable.clone(),
                        free: s.free.clone(),
                        disconnected_at: s.disconnected_at,
                        running: running.get(name.as_str()).copied().unwrap_or(0),
                        flavors: flavors
                            .values()
                            .filter(|f| placement::provides(&s.labels, &f.node_labels))
                            .map(|f| f.name.clone())
                            .collect(),
                        queue_usage: usage.remove(name.as_str()).unwrap_or_default(),
                    },
                )
            })
            .collect()
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Queued TrainJobs.
    pub fn queue_depth(&self) -> usize {
        self.queue.len()
    }

    /// Whether any TrainJob is in a queue (managed by quota).
    pub fn has_queued_jobs(&self) -> bool {
        self.jobs.values().any(|j| j.info.queue.is_some())
    }

    /// Connected spokes.
    pub fn connected_spokes(&self) -> usize {
        self.spokes
            .values()
            .filter(|s| s.disconnected_at.is_none())
            .count()
    }

    /// The TrainJobs placed on a spoke.
    pub fn placed_jobs(&self) -> std::collections::HashSet<JobKey> {
        self.jobs
            .values()
            .filter(|j| j.placed_on().is_some_and(|s| !s.is_empty()))
            .map(|j| j.info.key.clone())
            .collect()
    }

    /// The names of a TrainJob's pod sets (its JobSet's replicated jobs),
    /// while it wants to run.
    pub fn pod_set_names(&self, key: &JobKey) -> Option<Vec<&str>> {
        let job = self.jobs.get(key)?;
        Some(job.info.pod_sets.iter().map(|p| p.name.as_str()).collect())
    }

    /// Whether the dispatcher holds the TrainJob `key`.
    pub fn knows(&self, key: &JobKey) -> bool {
        self.jobs.contains_key(key)
    }

    /// The spoke a TrainJob is placed on, with the generation.
    pub fn placement(&self, key: &JobKey) -> Option<(&str, i64)> {
        let job = self.jobs.get(key)?;
        job.placed_on().map(|s| (s, job.generation))
    }
}
