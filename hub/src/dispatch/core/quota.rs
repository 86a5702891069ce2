//! Quota in dispatch: admission of the jobs in a queue by quota before they
//! are offered, preemption, and quota given back (the status numbers:
//! `quota_status.rs`).
//!
//! When quota is held: a job is charged when it is nominated (its flavors
//! assigned and at least one spoke that provides them offered it), and
//! keeps the charge while an offer of it is pending, while its placement is
//! written and while it runs. It gives the charge back when no offer of it
//! is left pending (every spoke refused, or the offers expired), when it is
//! requeued, finishes, is suspended or deleted. Several offers of one job
//! share its one charge, so quota is never over-committed whichever spoke
//! admits first. A preemptor is the exception: it keeps its charge for up
//! to `offer_timeout` while it waits for the one spoke its victims free.
//!
//! A job without a queue (`JobInfo::queue` None) is never charged, never
//! preempted and never preempts: it is dispatched as capacity allows.

use super::placement::{Eligibility, Where};
use super::{
    Action, Dispatcher, JobKey, Millis, OfferState, Phase, PreemptedBy, Want, gang_total,
    reason as event,
};
use crate::dispatch::quota::admit::{self, Request};
use crate::dispatch::quota::preempt::Room;
use crate::dispatch::quota::{
    Outcome, QueueingStrategy, QuotaConfig, ReclaimWithinCohort, Reservation, StopPolicy,
    WithinClusterQueue, reason,
};

/// When quota is given back, a ClusterQueue's waiting jobs may fail this
/// many attempts before the rest wait for the next pass over the queue.
const FREED_FAILURES: usize = 2;

/// How a placed job is evicted.
struct Eviction {
    /// The reason of the Event recorded on the TrainJob.
    event: &'static str,
    /// The reason of its Workload's `Evicted` condition.
    reason: &'static str,
    /// The reason its spoke is given with the stop.
    stop: &'static str,
    message: String,
    preemption: Option<PreemptedBy>,
}

impl Dispatcher {
    /// Replaces the quota configuration (flavors, ClusterQueues, cohorts).
    /// Reservations of queued jobs in a ClusterQueue that is now stopped,
    /// inactive or gone are cancelled (their offers withdrawn); the placed
    /// jobs of a ClusterQueue stopped with `HoldAndDrain` are evicted.
    /// Then the queue is tried again. Idempotent.
    pub fn set_quota_config(&mut self, config: QuotaConfig, now: Millis) -> Vec<Action> {
        self.quotas.set_config(config);
        let mut actions = Vec::new();
        let held: Vec<(JobKey, String, bool)> = self
            .quotas
            .reservations()
            .map(|(k, r)| (k.clone(), r.cluster_queue.clone(), r.admitted.is_some()))
            .collect();
        for (key, cq, admitted) in held {
            let stop = self.quotas.cluster_queue(&cq).map(|q| q.stop_policy);
            let usable = stop == Some(StopPolicy::None) && self.quotas.inactive(&cq).is_none();
            if usable {
                continue;
            }
            let queued = self
                .jobs
                .get(&key)
                .is_some_and(|j| matches!(j.phase, Phase::Queued { .. }));
            if queued {
                actions.extend(self.cancel_reservation(&key));
            } else if admitted
                && stop == Some(StopPolicy::HoldAndDrain)
                && self.jobs.get(&key).is_some_and(|j| {
                    j.info.want == Want::Run && matches!(j.phase, Phase::Placed { .. })
                })
            {
                let eviction = Eviction {
                    event: event::CLUSTER_QUEUE_STOPPED,
                    reason: reason::CLUSTER_QUEUE_STOPPED,
                    stop: "ClusterQueue stopped",
                    message: format!("Evicted: ClusterQueue {cq} is stopped (HoldAndDrain)"),
                    preemption: None,
                };
                actions.extend(self.evict(&key, eviction, now));
            }
        }
        actions.extend(self.dispatch_all(now));
        actions
    }

