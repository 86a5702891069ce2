//! The numbers the runner publishes on Kueue's objects and on each pending
//! workload, as plain values.

/// One resource of a flavor: what is held, and how much of it is over the
/// ClusterQueue's nominal quota (borrowed from its cohort), milli-units.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceUsage {
    pub name: String,
    pub total: i64,
    pub borrowed: i64,
}

/// `status.flavorsReservation[]` / `status.flavorsUsage[]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlavorUsage {
    pub name: String,
    pub resources: Vec<ResourceUsage>,
}

/// A ClusterQueue's status numbers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClusterQueueStatus {
    /// Quota held by every workload with a reservation.
    pub flavors_reservation: Vec<FlavorUsage>,
    /// Quota held by admitted (placed) workloads.
    pub flavors_usage: Vec<FlavorUsage>,
    /// Queued without a reservation.
    pub pending_workloads: usize,
    /// Holding a reservation (admitted or not yet).
    pub reserving_workloads: usize,
    /// Placed on a spoke.
    pub admitted_workloads: usize,
    /// Why it admits nothing (no such flavor, a cohort cycle, stopped);
    /// None while active.
    pub inactive: Option<String>,
}

/// A LocalQueue's status numbers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LocalQueueStatus {
    pub pending_workloads: usize,
    pub reserving_workloads: usize,
    pub admitted_workloads: usize,
    /// Quota held by its workloads with a reservation (`borrowed` is 0: a
    /// LocalQueue has no quota of its own).
    pub flavors_reservation: Vec<FlavorUsage>,
    /// Quota held by its admitted workloads.
    pub flavor_usage: Vec<FlavorUsage>,
}

/// Why a queued workload waits, as its Workload's `QuotaReserved=False`
/// condition says it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Waiting {
    /// [`super::reason::PENDING`] or [`super::reason::INADMISSIBLE`].
    pub reason: &'static str,
    pub message: String,
    /// Workloads ahead of it among those waiting in its ClusterQueue and
    /// in its LocalQueue (0: it is the head).
    pub position_in_cluster_queue: usize,
    pub position_in_local_queue: usize,
}
