//! TrainingRuntime and ClusterTrainingRuntime, and the spec they share.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::constants;
use crate::jobset::JobSetSpec;
use crate::podgroup::volcano::NetworkTopologySpec;
use crate::resource::is_default;

resource! {
    /// A namespaced blueprint for TrainJobs in its namespace: the JobSet template to build, the
    /// ML framework policy and the gang-scheduling policy.
    pub struct TrainingRuntime {
        group: "trainer.kubeflow.org",
        version: "v1alpha1",
        kind: "TrainingRuntime",
        plural: "trainingruntimes",
        scope: k8s_openapi::NamespaceResourceScope,
        spec: TrainingRuntimeSpec,
    }
}

resource! {
    /// A cluster-scoped blueprint for TrainJobs in every namespace; otherwise the same as
    /// [`TrainingRuntime`].
    pub struct ClusterTrainingRuntime {
        group: "trainer.kubeflow.org",
        version: "v1alpha1",
        kind: "ClusterTrainingRuntime",
        plural: "clustertrainingruntimes",
        scope: k8s_openapi::ClusterResourceScope,
        spec: TrainingRuntimeSpec,
    }
}

impl TrainingRuntime {
    /// Fills every unset field the CRD schema defaults; see [`TrainingRuntimeSpec::default_fields`].
    pub fn default_fields(&mut self) {
        self.spec.default_fields();
    }
}

impl ClusterTrainingRuntime {
    /// Fills every unset field the CRD schema defaults; see [`TrainingRuntimeSpec::default_fields`].
    pub fn default_fields(&mut self) {
        self.spec.default_fields();
    }
}

/// The desired state of a [`TrainingRuntime`] or [`ClusterTrainingRuntime`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("minProperties" = 1))]
pub struct TrainingRuntimeSpec {
    /// The ML framework and its distributed-training settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ml_policy: Option<MlPolicy>,

    /// Gang scheduling of the job's Pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_group_policy: Option<PodGroupPolicy>,

    /// The JobSet each TrainJob of this runtime is built from.
    #[serde(default, skip_serializing_if = "is_default")]
    #[schemars(extend("minProperties" = 1))]
    pub template: JobSetTemplateSpec,
}

impl TrainingRuntimeSpec {
    /// Fills the fields the CRD schema defaults, inside the objects that are present (as an API
    /// server does): the MPI and Flux policy fields, the coscheduling timeout, the Volcano
    /// network topology, and the JobSet template's defaults ([`JobSetSpec::default_fields`]).
    /// Set fields are kept. Idempotent.
    pub fn default_fields(&mut self) {
        if let Some(ml_policy) = &mut self.ml_policy {
            ml_policy.default_fields();
        }
        if let Some(pod_group_policy) = &mut self.pod_group_policy {
            pod_group_policy.default_fields();
        }
        self.template.spec.default_fields();
    }
}

/// The JobSet template of a runtime.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobSetTemplateSpec {
    /// Labels and annotations copied to every JobSet built from the template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ObjectMeta>,

    /// The JobSet spec.
    #[serde(default, skip_serializing_if = "is_default")]
    pub spec: JobSetSpec,
}

/// The ML framework of a runtime. At most one of the framework fields may be set; none means a
/// plain (framework-less) job.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "[has(self.torch), has(self.mpi), has(self.jax), has(self.xgboost),has(self.flux)].filter(x, x).size() <= 1",
    "message": "Only one of the policy can be configured",
}]))]
pub struct MlPolicy {
    /// Default number of training nodes; a TrainJob's `trainer.numNodes` overrides it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_nodes: Option<i32>,

    /// PyTorch distributed training with torchrun.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torch: Option<TorchMlPolicySource>,

    /// MPI (mpirun over SSH), e.g. for DeepSpeed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mpi: Option<MpiMlPolicySource>,

    /// JAX multi-process training.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jax: Option<JaxMlPolicySource>,

    /// XGBoost distributed training with the collective tracker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xgboost: Option<XgboostMlPolicySource>,

    /// Flux Framework as the in-job workload manager.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flux: Option<FluxMlPolicySource>,
}

/// Which framework an [`MlPolicy`] selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MlFramework {
    /// `mlPolicy.torch`.
    Torch,
    /// `mlPolicy.mpi`.
    Mpi,
    /// `mlPolicy.jax`.
    Jax,
    /// `mlPolicy.xgboost`.
    Xgboost,
    /// `mlPolicy.flux`.
    Flux,
}

