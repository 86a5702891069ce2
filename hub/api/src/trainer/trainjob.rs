//! The TrainJob kind.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, EnvVar, LocalObjectReference, PodSchedulingGate, PodSecurityContext,
    ResourceRequirements, SecurityContext, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::constants;
use crate::resource::IMMUTABLE;

resource! {
    /// A training job: which runtime to run ([`TrainJobSpec::runtime_ref`]) and what to change in
    /// it (trainer image, command, node count, initializers, patches).
    ///
    /// Namespaced. The name must be an RFC 1035 DNS label of at most 63 characters, because it
    /// becomes the name of the JobSet and the prefix of its Pods' host names.
    pub struct TrainJob {
        group: "trainer.kubeflow.org",
        version: "v1alpha1",
        kind: "TrainJob",
        plural: "trainjobs",
        scope: k8s_openapi::NamespaceResourceScope,
        spec: TrainJobSpec,
        status: TrainJobStatus,
        validations: [
            {
                "rule": "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
                "message": "metadata.name must match RFC 1035 DNS label format",
            },
            {
                "rule": "size(self.metadata.name) <= 63",
                "message": "metadata.name must be no more than 63 characters",
            },
        ],
    }
}

impl TrainJob {
    /// Fills every unset field that the TrainJob CRD schema gives a default, exactly as an API
    /// server would on create: see [`TrainJobSpec::default_fields`]. Idempotent.
    pub fn default_fields(&mut self) {
        self.spec.default_fields();
    }
}

/// The desired state of a [`TrainJob`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrainJobSpec {
    /// The runtime this job runs. Immutable.
    #[schemars(extend("x-kubernetes-validations" = [{"rule": IMMUTABLE, "message": "field is immutable"}]))]
    pub runtime_ref: RuntimeRef,

    /// Settings for the dataset and model initializer steps. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": IMMUTABLE, "message": "field is immutable"}]))]
    pub initializer: Option<Initializer>,

    /// Settings for the training step. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": IMMUTABLE, "message": "field is immutable"}]))]
    pub trainer: Option<Trainer>,

    /// Patches applied to the runtime's template before the job is built, one entry per
    /// manager (the user, Kueue, an admission webhook...). At most 16.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["manager"]))]
    pub runtime_patches: Option<Vec<RuntimePatch>>,

    /// Whether the job is suspended: its Pods are deleted while the TrainJob is kept.
    /// Defaults to `false`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = false))]
    pub suspend: Option<bool>,

    /// How long the job may run, in seconds, counted from its start and reset when it resumes
    /// from suspension; past it the job fails with reason `DeadlineExceeded`. At least 1.
    /// Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": IMMUTABLE, "message": "field is immutable"}]))]
    pub active_deadline_seconds: Option<i64>,

    /// The controller that reconciles this job: `trainer.kubeflow.org/trainjob-controller` (the
    /// default) or `kueue.x-k8s.io/multikueue`, which hands the job to Kueue MultiKueue.
    /// Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    #[schemars(extend(
        "default" = constants::MANAGED_BY_TRAINJOB_CONTROLLER,
        "x-kubernetes-validations" = [
            {
                "rule": "self in ['trainer.kubeflow.org/trainjob-controller', 'kueue.x-k8s.io/multikueue']",
                "message": "ManagedBy must be trainer.kubeflow.org/trainjob-controller or kueue.x-k8s.io/multikueue if set",
            },
            {"rule": IMMUTABLE, "message": "field is immutable"},
        ],
    ))]
    pub managed_by: Option<String>,
}

impl TrainJobSpec {
    /// Fills the fields the CRD schema defaults: `runtimeRef.apiGroup` (`trainer.kubeflow.org`),
    /// `runtimeRef.kind` (`ClusterTrainingRuntime`), `suspend` (`false`) and `managedBy`
    /// (`trainer.kubeflow.org/trainjob-controller`). Set fields are kept. Idempotent.
    pub fn default_fields(&mut self) {
        self.runtime_ref.default_fields();
        self.suspend.get_or_insert(false);
        self.managed_by
            .get_or_insert_with(|| constants::MANAGED_BY_TRAINJOB_CONTROLLER.to_owned());
    }

    /// Whether the job is suspended; an unset `suspend` means not suspended.
    pub fn is_suspended(&self) -> bool {
        self.suspend.unwrap_or(false)
    }
}

/// A reference to the [`TrainingRuntime`](super::TrainingRuntime) or
/// [`ClusterTrainingRuntime`](super::ClusterTrainingRuntime) a job runs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeRef {
    /// Name of the runtime. A namespaced `TrainingRuntime` must be in the TrainJob's namespace.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,

    /// API group of the runtime. Defaults to `trainer.kubeflow.org`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    #[schemars(extend("default" = constants::TRAINER_GROUP))]
    pub api_group: Option<String>,

    /// Kind of the runtime: `ClusterTrainingRuntime` (the default) or `TrainingRuntime`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    #[schemars(extend("default" = constants::CLUSTER_TRAINING_RUNTIME_KIND))]
    pub kind: Option<String>,
}

