//! The queue: dispatch order, and the offering of queued jobs to the
//! spokes they may go to.

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};
use std::ops::Bound;

use super::placement::{Eligibility, Spoke, Where, headroom};
use super::{Action, Dispatcher, Job, JobKey, Millis, Mode, OfferState, Phase, gang_total};

pub(super) type QueueKey = (Reverse<i32>, i64, JobKey);

/// A ClusterQueue's waiting jobs may fail this many attempts in one pass
/// over the queue before the rest of them wait for the next pass (a
/// StrictFIFO queue stops at its head).
const FAILURES_PER_PASS: usize = 8;

/// The queued jobs (waiting for a spoke to admit them) in dispatch order:
/// priority, then creation; and those in a ClusterQueue by queue.
#[derive(Debug, Default)]
pub(super) struct Queue {
    all: BTreeSet<QueueKey>,
    by_cq: HashMap<String, BTreeSet<QueueKey>>,
}

impl Queue {
    pub(super) fn insert(&mut self, job: &Job) {
        let key = job.queue_key();
        if let Some(cq) = job.cluster_queue() {
            self.by_cq
                .entry(cq.to_string())
                .or_default()
                .insert(key.clone());
        }
        self.all.insert(key);
    }

    pub(super) fn remove(&mut self, job: &Job) {
        self.remove_key(&job.queue_key(), job.cluster_queue());
    }

    pub(super) fn remove_key(&mut self, key: &QueueKey, cq: Option<&str>) {
        self.all.remove(key);
        if let Some(cq) = cq
            && let Some(set) = self.by_cq.get_mut(cq)
        {
            set.remove(key);
            if set.is_empty() {
                self.by_cq.remove(cq);
            }
        }
    }

    pub(super) fn len(&self) -> usize {
        self.all.len()
    }

    pub(super) fn keys(&self) -> Vec<JobKey> {
        self.all.iter().map(|(_, _, k)| k.clone()).collect()
    }

    /// The queued jobs of ClusterQueue `cq`, in order.
    pub(super) fn of(&self, cq: &str) -> impl Iterator<Item = &JobKey> {
        self.by_cq.get(cq).into_iter().flatten().map(|(_, _, k)| k)
    }

    /// The queued job of ClusterQueue `cq` that comes next after `after`
    /// (the first with None).
    pub(super) fn next_in(&self, cq: &str, after: Option<&QueueKey>) -> Option<QueueKey> {
        let set = self.by_cq.get(cq)?;
        match after {
            None => set.first().cloned(),
            Some(after) => set
                .range((Bound::Excluded(after), Bound::Unbounded))
                .next()
                .cloned(),
        }
    }
}

impl Dispatcher {
    /// Offers every queued job, in queue order, to the spokes it may go to.
    pub(super) fn dispatch_all(&mut self, now: Millis) -> Vec<Action> {
        let keys = self.queue.keys();
        let mut failures: HashMap<String, usize> = HashMap::new();
        let mut actions = Vec::new();
        for key in keys {
            let Some(cq) = self.waiting_in(&key) else {
                actions.extend(self.nominate(&key, now));
                continue;
            };
            let failed = failures.entry(cq).or_default();
            if *failed >= FAILURES_PER_PASS {
                continue;
            }
            actions.extend(self.nominate(&key, now));
            if !self.quotas.is_reserved(&key) {
                *failed += 1;
            }
        }
        actions
    }

    /// Offers one queued job to more spokes, within its quota (or its
    /// fan-out): connected, matching its selector, with room for the whole
    /// gang now. A job in a queue is first admitted by quota (perhaps by
    /// preempting others), and then offered only to the spokes that provide
    /// its flavors (only to the spoke room was made on, if it preempted);
    /// it gives its quota back when no offer of it is left pending.
    pub(super) fn nominate(&mut self, key: &JobKey, now: Millis) -> Vec<Action> {
        let mut actions = Vec::new();
        let managed = match self.jobs.get(key) {
            Some(job) if matches!(job.phase, Phase::Queued { .. }) => job.info.queue.is_some(),
            _ => return actions,
        };
        if managed && !self.quotas.is_reserved(key) {
            match self.admit_by_quota(key, now) {
                Some(done) => actions.extend(done),
                None => return actions,
            }
        }
        let fanout = match self.config.mode {
            Mode::AllAtOnce if self.config.fanout > 0 => Some(self.config.fanout),
            _ => None,
        };
        let turn = self.turn;
        self.turn = self.turn.wrapping_add(1);
        let Some(job) = self.jobs.get_mut(key) else {
            return actions;
        };
        let Phase::Queued { offers, quota, .. } = &mut job.phase else {
            return actions;
        };
        let demand = gang_total(&job.info.pod_sets);
        let place = Where::of(&self.quotas, key);
        let eligibility = Eligibility {
            cordoned: &self.unschedulable,
            offered: offers,
            demand: &demand,
            selector: job.info.selector.as_ref(),
            place: &place,
            room_now: !place.pinned(),
        };
        let mut eligible: Vec<(&String, &Spoke)> = self
            .spokes
            .iter()
            .filter(|(name, spoke)| eligibility.allows(name, spoke))
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
        let pending = offers
            .values()
            .any(|s| matches!(s, OfferState::Pending { .. }));
        if managed && !pending && !place.pinned() {
            self.unreserve(key);
        }
        actions
    }
}

/// Withdrawals of one run's offers from `spokes`.
pub(super) fn withdraw_all<'a>(
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

pub(super) fn initial_quota(mode: Mode) -> usize {
    match mode {
        Mode::AllAtOnce => usize::MAX,
        Mode::Incremental { step, .. } => step.max(1),
    }
}