impl MlPolicy {
    /// The frameworks that are set, in field order; a valid policy has at most one.
    pub fn frameworks(&self) -> Vec<MlFramework> {
        [
            (self.torch.is_some(), MlFramework::Torch),
            (self.mpi.is_some(), MlFramework::Mpi),
            (self.jax.is_some(), MlFramework::Jax),
            (self.xgboost.is_some(), MlFramework::Xgboost),
            (self.flux.is_some(), MlFramework::Flux),
        ]
        .into_iter()
        .filter_map(|(set, framework)| set.then_some(framework))
        .collect()
    }

    /// Fills the defaults of the framework policy that is present. Idempotent.
    pub fn default_fields(&mut self) {
        if let Some(mpi) = &mut self.mpi {
            mpi.default_fields();
        }
        if let Some(flux) = &mut self.flux {
            flux.default_fields();
        }
    }
}

/// PyTorch settings.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TorchMlPolicySource {
    /// Extra containers that receive the torchrun (`PET_*`) variables besides `node`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_injection: Option<TorchEnvInjection>,
}

/// Where, besides the `node` container, the torchrun variables are injected.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TorchEnvInjection {
    /// Targets keyed by replicated Job name. At most 16.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["jobName"]))]
    pub targets: Option<Vec<TorchEnvInjectionTarget>>,
}

/// Containers of one replicated Job that receive the torchrun variables.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TorchEnvInjectionTarget {
    /// Name of the replicated Job.
    #[schemars(length(min = 1, max = 253))]
    pub job_name: String,

    /// Names of its containers, 1 to 8, without `node` (which always receives them).
    #[schemars(length(min = 1, max = 8), inner(length(max = 63)))]
    #[schemars(extend(
        "x-kubernetes-list-type" = "set",
        "x-kubernetes-validations" = [{
            "rule": "!self.exists(c, c == 'node')",
            "message": "containerNames must not include the main node container because PET_* envs are always injected into it",
        }],
    ))]
    pub container_names: Vec<String>,
}

/// MPI settings.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MpiMlPolicySource {
    /// Slots per node in the hostfile. Defaults to 1; at least 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend(
        "default" = 1,
        "x-kubernetes-validations" = [{"rule": "self >= 1", "message": "NumProcPerNode in mpiPolicy must be >= 1"}],
    ))]
    pub num_proc_per_node: Option<i32>,

    /// MPI implementation. Defaults to OpenMPI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "OpenMPI"))]
    pub mpi_implementation: Option<MpiImplementation>,

    /// Where the SSH keys are mounted in the containers. Defaults to `/root/.ssh`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    #[schemars(extend("default" = "/root/.ssh"))]
    pub ssh_auth_mount_path: Option<String>,

    /// Whether the launcher also trains, as one of the nodes. Defaults to `false`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = false))]
    pub run_launcher_as_node: Option<bool>,
}

impl MpiMlPolicySource {
    /// Default of `sshAuthMountPath`.
    pub const DEFAULT_SSH_AUTH_MOUNT_PATH: &str = "/root/.ssh";

    /// Fills `numProcPerNode` (1), `mpiImplementation` (OpenMPI), `sshAuthMountPath`
    /// (`/root/.ssh`) and `runLauncherAsNode` (`false`) when unset. Idempotent.
    pub fn default_fields(&mut self) {
        self.num_proc_per_node.get_or_insert(1);
        self.mpi_implementation
            .get_or_insert(MpiImplementation::OpenMpi);
        self.ssh_auth_mount_path
            .get_or_insert_with(|| Self::DEFAULT_SSH_AUTH_MOUNT_PATH.to_owned());
        self.run_launcher_as_node.get_or_insert(false);
    }
}

/// An MPI implementation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum MpiImplementation {
    /// Open MPI (`OpenMPI`).
    #[default]
    #[serde(rename = "OpenMPI")]
    OpenMpi,
    /// The empty string, which the schema admits and which selects no implementation.
    #[serde(rename = "")]
    Unset,
}

/// JAX settings; JAX has none yet.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct JaxMlPolicySource {}

/// XGBoost settings; XGBoost has none yet.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct XgboostMlPolicySource {}

/// Flux Framework settings.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FluxMlPolicySource {
    /// Processes per node. Defaults to 1; at least 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend(
        "default" = 1,
        "x-kubernetes-validations" = [{"rule": "self >= 1", "message": "NumProcPerNode in fluxPolicy must be >= 1"}],
    ))]
    pub num_proc_per_node: Option<i32>,
}

