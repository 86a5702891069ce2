//! The jobs of queues as their Workloads show them: one pass over the
//! dispatcher's state that the runner publishes from.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use super::{Dispatcher, JobKey, Phase, PodSetDemand, QueueRef, Want};
use crate::dispatch::quota::{Assignment, Waiting, reason};

/// Where a job of a queue stands.
#[derive(Debug, Clone, PartialEq, Hash)]
pub enum QueueState {
    /// Not queued and holding no quota: suspended, finished, being deleted,
    /// or not yet queued.
    Idle,
    /// Queued without a reservation, and why.
    Waiting(Waiting),
    /// Quota reserved in `cluster_queue`; admitted once placed on `spoke`.
    Reserved {
        cluster_queue: String,
        assignment: Assignment,
        spoke: Option<String>,
    },
}

/// A job of a queue, for its Workload.
#[derive(Debug, Clone)]
pub struct QueuedJob {
    pub key: JobKey,
    pub uid: String,
    pub priority: i32,
    pub want: Want,
    pub queue: QueueRef,
    pub pod_sets: std::sync::Arc<[PodSetDemand]>,
    pub state: QueueState,
}

impl Dispatcher {
    /// The jobs of queues and where each stands, positions capped at
    /// `positions_shown`, copied out only where they may have changed.
    /// `unchanged(key, uid, fingerprint)` is asked for every job of a queue (so
    /// the caller also learns which exist); the fingerprint covers all a
    /// [`QueuedJob`] says that can change, and a job `unchanged` answers
    /// true for is not copied. Positions are counted in one pass over each
    /// ClusterQueue's waiting jobs, so this is linear in the jobs, however
    /// long the queues, and a pass where little changed copies little.
    pub fn queued_jobs(
        &self,
        positions_shown: usize,
        mut unchanged: impl FnMut(&JobKey, &str, u64) -> bool,
    ) -> Vec<(QueuedJob, u64)> {
        let positions = self.positions();
        let mut out = Vec::new();
        for job in self.jobs.values() {
            let Some(queue) = &job.info.queue else {
                continue;
            };
            let key = &job.info.key;
            let reservation = self.quotas.reservation(key);
            let waiting = match (reservation, &job.phase) {
                (None, Phase::Queued { .. }) => {
                    let (why, message) = self
                        .waiting
                        .get(key)
                        .map_or((reason::PENDING, "waiting to be tried"), |(w, m)| {
                            (*w, m.as_str())
                        });
                    let (in_cq, in_lq) = positions.get(key).copied().unwrap_or_default();
                    Some((
                        why,
                        message,
                        in_cq.min(positions_shown),
                        in_lq.min(positions_shown),
                    ))
                }
                _ => None,
            };
            // The fingerprint of what the job's Workload says, from the
            // parts as they are: most jobs are unchanged at most passes and
            // are not copied out at all.
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (&job.info.uid, job.info.want, job.info.priority).hash(&mut h);
            match (reservation, waiting) {
                (Some(r), _) => {
                    let spoke = r.admitted.as_ref().map(|(spoke, _)| spoke);
                    (0u8, &r.cluster_queue, &r.assignment, spoke).hash(&mut h);
                }
                (None, Some(w)) => (1u8, w).hash(&mut h),
                (None, None) => 2u8.hash(&mut h),
            }
            let fingerprint = h.finish();
            if unchanged(key, &job.info.uid, fingerprint) {
                continue;
            }
            let state = match (reservation, waiting) {
                (Some(r), _) => QueueState::Reserved {
                    cluster_queue: r.cluster_queue.clone(),
                    assignment: r.assignment.clone(),
                    spoke: r.admitted.as_ref().map(|(spoke, _)| spoke.clone()),
                },
                (None, Some((why, message, in_cq, in_lq))) => QueueState::Waiting(Waiting {
                    reason: why,
                    message: message.to_string(),
                    position_in_cluster_queue: in_cq,
                    position_in_local_queue: in_lq,
                }),
                (None, None) => QueueState::Idle,
            };
            out.push((
                QueuedJob {
                    key: key.clone(),
                    uid: job.info.uid.clone(),
                    priority: job.info.priority,
                    want: job.info.want,
                    queue: queue.clone(),
                    pod_sets: job.info.pod_sets.clone(),
                    state,
                },
                fingerprint,
            ));
        }
        out
    }

    /// Each waiting job's place among the waiting jobs of its ClusterQueue
    /// and of its LocalQueue.
    fn positions(&self) -> HashMap<&JobKey, (usize, usize)> {
        let mut out = HashMap::new();
        let cluster_queues: Vec<&String> = self.quotas.config().cluster_queues.keys().collect();
        for cq in cluster_queues {
            let mut per_lq: HashMap<(&str, &str), usize> = HashMap::new();
            let mut in_cq = 0;
            for k in self.queue.of(cq) {
                if self.quotas.is_reserved(k) {
                    continue;
                }
                let Some(lq) = self
                    .jobs
                    .get(k)
                    .and_then(|j| j.info.queue.as_ref())
                    .map(|q| q.local_queue.as_str())
                else {
                    continue;
                };
                let in_lq = per_lq.entry((k.namespace.as_str(), lq)).or_default();
                out.insert(k, (in_cq, *in_lq));
                in_cq += 1;
                *in_lq += 1;
            }
        }
        out
    }
}
