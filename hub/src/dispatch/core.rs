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

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::Value;
use trainhub_apiserver::selector::LabelSelector;

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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    /// Higher first.
    pub priority: i32,
    /// Creation time (any monotonic order, e.g. Unix milliseconds).
    pub created: i64,
    /// Spokes whose labels match may take it; None: every spoke.
    pub selector: Option<LabelSelector>,
    pub pod_sets: Vec<PodSetDemand>,
    pub want: Want,
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
}

/// Something for the runner to do. Sends are best effort (a lost message is
/// repaired by the next hello); commits are acknowledged with
/// [`Dispatcher::committed`].
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Offer {
        spoke: String,
        job: JobKey,
        run_id: String,
        generation: i64,
        pod_sets: Vec<PodSetDemand>,
    },
    Withdraw {
        spoke: String,
        run_id: String,
        generation: i64,
    },
    /// Persist the placement; answer with [`Dispatcher::committed`].
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
}

type QueueKey = (Reverse<i32>, i64, JobKey);

#[derive(Debug, Clone)]
struct Spoke {
    labels: Value,
    allocatable: Resources,
    free: Resources,
    /// None while connected.
    disconnected_at: Option<Millis>,
}

impl Spoke {
    /// A spoke known only from a stored placement: not connected since `now`.
    fn unseen(now: Millis) -> Spoke {
        Spoke {
            labels: Value::Null,
            allocatable: Resources::new(),
            free: Resources::new(),
            disconnected_at: Some(now),
        }
    }

    fn could_ever_fit(&self, demand: &Resources) -> bool {
        demand
            .iter()
            .all(|(r, m)| *m <= 0 || self.allocatable.get(r).is_some_and(|a| a >= m))
    }

    fn fits_now(&self, demand: &Resources) -> bool {
        demand
            .iter()
            .all(|(r, m)| *m <= 0 || self.free.get(r).is_some_and(|f| f >= m))
    }
}

/// The dispatcher's state. Feed it events; carry out the actions it returns.
#[derive(Debug)]
pub struct Dispatcher {
    config: Config,
    jobs: HashMap<JobKey, Job>,
    by_uid: HashMap<String, JobKey>,
    /// Queued jobs in dispatch order.
    queue: BTreeSet<QueueKey>,
    spokes: BTreeMap<String, Spoke>,
    /// Advances with every nomination, so that spokes with equal room take
    /// turns at the head of a limited fan-out.
    turn: usize,
    /// Cordoned spokes (`Spoke.spec.unschedulable`): offered nothing new;
    /// kept across reconnects.
    unschedulable: BTreeSet<String>,
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
}

impl Dispatcher {
    pub fn new(config: Config) -> Self {
        Dispatcher {
            config,
            jobs: HashMap::new(),
            by_uid: HashMap::new(),
            queue: BTreeSet::new(),
            spokes: BTreeMap::new(),
            turn: 0,
            unschedulable: BTreeSet::new(),
        }
    }

    /// Cordons (`true`) or uncordons a spoke. A cordoned spoke is offered
    /// nothing new; its placed runs and pending offers are left alone.
    /// Uncordoning offers queued jobs at once.
    pub fn set_unschedulable(
        &mut self,
        name: &str,
        unschedulable: bool,
        now: Millis,
    ) -> Vec<Action> {
        if unschedulable {
            self.unschedulable.insert(name.to_string());
            return Vec::new();
        }
        if self.unschedulable.remove(name) {
            return self.dispatch_all(now);
        }
        Vec::new()
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

    /// The spoke a TrainJob is placed on, with the generation.
    pub fn placement(&self, key: &JobKey) -> Option<(&str, i64)> {
        let job = self.jobs.get(key)?;
        job.placed_on().map(|s| (s, job.generation))
    }

    /// A TrainJob appeared or changed. `placement` is what the store holds,
    /// given when the job is first seen (at start-up, after a restart). A
    /// placement on a spoke that is not connected arms the worker-lost timer
    /// from `now`, so a spoke that never returns does not strand it.
    pub fn upsert_job(
        &mut self,
        info: JobInfo,
        placement: Option<Placement>,
        now: Millis,
    ) -> Vec<Action> {
        let mut actions = Vec::new();
        let key = info.key.clone();
        let job = match self.jobs.get_mut(&key) {
            Some(job) if job.info.uid == info.uid => {
                self.queue.remove(&job.queue_key());
                job.info = info;
                job
            }
            existing => {
                if let Some(old) = existing.map(|j| j.info.uid.clone()) {
                    // Same name, new object: the old one is gone.
                    actions.extend(self.remove_job(&key));
                    self.by_uid.remove(&old);
                }
                let (generation, phase) = match placement {
                    Some(Placement {
                        spoke: Some(spoke),
                        generation,
                    }) => {
                        self.spokes
                            .entry(spoke.clone())
                            .or_insert_with(|| Spoke::unseen(now));
                        (generation, Phase::Placed { spoke })
                    }
                    Some(Placement {
                        spoke: None,
                        generation,
                    }) => (generation, Phase::Idle),
                    None => (0, Phase::Idle),
                };
                self.by_uid.insert(info.uid.clone(), key.clone());
                self.jobs.entry(key.clone()).or_insert(Job {
                    info,
                    generation,
                    phase,
                    started_at: None,
                    suspended: false,
                    released: false,
                    missed_heartbeats: 0,
                })
            }
        };
        let uid = job.info.uid.clone();
        let event = |reason: &'static str, message: String| Action::Event {
            job: key.clone(),
            uid: uid.clone(),
            warning: false,
            reason,
            message,
        };
        match (job.info.want, &job.phase) {
            (Want::Run, Phase::Idle) => {
                if std::mem::take(&mut job.suspended) {
                    actions.push(event(reason::RESUMED, "Resumed: queued again".into()));
                }
                job.generation += 1;
                job.phase = Phase::Queued {
                    offers: BTreeMap::new(),
                    round_started: now,
                    quota: initial_quota(self.config.mode),
                };
            }
            // Not placed: nothing to wait for.
            (Want::Delete, Phase::Idle) => {
                actions.push(Action::Release {
                    job: key.clone(),
                    uid: uid.clone(),
                });
            }
            // No longer wanted before a spoke admitted it.
            (Want::Suspend | Want::Finished | Want::Delete, Phase::Queued { offers, .. }) => {
                actions.extend(withdraw_all(offers.keys(), &job.info.uid, job.generation));
                match job.info.want {
                    Want::Delete => actions.push(Action::Release {
                        job: key.clone(),
                        uid: uid.clone(),
                    }),
                    Want::Suspend => {
                        job.suspended = true;
                        actions.push(event(
                            reason::SUSPENDED,
                            "Suspended: its offers were withdrawn".into(),
                        ));
                    }
                    _ => {}
                }
                job.phase = Phase::Idle;
            }
            (Want::Suspend, Phase::Placed { spoke }) => {
                let spoke = spoke.clone();
                actions.push(Action::Stop {
                    spoke: spoke.clone(),
                    run_id: job.info.uid.clone(),
                    generation: job.generation,
                    reason: "suspended",
                });
                actions.push(Action::Commit {
                    job: key.clone(),
                    placement: Placement {
                        spoke: None,
                        generation: job.generation,
                    },
                });
                actions.push(event(
                    reason::SUSPENDED,
                    format!(
                        "Suspended: its run (placement {}) stopped on spoke {spoke}",
                        job.generation
                    ),
                ));
                job.suspended = true;
                job.phase = Phase::Idle;
            }
            (Want::Suspend, Phase::Idle) => job.suspended = true,
            // Its run ended: the finalizer has nothing left to guard (the
            // spoke cleans up when the TrainJob is deleted, or when it
            // reports the run once the TrainJob is gone).
            (Want::Finished, Phase::Placed { .. }) if !job.released => {
                job.released = true;
                actions.push(Action::Release {
                    job: key.clone(),
                    uid: uid.clone(),
                });
            }
            (Want::Delete, Phase::Placed { spoke }) if job.released => {
                actions.push(Action::Stop {
                    spoke: spoke.clone(),
                    run_id: uid.clone(),
                    generation: job.generation,
                    reason: "deleted",
                });
                actions.push(Action::Release {
                    job: key.clone(),
                    uid: uid.clone(),
                });
                job.phase = Phase::Idle;
            }
            // Its spoke was given up already: nothing will confirm.
            (Want::Delete, Phase::Placed { spoke }) if !self.spokes.contains_key(spoke) => {
                job.phase = Phase::Idle;
                actions.push(Action::Release {
                    job: key.clone(),
                    uid: uid.clone(),
                });
            }
            (Want::Delete, Phase::Placed { spoke }) => {
                let spoke = spoke.clone();
                actions.push(Action::Stop {
                    spoke: spoke.clone(),
                    run_id: job.info.uid.clone(),
                    generation: job.generation,
                    reason: "deleted",
                });
                actions.push(event(
                    reason::STOPPING,
                    format!(
                        "Deleted: stopping its run (placement {}) on spoke {spoke}",
                        job.generation
                    ),
                ));
                job.phase = Phase::Deleting { spoke, since: now };
            }
            // Committing: `committed` decides once the write is done.
            _ => {}
        }
        if matches!(job.phase, Phase::Queued { .. }) {
            self.queue.insert(job.queue_key());
            actions.extend(self.nominate(&key, now));
        }
        actions
    }

