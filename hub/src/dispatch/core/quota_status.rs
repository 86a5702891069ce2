//! Read-only views of quota in dispatch: why a job waits and its place in
//! its queues, and the status numbers of ClusterQueues and LocalQueues.

use std::collections::{BTreeMap, HashMap};

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
    /// (For tests: each call is a pass over every reservation; code asks
    /// for [`Self::cluster_queue_statuses`] once.)
    #[cfg(test)]
    pub fn cluster_queue_status(&self, name: &str) -> Option<ClusterQueueStatus> {
        self.cluster_queue_statuses()
            .into_iter()
            .find_map(|(n, s)| (n == name).then_some(s))
    }

    /// Every ClusterQueue's status numbers, by name, from one pass over
    /// the reservations (what a publisher asks for all of them at once
    /// costs one pass, however many queues there are).
    pub fn cluster_queue_statuses(&self) -> Vec<(String, ClusterQueueStatus)> {
        let mut counts: HashMap<&str, (usize, usize)> = HashMap::new();
        for (_, r) in self.quotas.reservations() {
            let (reserving, admitted) = counts.entry(r.cluster_queue.as_str()).or_default();
            *reserving += 1;
            *admitted += usize::from(r.admitted.is_some());
        }
        self.quotas
            .config()
            .cluster_queues
            .iter()
            .map(|(name, cq)| {
                let pending = self
                    .queue
                    .of(name)
                    .filter(|k| !self.quotas.is_reserved(k))
                    .count();
                let (reserving, admitted) = counts.get(name.as_str()).copied().unwrap_or_default();
                let inactive = self.quotas.inactive(name).map(str::to_string).or_else(|| {
                    (cq.stop_policy != StopPolicy::None)
                        .then(|| format!("stopped (stopPolicy {:?})", cq.stop_policy))
                });
                let status = ClusterQueueStatus {
                    flavors_reservation: self.quotas.flavors_usage(name, false),
                    flavors_usage: self.quotas.flavors_usage(name, true),
                    pending_workloads: pending,
                    reserving_workloads: reserving,
                    admitted_workloads: admitted,
                    inactive,
                };
                (name.clone(), status)
            })
            .collect()
    }

    /// A LocalQueue's status numbers (zero for one nothing names). (For
    /// tests: each call is a pass over every job; code asks for
    /// [`Self::local_queue_statuses`] once.)
    #[cfg(test)]
    pub fn local_queue_status(&self, namespace: &str, name: &str) -> LocalQueueStatus {
        self.local_queue_statuses()
            .remove(&(namespace.to_string(), name.to_string()))
            .unwrap_or_default()
    }

    /// The status numbers of every LocalQueue some job names, by namespace
    /// and name, from one pass over the jobs (a LocalQueue no job names
    /// has the default, zero, status).
    pub fn local_queue_statuses(&self) -> HashMap<(String, String), LocalQueueStatus> {
        type Totals = BTreeMap<(String, String), i64>;
        let mut acc: HashMap<(&str, &str), (LocalQueueStatus, Totals, Totals)> = HashMap::new();
        for job in self.jobs.values() {
            let Some(queue) = &job.info.queue else {
                continue;
            };
            let key = (job.info.key.namespace.as_str(), queue.local_queue.as_str());
            match self.quotas.reservation(&job.info.key) {
                Some(r) => {
                    let (status, reserved, used) = acc.entry(key).or_default();
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
                    acc.entry(key).or_default().0.pending_workloads += 1;
                }
                None => {}
            }
        }
        acc.into_iter()
            .map(|((namespace, name), (mut status, reserved, used))| {
                status.flavors_reservation = by_flavor(reserved);
                status.flavor_usage = by_flavor(used);
                ((namespace.to_string(), name.to_string()), status)
            })
            .collect()
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