    /// The quota configuration and every reservation.
    pub fn quotas(&self) -> &crate::dispatch::quota::Quotas {
        &self.quotas
    }

    /// A queued job's reservation not yet placed is withdrawn: its offers go
    /// and its quota is given back; it stays queued.
    fn cancel_reservation(&mut self, key: &JobKey) -> Vec<Action> {
        self.quotas.release(key);
        let Some(job) = self.jobs.get_mut(key) else {
            return Vec::new();
        };
        let Phase::Queued { offers, .. } = &mut job.phase else {
            return Vec::new();
        };
        let withdrawn = std::mem::take(offers);
        withdrawn
            .into_iter()
            .filter(|(_, s)| matches!(s, OfferState::Pending { .. }))
            .map(|(spoke, _)| Action::Withdraw {
                spoke,
                run_id: job.info.uid.clone(),
                generation: job.generation,
            })
            .collect()
    }

    /// The ClusterQueue a queued job in a queue waits in without a
    /// reservation ("" if its LocalQueue does not exist); None for any
    /// other job.
    pub(super) fn waiting_in(&self, key: &JobKey) -> Option<String> {
        let job = self.jobs.get(key)?;
        let queue = job.info.queue.as_ref()?;
        if !matches!(job.phase, Phase::Queued { .. }) || self.quotas.is_reserved(key) {
            return None;
        }
        Some(queue.cluster_queue.clone().unwrap_or_default())
    }

    fn wait(&mut self, key: &JobKey, why: &'static str, message: String) -> Option<Vec<Action>> {
        self.waiting.insert(key.clone(), (why, message));
        None
    }

