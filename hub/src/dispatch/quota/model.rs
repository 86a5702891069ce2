//! Kueue's quota objects as plain types (ResourceFlavor, ClusterQueue,
//! Cohort, LocalQueue, WorkloadPriorityClass), v1beta2 semantics, with
//! quantities in milli-units.

use std::collections::BTreeMap;

use trainhub_apiserver::selector::LabelSelector;

/// A ResourceFlavor: which spokes provide it (their labels must include
/// `node_labels`), the taints a workload must tolerate to use it, and the
/// tolerations it grants to the workloads admitted with it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Flavor {
    pub name: String,
    pub node_labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    pub tolerations: Vec<Toleration>,
}

/// A `corev1.Taint`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taint {
    pub key: String,
    pub value: String,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

impl Taint {
    /// Whether admission must respect it: `NoSchedule` and `NoExecute` do,
    /// `PreferNoSchedule` does not (as Kueue's flavor assigner decides).
    pub fn binds(&self) -> bool {
        self.effect == "NoSchedule" || self.effect == "NoExecute"
    }
}

impl std::fmt::Display for Taint {
    /// `key=value:Effect`, or `key:Effect` without a value, as Kubernetes
    /// prints a taint.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.value.is_empty() {
            write!(f, "{}:{}", self.key, self.effect)
        } else {
            write!(f, "{}={}:{}", self.key, self.value, self.effect)
        }
    }
}

/// A `corev1.Toleration` (`tolerationSeconds` is irrelevant to admission).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Toleration {
    /// Empty with `Exists`: every key.
    pub key: String,
    /// `Exists`, or `Equal` (the default).
    pub exists: bool,
    pub value: String,
    /// Empty: every effect.
    pub effect: String,
}

impl Toleration {
    /// Whether it tolerates `taint`, by Kubernetes' rule.
    pub fn tolerates(&self, taint: &Taint) -> bool {
        if !self.effect.is_empty() && self.effect != taint.effect {
            return false;
        }
        if self.key.is_empty() {
            return self.exists;
        }
        self.key == taint.key && (self.exists || self.value == taint.value)
    }
}

/// One resource's quota in one flavor, milli-units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Quota {
    pub nominal: i64,
    /// How much more than `nominal` it may borrow from its cohort; None:
    /// no limit.
    pub borrowing_limit: Option<i64>,
    /// How much of `nominal` its cohort may borrow; None: all of it.
    pub lending_limit: Option<i64>,
}

/// A flavor of a resource group with its quotas, resource → quota.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FlavorQuotas {
    pub flavor: String,
    pub quotas: BTreeMap<String, Quota>,
}

/// A resource group: the resources it covers, and the flavors that provide
/// them, in the order they are tried.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ResourceGroup {
    pub covered: Vec<String>,
    pub flavors: Vec<FlavorQuotas>,
}

/// `spec.queueingStrategy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QueueingStrategy {
    /// The head of the queue blocks those behind it until it is admitted.
    StrictFifo,
    /// A head that does not fit lets those behind it try.
    #[default]
    BestEffortFifo,
}

/// `spec.stopPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StopPolicy {
    #[default]
    None,
    /// Nothing new is admitted; admitted workloads run to completion;
    /// reservations not yet placed are cancelled.
    Hold,
    /// As `Hold`, and admitted workloads are evicted.
    HoldAndDrain,
}

/// `spec.preemption.withinClusterQueue`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WithinClusterQueue {
    #[default]
    Never,
    /// Victims of strictly lower priority.
    LowerPriority,
    /// Victims of lower priority, or of equal priority and newer.
    LowerOrNewerEqualPriority,
}

/// `spec.preemption.reclaimWithinCohort`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReclaimWithinCohort {
    #[default]
    Never,
    /// Victims of lower priority in the cohort's borrowing ClusterQueues.
    LowerPriority,
    /// Any victim in the cohort's borrowing ClusterQueues.
    Any,
}