impl RuntimeRef {
    /// Fills `apiGroup` and `kind` with their schema defaults when unset. Idempotent.
    pub fn default_fields(&mut self) {
        self.api_group
            .get_or_insert_with(|| constants::TRAINER_GROUP.to_owned());
        self.kind
            .get_or_insert_with(|| constants::CLUSTER_TRAINING_RUNTIME_KIND.to_owned());
    }

    /// The referenced kind, with the schema default applied.
    pub fn kind_or_default(&self) -> &str {
        self.kind
            .as_deref()
            .unwrap_or(constants::CLUSTER_TRAINING_RUNTIME_KIND)
    }

    /// The referenced API group, with the schema default applied.
    pub fn api_group_or_default(&self) -> &str {
        self.api_group
            .as_deref()
            .unwrap_or(constants::TRAINER_GROUP)
    }
}

/// Settings for the steps that fetch the dataset and the pre-trained model before training.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Initializer {
    /// Applied to the runtime's Job template labelled
    /// `trainer.kubeflow.org/trainjob-ancestor-step: dataset-initializer`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset: Option<DatasetInitializer>,

    /// Applied to the runtime's Job template labelled
    /// `trainer.kubeflow.org/trainjob-ancestor-step: model-initializer`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelInitializer>,
}

/// Settings for an initializer step: where to fetch from and with which credentials.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AssetInitializer {
    /// URI of the asset, e.g. `hf://org/model` or `s3://bucket/path`: empty, or
    /// `scheme://...`. Handed to the initializer container as `STORAGE_URI`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self == '' || self.matches('^[A-Za-z][A-Za-z0-9+.-]*://.+$')",
        "message": "storageUri may be empty, or it must be a valid URI (scheme://...)",
    }]))]
    pub storage_uri: Option<String>,

    /// Environment variables merged into the initializer container's, by name. At most 128.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub env: Option<Vec<EnvVar>>,

    /// Secret, in the TrainJob's namespace, with the credentials to fetch the asset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<LocalObjectReference>,
}

/// Settings for the dataset initializer step.
pub type DatasetInitializer = AssetInitializer;

/// Settings for the model initializer step.
pub type ModelInitializer = AssetInitializer;

/// Settings for the training step, applied to the runtime's Job template labelled
/// `trainer.kubeflow.org/trainjob-ancestor-step: trainer`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Trainer {
    /// Image of the training container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 500))]
    pub image: Option<String>,

    /// Entrypoint of the training container. At most 128 entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128), inner(length(max = 1048576)))]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub command: Option<Vec<String>>,

    /// Arguments to the entrypoint of the training container. At most 128 entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128), inner(length(max = 1048576)))]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub args: Option<Vec<String>>,

    /// Environment variables merged into the training container's, by name. At most 128.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub env: Option<Vec<EnvVar>>,

    /// Number of training nodes (Pods). Overrides the runtime's `mlPolicy.numNodes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub num_nodes: Option<i32>,

    /// Compute resources of each training node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources_per_node: Option<ResourceRequirements>,

    /// Number of processes (workers, slots) on each training node. At least 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self >= 1",
        "message": "numProcPerNode must be greater than or equal to 1",
    }]))]
    pub num_proc_per_node: Option<i32>,
}

/// Changes one manager makes to the runtime template of one TrainJob.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RuntimePatch {
    /// Who owns this entry, e.g. `kueue.x-k8s.io/manager`; the key of the list. Immutable.
    #[schemars(length(min = 1, max = 253))]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": IMMUTABLE, "message": "field is immutable"}]))]
    pub manager: String,

    /// When the entry was last written; set by the admission webhook on create and update.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Time>,

    /// The patch for a job built from a `TrainingRuntime` or `ClusterTrainingRuntime`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub training_runtime_spec: Option<TrainingRuntimeSpecPatch>,
}

/// The part of a [`TrainingRuntimeSpec`](super::TrainingRuntimeSpec) a runtime patch may change.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrainingRuntimeSpecPatch {
    /// Patch of the JobSet template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<JobSetTemplatePatch>,
}

/// Patch of a runtime's JobSet template.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobSetTemplatePatch {
    /// Labels and annotations merged into the JobSet's metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ObjectMeta>,

    /// Patch of the JobSet spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<JobSetSpecPatch>,
}