    /// Admits a queued job of a queue by quota: its ClusterQueue must exist,
    /// be active and not stopped, and select its namespace; a StrictFIFO
    /// queue admits its head first; flavors are assigned, and the quota
    /// reserved if a spoke providing them has room for the gang now, or
    /// made available by preemption. The actions of a preemption, or None
    /// if it waits (why is recorded for [`Dispatcher::waiting`]).
    pub(super) fn admit_by_quota(&mut self, key: &JobKey, now: Millis) -> Option<Vec<Action>> {
        let job = self.jobs.get(key)?;
        let queue = job.info.queue.as_ref()?;
        let Some(cq_name) = queue.cluster_queue.clone() else {
            let message = format!("LocalQueue {} doesn't exist", queue.local_queue);
            return self.wait(key, reason::INADMISSIBLE, message);
        };
        if let Some(why) = &queue.hold {
            let message = why.clone();
            return self.wait(key, reason::INADMISSIBLE, message);
        }
        let Some(cq) = self.quotas.cluster_queue(&cq_name) else {
            let message = format!("ClusterQueue {cq_name} doesn't exist");
            return self.wait(key, reason::INADMISSIBLE, message);
        };
        if let Some(why) = self.quotas.inactive(&cq_name) {
            let message = format!("ClusterQueue {cq_name} is inactive: {why}");
            return self.wait(key, reason::INADMISSIBLE, message);
        }
        if cq.stop_policy != StopPolicy::None {
            let message = format!(
                "ClusterQueue {cq_name} is stopped (stopPolicy {:?})",
                cq.stop_policy
            );
            return self.wait(key, reason::INADMISSIBLE, message);
        }
        if !cq.namespace_selector.matches(Some(&queue.namespace_labels)) {
            let message = format!(
                "namespace {} doesn't match the namespaceSelector of ClusterQueue {cq_name}",
                key.namespace
            );
            return self.wait(key, reason::INADMISSIBLE, message);
        }
        let head = match cq.strategy {
            QueueingStrategy::StrictFifo => self
                .queue
                .of(&cq_name)
                .find(|k| !self.quotas.is_reserved(k))
                .cloned(),
            QueueingStrategy::BestEffortFifo => None,
        };
        if let Some(head) = head
            && head != *key
        {
            // Another namespace's TrainJob is not named to this one.
            let message = if head.namespace == key.namespace {
                format!(
                    "waiting for {}, the head of StrictFIFO ClusterQueue {cq_name}, to be admitted",
                    head.name
                )
            } else {
                format!("waiting for the head of StrictFIFO ClusterQueue {cq_name} to be admitted")
            };
            return self.wait(key, reason::PENDING, message);
        }
        let policy = cq.preemption;
        let demand = gang_total(&job.info.pod_sets);
        let pods: i64 = job.info.pod_sets.iter().map(|p| i64::from(p.count)).sum();
        let names: Vec<&str> = job.info.pod_sets.iter().map(|p| p.name.as_str()).collect();
        let names = names.join(", ");
        let request = Request {
            demand: &demand,
            pods,
            tolerations: &queue.tolerations,
            pod_sets: &names,
        };
        let outcome = self.quotas.assign(&cq_name, request)?;
        let (assignment, short) = match outcome {
            Outcome::NoFit {
                inadmissible,
                message,
            } => {
                let why = if inadmissible {
                    reason::INADMISSIBLE
                } else {
                    reason::PENDING
                };
                return self.wait(key, why, message);
            }
            Outcome::Fit(assignment) => (assignment, None),
            Outcome::Preempt {
                assignment,
                message,
            } => (assignment, Some(message)),
        };
        let Phase::Queued { offers, .. } = &job.phase else {
            return None;
        };
        let place = Where::assigned(&self.quotas, &assignment);
        let mut eligibility = Eligibility {
            cordoned: &self.unschedulable,
            offered: offers,
            demand: &demand,
            selector: job.info.selector.as_ref(),
            place: &place,
            room_now: true,
        };
        let reservation = Reservation {
            cluster_queue: cq_name.clone(),
            local_queue: queue.local_queue.clone(),
            assignment: assignment.clone(),
            priority: job.info.priority,
            created: job.info.created,
            gang: demand.clone(),
            admitted: None,
            pin: None,
        };
        let Some(short) = short else {
            if self.spokes.iter().any(|(n, s)| eligibility.allows(n, s)) {
                self.reserve(key, reservation);
                return Some(Vec::new());
            }
            eligibility.room_now = false;
            let provided = self.spokes.iter().any(|(n, s)| eligibility.allows(n, s));
            let flavors = place.flavor_names();
            let message = if provided {
                format!(
                    "no spoke providing flavor {flavors} has room for the whole gang now (or every one refused it)"
                )
            } else {
                format!(
                    "no spoke with flavor {flavors} may take it (connected, not cordoned, matching its selector, big enough for the whole gang)"
                )
            };
            return self.wait(key, reason::PENDING, message);
        };
        let may_preempt = policy.within_cluster_queue != WithinClusterQueue::Never
            || policy.reclaim_within_cohort != ReclaimWithinCohort::Never;
        if !may_preempt || self.preempt_after.get(key).is_some_and(|at| *at > now) {
            return self.wait(key, reason::PENDING, short);
        }
        // Spokes the gang could go to once victims stop.
        eligibility.room_now = false;
        let rooms: Vec<Room> = self
            .spokes
            .iter()
            .filter(|(n, s)| eligibility.allows(n, s))
            .map(|(n, s)| Room {
                spoke: n.clone(),
                free: s.free.clone(),
            })
            .collect();
        let mut candidates =
            self.quotas
                .candidates(&cq_name, job.info.priority, job.info.created, &assignment);
        candidates.retain(|c| {
            self.jobs.get(&c.key).is_some_and(|v| {
                v.info.want == Want::Run
                    && matches!(&v.phase, Phase::Placed { spoke } if *spoke == c.spoke)
            })
        });
        let preemptor_uid = job.info.uid.clone();
        let decision = self.quotas.choose_victims(
            &cq_name,
            job.info.priority,
            &assignment,
            &demand,
            &rooms,
            &candidates,
        );
        let Some(decision) = decision else {
            self.preempt_after
                .insert(key.clone(), now.saturating_add(self.config.retry_ms));
            return self.wait(key, reason::PENDING, short);
        };
        let mut actions = Vec::new();
        for v in decision.victims {
            let victim = &candidates[v];
            let (why, human) = if victim.same_queue {
                (
                    reason::IN_CLUSTER_QUEUE,
                    "prioritization in the ClusterQueue",
                )
            } else {
                (
                    reason::IN_COHORT_RECLAMATION,
                    "reclamation within the cohort",
                )
            };
            // Kueue's message: the preemptor by its uids only (it may be
            // another tenant's).
            let message = format!(
                "Preempted to accommodate a workload (UID: {}, JobUID: {preemptor_uid}) due to {human}",
                crate::kueue::workload::workload_uid(&preemptor_uid)
            );
            let eviction = Eviction {
                event: event::PREEMPTED,
                reason: reason::PREEMPTED,
                stop: "preempted",
                message,
                preemption: Some(PreemptedBy {
                    preemptor: key.clone(),
                    preemptor_uid: preemptor_uid.clone(),
                    reason: why,
                }),
            };
            actions.extend(self.evict(&victim.key, eviction, now));
        }
        let mut reservation = reservation;
        reservation.pin = Some((decision.spoke, now));
        self.reserve(key, reservation);
        Some(actions)
    }

