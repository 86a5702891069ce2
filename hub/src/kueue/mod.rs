//! Kueue's API (`kueue.x-k8s.io`), served by the hub itself so that Kueue
//! users' manifests apply unchanged: ResourceFlavor, ClusterQueue,
//! LocalQueue, Cohort and WorkloadPriorityClass, written by admins, and a
//! read-only Workload per queued TrainJob, written by the hub.
//!
//! - [`api`]: the resources, read from Kueue's CRDs in `manifests/crds/`
//!   (v1beta2, the storage version, and the deprecated v1beta1);
//! - [`conversion`]: v1beta1 ⇄ v1beta2, one pure function per kind and
//!   direction, as Kueue's conversion webhook converts;
//! - [`validate`]: Kueue's validating webhooks (the checks its CRDs do not
//!   carry), pure functions over v1beta2 objects;
//! - [`KueueAdmission`]: the CRD schema of the request's version, then
//!   those webhook checks and the cross-object ones (cohort cycles);
//! - [`workload`]: the Workload object of a TrainJob.
//!
//! The quota decisions themselves (admitting Workloads against
//! ClusterQueues) live beside dispatch; this module is the API surface.

pub mod api;
pub mod conversion;
pub mod validate;
pub mod workload;

mod admission;

pub use admission::KueueAdmission;

/// Kueue's API group.
pub const GROUP: &str = "kueue.x-k8s.io";
/// The version objects are stored at (and kubectl's preferred version).
pub const STORAGE_VERSION: &str = "v1beta2";
/// The deprecated version still served.
pub const V1BETA1: &str = "v1beta1";

/// Kinds.
pub const RESOURCE_FLAVOR: &str = "ResourceFlavor";
pub const CLUSTER_QUEUE: &str = "ClusterQueue";
pub const LOCAL_QUEUE: &str = "LocalQueue";
pub const COHORT: &str = "Cohort";
pub const WORKLOAD_PRIORITY_CLASS: &str = "WorkloadPriorityClass";
pub const WORKLOAD: &str = "Workload";

/// Store keys (the same at every version).
pub const RESOURCE_FLAVORS: &str = "kueue.x-k8s.io/resourceflavors";
pub const CLUSTER_QUEUES: &str = "kueue.x-k8s.io/clusterqueues";
pub const LOCAL_QUEUES: &str = "kueue.x-k8s.io/localqueues";
pub const COHORTS: &str = "kueue.x-k8s.io/cohorts";
pub const WORKLOAD_PRIORITY_CLASSES: &str = "kueue.x-k8s.io/workloadpriorityclasses";
pub const WORKLOADS: &str = "kueue.x-k8s.io/workloads";

/// On a TrainJob: the LocalQueue (in its namespace) it is submitted to.
pub const LABEL_QUEUE_NAME: &str = "kueue.x-k8s.io/queue-name";
/// On a TrainJob: the WorkloadPriorityClass of its Workload.
pub const LABEL_PRIORITY_CLASS: &str = "kueue.x-k8s.io/priority-class";
/// On a TrainJob: the longest it may run once admitted, in seconds.
pub const LABEL_MAX_EXEC_TIME_SECONDS: &str = "kueue.x-k8s.io/max-exec-time-seconds";
/// On a Workload: the uid of the job it was made for.
pub const LABEL_JOB_UID: &str = "kueue.x-k8s.io/job-uid";

/// Workload condition types, as Kueue spells them.
pub mod conditions {
    /// Quota is reserved in a ClusterQueue.
    pub const QUOTA_RESERVED: &str = "QuotaReserved";
    /// Quota is reserved and every admission check passed.
    pub const ADMITTED: &str = "Admitted";
    /// The workload was evicted (preempted, deactivated, ...).
    pub const EVICTED: &str = "Evicted";
    /// The workload was preempted by another.
    pub const PREEMPTED: &str = "Preempted";
    /// The job finished, successfully or not.
    pub const FINISHED: &str = "Finished";
    /// Every pod of the workload is ready.
    pub const PODS_READY: &str = "PodsReady";
}
