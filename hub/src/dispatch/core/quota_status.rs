//! Read-only views of quota in dispatch: why a job waits and its place in
//! its queues, and the status numbers of ClusterQueues and LocalQueues.

use std::collections::BTreeMap;

use super::{Dispatcher, JobKey, Phase};
use crate::dispatch::quota::{ClusterQueueStatus, LocalQueueStatus, StopPolicy, Waiting, reason};

impl Dispatcher {
    /// Why a queued job of a queue waits for quota, and its place in its
    /// queues; None if it is not waiting (unmanaged, reserved, placed).
    pub fn waiting(&self, key: &JobKey) -> Option<Waiting> {
        let cq = self.waiting_in(key)?;
        let (why, message) = self
            .waiting
            .get(key)
            .cloned()
            .unwrap_or((reason::PENDING, "waiting to be tried".to_string()));
        let lq = self.jobs.get(key)?.info.queue.as_ref()?.local_queue.clone();
        let mut in_cq = 0;
        let mut in_lq = 0;
        for k in self.queue.of(&cq) {
            if k == key {
                break;
            }
            if self.quotas.is_reserved(k) {
                continue;
            }
            in_cq += 1;
            let same_lq = self.jobs.get(k).is_some_and(|j| {
                k.namespace == key.namespace
                    && j.info.queue.as_ref().is_some_and(|q| q.local_queue == lq)
            });
            if same_lq {
                in_lq += 1;
            }
        }
        Some(Waiting {
            reason: why,
            message,
            position_in_cluster_queue: in_cq,
            position_in_local_queue: in_lq,
        })
    }

    /// A ClusterQueue's status numbers; None if there is no such queue.
    pub fn cluster_queue_status(&self, name: &str) -> Option<ClusterQueueStatus> {
        let cq = self.quotas.cluster_queue(name)?;
        let pending = self
            .queue
            .of(name)
            .filter(|k| !self.quotas.is_reserved(k))
            .count();
        let (mut reserving, mut admitted) = (0, 0);
        for (_, r) in self.quotas.reservations() {
            if r.cluster_queue == name {
                reserving += 1;
                admitted += usize::from(r.admitted.is_some());
            }
        }
        let inactive = self.quotas.inactive(name).map(str::to_string).or_else(|| {
            (cq.stop_policy != StopPolicy::None)
                .then(|| format!("stopped (stopPolicy {:?})", cq.stop_policy))
        });
        Some(ClusterQueueStatus {
            flavors_reservation: self.quotas.flavors_usage(name, false),
            flavors_usage: self.quotas.flavors_usage(name, true),
            pending_workloads: pending,
            reserving_workloads: reserving,
            admitted_workloads: admitted,
            inactive,
        })
    }

    /// A LocalQueue's status numbers (zero for one nothing names).
    pub fn local_queue_status(&self, namespace: &str, name: &str) -> LocalQueueStatus {
        let mut status = LocalQueueStatus::default();
        let mut reserved: BTreeMap<(String, String), i64> = BTreeMap::new();
        let mut used: BTreeMap<(String, String), i64> = BTreeMap::new();
        for job in self.jobs.values() {
            let Some(queue) = &job.info.queue else {
                continue;
            };
            if job.info.key.namespace != namespace || queue.local_queue != name {
                continue;
            }
            match self.quotas.reservation(&job.info.key) {
                Some(r) => {
                    status.reserving_workloads += 1;
                    for (fr, amount) in &r.assignment.usage {
                        *reserved.entry(fr.clone()).or_default() += amount;
                    }
                    if r.admitted.is_some() {
                        status.admitted_workloads += 1;
                        for (fr, amount) in &r.assignment.usage {
                            *used.entry(fr.clone()).or_default() += amount;
                        }
                    }
                }
                None if matches!(job.phase, Phase::Queued { .. }) => {
                    status.pending_workloads += 1;
                }
                None => {}
            }
        }
        status.flavors_reservation = by_flavor(reserved);
        status.flavor_usage = by_flavor(used);
        status
    }
}

fn by_flavor(totals: BTreeMap<(String, String), i64>) -> Vec<crate::dispatch::quota::FlavorUsage> {
    let mut out: Vec<crate::dispatch::quota::FlavorUsage> = Vec::new();
    for ((flavor, resource), total) in totals {
        let usage = crate::dispatch::quota::ResourceUsage {
            name: resource,
            total,
            borrowed: 0,
        };
        match out.last_mut() {
            Some(last) if last.name == flavor => last.resources.push(usage),
            _ => out.push(crate::dispatch::quota::FlavorUsage {
                name: flavor,
                resources: vec![usage],
            }),
        }
    }
    out
}