/// `spec.preemption.borrowWithinCohort`: with `LowerPriority`, a workload
/// may preempt in its cohort while it borrows (beyond its nominal quota),
/// victims of lower priority than its own and at most
/// `maxPriorityThreshold` when set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BorrowWithinCohort {
    pub lower_priority: bool,
    pub max_priority_threshold: Option<i32>,
}

impl BorrowWithinCohort {
    /// Whether a workload of `preemptor` priority that borrows may preempt
    /// one of `victim` priority in another ClusterQueue of its cohort.
    pub fn allows(&self, preemptor: i32, victim: i32) -> bool {
        self.lower_priority
            && victim < preemptor
            && self.max_priority_threshold.is_none_or(|t| victim <= t)
    }
}

/// `spec.preemption`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Preemption {
    pub within_cluster_queue: WithinClusterQueue,
    pub reclaim_within_cohort: ReclaimWithinCohort,
    pub borrow_within_cohort: BorrowWithinCohort,
}

/// `whenCanBorrow` / `whenCanPreempt` of `spec.flavorFungibility`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fungibility {
    /// Take this flavor (borrowing, or preempting).
    MayStopSearch,
    /// Try the next flavor first; come back to this one if none is better.
    TryNextFlavor,
}

/// `spec.flavorFungibility` (defaults: borrow before trying the next
/// flavor; try the next flavor before preempting).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlavorFungibility {
    pub when_can_borrow: Fungibility,
    pub when_can_preempt: Fungibility,
}

impl Default for FlavorFungibility {
    fn default() -> Self {
        FlavorFungibility {
            when_can_borrow: Fungibility::MayStopSearch,
            when_can_preempt: Fungibility::TryNextFlavor,
        }
    }
}

/// `spec.fairSharing`: the weight of a ClusterQueue or Cohort when
/// competing for unused quota, in milli-units (1000 = weight 1). Kept for
/// fair sharing; admission does not read it yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FairSharing {
    pub weight_milli: i64,
}

impl Default for FairSharing {
    fn default() -> Self {
        FairSharing { weight_milli: 1000 }
    }
}

/// A ClusterQueue.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ClusterQueue {
    pub name: String,
    /// `spec.cohortName`.
    pub cohort: Option<String>,
    pub resource_groups: Vec<ResourceGroup>,
    pub strategy: QueueingStrategy,
    pub stop_policy: StopPolicy,
    pub preemption: Preemption,
    pub flavor_fungibility: FlavorFungibility,
    /// `spec.namespaceSelector`; absent selects no namespace, `{}` every
    /// namespace.
    pub namespace_selector: LabelSelector,
    pub fair_sharing: FairSharing,
}

/// A Cohort: a node of the cohort tree, with quota of its own that its
/// members share (`resource_groups`), and a parent it lends to and borrows
/// from within its limits.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Cohort {
    pub name: String,
    /// `spec.parentName`.
    pub parent: Option<String>,
    pub resource_groups: Vec<ResourceGroup>,
    pub fair_sharing: FairSharing,
}

/// A LocalQueue: the namespaced name a TrainJob's
/// `kueue.x-k8s.io/queue-name` label refers to, and its ClusterQueue.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LocalQueue {
    pub namespace: String,
    pub name: String,
    pub cluster_queue: String,
    pub stop_policy: StopPolicy,
}

/// A WorkloadPriorityClass: `kueue.x-k8s.io/priority-class` names it, its
/// value is the workload's priority.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WorkloadPriorityClass {
    pub name: String,
    pub value: i32,
}

/// Every quota object admission reads, by name.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct QuotaConfig {
    pub flavors: BTreeMap<String, Flavor>,
    pub cluster_queues: BTreeMap<String, ClusterQueue>,
    pub cohorts: BTreeMap<String, Cohort>,
}

impl ClusterQueue {
    /// The resource group covering `resource`, if any.
    pub fn group_of(&self, resource: &str) -> Option<usize> {
        self.resource_groups
            .iter()
            .position(|g| g.covered.iter().any(|r| r == resource))
    }
}