/// Patch of a JobSet spec: per replicated Job.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobSetSpecPatch {
    /// Patches keyed by replicated Job name. At most 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 100))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub replicated_jobs: Option<Vec<ReplicatedJobPatch>>,
}

/// Patch of one replicated Job of the JobSet.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicatedJobPatch {
    /// Name of the replicated Job to patch; it must exist in the runtime.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,

    /// Patch of the replicated Job's Job template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<JobTemplatePatch>,
}

/// Patch of a Job template.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobTemplatePatch {
    /// Labels and annotations merged into the Job template's metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ObjectMeta>,

    /// Patch of the Job spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<JobSpecPatch>,
}

/// Patch of a Job spec: only its Pod template.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobSpecPatch {
    /// Patch of the Job's Pod template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<PodTemplatePatch>,
}

/// Patch of a Pod template.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodTemplatePatch {
    /// Labels and annotations merged into the Pod template's metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ObjectMeta>,

    /// Patch of the Pod spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<PodSpecPatch>,
}

/// The Pod spec fields a runtime patch may set. Lists keyed by name merge into the runtime's
/// lists entry by entry.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodSpecPatch {
    /// Scheduling affinity of the Pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,

    /// Patches of containers, keyed by name. At most 64. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    #[schemars(extend(
        "x-kubernetes-list-type" = "map",
        "x-kubernetes-list-map-keys" = ["name"],
        "x-kubernetes-validations" = [{"rule": IMMUTABLE, "message": "field is immutable"}],
    ))]
    pub containers: Option<Vec<ContainerPatch>>,

    /// Image pull secrets of the Pods, keyed by name. At most 64. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    #[schemars(extend(
        "x-kubernetes-list-type" = "map",
        "x-kubernetes-list-map-keys" = ["name"],
        "x-kubernetes-validations" = [{"rule": IMMUTABLE, "message": "field is immutable"}],
    ))]
    pub image_pull_secrets: Option<Vec<LocalObjectReference>>,

    /// Patches of init containers, keyed by name. At most 64. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    #[schemars(extend(
        "x-kubernetes-list-type" = "map",
        "x-kubernetes-list-map-keys" = ["name"],
        "x-kubernetes-validations" = [{"rule": IMMUTABLE, "message": "field is immutable"}],
    ))]
    pub init_containers: Option<Vec<ContainerPatch>>,

    /// Node selector of the Pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,

    /// Scheduling gates of the Pods, keyed by name. At most 16.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub scheduling_gates: Option<Vec<PodSchedulingGate>>,

    /// Pod-level security context. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": IMMUTABLE, "message": "field is immutable"}]))]
    pub security_context: Option<PodSecurityContext>,

    /// Service account of the Pods. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": IMMUTABLE, "message": "field is immutable"}]))]
    pub service_account_name: Option<String>,

    /// Termination grace period of the Pods, in seconds. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": IMMUTABLE, "message": "field is immutable"}]))]
    pub termination_grace_period_seconds: Option<i64>,

    /// Tolerations of the Pods; replaces the list as a whole. At most 128.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub tolerations: Option<Vec<Toleration>>,

    /// Volumes of the Pods, keyed by name. At most 128. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    #[schemars(extend(
        "x-kubernetes-list-type" = "map",
        "x-kubernetes-list-map-keys" = ["name"],
        "x-kubernetes-validations" = [{"rule": IMMUTABLE, "message": "field is immutable"}],
    ))]
    pub volumes: Option<Vec<Volume>>,
}

/// The container fields a runtime patch may set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContainerPatch {
    /// Name of the container; the runtime must have it.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,

    /// Environment variables merged into the container's, by name. At most 128.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub env: Option<Vec<EnvVar>>,

    /// Container-level security context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<SecurityContext>,

    /// Volume mounts merged into the container's, by name. At most 128.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub volume_mounts: Option<Vec<VolumeMount>>,
}

/// The observed state of a [`TrainJob`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("minProperties" = 1))]
pub struct TrainJobStatus {
    /// Conditions of the job, keyed by type: `Suspended`, `Complete`, `Failed`. At most 8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 8))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Option<Vec<Condition>>,

    /// Status of each replicated Job of the JobSet, keyed by name. At most 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 100))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub jobs_status: Option<Vec<JobStatus>>,

    /// Progress the training step last reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "has(self.lastUpdatedTime)",
        "message": "lastUpdatedTime is required when trainerStatus is present",
    }]))]
    pub trainer_status: Option<TrainerStatus>,
}