impl FluxMlPolicySource {
    /// Fills `numProcPerNode` (1) when unset. Idempotent.
    pub fn default_fields(&mut self) {
        self.num_proc_per_node.get_or_insert(1);
    }
}

/// Gang scheduling of a job's Pods: at most one of the schedulers.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodGroupPolicy {
    /// The scheduler-plugins coscheduling plugin (`scheduling.x-k8s.io` PodGroup).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coscheduling: Option<CoschedulingPodGroupPolicySource>,

    /// The Volcano scheduler (`scheduling.volcano.sh` PodGroup).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volcano: Option<VolcanoPodGroupPolicySource>,
}

impl PodGroupPolicy {
    /// Fills the defaults of the scheduler policy that is present. Idempotent.
    pub fn default_fields(&mut self) {
        if let Some(coscheduling) = &mut self.coscheduling {
            coscheduling
                .schedule_timeout_seconds
                .get_or_insert(constants::DEFAULT_SCHEDULE_TIMEOUT_SECONDS);
        }
        if let Some(network_topology) = self
            .volcano
            .as_mut()
            .and_then(|volcano| volcano.network_topology.as_mut())
        {
            network_topology.default_fields();
        }
    }
}

/// Coscheduling settings.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CoschedulingPodGroupPolicySource {
    /// How long, in seconds, the scheduler waits for the whole gang before giving up on the
    /// attempt. Defaults to 60.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = constants::DEFAULT_SCHEDULE_TIMEOUT_SECONDS))]
    pub schedule_timeout_seconds: Option<i32>,
}

/// Volcano settings.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolcanoPodGroupPolicySource {
    /// Network topology constraint copied into the Volcano PodGroup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_topology: Option<NetworkTopologySpec>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_fields_fills_present_policies_only() {
        let mut spec = TrainingRuntimeSpec {
            ml_policy: Some(MlPolicy {
                mpi: Some(MpiMlPolicySource::default()),
                ..Default::default()
            }),
            pod_group_policy: Some(PodGroupPolicy {
                coscheduling: Some(CoschedulingPodGroupPolicySource::default()),
                ..Default::default()
            }),
            ..Default::default()
        };
        spec.default_fields();

        let Some(ml_policy) = &spec.ml_policy else {
            panic!("mlPolicy vanished")
        };
        let mpi = ml_policy.mpi.as_ref().unwrap();
        assert_eq!(mpi.num_proc_per_node, Some(1));
        assert_eq!(mpi.mpi_implementation, Some(MpiImplementation::OpenMpi));
        assert_eq!(mpi.ssh_auth_mount_path.as_deref(), Some("/root/.ssh"));
        assert_eq!(mpi.run_launcher_as_node, Some(false));
        assert_eq!(ml_policy.flux, None, "absent policies stay absent");
        assert_eq!(
            spec.pod_group_policy.as_ref().unwrap().coscheduling,
            Some(CoschedulingPodGroupPolicySource {
                schedule_timeout_seconds: Some(60)
            })
        );
        assert_eq!(spec.pod_group_policy.as_ref().unwrap().volcano, None);

        let once = spec.clone();
        spec.default_fields();
        assert_eq!(spec, once, "defaulting twice changes nothing");
    }

    #[test]
    fn default_fields_keeps_set_values() {
        let mut mpi = MpiMlPolicySource {
            num_proc_per_node: Some(8),
            run_launcher_as_node: Some(true),
            ..Default::default()
        };
        mpi.default_fields();
        assert_eq!(mpi.num_proc_per_node, Some(8));
        assert_eq!(mpi.run_launcher_as_node, Some(true));
    }

    #[test]
    fn frameworks_lists_every_set_policy() {
        let policy = MlPolicy {
            torch: Some(TorchMlPolicySource::default()),
            jax: Some(JaxMlPolicySource {}),
            ..Default::default()
        };
        assert_eq!(policy.frameworks(), [MlFramework::Torch, MlFramework::Jax]);
        assert!(MlPolicy::default().frameworks().is_empty());
    }

    #[test]
    fn mpi_implementation_round_trips_its_upstream_spellings() {
        for (value, text) in [
            (MpiImplementation::OpenMpi, "\"OpenMPI\""),
            (MpiImplementation::Unset, "\"\""),
        ] {
            assert_eq!(serde_json::to_string(&value).unwrap(), text);
            assert_eq!(
                serde_json::from_str::<MpiImplementation>(text).unwrap(),
                value
            );
        }
    }
}
