//! TrainJob events: created, changed (suspended, resumed, finished,
//! deleted), removed, and runs stopped or lost on their spoke.

use std::collections::BTreeMap;

use super::placement::Spoke;
use super::queue::{initial_quota, withdraw_all};
use super::{
    Action, Dispatcher, Job, JobInfo, JobKey, LOST_FENCED, LOST_SPOKE_RESTARTED, Millis, Phase,
    Placement, Want, reason,
};

impl Dispatcher {
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
                self.queue.remove(job);
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
                self.jobs.entry(key.clone()).or_insert_with(|| {
                    Box::new(Job {
                        info,
                        generation,
                        phase,
                        started_at: None,
                        suspended: false,
                        released: false,
                        missed_heartbeats: 0,
                    })
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
            self.queue.insert(job);
            actions.extend(self.nominate(&key, now));
        }
        actions.extend(self.sync_quota(&key, now));
        actions
    }

    /// A TrainJob is gone: its run is cancelled and its placement forgotten.
    pub fn remove_job(&mut self, key: &JobKey) -> Vec<Action> {
        let Some(job) = self.jobs.remove(key) else {
            return Vec::new();
        };
        self.by_uid.remove(&job.info.uid);
        self.queue.remove(&job);
        self.forget_quota(key);
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

    /// Queues a job again under a new generation, committing that it is not
    /// placed (before any new offer can be admitted and placed). Its quota
    /// is given back.
    pub(super) fn requeue(
        &mut self,
        key: &JobKey,
        reason: &'static str,
        message: String,
        now: Millis,
    ) -> Vec<Action> {
        self.quotas.release(key);
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
        self.queue.insert(job);
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
}
