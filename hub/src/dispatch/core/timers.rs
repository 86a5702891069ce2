//! Time in dispatch: what [`Dispatcher::tick`] decides as time passes
//! (lost spokes given up, unanswered offers withdrawn, deletions past their
//! timeout released, incremental rounds widened, preemptors' pins expired).

use super::{Action, Dispatcher, JobKey, Millis, Mode, OfferState, Phase, Want, reason};

impl Dispatcher {
    /// Time passes: lost spokes are given up (their runs requeued, the
    /// deleted TrainJobs waiting on them released), deletions waiting past
    /// `deletion_timeout` released, unanswered offers past `offer_timeout`
    /// withdrawn, incremental rounds widen, refusals expire, a preemptor
    /// still waiting for its spoke after `offer_timeout` gives its quota
    /// back.
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
        self.expire_pins(now);
        actions.extend(self.dispatch_all(now));
        actions
    }
}
