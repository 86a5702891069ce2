//! `jobset.x-k8s.io/v1alpha2`: [`JobSet`], a group of Jobs run as one unit, which a TrainJob is
//! built as. The field set follows the JobSet CRD (v0.9); [`JobSetSpec`] is also embedded in
//! training runtimes.

use k8s_openapi::api::batch::v1::JobTemplateSpec;
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::constants;
use crate::resource::{IMMUTABLE, plain_integer};

/// API group of [`JobSet`].
pub const GROUP: &str = <JobSet as k8s_openapi::Resource>::GROUP;

/// API version of [`JobSet`].
pub const VERSION: &str = <JobSet as k8s_openapi::Resource>::VERSION;

resource! {
    /// A group of Jobs created, restarted and finished together, with a headless Service
    /// giving every Pod a stable host name (`<jobset>-<replicatedJob>-<jobIndex>-<podIndex>.<subdomain>`).
    pub struct JobSet {
        group: "jobset.x-k8s.io",
        version: "v1alpha2",
        kind: "JobSet",
        plural: "jobsets",
        scope: k8s_openapi::NamespaceResourceScope,
        spec: JobSetSpec,
        status: JobSetStatus,
    }
}

impl JobSet {
    /// Fills every unset field the JobSet CRD schema defaults; see [`JobSetSpec::default_fields`].
    pub fn default_fields(&mut self) {
        self.spec.default_fields();
    }
}

/// The desired state of a [`JobSet`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!(has(self.startupPolicy) && self.startupPolicy.startupPolicyOrder == 'InOrder' && self.replicatedJobs.exists(x, has(x.dependsOn)))",
    "message": "StartupPolicy and DependsOn APIs are mutually exclusive",
}]))]
pub struct JobSetSpec {
    /// The groups of identical Jobs, keyed by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub replicated_jobs: Option<Vec<ReplicatedJob>>,

    /// Pod networking: the headless Service and host names. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": IMMUTABLE, "message": "Value is immutable"}]))]
    pub network: Option<Network>,

    /// When the JobSet counts as completed. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": IMMUTABLE, "message": "Value is immutable"}]))]
    pub success_policy: Option<SuccessPolicy>,

    /// What a failed Job does to the JobSet: restart it or fail it. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": IMMUTABLE, "message": "Value is immutable"}]))]
    pub failure_policy: Option<FailurePolicy>,

    /// Whether replicated Jobs start in order. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": IMMUTABLE, "message": "Value is immutable"}]))]
    pub startup_policy: Option<StartupPolicy>,

    /// Whether the JobSet is suspended (its Jobs suspended, their Pods deleted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<bool>,

    /// A Pod whose stable address every Pod receives in the `jobset.sigs.k8s.io/coordinator`
    /// annotation and label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coordinator: Option<Coordinator>,

    /// The controller that reconciles this JobSet; unset means the JobSet controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed_by: Option<String>,

    /// Seconds after the JobSet finishes before it is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub ttl_seconds_after_finished: Option<i32>,

    /// PersistentVolumeClaims created for the JobSet and shared by its Pods. At most 50. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 50))]
    #[schemars(extend(
        "x-kubernetes-list-type" = "atomic",
        "x-kubernetes-validations" = [{"rule": IMMUTABLE, "message": "Value is immutable"}],
    ))]
    pub volume_claim_policies: Option<Vec<VolumeClaimPolicy>>,
}

impl JobSetSpec {
    /// Fills the fields the CRD schema defaults, inside the objects that are present: each
    /// replicated Job's `replicas` (1) and `groupName` (`default`), `failurePolicy.restartStrategy`
    /// (`Recreate`) and each volume claim policy's `retentionPolicy.whenDeleted` (`Delete`).
    /// Set fields are kept. Idempotent. Defaults of the embedded Kubernetes types (Job and Pod
    /// templates) are not applied.
    pub fn default_fields(&mut self) {
        for job in self.replicated_jobs.iter_mut().flatten() {
            job.default_fields();
        }
        if let Some(failure_policy) = &mut self.failure_policy {
            failure_policy
                .restart_strategy
                .get_or_insert(RestartStrategy::Recreate);
        }
        for policy in self.volume_claim_policies.iter_mut().flatten() {
            if let Some(retention) = &mut policy.retention_policy {
                retention
                    .when_deleted
                    .get_or_insert(RetentionPolicy::Delete);
            }
        }
    }

