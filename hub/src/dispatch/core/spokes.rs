//! Spoke events: connections, heartbeats (capacity and reservations),
//! disconnections and cordons.

use std::collections::BTreeSet;

use serde_json::Value;

use super::placement::{Spoke, split_capacity};
use super::{Action, Dispatcher, Millis, OfferState, Phase, Verdict, Want, reason};

impl Dispatcher {
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

    pub(super) fn reconcile_reservations(
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
}