    fn reserve(&mut self, key: &JobKey, reservation: Reservation) {
        self.quotas.reserve(key.clone(), reservation);
        self.waiting.remove(key);
        self.preempt_after.remove(key);
    }

    /// Stops a placed job and queues it again under a new generation, its
    /// quota given back: an eviction by Kueue.
    fn evict(&mut self, key: &JobKey, eviction: Eviction, now: Millis) -> Vec<Action> {
        let Some(job) = self.jobs.get(key) else {
            return Vec::new();
        };
        let Phase::Placed { spoke } = &job.phase else {
            return Vec::new();
        };
        let uid = job.info.uid.clone();
        let mut actions = vec![Action::Stop {
            spoke: spoke.clone(),
            run_id: uid.clone(),
            generation: job.generation,
            reason: eviction.stop,
        }];
        actions.extend(self.requeue(key, eviction.event, eviction.message.clone(), now));
        actions.push(Action::Evicted {
            job: key.clone(),
            uid,
            reason: eviction.reason,
            message: eviction.message,
            preemption: eviction.preemption,
        });
        actions
    }

    /// Gives back the quota of a queued job no offer of which is pending:
    /// it waits in its queue again.
    pub(super) fn unreserve(&mut self, key: &JobKey) {
        if let Some(r) = self.quotas.release(key) {
            let flavors = r.assignment.flavor_names().join(", ");
            self.waiting.insert(
                key.clone(),
                (
                    reason::PENDING,
                    format!("no spoke with flavor {flavors} admitted it yet; it is offered again when one has room"),
                ),
            );
        }
    }

    /// A job is gone: everything quota knew of it goes.
    pub(super) fn forget_quota(&mut self, key: &JobKey) {
        self.quotas.release(key);
        self.waiting.remove(key);
        self.preempt_after.remove(key);
    }