    /// The replicated Job with the given name.
    pub fn replicated_job(&self, name: &str) -> Option<&ReplicatedJob> {
        self.replicated_jobs
            .as_deref()?
            .iter()
            .find(|j| j.name == name)
    }

    /// The replicated Job with the given name, mutably.
    pub fn replicated_job_mut(&mut self, name: &str) -> Option<&mut ReplicatedJob> {
        self.replicated_jobs
            .as_deref_mut()?
            .iter_mut()
            .find(|j| j.name == name)
    }
}

/// A group of identical Jobs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicatedJob {
    /// Name of the group; Job names are `<jobset>-<name>-<index>`.
    pub name: String,

    /// Name of the group of replicated Jobs this one belongs to. Defaults to `default`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = constants::DEFAULT_REPLICATED_JOB_GROUP_NAME))]
    pub group_name: Option<String>,

    /// Template of each Job.
    pub template: JobTemplateSpec,

    /// Number of Jobs. Defaults to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = constants::DEFAULT_JOB_REPLICAS))]
    pub replicas: Option<i32>,

    /// Replicated Jobs that must reach a status before this one starts, keyed by name.
    /// At most 5. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 5))]
    #[schemars(extend(
        "x-kubernetes-list-type" = "map",
        "x-kubernetes-list-map-keys" = ["name"],
        "x-kubernetes-validations" = [{"rule": IMMUTABLE, "message": "Value is immutable"}],
    ))]
    pub depends_on: Option<Vec<DependsOn>>,
}

impl ReplicatedJob {
    /// Fills `replicas` (1) and `groupName` (`default`) when unset. Idempotent.
    pub fn default_fields(&mut self) {
        self.replicas.get_or_insert(constants::DEFAULT_JOB_REPLICAS);
        self.group_name
            .get_or_insert_with(|| constants::DEFAULT_REPLICATED_JOB_GROUP_NAME.to_owned());
    }

    /// Number of Jobs, with the schema default applied.
    pub fn replicas_or_default(&self) -> i32 {
        self.replicas.unwrap_or(constants::DEFAULT_JOB_REPLICAS)
    }
}

/// A dependency of a replicated Job on another.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DependsOn {
    /// Name of the replicated Job depended on.
    pub name: String,

    /// The status all its Jobs must reach.
    pub status: DependsOnStatus,
}

/// Status a [`DependsOn`] waits for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum DependsOnStatus {
    /// Every Job is ready (its Pods are ready or done).
    #[default]
    Ready,
    /// Every Job completed.
    Complete,
}

/// Networking of a JobSet's Pods.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Network {
    /// Whether Pods get host names from the headless Service. Defaults to true in the controller.
    #[serde(
        rename = "enableDNSHostnames",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub enable_dns_hostnames: Option<bool>,

    /// Subdomain (headless Service name) of the Pods; defaults to the JobSet name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subdomain: Option<String>,

    /// Whether Pods are published in DNS before they are ready. Defaults to true in the controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publish_not_ready_addresses: Option<bool>,
}

/// When a JobSet completes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SuccessPolicy {
    /// Whether all or any of the target Jobs must complete.
    pub operator: SuccessPolicyOperator,

    /// Replicated Jobs whose Jobs count; empty means all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub target_replicated_jobs: Option<Vec<String>>,
}

/// Operator of a [`SuccessPolicy`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum SuccessPolicyOperator {
    /// Every target Job must complete.
    #[default]
    All,
    /// One target Job completing is enough.
    Any,
}