    /// A TrainJob is gone: its run is cancelled and its placement forgotten.
    pub fn remove_job(&mut self, key: &JobKey) -> Vec<Action> {
        let Some(job) = self.jobs.remove(key) else {
            return Vec::new();
        };
        self.by_uid.remove(&job.info.uid);
        self.queue.remove(&job.queue_key());
        let mut actions = Vec::new();
        let run_id = job.info.uid.clone();
        match job.phase {
            Phase::Queued { offers, .. } => {
                actions.extend(withdraw_all(offers.keys(), &run_id, job.generation));
            }
            Phase::Placed { spoke }
            | Phase::Committing { spoke }
            | Phase::Deleting { spoke, .. } => {
                actions.push(Action::Stop {
                    spoke,
                    run_id,
                    generation: job.generation,
                    reason: "deleted",
                });
            }
            Phase::Idle => {}
        }
        actions.push(Action::Forget { job: key.clone() });
        actions
    }

    /// A spoke confirmed that every run of `run_id` up to `generation` is
    /// gone from it: a deleted TrainJob waiting on it is released.
    pub fn run_stopped(&mut self, spoke: &str, run_id: &str, generation: i64) -> Vec<Action> {
        let Some(job) = self.by_uid.get(run_id).and_then(|k| self.jobs.get_mut(k)) else {
            return Vec::new();
        };
        match &job.phase {
            Phase::Deleting { spoke: on, .. } if on == spoke && generation >= job.generation => {
                job.phase = Phase::Idle;
                vec![Action::Release {
                    job: job.info.key.clone(),
                    uid: job.info.uid.clone(),
                }]
            }
            _ => Vec::new(),
        }
    }

    /// A spoke (re)connected and listed the runs it holds: every run that
    /// is not its current placement is stopped; a placement it lost is
    /// started again; queued jobs are offered.
    pub fn spoke_connected(
        &mut self,
        name: &str,
        labels: Value,
        capacity: Vec<(String, i64, i64)>,
        held: &[(String, i64)],
        now: Millis,
    ) -> Vec<Action> {
        let (allocatable, free) = split_capacity(capacity);
        self.spokes.insert(
            name.to_string(),
            Spoke {
                labels,
                allocatable,
                free,
                disconnected_at: None,
            },
        );
        let mut actions = Vec::new();
        let mut holds_current = BTreeSet::new();
        for (run_id, generation) in held {
            match self.check_run(name, run_id, *generation) {
                Verdict::Accept(key) => {
                    holds_current.insert(key);
                }
                Verdict::Stale | Verdict::Foreign => actions.push(Action::Stop {
                    spoke: name.to_string(),
                    run_id: run_id.clone(),
                    generation: *generation,
                    reason: "not placed on this spoke",
                }),
            }
        }
        let holds: BTreeSet<&str> = held.iter().map(|(id, _)| id.as_str()).collect();
        for job in self.jobs.values_mut() {
            match &job.phase {
                Phase::Placed { spoke }
                    if spoke == name
                        && job.info.want == Want::Run
                        && !holds_current.contains(&job.info.key) =>
                {
                    job.started_at = Some(now);
                    actions.push(Action::Start {
                        spoke: name.to_string(),
                        job: job.info.key.clone(),
                        run_id: job.info.uid.clone(),
                        generation: job.generation,
                    });
                }
                // Deleted while away: it no longer holds the run, so the
                // stop is done (a run it still holds was stopped above).
                Phase::Deleting { spoke, .. }
                    if spoke == name && !holds.contains(job.info.uid.as_str()) =>
                {
                    job.phase = Phase::Idle;
                    actions.push(Action::Release {
                        job: job.info.key.clone(),
                        uid: job.info.uid.clone(),
                    });
                }
                _ => {}
            }
        }
        actions.extend(self.dispatch_all(now));
        actions
    }

    /// A heartbeat: new capacity, and every reservation the spoke holds
    /// (`(run_id, generation)` of admitted offers neither started nor
    /// withdrawn), reconciled both ways:
    /// - one the hub no longer offers to this spoke is withdrawn (again);
    /// - one the hub still offers counts as the admission it never heard;
    /// - one of a placement on this spoke whose Start went out at least
    ///   `retry_ms` ago gets the Start again (the Start was lost);
    /// - an admission by this spoke whose placement is being written (so no
    ///   Start went out yet) that two heartbeats in a row do not list is
    ///   forgotten: the job is requeued under a new generation and nominated
    ///   again. (A spoke lists a reservation on every heartbeat after its
    ///   admission; two, so that a spoke that does not list reservations at
    ///   all does not lose an admission to a write that is merely slow.)
    ///
    /// Growing free capacity clears the spoke's refusals and offers queued
    /// jobs again. Safe to repeat: every answer is idempotent.
    pub fn spoke_heartbeat(
        &mut self,
        name: &str,
        capacity: Vec<(String, i64, i64)>,
        reservations: &[(String, i64)],
        now: Millis,
    ) -> Vec<Action> {
        let Some(spoke) = self.spokes.get_mut(name) else {
            return Vec::new();
        };
        let (allocatable, free) = split_capacity(capacity);
        let grew = free
            .iter()
            .any(|(r, f)| spoke.free.get(r).is_none_or(|old| f > old));
        spoke.allocatable = allocatable;
        spoke.free = free;
        let mut actions = self.reconcile_reservations(name, reservations, now);
        if !grew {
            return actions;
        }
        for job in self.jobs.values_mut() {
            if let Phase::Queued { offers, .. } = &mut job.phase
                && matches!(offers.get(name), Some(OfferState::Refused { .. }))
            {
                offers.remove(name);
            }
        }
        actions.extend(self.dispatch_all(now));
        actions
    }

    fn reconcile_reservations(
        &mut self,
        name: &str,
        reservations: &[(String, i64)],
        now: Millis,
    ) -> Vec<Action> {
        let mut actions = Vec::new();
        for (run_id, generation) in reservations {
            let withdraw = Action::Withdraw {
                spoke: name.to_string(),
                run_id: run_id.clone(),
                generation: *generation,
            };
            let Some(job) = self.by_uid.get(run_id).and_then(|k| self.jobs.get_mut(k)) else {
                actions.push(withdraw);
                continue;
            };
            if job.generation != *generation {
                actions.push(withdraw);
                continue;
            }
            match &job.phase {
                Phase::Queued { offers, .. }
                    if matches!(offers.get(name), Some(OfferState::Pending { .. })) =>
                {
                    actions.extend(self.admit_answer(name, run_id, *generation, true, now));
                }
                Phase::Committing { spoke } if spoke == name => {}
                Phase::Placed { spoke } if spoke == name => {
                    if job.info.want == Want::Run
                        && job
                            .started_at
                            .is_some_and(|at| now.saturating_sub(at) >= self.config.retry_ms)
                    {
                        job.started_at = Some(now);
                        actions.push(Action::Start {
                            spoke: name.to_string(),
                            job: job.info.key.clone(),
                            run_id: run_id.clone(),
                            generation: *generation,
                        });
                    }
                }
                _ => actions.push(withdraw),
            }
        }
        let held: BTreeSet<(&str, i64)> = reservations
            .iter()
            .map(|(id, g)| (id.as_str(), *g))
            .collect();
        let mut lost = Vec::new();
        for j in self.jobs.values_mut() {
            if matches!(&j.phase, Phase::Committing { spoke } if spoke == name)
                && !held.contains(&(j.info.uid.as_str(), j.generation))
            {
                j.missed_heartbeats = j.missed_heartbeats.saturating_add(1);
                if j.missed_heartbeats >= 2 {
                    lost.push(j.info.key.clone());
                }
            }
        }
        for key in lost {
            actions.push(Action::Withdraw {
                spoke: name.to_string(),
                run_id: self.jobs[&key].info.uid.clone(),
                generation: self.jobs[&key].generation,
            });
            let message = format!("Requeued: spoke {name} no longer holds its admission");
            actions.extend(self.requeue(&key, reason::ADMISSION_LOST, message, now));
            actions.extend(self.nominate(&key, now));
        }
        actions
    }