impl TrainJobStatus {
    /// The condition of the given type, if present.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions
            .as_deref()?
            .iter()
            .find(|c| c.type_ == type_)
    }

    /// Whether the condition of the given type is present with status `True`.
    pub fn is_condition_true(&self, type_: &str) -> bool {
        self.condition(type_).is_some_and(|c| c.status == "True")
    }

    /// Whether the job reached a terminal state (`Complete` or `Failed` is `True`).
    pub fn is_finished(&self) -> bool {
        self.is_condition_true(constants::CONDITION_COMPLETE)
            || self.is_condition_true(constants::CONDITION_FAILED)
    }
}

/// Counts of the child Jobs of one replicated Job.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobStatus {
    /// Name of the replicated Job.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,

    /// Jobs whose ready plus completed Pods reach their parallelism or completions.
    #[schemars(range(min = 0))]
    pub ready: i32,

    /// Jobs that completed successfully.
    #[schemars(range(min = 0))]
    pub succeeded: i32,

    /// Jobs that failed.
    #[schemars(range(min = 0))]
    pub failed: i32,

    /// Jobs with at least one running or pending Pod not marked for deletion.
    #[schemars(range(min = 0))]
    pub active: i32,

    /// Jobs that are suspended.
    #[schemars(range(min = 0))]
    pub suspended: i32,
}

/// Progress reported by the training step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrainerStatus {
    /// Estimated completion, in percent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub progress_percentage: Option<i32>,

    /// Estimated training time left, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub estimated_remaining_seconds: Option<i32>,

    /// Latest values of the model's metrics. At most 256.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub metrics: Option<Vec<Metric>>,

    /// When this status was observed; required whenever the status is present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_updated_time: Option<Time>,
}

/// One named metric value, e.g. `loss`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Metric {
    /// Name of the metric, e.g. `loss` or `eval_accuracy`.
    #[schemars(length(min = 1, max = 64))]
    pub name: String,

    /// Value of the metric, as a string.
    #[schemars(length(min = 1, max = 64))]
    pub value: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_fields_fills_only_unset_fields() {
        let mut job = TrainJob::default();
        job.spec.runtime_ref.name = "torch-distributed".into();
        job.spec.runtime_ref.kind = Some("TrainingRuntime".into());
        job.default_fields();

        let spec = &job.spec;
        assert_eq!(
            spec.runtime_ref.api_group.as_deref(),
            Some("trainer.kubeflow.org")
        );
        assert_eq!(spec.runtime_ref.kind.as_deref(), Some("TrainingRuntime"));
        assert_eq!(spec.suspend, Some(false));
        assert_eq!(
            spec.managed_by.as_deref(),
            Some("trainer.kubeflow.org/trainjob-controller")
        );

        let once = job.clone();
        job.default_fields();
        assert_eq!(job, once, "defaulting twice changes nothing");
    }

    #[test]
    fn deserialization_applies_no_defaults() {
        let job: TrainJob = serde_json::from_value(serde_json::json!({
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": "j"},
            "spec": {"runtimeRef": {"name": "torch-distributed"}},
        }))
        .unwrap();
        assert_eq!(job.spec.runtime_ref.kind, None);
        assert_eq!(job.spec.suspend, None);
        assert_eq!(job.spec.managed_by, None);
        assert_eq!(
            job.spec.runtime_ref.kind_or_default(),
            "ClusterTrainingRuntime"
        );
    }

    #[test]
    fn serialization_emits_type_meta_and_omits_absent_status() {
        let job = TrainJob::default();
        let value = serde_json::to_value(&job).unwrap();
        assert_eq!(value["apiVersion"], "trainer.kubeflow.org/v1alpha1");
        assert_eq!(value["kind"], "TrainJob");
        assert!(value.get("status").is_none());
    }

    #[test]
    fn deserialization_rejects_another_kind() {
        let err = serde_json::from_value::<TrainJob>(serde_json::json!({
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainingRuntime",
            "spec": {"runtimeRef": {"name": "x"}},
        }))
        .unwrap_err();
        assert!(err.to_string().contains("TrainingRuntime"), "{err}");

        let err = serde_json::from_value::<TrainJob>(serde_json::json!({
            "apiVersion": "trainer.kubeflow.org/v2",
            "kind": "TrainJob",
        }))
        .unwrap_err();
        assert!(err.to_string().contains("trainer.kubeflow.org/v2"), "{err}");
    }

    #[test]
    fn status_reports_finished_on_true_complete_or_failed() {
        let condition = |type_: &str, status: &str| Condition {
            type_: type_.into(),
            status: status.into(),
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            message: String::new(),
            reason: String::new(),
            observed_generation: None,
        };
        let mut status = TrainJobStatus {
            conditions: Some(vec![condition("Complete", "False")]),
            ..Default::default()
        };
        assert!(!status.is_finished());
        status.conditions = Some(vec![condition("Failed", "True")]);
        assert!(status.is_finished());
    }
}
