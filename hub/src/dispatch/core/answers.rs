//! Answers: a spoke's answer to an offer, the store's to a placement
//! commit, and whether a spoke's report about a run is taken.

use std::collections::BTreeMap;

use super::queue::initial_quota;
use super::{Action, Dispatcher, JobKey, Millis, OfferState, Phase, Placement, Verdict, Want};

impl Dispatcher {
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
        let cq = job.cluster_queue().map(str::to_string);
        job.phase = Phase::Committing {
            spoke: spoke.to_string(),
        };
        job.missed_heartbeats = 0;
        self.queue.remove_key(&queue_key, cq.as_deref());
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
            self.queue.insert(job);
            let mut actions = vec![Action::Withdraw {
                spoke,
                run_id,
                generation: placement.generation,
            }];
            self.unreserve(key);
            actions.extend(self.nominate(key, now));
            return actions;
        }
        job.phase = Phase::Placed {
            spoke: spoke.clone(),
        };
        job.released = false;
        if job.info.want == Want::Run {
            self.quotas.admit(key, &spoke, now);
        }
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
}