    /// Queues a job again under a new generation, committing that it is not
    /// placed (before any new offer can be admitted and placed).
    fn requeue(
        &mut self,
        key: &JobKey,
        reason: &'static str,
        message: String,
        now: Millis,
    ) -> Vec<Action> {
        let Some(job) = self.jobs.get_mut(key) else {
            return Vec::new();
        };
        job.generation += 1;
        job.started_at = None;
        job.phase = Phase::Queued {
            offers: BTreeMap::new(),
            round_started: now,
            quota: initial_quota(self.config.mode),
        };
        self.queue.insert(job.queue_key());
        vec![
            Action::Commit {
                job: key.clone(),
                placement: Placement {
                    spoke: None,
                    generation: job.generation,
                },
            },
            Action::Event {
                job: key.clone(),
                uid: job.info.uid.clone(),
                warning: true,
                reason,
                message,
            },
        ]
    }

    /// The spoke's stream ended. Its pending offers count as refused; its
    /// runs stay placed until `worker_lost_timeout` passes.
    pub fn spoke_disconnected(&mut self, name: &str, now: Millis) -> Vec<Action> {
        if let Some(spoke) = self.spokes.get_mut(name) {
            spoke.disconnected_at = Some(now);
        }
        let mut requeue = Vec::new();
        for job in self.jobs.values_mut() {
            if let Phase::Queued { offers, .. } = &mut job.phase
                && offers.remove(name).is_some()
            {
                requeue.push(job.info.key.clone());
            }
        }
        let mut actions = Vec::new();
        for key in requeue {
            actions.extend(self.nominate(&key, now));
        }
        actions
    }

    /// A spoke answered an offer.
    pub fn admit_answer(
        &mut self,
        spoke: &str,
        run_id: &str,
        generation: i64,
        admitted: bool,
        now: Millis,
    ) -> Vec<Action> {
        let withdraw = || Action::Withdraw {
            spoke: spoke.to_string(),
            run_id: run_id.to_string(),
            generation,
        };
        let Some(key) = self.by_uid.get(run_id).cloned() else {
            return if admitted {
                vec![withdraw()]
            } else {
                Vec::new()
            };
        };
        let Some(job) = self.jobs.get_mut(&key) else {
            return Vec::new();
        };
        let current = job.generation == generation;
        let Phase::Queued { offers, .. } = &mut job.phase else {
            // Already won elsewhere, or no longer wanted.
            return if admitted && (!current || job.placed_on() != Some(spoke)) {
                vec![withdraw()]
            } else {
                Vec::new()
            };
        };
        // Only a pending offer can win: an expired one was withdrawn.
        let pending = matches!(offers.get(spoke), Some(OfferState::Pending { .. }));
        if !current || !offers.contains_key(spoke) || (admitted && !pending) {
            return if admitted {
                vec![withdraw()]
            } else {
                Vec::new()
            };
        }
        if !admitted {
            offers.insert(spoke.to_string(), OfferState::Refused { at: now });
            return self.nominate(&key, now);
        }
        // The first admission wins: commit it before anyone is told.
        let mut actions: Vec<Action> = offers
            .keys()
            .filter(|s| s.as_str() != spoke)
            .map(|s| Action::Withdraw {
                spoke: s.clone(),
                run_id: run_id.to_string(),
                generation,
            })
            .collect();
        let queue_key = job.queue_key();
        job.phase = Phase::Committing {
            spoke: spoke.to_string(),
        };
        job.missed_heartbeats = 0;
        self.queue.remove(&queue_key);
        actions.push(Action::Commit {
            job: key,
            placement: Placement {
                spoke: Some(spoke.to_string()),
                generation,
            },
        });
        actions
    }

    /// The store answered a [`Action::Commit`] of a placement on a spoke.
    /// On success the winner is told to start; on failure the TrainJob goes
    /// back to the queue (the winner's reservation is withdrawn).
    pub fn committed(
        &mut self,
        key: &JobKey,
        placement: &Placement,
        ok: bool,
        now: Millis,
    ) -> Vec<Action> {
        let Some(spoke) = placement.spoke.clone() else {
            return Vec::new();
        };
        let Some(job) = self.jobs.get_mut(key) else {
            // Deleted meanwhile: `remove_job` stopped the run.
            return Vec::new();
        };
        if job.generation != placement.generation
            || job.phase
                != (Phase::Committing {
                    spoke: spoke.clone(),
                })
        {
            return Vec::new();
        }
        let run_id = job.info.uid.clone();
        if !ok && job.info.want != Want::Run {
            job.phase = Phase::Idle;
            let mut actions = vec![Action::Withdraw {
                spoke,
                run_id: run_id.clone(),
                generation: placement.generation,
            }];
            if job.info.want == Want::Delete {
                actions.push(Action::Release {
                    job: key.clone(),
                    uid: run_id,
                });
            }
            return actions;
        }
        if !ok {
            job.phase = Phase::Queued {
                offers: BTreeMap::new(),
                round_started: now,
                quota: initial_quota(self.config.mode),
            };
            self.queue.insert(job.queue_key());
            let mut actions = vec![Action::Withdraw {
                spoke,
                run_id,
                generation: placement.generation,
            }];
            actions.extend(self.nominate(key, now));
            return actions;
        }
        job.phase = Phase::Placed {
            spoke: spoke.clone(),
        };
        job.released = false;
        match job.info.want {
            Want::Run => {
                job.started_at = Some(now);
                vec![Action::Start {
                    spoke,
                    job: key.clone(),
                    run_id,
                    generation: placement.generation,
                }]
            }
            // Deleted while the write was in flight.
            Want::Delete => {
                job.phase = Phase::Deleting {
                    spoke: spoke.clone(),
                    since: now,
                };
                vec![Action::Stop {
                    spoke,
                    run_id,
                    generation: placement.generation,
                    reason: "deleted",
                }]
            }
            // Suspended or finished while the write was in flight.
            Want::Suspend | Want::Finished => {
                let generation = job.generation;
                job.phase = Phase::Idle;
                vec![
                    Action::Stop {
                        spoke,
                        run_id,
                        generation,
                        reason: "suspended",
                    },
                    Action::Commit {
                        job: key.clone(),
                        placement: Placement {
                            spoke: None,
                            generation,
                        },
                    },
                ]
            }
        }
    }

    /// Whether `spoke` may report on run `(run_id, generation)`.
    pub fn check_run(&self, spoke: &str, run_id: &str, generation: i64) -> Verdict {
        let Some(job) = self.by_uid.get(run_id).and_then(|k| self.jobs.get(k)) else {
            // A TrainJob the hub does not have: an orphan.
            return Verdict::Stale;
        };
        if job.placed_on() == Some(spoke) && job.generation == generation {
            return Verdict::Accept(job.info.key.clone());
        }
        if generation < job.generation
            || matches!(&job.phase, Phase::Idle)
            || matches!(&job.phase, Phase::Deleting { spoke: on, .. } if on == spoke)
        {
            // It was placed here once (an older generation) or not at all;
            // an older generation is only stale if it could have been here.
            return Verdict::Stale;
        }
        Verdict::Foreign
    }

