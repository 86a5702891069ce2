//! Quotas, Kueue's model, applied across every spoke: pure decisions over
//! plain types, no I/O.
//!
//! A TrainJob queued in a ClusterQueue (through a LocalQueue) is admitted
//! by quota before it is offered to spokes:
//! - [`model`]: ResourceFlavor, ClusterQueue, Cohort, LocalQueue and
//!   WorkloadPriorityClass as plain types; [`parse`] reads them from the
//!   `kueue.x-k8s.io/v1beta2` objects;
//! - [`tree`]: the cohort tree's arithmetic (nominal quota, borrowing and
//!   lending limits, usage that flows up past what a node keeps back);
//! - [`admit`]: flavor assignment for a workload's gang, as Kueue's flavor
//!   assigner does it;
//! - [`preempt`]: the fewest victims that make room for a workload, its
//!   gang on one spoke;
//! - [`book`]: the configuration and every reservation charged to it,
//!   indexed per ClusterQueue and per spoke;
//! - [`status`]: the numbers published on the queues and workloads.
//!
//! The dispatcher ([`super::core::Dispatcher`]) drives them: it asks for a
//! flavor assignment, reserves the quota before it offers the TrainJob to
//! the spokes that provide the flavors, and gives it back when the
//! TrainJob goes back to the queue, finishes or goes away.
//!
//! Fair sharing (weights, dominant resource share) is not implemented:
//! the weights are parsed into [`model::FairSharing`], and the order in
//! which waiting workloads are tried is the dispatcher's queue order
//! (priority, then creation), the one place a fair-sharing order would
//! replace.

pub mod admit;
pub mod book;
pub mod model;
pub mod parse;
pub mod preempt;
pub mod status;
pub mod tree;

pub use self::admit::{Assignment, Outcome, quantity_string};
pub use self::book::{Quotas, Reservation};
pub use self::model::*;
pub use self::parse::{
    QuotaError, parse_cluster_queue, parse_cohort, parse_flavor, parse_local_queue,
    parse_priority_class, parse_tolerations,
};
pub use self::status::{ClusterQueueStatus, FlavorUsage, LocalQueueStatus, ResourceUsage, Waiting};

/// Kueue's reasons, spelled as Kueue spells them.
pub mod reason {
    /// Waiting for quota (or for a spoke with its flavors).
    pub const PENDING: &str = "Pending";
    /// Cannot be admitted as things are configured (no such queue, a
    /// resource no group covers, a namespace the selector refuses, a
    /// stopped or inactive ClusterQueue).
    pub const INADMISSIBLE: &str = "Inadmissible";
    /// Eviction by preemption (the `Evicted` condition's reason).
    pub const PREEMPTED: &str = "Preempted";
    /// Eviction because its ClusterQueue is stopped with `HoldAndDrain`.
    pub const CLUSTER_QUEUE_STOPPED: &str = "ClusterQueueStopped";
    /// Eviction because its LocalQueue is stopped with `HoldAndDrain`.
    pub const LOCAL_QUEUE_STOPPED: &str = "LocalQueueStopped";
    /// Preempted by a workload of its own ClusterQueue.
    pub const IN_CLUSTER_QUEUE: &str = "InClusterQueue";
    /// Preempted to give back quota its ClusterQueue borrowed in the cohort.
    pub const IN_COHORT_RECLAMATION: &str = "InCohortReclamation";
}

/// The property tests' configuration: `cases` unless `PROPTEST_CASES` says
/// otherwise, shrinking bounded.
#[cfg(test)]
pub(crate) fn proptest_config(cases: u32) -> proptest::test_runner::Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(cases);
    proptest::test_runner::Config {
        cases,
        max_shrink_iters: 2000,
        ..proptest::test_runner::Config::default()
    }
}