/// How a JobSet reacts to failed Jobs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailurePolicy {
    /// How many times the JobSet is restarted before it fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_restarts: Option<i32>,

    /// How a restart happens. Defaults to `Recreate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "Recreate"))]
    pub restart_strategy: Option<RestartStrategy>,

    /// Rules matched in order against a failed Job; the first match decides the action.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules: Option<Vec<FailurePolicyRule>>,
}

/// How a JobSet restart happens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum RestartStrategy {
    /// Recreate every Job at once.
    #[default]
    Recreate,
    /// Recreate Jobs only after every old Job is gone.
    BlockingRecreate,
    /// Restart Pods in place, without recreating Jobs.
    InPlaceRestart,
}

/// One rule of a [`FailurePolicy`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailurePolicyRule {
    /// Name of the rule, unique within the policy.
    pub name: String,

    /// What to do when the rule matches.
    pub action: FailurePolicyAction,

    /// Job failure reasons that match; empty matches every reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_job_failure_reasons: Option<Vec<String>>,

    /// Regular expressions matched against the Job failure message; empty matches every message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_job_failure_message_patterns: Option<Vec<String>>,

    /// Replicated Jobs the rule applies to; empty means all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub target_replicated_jobs: Option<Vec<String>>,
}

/// Action of a [`FailurePolicyRule`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum FailurePolicyAction {
    /// Fail the JobSet at once.
    #[default]
    FailJobSet,
    /// Restart the JobSet, counting towards `maxRestarts`.
    RestartJobSet,
    /// Restart the JobSet without counting towards `maxRestarts`.
    RestartJobSetAndIgnoreMaxRestarts,
    /// Restart only the failed Job, counting towards `maxRestarts`.
    RestartJob,
    /// Restart only the failed Job without counting towards `maxRestarts`.
    RestartJobAndIgnoreMaxRestarts,
}

/// Start order of replicated Jobs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StartupPolicy {
    /// The order.
    pub startup_policy_order: StartupPolicyOrder,
}

/// Order of a [`StartupPolicy`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum StartupPolicyOrder {
    /// All replicated Jobs start together.
    #[default]
    AnyOrder,
    /// Each replicated Job starts once the previous one is ready, in list order.
    InOrder,
}

/// The Pod whose address is handed to every Pod as the coordinator.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Coordinator {
    /// Replicated Job of the coordinator Pod.
    pub replicated_job: String,

    /// Index of the Job within the replicated Job; defaults to 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "plain_integer")]
    pub job_index: Option<i64>,

    /// Completion index of the Pod within the Job; defaults to 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "plain_integer")]
    pub pod_index: Option<i64>,
}

/// PersistentVolumeClaims created for a JobSet.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "self.templates.all(t, !has(t.metadata.namespace) || size(t.metadata.namespace) == 0)",
    "message": "namespace cannot be set for VolumeClaimPolicies templates",
}]))]
pub struct VolumeClaimPolicy {
    /// Claim templates, without namespace. At most 50.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 50))]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub templates: Option<Vec<PersistentVolumeClaimTemplate>>,

    /// What happens to the claims when the JobSet is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_policy: Option<VolumeRetentionPolicy>,
}

/// A PersistentVolumeClaim as embedded in a JobSet: `apiVersion` and `kind` are optional and
/// kept only when given (k8s-openapi's [`PersistentVolumeClaim`] always writes them).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PersistentVolumeClaimTemplate {
    /// `v1` when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,

    /// `PersistentVolumeClaim` when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,

    /// Name and labels of the claim; the namespace must be empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ObjectMeta>,

    /// The claim's spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<PersistentVolumeClaimSpec>,

    /// The claim's status; ignored in a template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<PersistentVolumeClaimStatus>,
}

impl From<PersistentVolumeClaimTemplate> for PersistentVolumeClaim {
    fn from(template: PersistentVolumeClaimTemplate) -> Self {
        Self {
            metadata: template.metadata.unwrap_or_default(),
            spec: template.spec,
            status: template.status,
        }
    }
}