    /// A spoke says it stopped run `(run_id, generation)` without being
    /// asked (`reason`: it fenced itself, or restarted and killed what it
    /// found). If that is the TrainJob's current placement on this spoke,
    /// the TrainJob is queued again at once under a new generation, as a
    /// lost spoke's are; a lost run of any other generation or spoke
    /// changes nothing. The lost run itself is then stale, and stopped
    /// when the spoke lists it.
    pub fn run_lost(
        &mut self,
        spoke: &str,
        run_id: &str,
        generation: i64,
        reason: &str,
        now: Millis,
    ) -> Vec<Action> {
        let Some(job) = self.by_uid.get(run_id).and_then(|k| self.jobs.get_mut(k)) else {
            return Vec::new();
        };
        let placed_here = matches!(&job.phase, Phase::Placed { spoke: s } if s == spoke);
        if !placed_here || job.generation != generation || job.info.want != Want::Run {
            return Vec::new();
        }
        let key = job.info.key.clone();
        let (why, message) = match reason {
            LOST_FENCED => (
                reason::FENCED,
                format!(
                    "Requeued: spoke {spoke} fenced itself (it heard nothing from the hub for its fence-after) and stopped the run"
                ),
            ),
            LOST_SPOKE_RESTARTED => (
                reason::SPOKE_RESTARTED,
                format!("Requeued: spoke {spoke} restarted and killed the run's processes"),
            ),
            other => (
                reason::RUN_LOST,
                format!("Requeued: spoke {spoke} lost the run ({other:.64})"),
            ),
        };
        let mut actions = self.requeue(&key, why, message, now);
        actions.extend(self.dispatch_all(now));
        actions
    }

    /// Time passes: lost spokes are given up (their runs requeued, the
    /// deleted TrainJobs waiting on them released), deletions waiting past
    /// `deletion_timeout` released, unanswered offers past `offer_timeout`
    /// withdrawn, incremental rounds widen, refusals expire.
    pub fn tick(&mut self, now: Millis) -> Vec<Action> {
        let lost: Vec<String> = self
            .spokes
            .iter()
            .filter(|(_, s)| {
                s.disconnected_at
                    .is_some_and(|at| now.saturating_sub(at) >= self.config.worker_lost_timeout_ms)
            })
            .map(|(n, _)| n.clone())
            .collect();
        let mut actions = Vec::new();
        for name in &lost {
            self.spokes.remove(name);
            let requeue: Vec<JobKey> = self
                .jobs
                .values()
                .filter(|job| {
                    job.info.want == Want::Run
                        && matches!(&job.phase, Phase::Placed { spoke } if spoke == name)
                })
                .map(|job| job.info.key.clone())
                .collect();
            for key in requeue {
                let message = format!(
                    "Requeued: spoke {name} stayed disconnected for the worker-lost timeout ({}s)",
                    self.config.worker_lost_timeout_ms / 1000
                );
                actions.extend(self.requeue(&key, reason::SPOKE_LOST, message, now));
            }
        }
        let retry_ms = self.config.retry_ms;
        let offer_timeout_ms = self.config.offer_timeout_ms;
        let deletion_timeout_ms = self.config.deletion_timeout_ms;
        for job in self.jobs.values_mut() {
            let uid = job.info.uid.clone();
            match &mut job.phase {
                Phase::Queued {
                    offers,
                    round_started,
                    quota,
                } => {
                    let mut expired = Vec::new();
                    offers.retain(|spoke, state| match state {
                        OfferState::Refused { at } => now.saturating_sub(*at) < retry_ms,
                        OfferState::Pending { at } => {
                            if now.saturating_sub(*at) >= offer_timeout_ms {
                                expired.push(spoke.clone());
                            }
                            true
                        }
                    });
                    for spoke in expired {
                        offers.insert(spoke.clone(), OfferState::Refused { at: now });
                        actions.push(Action::Withdraw {
                            spoke: spoke.clone(),
                            run_id: uid.clone(),
                            generation: job.generation,
                        });
                        actions.push(Action::Event {
                            job: job.info.key.clone(),
                            uid: uid.clone(),
                            warning: true,
                            reason: reason::OFFER_EXPIRED,
                            message: format!(
                                "The offer to spoke {spoke} (placement {}) went unanswered for {}s and was withdrawn",
                                job.generation,
                                offer_timeout_ms / 1000
                            ),
                        });
                    }
                    if let Mode::Incremental { step, round_ms } = self.config.mode
                        && now.saturating_sub(*round_started) >= round_ms
                    {
                        *round_started = now;
                        *quota = quota.saturating_add(step);
                    }
                }
                Phase::Deleting { spoke, since }
                    if lost.contains(spoke)
                        || now.saturating_sub(*since) >= deletion_timeout_ms =>
                {
                    job.phase = Phase::Idle;
                    actions.push(Action::Release {
                        job: job.info.key.clone(),
                        uid,
                    });
                }
                _ => {}
            }
        }
        actions.extend(self.dispatch_all(now));
        actions
    }

    /// Offers every queued job, in queue order, to the spokes it may go to.
    fn dispatch_all(&mut self, now: Millis) -> Vec<Action> {
        let keys: Vec<JobKey> = self.queue.iter().map(|(_, _, k)| k.clone()).collect();
        let mut actions = Vec::new();
        for key in keys {
            actions.extend(self.nominate(&key, now));
        }
        actions
    }

    /// Offers one queued job to more spokes, within its quota (or its
    /// fan-out): connected, matching its selector, with room for the whole
    /// gang now.
    fn nominate(&mut self, key: &JobKey, now: Millis) -> Vec<Action> {
        let fanout = match self.config.mode {
            Mode::AllAtOnce if self.config.fanout > 0 => Some(self.config.fanout),
            _ => None,
        };
        let turn = self.turn;
        self.turn = self.turn.wrapping_add(1);
        let Some(job) = self.jobs.get_mut(key) else {
            return Vec::new();
        };
        let Phase::Queued { offers, quota, .. } = &mut job.phase else {
            return Vec::new();
        };
        let demand = gang_total(&job.info.pod_sets);
        let mut eligible: Vec<(&String, &Spoke)> = self
            .spokes
            .iter()
            .filter(|(name, spoke)| {
                spoke.disconnected_at.is_none()
                    && !self.unschedulable.contains(*name)
                    && !offers.contains_key(*name)
                    && spoke.could_ever_fit(&demand)
                    && spoke.fits_now(&demand)
                    && job
                        .info
                        .selector
                        .as_ref()
                        .is_none_or(|s| s.matches(Some(&spoke.labels)))
            })
            .collect();
        let room = match fanout {
            None => quota.saturating_sub(offers.len()),
            Some(fanout) => {
                if !eligible.is_empty() {
                    let at = turn % eligible.len();
                    eligible.rotate_left(at);
                }
                // Stable: equals keep their turn order.
                eligible.sort_by(|a, b| headroom(b.1, &demand).total_cmp(&headroom(a.1, &demand)));
                let pending = offers
                    .values()
                    .filter(|s| matches!(s, OfferState::Pending { .. }))
                    .count();
                fanout.saturating_sub(pending)
            }
        };
        let mut actions = Vec::new();
        for (name, _) in eligible.into_iter().take(room) {
            offers.insert(name.clone(), OfferState::Pending { at: now });
            actions.push(Action::Offer {
                spoke: name.clone(),
                job: key.clone(),
                run_id: job.info.uid.clone(),
                generation: job.generation,
                pod_sets: job.info.pod_sets.clone(),
            });
        }
        actions
    }
}

/// The share of a spoke's allocatable left free after placing `demand`, on
/// the resource the demand leaves scarcest (1.0 for an empty demand).
fn headroom(spoke: &Spoke, demand: &Resources) -> f64 {
    demand
        .iter()
        .filter(|(_, m)| **m > 0)
        .map(|(r, m)| {
            let alloc = spoke.allocatable.get(r).copied().unwrap_or(0).max(1) as f64;
            let free = spoke.free.get(r).copied().unwrap_or(0) as f64;
            (free - *m as f64) / alloc
        })
        .fold(1.0, f64::min)
}

/// Withdrawals of one run's offers from `spokes`.
fn withdraw_all<'a>(
    spokes: impl Iterator<Item = &'a String>,
    run_id: &str,
    generation: i64,
) -> Vec<Action> {
    spokes
        .map(|spoke| Action::Withdraw {
            spoke: spoke.clone(),
            run_id: run_id.to_string(),
            generation,
        })
        .collect()
}

fn initial_quota(mode: Mode) -> usize {
    match mode {
        Mode::AllAtOnce => usize::MAX,
        Mode::Incremental { step, .. } => step.max(1),
    }
}