    /// After a job changed: one that no longer wants to run gives its quota
    /// back (and the jobs waiting in its cohort are tried); one placed
    /// without a reservation (loaded at start-up, or its demand known only
    /// now) is charged for what it runs.
    pub(super) fn sync_quota(&mut self, key: &JobKey, now: Millis) -> Vec<Action> {
        let Some(job) = self.jobs.get(key) else {
            return Vec::new();
        };
        if job.info.want != Want::Run {
            self.waiting.remove(key);
            self.preempt_after.remove(key);
            return match self.quotas.release(key) {
                Some(r) => self.quota_freed(&r.cluster_queue, now),
                None => Vec::new(),
            };
        }
        if let Some(queue) = job
            .info
            .queue
            .as_ref()
            .filter(|q| q.drain && q.hold.is_some())
            && matches!(job.phase, Phase::Placed { .. })
        {
            let eviction = Eviction {
                event: event::LOCAL_QUEUE_STOPPED,
                reason: reason::LOCAL_QUEUE_STOPPED,
                stop: "LocalQueue stopped",
                message: format!(
                    "Evicted: LocalQueue {} is stopped (HoldAndDrain)",
                    queue.local_queue
                ),
                preemption: None,
            };
            return self.evict(key, eviction, now);
        }
        let (Some(queue), Some(spoke)) = (job.info.queue.as_ref(), job.placed_on()) else {
            return Vec::new();
        };
        let demand = gang_total(&job.info.pod_sets);
        if self
            .quotas
            .reservation(key)
            .is_some_and(|r| r.gang == demand)
        {
            return Vec::new();
        }
        let Some(cq_name) = queue.cluster_queue.clone() else {
            return Vec::new();
        };
        let Some(cq) = self.quotas.cluster_queue(&cq_name) else {
            return Vec::new();
        };
        let pods: i64 = job.info.pod_sets.iter().map(|p| i64::from(p.count)).sum();
        let labels = self
            .spokes
            .get(spoke)
            .map(|s| s.labels.clone())
            .unwrap_or_default();
        let assignment =
            admit::assign_for_spoke(cq, &self.quotas.config().flavors, &demand, pods, &labels);
        let admitted = self
            .quotas
            .reservation(key)
            .and_then(|r| r.admitted.clone())
            .or_else(|| {
                matches!(job.phase, Phase::Placed { .. }).then(|| (spoke.to_string(), now))
            });
        let reservation = Reservation {
            cluster_queue: cq_name,
            local_queue: queue.local_queue.clone(),
            assignment,
            priority: job.info.priority,
            created: job.info.created,
            gang: demand,
            admitted,
            pin: None,
        };
        self.reserve(key, reservation);
        Vec::new()
    }

    /// Quota of ClusterQueue `cq` was given back: the jobs waiting in its
    /// cohort tree are tried, in queue order within each ClusterQueue, until
    /// a ClusterQueue's head blocks (StrictFIFO) or [`FREED_FAILURES`] of
    /// its jobs fail (the rest wait for the next pass over the queue).
    fn quota_freed(&mut self, cq: &str, now: Millis) -> Vec<Action> {
        let members = self.quotas.tree_members(cq).to_vec();
        let mut actions = Vec::new();
        for member in members {
            let mut cursor = None;
            let mut failures = 0;
            while let Some(next) = self.queue.next_in(&member, cursor.as_ref()) {
                let key = next.2.clone();
                cursor = Some(next);
                if self.quotas.is_reserved(&key) {
                    continue;
                }
                actions.extend(self.nominate(&key, now));
                if !self.quotas.is_reserved(&key) {
                    failures += 1;
                    if failures >= FREED_FAILURES {
                        break;
                    }
                }
            }
        }
        actions
    }

    /// Preemptors that waited `offer_timeout` for their spoke give up the
    /// pin: the nomination that follows in [`Dispatcher::tick`] offers them
    /// wherever they fit, or gives their quota back.
    pub(super) fn expire_pins(&mut self, now: Millis) {
        let expired: Vec<JobKey> = self
            .quotas
            .reservations()
            .filter(|(_, r)| {
                r.pin
                    .as_ref()
                    .is_some_and(|(_, at)| now.saturating_sub(*at) >= self.config.offer_timeout_ms)
            })
            .map(|(k, _)| k.clone())
            .collect();
        for key in expired {
            self.quotas.unpin(&key);
        }
    }
}