impl From<PersistentVolumeClaim> for PersistentVolumeClaimTemplate {
    fn from(claim: PersistentVolumeClaim) -> Self {
        Self {
            api_version: None,
            kind: None,
            metadata: Some(claim.metadata),
            spec: claim.spec,
            status: claim.status,
        }
    }
}

/// Retention of a JobSet's PersistentVolumeClaims.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeRetentionPolicy {
    /// What happens when the JobSet is deleted. Defaults to `Delete`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "Delete"))]
    pub when_deleted: Option<RetentionPolicy>,
}

/// Fate of a claim when its JobSet is deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum RetentionPolicy {
    /// The claim is deleted with the JobSet.
    #[default]
    Delete,
    /// The claim outlives the JobSet.
    Retain,
}

/// The observed state of a [`JobSet`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobSetStatus {
    /// Conditions, keyed by type: `Completed`, `Failed`, `Suspended`, `StartupPolicyCompleted`...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Option<Vec<Condition>>,

    /// Times the JobSet was restarted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarts: Option<i32>,

    /// Restarts that count towards `failurePolicy.maxRestarts`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarts_count_towards_max: Option<i32>,

    /// `Completed` or `Failed` once the JobSet finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminal_state: Option<String>,

    /// Job counts per replicated Job, keyed by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub replicated_jobs_status: Option<Vec<ReplicatedJobStatus>>,

    /// In-place restart attempt the Pods are expected to be at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub current_in_place_restart_attempt: Option<i32>,

    /// In-place restart attempt before the current one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub previous_in_place_restart_attempt: Option<i32>,
}

impl JobSetStatus {
    /// The condition of the given type, if present.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions
            .as_deref()?
            .iter()
            .find(|c| c.type_ == type_)
    }
}

/// Counts of the Jobs of one replicated Job.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicatedJobStatus {
    /// Name of the replicated Job.
    pub name: String,

    /// Jobs whose ready plus completed Pods reach their parallelism or completions.
    pub ready: i32,

    /// Jobs that completed.
    pub succeeded: i32,

    /// Jobs that failed.
    pub failed: i32,

    /// Jobs with at least one running or pending Pod.
    pub active: i32,

    /// Jobs that are suspended.
    pub suspended: i32,

    /// Restart count of each Job, by Job index. At most 1024 entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub job_restarts: Option<Vec<i32>>,

    /// Restarts of each Job that count towards `maxRestarts`, by Job index. At most 1024 entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub job_restarts_count_towards_max: Option<Vec<i32>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_fields_fills_replicated_jobs_and_policies() {
        let mut spec = JobSetSpec {
            replicated_jobs: Some(vec![
                ReplicatedJob {
                    name: "node".into(),
                    ..Default::default()
                },
                ReplicatedJob {
                    name: "launcher".into(),
                    replicas: Some(0),
                    group_name: Some("mpi".into()),
                    ..Default::default()
                },
            ]),
            failure_policy: Some(FailurePolicy::default()),
            ..Default::default()
        };
        spec.default_fields();

        let node = spec.replicated_job("node").unwrap();
        assert_eq!(
            (node.replicas, node.group_name.as_deref()),
            (Some(1), Some("default"))
        );
        let launcher = spec.replicated_job("launcher").unwrap();
        assert_eq!(
            (launcher.replicas, launcher.group_name.as_deref()),
            (Some(0), Some("mpi"))
        );
        assert_eq!(
            spec.failure_policy.unwrap().restart_strategy,
            Some(RestartStrategy::Recreate)
        );
    }

    #[test]
    fn network_uses_the_upstream_dns_spelling() {
        let network = Network {
            enable_dns_hostnames: Some(true),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(&network).unwrap(),
            serde_json::json!({"enableDNSHostnames": true})
        );
    }
}