fn split_capacity(capacity: Vec<(String, i64, i64)>) -> (Resources, Resources) {
    let mut allocatable = Resources::new();
    let mut free = Resources::new();
    for (resource, alloc, f) in capacity {
        allocatable.insert(resource.clone(), alloc);
        free.insert(resource, f);
    }
    (allocatable, free)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key(name: &str) -> JobKey {
        JobKey {
            namespace: "default".into(),
            name: name.into(),
        }
    }

    fn job(name: &str, cpu: i64, nodes: u32) -> JobInfo {
        JobInfo {
            key: key(name),
            uid: format!("uid-{name}"),
            priority: 0,
            created: 0,
            selector: None,
            pod_sets: vec![PodSetDemand {
                name: "node".into(),
                count: nodes,
                requests_milli: [("cpu".to_string(), cpu)].into(),
            }],
            want: Want::Run,
        }
    }

    fn cpu(alloc: i64, free: i64) -> Vec<(String, i64, i64)> {
        vec![("cpu".into(), alloc, free)]
    }

    fn offers(actions: &[Action]) -> Vec<(String, String, i64)> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Offer {
                    spoke,
                    job,
                    generation,
                    ..
                } => Some((spoke.clone(), job.name.clone(), *generation)),
                _ => None,
            })
            .collect()
    }

    fn events(actions: &[Action]) -> Vec<&'static str> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Event { reason, .. } => Some(*reason),
                _ => None,
            })
            .collect()
    }

    fn released(actions: &[Action]) -> Vec<String> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Release { job, .. } => Some(job.name.clone()),
                _ => None,
            })
            .collect()
    }

    fn withdrawals(actions: &[Action]) -> Vec<(String, String, i64)> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Withdraw {
                    spoke,
                    run_id,
                    generation,
                } => Some((spoke.clone(), run_id.clone(), *generation)),
                _ => None,
            })
            .collect()
    }

    fn deleting(name: &str) -> JobInfo {
        let mut j = job(name, 1000, 1);
        j.want = Want::Delete;
        j
    }

    fn dispatcher(mode: Mode) -> Dispatcher {
        Dispatcher::new(Config {
            mode,
            worker_lost_timeout_ms: 1000,
            retry_ms: 500,
            fanout: 0,
            offer_timeout_ms: 2000,
            deletion_timeout_ms: 3000,
        })
    }

    fn connect(d: &mut Dispatcher, name: &str, labels: Value, free: i64) -> Vec<Action> {
        d.spoke_connected(name, labels, cpu(8000, free), &[], 0)
    }

    fn place(d: &mut Dispatcher, name: &str, spoke: &str) -> Vec<Action> {
        let uid = format!("uid-{name}");
        let generation = d.jobs[&key(name)].generation;
        let actions = d.admit_answer(spoke, &uid, generation, true, 0);
        let placement = Placement {
            spoke: Some(spoke.into()),
            generation,
        };
        assert!(actions.contains(&Action::Commit {
            job: key(name),
            placement: placement.clone()
        }));
        let mut all = actions;
        all.extend(d.committed(&key(name), &placement, true, 0));
        all
    }

    #[test]
    fn after_a_hub_restart_a_placement_on_a_spoke_that_never_returns_is_requeued() {
        let mut d = dispatcher(Mode::AllAtOnce);
        let placed = Placement {
            spoke: Some("gone".into()),
            generation: 2,
        };
        // Loaded at 100: the timer runs from the load.
        assert!(
            d.upsert_job(job("j", 1000, 1), Some(placed), 100)
                .is_empty()
        );
        connect(&mut d, "b", json!({}), 8000);
        assert_eq!(d.connected_spokes(), 1, "the absent spoke is not counted");
        assert!(d.tick(1000).is_empty(), "not lost yet");
        assert_eq!(d.placement(&key("j")), Some(("gone", 2)));
        let actions = d.tick(1100);
        assert!(actions.contains(&Action::Commit {
            job: key("j"),
            placement: Placement {
                spoke: None,
                generation: 3
            }
        }));
        assert_eq!(events(&actions), vec![reason::SPOKE_LOST]);
        assert_eq!(offers(&actions), vec![("b".into(), "j".into(), 3)]);
    }

    #[test]
    fn after_a_hub_restart_a_spoke_that_returns_in_time_keeps_its_placement() {
        let mut d = dispatcher(Mode::AllAtOnce);
        let placed = Placement {
            spoke: Some("a".into()),
            generation: 1,
        };
        d.upsert_job(job("j", 1000, 1), Some(placed), 0);
        assert!(
            d.spoke_connected("a", json!({}), cpu(8000, 7000), &[("uid-j".into(), 1)], 500)
                .is_empty()
        );
        assert!(d.tick(5000).is_empty(), "connected: never lost");
        assert_eq!(d.placement(&key("j")), Some(("a", 1)));
    }

    #[test]
    fn an_unanswered_offer_expires_is_withdrawn_and_offered_again() {
        let mut d = dispatcher(Mode::AllAtOnce);
        connect(&mut d, "a", json!({}), 8000);
        d.upsert_job(job("j", 1000, 1), None, 0);
        d.spoke_connected("b", json!({}), cpu(8000, 8000), &[], 1000);
        // Neither answers.
        assert!(withdrawals(&d.tick(1999)).is_empty());
        let actions = d.tick(2000);
        assert_eq!(withdrawals(&actions), vec![("a".into(), "uid-j".into(), 1)]);
        assert_eq!(events(&actions), vec![reason::OFFER_EXPIRED]);
        // Counted as a refusal: offered to a again after the retry time.
        assert!(offers(&actions).is_empty());
        let actions = d.tick(2500);
        assert_eq!(offers(&actions), vec![("a".into(), "j".into(), 1)]);
        assert!(withdrawals(&actions).is_empty());
        assert_eq!(
            withdrawals(&d.tick(3000)),
            vec![("b".into(), "uid-j".into(), 1)]
        );
        // b admits after its offer expired: it cannot win, it is withdrawn.
        assert_eq!(
            d.admit_answer("b", "uid-j", 1, true, 3050),
            vec![Action::Withdraw {
                spoke: "b".into(),
                run_id: "uid-j".into(),
                generation: 1
            }]
        );
        // A timely answer wins as usual.
        let actions = d.admit_answer("a", "uid-j", 1, true, 3100);
        assert!(actions.iter().any(|a| matches!(a, Action::Commit { .. })));
    }

    #[test]
    fn a_reservation_the_hub_no_longer_offers_is_withdrawn_again() {
        let mut d = dispatcher(Mode::AllAtOnce);
        connect(&mut d, "a", json!({}), 8000);
        connect(&mut d, "b", json!({}), 8000);
        d.upsert_job(job("j", 1000, 1), None, 0);
        place(&mut d, "j", "b");
        // a admitted late; its Withdraw was lost: it still lists it.
        let actions = d.spoke_heartbeat(
            "a",
            cpu(8000, 7000),
            &[("uid-j".into(), 1), ("uid-gone".into(), 4)],
            10,
        );
        assert_eq!(
            withdrawals(&actions),
            vec![
                ("a".into(), "uid-j".into(), 1),
                ("a".into(), "uid-gone".into(), 4)
            ]
        );
        // The winner's own reservation (its Start in flight) is left alone.
        assert!(
            d.spoke_heartbeat("b", cpu(8000, 7000), &[("uid-j".into(), 1)], 20)
                .is_empty()
        );
        // An older generation is withdrawn.
        assert_eq!(
            withdrawals(&d.spoke_heartbeat("b", cpu(8000, 7000), &[("uid-j".into(), 0)], 30)),
            vec![("b".into(), "uid-j".into(), 0)]
        );
    }

    #[test]
    fn a_reservation_of_a_pending_offer_is_the_admission_the_hub_never_heard() {
        let mut d = dispatcher(Mode::AllAtOnce);
        connect(&mut d, "a", json!({}), 8000);
        d.upsert_job(job("j", 1000, 1), None, 0);
        let actions = d.spoke_heartbeat("a", cpu(8000, 7000), &[("uid-j".into(), 1)], 10);
        assert_eq!(
            actions,
            vec![Action::Commit {
                job: key("j"),
                placement: Placement {
                    spoke: Some("a".into()),
                    generation: 1
                }
            }]
        );
        // The answer arriving after all changes nothing.
        assert!(d.admit_answer("a", "uid-j", 1, true, 11).is_empty());
    }

    #[test]
    fn a_placement_whose_start_was_lost_is_started_again() {
        let mut d = dispatcher(Mode::AllAtOnce);
        connect(&mut d, "a", json!({}), 8000);
        d.upsert_job(job("j", 1000, 1), None, 0);
        place(&mut d, "j", "a");
        let start = Action::Start {
            spoke: "a".into(),
            job: key("j"),
            run_id: "uid-j".into(),
            generation: 1,
        };
        // Within the retry time the Start may still be on its way.
        assert!(
            d.spoke_heartbeat("a", cpu(8000, 7000), &[("uid-j".into(), 1)], 100)
                .is_empty()
        );
        assert_eq!(
            d.spoke_heartbeat("a", cpu(8000, 7000), &[("uid-j".into(), 1)], 500),
            vec![start.clone()]
        );
        assert!(
            d.spoke_heartbeat("a", cpu(8000, 7000), &[("uid-j".into(), 1)], 600)
                .is_empty(),
            "once per retry time"
        );
    }

    #[test]
    fn an_admission_the_spoke_no_longer_holds_is_forgotten_and_the_job_nominated_again() {
        let mut d = dispatcher(Mode::AllAtOnce);
        connect(&mut d, "a", json!({}), 8000);
        d.upsert_job(job("j", 1000, 1), None, 0);
        d.admit_answer("a", "uid-j", 1, true, 10);
        // The placement is being written; the spoke lists no reservation,
        // twice in a row.
        assert!(d.spoke_heartbeat("a", cpu(8000, 8000), &[], 15).is_empty());
        let actions = d.spoke_heartbeat("a", cpu(8000, 8000), &[], 20);
        assert!(actions.contains(&Action::Commit {
            job: key("j"),
            placement: Placement {
                spoke: None,
                generation: 2
            }
        }));
        assert_eq!(events(&actions), vec![reason::ADMISSION_LOST]);
        assert_eq!(offers(&actions), vec![("a".into(), "j".into(), 2)]);
        // The write of the old placement lands: nothing starts.
        let old = Placement {
            spoke: Some("a".into()),
            generation: 1,
        };
        assert!(d.committed(&key("j"), &old, true, 30).is_empty());
        assert_eq!(d.check_run("a", "uid-j", 1), Verdict::Stale);
    }

    #[test]
    fn a_deleted_trainjob_never_placed_is_released_at_once() {
        let mut d = dispatcher(Mode::AllAtOnce);
        assert!(d.upsert_job(job("idle", 1000, 1), None, 0).is_empty());
        assert_eq!(released(&d.upsert_job(deleting("idle"), None, 1)), ["idle"]);
        connect(&mut d, "a", json!({}), 8000);
        d.upsert_job(job("q", 1000, 1), None, 0);
        let actions = d.upsert_job(deleting("q"), None, 1);
        assert_eq!(withdrawals(&actions), vec![("a".into(), "uid-q".into(), 1)]);
        assert_eq!(released(&actions), ["q"]);
        assert!(offers(&d.tick(10)).is_empty(), "never offered again");
    }

    #[test]
    fn a_deleted_trainjob_is_released_when_its_spoke_confirms_the_stop() {
        let mut d = dispatcher(Mode::AllAtOnce);
        connect(&mut d, "a", json!({}), 8000);
        d.upsert_job(job("j", 1000, 1), None, 0);
        place(&mut d, "j", "a");
        let actions = d.upsert_job(deleting("j"), None, 10);
        assert!(actions.contains(&Action::Stop {
            spoke: "a".into(),
            run_id: "uid-j".into(),
            generation: 1,
            reason: "deleted"
        }));
        assert!(released(&actions).is_empty(), "waits for the spoke");
        assert_eq!(d.check_run("a", "uid-j", 1), Verdict::Stale);
        assert!(d.run_stopped("b", "uid-j", 1).is_empty(), "another spoke");
        assert!(d.run_stopped("a", "uid-j", 0).is_empty(), "an older run");
        assert_eq!(released(&d.run_stopped("a", "uid-j", 1)), ["j"]);
        assert!(released(&d.tick(100_000)).is_empty(), "released once");
    }

    #[test]
    fn a_deleted_trainjob_is_released_when_its_spoke_returns_without_the_run() {
        let mut d = dispatcher(Mode::AllAtOnce);
        connect(&mut d, "a", json!({}), 8000);
        d.upsert_job(job("j", 1000, 1), None, 0);
        place(&mut d, "j", "a");
        d.spoke_disconnected("a", 5);
        d.upsert_job(deleting("j"), None, 10);
        // Back still holding it: stopped again, still waiting.
        let actions =
            d.spoke_connected("a", json!({}), cpu(8000, 7000), &[("uid-j".into(), 1)], 20);
        assert!(released(&actions).is_empty());
        assert!(
            actions
                .iter()
                .any(|a| matches!(a, Action::Stop { generation: 1, .. }))
        );
        d.spoke_disconnected("a", 30);
        let actions = d.spoke_connected("a", json!({}), cpu(8000, 8000), &[], 40);
        assert_eq!(released(&actions), ["j"]);
    }

    #[test]
    fn a_finished_trainjob_is_released_and_its_deletion_waits_for_nothing() {
        let mut d = dispatcher(Mode::AllAtOnce);
        connect(&mut d, "a", json!({}), 8000);
        d.upsert_job(job("j", 1000, 1), None, 0);
        place(&mut d, "j", "a");
        let mut finished = job("j", 1000, 1);
        finished.want = Want::Finished;
        assert_eq!(released(&d.upsert_job(finished.clone(), None, 10)), ["j"]);
        assert!(
            released(&d.upsert_job(finished, None, 11)).is_empty(),
            "once"
        );
        let actions = d.upsert_job(deleting("j"), None, 20);
        assert_eq!(released(&actions), ["j"]);
        assert!(actions.iter().any(|a| matches!(
            a,
            Action::Stop {
                reason: "deleted",
                ..
            }
        )));
    }

    #[test]
    fn a_deleted_trainjob_is_released_when_its_spoke_is_lost_or_after_the_bound() {
        let mut d = dispatcher(Mode::AllAtOnce);
        connect(&mut d, "a", json!({}), 8000);
        connect(&mut d, "b", json!({}), 8000);
        d.upsert_job(job("j", 1000, 1), None, 0);
        place(&mut d, "j", "a");
        d.upsert_job(job("k", 1000, 1), None, 0);
        place(&mut d, "k", "b");
        d.spoke_disconnected("a", 100);
        d.upsert_job(deleting("j"), None, 100);
        d.upsert_job(deleting("k"), None, 100);
        // a is lost at 1100: j is released; k's spoke never answers.
        assert_eq!(released(&d.tick(1100)), ["j"]);
        assert!(released(&d.tick(3099)).is_empty());
        assert_eq!(released(&d.tick(3100)), ["k"]);
    }

    #[test]
    fn a_limited_fanout_offers_the_roomiest_spokes_and_replaces_a_refusal() {
        let mut d = Dispatcher::new(Config {
            fanout: 2,
            ..Config::default()
        });
        connect(&mut d, "a", json!({}), 3000);
        connect(&mut d, "b", json!({}), 8000);
        connect(&mut d, "c", json!({}), 6000);
        connect(&mut d, "d", json!({}), 2000);
        let actions = d.upsert_job(job("j", 1000, 2), None, 0);
        assert_eq!(
            offers(&actions),
            vec![("b".into(), "j".into(), 1), ("c".into(), "j".into(), 1)]
        );
        // b refuses: the next roomiest spoke takes its place.
        let actions = d.admit_answer("b", "uid-j", 1, false, 1);
        assert_eq!(offers(&actions), vec![("a".into(), "j".into(), 1)]);
        // The winner's rivals are withdrawn, the refusal included.
        let actions = d.admit_answer("a", "uid-j", 1, true, 2);
        let withdrawn: BTreeSet<&str> = actions
            .iter()
            .filter_map(|a| match a {
                Action::Withdraw { spoke, .. } => Some(spoke.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(withdrawn, BTreeSet::from(["b", "c"]));
    }

    #[test]
    fn spokes_with_equal_room_take_turns_under_a_limited_fanout() {
        let mut d = Dispatcher::new(Config {
            fanout: 1,
            ..Config::default()
        });
        for s in ["a", "b", "c"] {
            connect(&mut d, s, json!({}), 8000);
        }
        let first: Vec<String> = (0..6)
            .map(|i| {
                let actions = d.upsert_job(job(&format!("j{i}"), 1000, 1), None, 0);
                let offered = offers(&actions);
                assert_eq!(offered.len(), 1, "{offered:?}");
                offered[0].0.clone()
            })
            .collect();
        for s in ["a", "b", "c"] {
            assert_eq!(first.iter().filter(|f| *f == s).count(), 2, "{first:?}");
        }
    }

    #[test]
    fn all_at_once_offers_every_eligible_spoke_and_the_first_admission_wins() {
        let mut d = dispatcher(Mode::AllAtOnce);
        for s in ["a", "b", "c"] {
            connect(&mut d, s, json!({}), 8000);
        }
        connect(&mut d, "small", json!({}), 1000);
        let actions = d.upsert_job(job("j", 2000, 2), None, 0);
        assert_eq!(
            offers(&actions),
            vec![
                ("a".into(), "j".into(), 1),
                ("b".into(), "j".into(), 1),
                ("c".into(), "j".into(), 1)
            ]
        );
        // b admits first: committed before anyone is told, others withdrawn.
        let actions = d.admit_answer("b", "uid-j", 1, true, 1);
        assert_eq!(
            actions,
            vec![
                Action::Withdraw {
                    spoke: "a".into(),
                    run_id: "uid-j".into(),
                    generation: 1
                },
                Action::Withdraw {
                    spoke: "c".into(),
                    run_id: "uid-j".into(),
                    generation: 1
                },
                Action::Commit {
                    job: key("j"),
                    placement: Placement {
                        spoke: Some("b".into()),
                        generation: 1
                    }
                },
            ]
        );
        assert_eq!(d.placement(&key("j")), Some(("b", 1)));
        // a admits too late: withdrawn.
        assert_eq!(
            d.admit_answer("a", "uid-j", 1, true, 2),
            vec![Action::Withdraw {
                spoke: "a".into(),
                run_id: "uid-j".into(),
                generation: 1
            }]
        );
        let placement = Placement {
            spoke: Some("b".into()),
            generation: 1,
        };
        assert_eq!(
            d.committed(&key("j"), &placement, true, 3),
            vec![Action::Start {
                spoke: "b".into(),
                job: key("j"),
                run_id: "uid-j".into(),
                generation: 1
            }]
        );
        assert_eq!(d.queue_depth(), 0);
        // Duplicate commit acknowledgement: nothing more.
        assert!(d.committed(&key("j"), &placement, true, 4).is_empty());
    }

    #[test]
    fn incremental_widens_by_step_each_round() {
        let mut d = dispatcher(Mode::Incremental {
            step: 2,
            round_ms: 100,
        });
        for s in ["a", "b", "c", "d", "e"] {
            connect(&mut d, s, json!({}), 8000);
        }
        let first = offers(&d.upsert_job(job("j", 1000, 1), None, 0));
        assert_eq!(first.len(), 2);
        assert!(offers(&d.tick(50)).is_empty(), "round not over");
        let second = offers(&d.tick(100));
        assert_eq!(
            second.iter().map(|o| o.0.as_str()).collect::<Vec<_>>(),
            ["c", "d"]
        );
    }

    #[test]
    fn queue_order_is_priority_then_creation_time() {
        let mut d = dispatcher(Mode::AllAtOnce);
        let mut low = job("low", 1000, 1);
        low.created = 1;
        let mut old = job("old", 1000, 1);
        old.created = 2;
        old.priority = 5;
        let mut new = job("new", 1000, 1);
        new.created = 3;
        new.priority = 5;
        for j in [low, new, old] {
            assert!(d.upsert_job(j, None, 0).is_empty(), "no spoke yet");
        }
        let order: Vec<String> = offers(&connect(&mut d, "a", json!({}), 8000))
            .into_iter()
            .map(|o| o.1)
            .collect();
        assert_eq!(order, ["old", "new", "low"]);
    }

    #[test]
    fn selector_and_capacity_decide_eligibility() {
        let mut d = dispatcher(Mode::AllAtOnce);
        connect(&mut d, "east", json!({"region": "east"}), 8000);
        connect(&mut d, "west", json!({"region": "west"}), 8000);
        connect(&mut d, "west-small", json!({"region": "west"}), 1000);
        let mut j = job("j", 2000, 1);
        j.selector = Some(LabelSelector::parse("region=west").unwrap());
        assert_eq!(
            offers(&d.upsert_job(j, None, 0)),
            vec![("west".into(), "j".into(), 1)]
        );
        // A gang bigger than any spoke is never offered.
        assert!(offers(&d.upsert_job(job("huge", 5000, 2), None, 0)).is_empty());
    }

    #[test]
    fn a_cordoned_spoke_gets_no_offers_until_uncordoned_and_keeps_its_runs() {
        let mut d = dispatcher(Mode::AllAtOnce);
        connect(&mut d, "a", json!({}), 8000);
        connect(&mut d, "b", json!({}), 8000);
        d.upsert_job(job("placed", 1000, 1), None, 0);
        place(&mut d, "placed", "a");
        assert!(d.set_unschedulable("a", true, 0).is_empty());
        assert_eq!(
            offers(&d.upsert_job(job("j", 1000, 1), None, 0)),
            vec![("b".into(), "j".into(), 1)]
        );
        // Nothing changed for the run already there.
        assert_eq!(d.placement(&key("placed")), Some(("a", 1)));
        assert_eq!(d.spoke_views()["a"].running, 1);
        // Still cordoned after a reconnect.
        d.spoke_disconnected("a", 5);
        d.spoke_connected("a", json!({}), cpu(8000, 7000), &[], 6);
        assert!(
            offers(&d.upsert_job(job("k", 1000, 1), None, 7))
                .iter()
                .all(|(s, ..)| s != "a")
        );
        // Uncordoned: the queued jobs are offered to it at once.
        let again = offers(&d.set_unschedulable("a", false, 8));
        assert!(again.iter().any(|(s, ..)| s == "a"), "{again:?}");
    }

    #[test]
    fn a_refusal_is_retried_when_capacity_grows_or_after_retry_time() {
        let mut d = dispatcher(Mode::AllAtOnce);
        connect(&mut d, "a", json!({}), 8000);
        d.upsert_job(job("j", 1000, 1), None, 0);
        assert!(offers(&d.admit_answer("a", "uid-j", 1, false, 10)).is_empty());
        // Same free capacity: no new offer.
        assert!(offers(&d.spoke_heartbeat("a", cpu(8000, 8000), &[], 20)).is_empty());
        assert!(offers(&d.tick(100)).is_empty());
        // The retry time passed.
        assert_eq!(offers(&d.tick(600)).len(), 1);
        d.admit_answer("a", "uid-j", 1, false, 600);
        // Capacity grew.
        d.spoke_heartbeat("a", cpu(8000, 4000), &[], 610);
        assert_eq!(
            offers(&d.spoke_heartbeat("a", cpu(8000, 6000), &[], 620)).len(),
            1
        );
    }

    #[test]
    fn a_lost_spoke_is_given_up_and_its_stale_run_stopped_when_it_returns() {
        let mut d = dispatcher(Mode::AllAtOnce);
        connect(&mut d, "a", json!({}), 8000);
        d.upsert_job(job("j", 1000, 1), None, 0);
        place(&mut d, "j", "a");
        connect(&mut d, "b", json!({}), 8000);
        assert!(d.spoke_disconnected("a", 100).is_empty());
        // Not yet lost: the run stays placed on a.
        assert!(d.tick(500).is_empty());
        assert_eq!(d.placement(&key("j")), Some(("a", 1)));
        // Lost: requeued under generation 2 and offered to b.
        let actions = d.tick(1100);
        assert!(actions.contains(&Action::Commit {
            job: key("j"),
            placement: Placement {
                spoke: None,
                generation: 2
            }
        }));
        assert_eq!(offers(&actions), vec![("b".into(), "j".into(), 2)]);
        place(&mut d, "j", "b");
        // a returns still holding generation 1: stopped, and its reports refused.
        let actions = d.spoke_connected(
            "a",
            json!({}),
            cpu(8000, 7000),
            &[("uid-j".into(), 1)],
            1200,
        );
        assert_eq!(
            actions,
            vec![Action::Stop {
                spoke: "a".into(),
                run_id: "uid-j".into(),
                generation: 1,
                reason: "not placed on this spoke"
            }]
        );
        assert_eq!(d.check_run("a", "uid-j", 1), Verdict::Stale);
        assert_eq!(d.check_run("b", "uid-j", 2), Verdict::Accept(key("j")));
        assert_eq!(d.check_run("a", "uid-j", 2), Verdict::Foreign);
    }

    #[test]
    fn a_run_the_spoke_lost_is_requeued_at_once_and_an_older_one_changes_nothing() {
        let mut d = dispatcher(Mode::AllAtOnce);
        connect(&mut d, "a", json!({}), 8000);
        d.upsert_job(job("j", 1000, 1), None, 0);
        place(&mut d, "j", "a");
        connect(&mut d, "b", json!({}), 8000);
        // Another spoke, or a generation that is not the placement's: nothing.
        assert!(d.run_lost("b", "uid-j", 1, LOST_FENCED, 10).is_empty());
        assert!(d.run_lost("a", "uid-j", 0, LOST_FENCED, 10).is_empty());
        assert!(d.run_lost("a", "uid-other", 1, LOST_FENCED, 10).is_empty());
        assert_eq!(d.placement(&key("j")), Some(("a", 1)));
        // The placement's run: requeued under generation 2 with the reason,
        // and offered again (a, which restarted, too), without waiting for
        // the worker-lost timeout.
        d.spoke_disconnected("a", 20);
        connect(&mut d, "a", json!({}), 8000);
        let actions = d.run_lost("a", "uid-j", 1, LOST_SPOKE_RESTARTED, 30);
        assert_eq!(
            actions[..2],
            [
                Action::Commit {
                    job: key("j"),
                    placement: Placement {
                        spoke: None,
                        generation: 2
                    }
                },
                Action::Event {
                    job: key("j"),
                    uid: "uid-j".into(),
                    warning: true,
                    reason: reason::SPOKE_RESTARTED,
                    message: "Requeued: spoke a restarted and killed the run's processes".into(),
                }
            ]
        );
        let mut offered = offers(&actions);
        offered.sort();
        assert_eq!(
            offered,
            vec![("a".into(), "j".into(), 2), ("b".into(), "j".into(), 2)]
        );
        // Said again (a second hello): the run is now stale, nothing more.
        assert!(
            d.run_lost("a", "uid-j", 1, LOST_SPOKE_RESTARTED, 40)
                .is_empty()
        );
        assert_eq!(d.check_run("a", "uid-j", 1), Verdict::Stale);
        place(&mut d, "j", "b");
        assert!(d.run_lost("a", "uid-j", 1, LOST_FENCED, 50).is_empty());
        assert_eq!(d.placement(&key("j")), Some(("b", 2)));
    }

    #[test]
    fn reconnect_within_the_timeout_keeps_the_run_and_restarts_a_lost_start() {
        let mut d = dispatcher(Mode::AllAtOnce);
        connect(&mut d, "a", json!({}), 8000);
        d.upsert_job(job("j", 1000, 1), None, 0);
        place(&mut d, "j", "a");
        d.spoke_disconnected("a", 10);
        // Back in time, holding the run: nothing to do.
        assert!(
            d.spoke_connected("a", json!({}), cpu(8000, 7000), &[("uid-j".into(), 1)], 20)
                .is_empty()
        );
        // Back without it (the start was lost): started again.
        d.spoke_disconnected("a", 30);
        assert_eq!(
            d.spoke_connected("a", json!({}), cpu(8000, 8000), &[], 40),
            vec![Action::Start {
                spoke: "a".into(),
                job: key("j"),
                run_id: "uid-j".into(),
                generation: 1
            }]
        );
        assert!(d.tick(5000).is_empty(), "reconnected: never lost");
    }

    #[test]
    fn after_a_hub_restart_the_committed_placement_is_kept() {
        let mut d = dispatcher(Mode::AllAtOnce);
        let placed = Placement {
            spoke: Some("a".into()),
            generation: 3,
        };
        assert!(d.upsert_job(job("j", 1000, 1), Some(placed), 0).is_empty());
        connect(&mut d, "b", json!({}), 8000);
        // Unplaced at generation 3 (requeued before the crash): offered as 4.
        let unplaced = Placement {
            spoke: None,
            generation: 3,
        };
        assert_eq!(
            offers(&d.upsert_job(job("k", 1000, 1), Some(unplaced), 0)),
            vec![("b".into(), "k".into(), 4)]
        );
        assert_eq!(d.placement(&key("j")), Some(("a", 3)));
    }

    #[test]
    fn suspend_stops_the_run_and_resume_requeues_under_a_new_generation() {
        let mut d = dispatcher(Mode::AllAtOnce);
        connect(&mut d, "a", json!({}), 8000);
        d.upsert_job(job("j", 1000, 1), None, 0);
        place(&mut d, "j", "a");
        let mut suspended = job("j", 1000, 1);
        suspended.want = Want::Suspend;
        let actions = d.upsert_job(suspended, None, 1);
        assert_eq!(
            actions,
            vec![
                Action::Stop {
                    spoke: "a".into(),
                    run_id: "uid-j".into(),
                    generation: 1,
                    reason: "suspended"
                },
                Action::Commit {
                    job: key("j"),
                    placement: Placement {
                        spoke: None,
                        generation: 1
                    }
                },
                Action::Event {
                    job: key("j"),
                    uid: "uid-j".into(),
                    warning: false,
                    reason: reason::SUSPENDED,
                    message: "Suspended: its run (placement 1) stopped on spoke a".into()
                }
            ]
        );
        let actions = d.upsert_job(job("j", 1000, 1), None, 2);
        assert_eq!(offers(&actions), vec![("a".into(), "j".into(), 2)]);
        assert_eq!(events(&actions), vec![reason::RESUMED]);
    }

    #[test]
    fn delete_cancels_the_run_and_forgets_the_placement() {
        let mut d = dispatcher(Mode::AllAtOnce);
        connect(&mut d, "a", json!({}), 8000);
        connect(&mut d, "b", json!({}), 8000);
        d.upsert_job(job("q", 1000, 1), None, 0);
        assert_eq!(
            d.remove_job(&key("q")),
            vec![
                Action::Withdraw {
                    spoke: "a".into(),
                    run_id: "uid-q".into(),
                    generation: 1
                },
                Action::Withdraw {
                    spoke: "b".into(),
                    run_id: "uid-q".into(),
                    generation: 1
                },
                Action::Forget { job: key("q") }
            ]
        );
        d.upsert_job(job("j", 1000, 1), None, 0);
        place(&mut d, "j", "a");
        assert_eq!(
            d.remove_job(&key("j")),
            vec![
                Action::Stop {
                    spoke: "a".into(),
                    run_id: "uid-j".into(),
                    generation: 1,
                    reason: "deleted"
                },
                Action::Forget { job: key("j") }
            ]
        );
        // Its spoke still reports it: stale, not foreign.
        assert_eq!(d.check_run("a", "uid-j", 1), Verdict::Stale);
    }

    #[test]
    fn a_failed_commit_requeues_and_withdraws_the_winner() {
        let mut d = dispatcher(Mode::AllAtOnce);
        connect(&mut d, "a", json!({}), 8000);
        d.upsert_job(job("j", 1000, 1), None, 0);
        d.admit_answer("a", "uid-j", 1, true, 0);
        let placement = Placement {
            spoke: Some("a".into()),
            generation: 1,
        };
        let actions = d.committed(&key("j"), &placement, false, 1);
        assert_eq!(
            actions[0],
            Action::Withdraw {
                spoke: "a".into(),
                run_id: "uid-j".into(),
                generation: 1
            }
        );
        assert_eq!(offers(&actions), vec![("a".into(), "j".into(), 1)]);
    }

    #[test]
    fn answers_for_unknown_or_old_generations_are_withdrawn() {
        let mut d = dispatcher(Mode::AllAtOnce);
        connect(&mut d, "a", json!({}), 8000);
        assert_eq!(
            d.admit_answer("a", "nope", 1, true, 0),
            vec![Action::Withdraw {
                spoke: "a".into(),
                run_id: "nope".into(),
                generation: 1
            }]
        );
        d.upsert_job(job("j", 1000, 1), None, 0);
        assert_eq!(
            d.admit_answer("a", "uid-j", 0, true, 0),
            vec![Action::Withdraw {
                spoke: "a".into(),
                run_id: "uid-j".into(),
                generation: 0
            }]
        );
        // A duplicate refusal changes nothing.
        assert!(d.admit_answer("a", "uid-j", 1, false, 0).is_empty());
        assert!(d.admit_answer("a", "uid-j", 1, false, 0).is_empty());
    }
}
