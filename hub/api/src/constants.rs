//! Names that cross the API boundary, spelled exactly as upstream Kubeflow Trainer, JobSet,
//! Kubernetes, scheduler-plugins and Volcano spell them. Clients, runtimes and the objects the
//! hub builds match on these strings, so they must never be reworded.

// ----- trainer.kubeflow.org: API identity -----

/// API group of TrainJob, TrainingRuntime and ClusterTrainingRuntime.
pub const TRAINER_GROUP: &str = "trainer.kubeflow.org";

/// Kind of the cluster-scoped runtime; the default `spec.runtimeRef.kind` of a TrainJob.
pub const CLUSTER_TRAINING_RUNTIME_KIND: &str = "ClusterTrainingRuntime";

/// Kind of the namespaced runtime.
pub const TRAINING_RUNTIME_KIND: &str = "TrainingRuntime";

/// Kind of the JobSet a TrainJob is materialised as.
pub const JOBSET_KIND: &str = "JobSet";

/// Kind of the gang-scheduling object (both scheduler-plugins and Volcano call it so).
pub const POD_GROUP_KIND: &str = "PodGroup";

// ----- labels and annotations -----

/// Label on a runtime's replicated Job template naming which part of the TrainJob it runs:
/// one of [`ANCESTOR_DATASET_INITIALIZER`], [`ANCESTOR_MODEL_INITIALIZER`] or
/// [`ANCESTOR_TRAINER`]. TrainJob fields are applied to the templates carrying the matching value.
pub const LABEL_TRAINJOB_ANCESTOR: &str = "trainer.kubeflow.org/trainjob-ancestor-step";

/// Label on a runtime naming the ML framework it runs (e.g. `torch`); selects the framework plugin.
pub const LABEL_FRAMEWORK: &str = "trainer.kubeflow.org/framework";

/// Label on a runtime marking its support status, e.g. [`SUPPORT_DEPRECATED`].
pub const LABEL_SUPPORT: &str = "trainer.kubeflow.org/support";

/// Value of [`LABEL_SUPPORT`] for a deprecated runtime.
pub const SUPPORT_DEPRECATED: &str = "deprecated";

/// [`LABEL_TRAINJOB_ANCESTOR`] value of the dataset initializer step; also the name of its
/// replicated Job, container and volume.
pub const ANCESTOR_DATASET_INITIALIZER: &str = "dataset-initializer";

/// [`LABEL_TRAINJOB_ANCESTOR`] value of the model initializer step; also the name of its
/// replicated Job, container and volume.
pub const ANCESTOR_MODEL_INITIALIZER: &str = "model-initializer";

/// [`LABEL_TRAINJOB_ANCESTOR`] value of the training step.
pub const ANCESTOR_TRAINER: &str = "trainer";

/// Label (and annotation) JobSet puts on its Jobs and Pods: the owning JobSet's name.
pub const LABEL_JOBSET_NAME: &str = "jobset.sigs.k8s.io/jobset-name";

/// Label (and annotation) JobSet puts on its Jobs and Pods: the replicated Job's name.
pub const LABEL_REPLICATED_JOB_NAME: &str = "jobset.sigs.k8s.io/replicatedjob-name";

/// Label (and annotation) JobSet puts on its Jobs and Pods: the replica count of the replicated Job.
pub const LABEL_REPLICATED_JOB_REPLICAS: &str = "jobset.sigs.k8s.io/replicatedjob-replicas";

/// Label (and annotation) JobSet puts on its Jobs and Pods: the index of the Job within its
/// replicated Job, from 0.
pub const LABEL_JOB_INDEX: &str = "jobset.sigs.k8s.io/job-index";

/// Label (and annotation) JobSet puts on its Jobs and Pods: the index of the Job, unique across
/// the whole JobSet.
pub const LABEL_JOB_GLOBAL_INDEX: &str = "jobset.sigs.k8s.io/job-global-index";

/// Label (and annotation) JobSet puts on its Jobs and Pods: the total number of Jobs in the JobSet.
pub const LABEL_GLOBAL_REPLICAS: &str = "jobset.sigs.k8s.io/global-replicas";

/// Label (and annotation) JobSet puts on its Jobs and Pods: a SHA-256 hash identifying the Job.
pub const LABEL_JOB_KEY: &str = "jobset.sigs.k8s.io/job-key";

/// Annotation (and, on recent Kubernetes, label) the Job controller puts on each Pod of an
/// Indexed Job: the Pod's completion index, from 0.
pub const JOB_COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";

/// Downward-API field path that reads [`JOB_COMPLETION_INDEX`] from a Pod's annotations.
pub const JOB_COMPLETION_INDEX_FIELD_PATH: &str =
    "metadata.annotations['batch.kubernetes.io/job-completion-index']";

/// Label that assigns a Pod to a scheduler-plugins (coscheduling) PodGroup; the value is the
/// PodGroup's name.
pub const LABEL_COSCHEDULING_POD_GROUP: &str = "scheduling.x-k8s.io/pod-group";

/// Annotation that assigns a Pod to a Volcano PodGroup; the value is the PodGroup's name.
pub const ANNOTATION_VOLCANO_GROUP_NAME: &str = "scheduling.k8s.io/group-name";

/// Label or annotation naming the Volcano queue a TrainJob's PodGroup is submitted to.
pub const VOLCANO_QUEUE_NAME: &str = "scheduling.volcano.sh/queue-name";

/// Label naming the Kueue LocalQueue a workload is submitted to.
pub const LABEL_KUEUE_QUEUE_NAME: &str = "kueue.x-k8s.io/queue-name";

// ----- spec.managedBy -----

/// `spec.managedBy` of a TrainJob reconciled by the built-in TrainJob controller (the default).
pub const MANAGED_BY_TRAINJOB_CONTROLLER: &str = "trainer.kubeflow.org/trainjob-controller";

/// `spec.managedBy` of a TrainJob delegated to Kueue MultiKueue.
pub const MANAGED_BY_MULTIKUEUE: &str = "kueue.x-k8s.io/multikueue";

// ----- TrainJob conditions -----

/// TrainJob condition type: the TrainJob is suspended (`True`) or was resumed (`False`).
pub const CONDITION_SUSPENDED: &str = "Suspended";

/// TrainJob condition type: the TrainJob finished successfully.
pub const CONDITION_COMPLETE: &str = "Complete";

/// TrainJob condition type: the TrainJob failed.
pub const CONDITION_FAILED: &str = "Failed";

/// Reason of the `Suspended=True` condition.
pub const REASON_SUSPENDED: &str = "Suspended";

/// Reason of the `Suspended=False` condition set when a suspended TrainJob resumes.
pub const REASON_RESUMED: &str = "Resumed";

/// Reason of the `Complete` condition, carried over from the JobSet: every Job completed.
pub const REASON_ALL_JOBS_COMPLETED: &str = "AllJobsCompleted";

/// Reason of the `Failed` condition, carried over from the JobSet: one or more Jobs failed.
pub const REASON_FAILED_JOBS: &str = "FailedJobs";

/// Reason of the `Failed` condition when the TrainJob ran past `spec.activeDeadlineSeconds`.
pub const REASON_DEADLINE_EXCEEDED: &str = "DeadlineExceeded";

/// Reason of the `Failed` condition when the referenced runtime is not supported.
pub const REASON_TRAINING_RUNTIME_NOT_SUPPORTED: &str = "TrainingRuntimeNotSupported";

/// Message of the `Suspended=True` condition.
pub const MESSAGE_SUSPENDED: &str = "TrainJob is suspended";

/// Message of the `Suspended=False` condition with reason [`REASON_RESUMED`].
pub const MESSAGE_RESUMED: &str = "TrainJob is resumed";

/// Message of the `Complete` condition, carried over from the JobSet.
pub const MESSAGE_JOBSET_COMPLETED: &str = "jobset completed successfully";

/// Message of the `Failed` condition, carried over from the JobSet, when Jobs failed.
pub const MESSAGE_JOBSET_FAILED: &str = "jobset failed due to one or more job failures";

/// Message of the `Failed` condition with reason [`REASON_DEADLINE_EXCEEDED`].
pub const MESSAGE_DEADLINE_EXCEEDED: &str = "TrainJob exceeded its active deadline";

// ----- JobSet conditions -----

/// JobSet condition type: every Job completed.
pub const JOBSET_CONDITION_COMPLETED: &str = "Completed";

/// JobSet condition type: the JobSet failed.
pub const JOBSET_CONDITION_FAILED: &str = "Failed";

/// JobSet condition type: the JobSet is suspended.
pub const JOBSET_CONDITION_SUSPENDED: &str = "Suspended";

// ----- containers, Jobs, ports -----

/// Name of the trainer replicated Job and of its training container.
pub const NODE: &str = "node";

/// Name of the MPI launcher replicated Job and container. With `runLauncherAsNode` the
/// launcher Job's container is still named [`NODE`].
pub const LAUNCHER: &str = "launcher";

/// Name of the dataset initializer container (and replicated Job).
pub const DATASET_INITIALIZER: &str = ANCESTOR_DATASET_INITIALIZER;

/// Name of the model initializer container (and replicated Job).
pub const MODEL_INITIALIZER: &str = ANCESTOR_MODEL_INITIALIZER;

/// Mount path of the dataset volume in initializer and trainer containers.
pub const DATASET_MOUNT_PATH: &str = "/workspace/dataset";

/// Mount path of the model volume in initializer and trainer containers.
pub const MODEL_MOUNT_PATH: &str = "/workspace/model";

/// Port the trainer nodes talk to each other on (rendezvous, coordinator, tracker).
pub const CONTAINER_TRAINER_PORT: i32 = 29500;

/// Default `scheduleTimeoutSeconds` of a coscheduling pod group policy.
pub const DEFAULT_SCHEDULE_TIMEOUT_SECONDS: i32 = 60;

/// Default `replicas` of a JobSet replicated Job.
pub const DEFAULT_JOB_REPLICAS: i32 = 1;

/// Default `groupName` of a JobSet replicated Job.
pub const DEFAULT_REPLICATED_JOB_GROUP_NAME: &str = "default";

// ----- environment variables -----

/// Environment variable handing an initializer its `storageUri`.
pub const ENV_STORAGE_URI: &str = "STORAGE_URI";

/// torchrun: number of nodes.
pub const TORCH_ENV_NUM_NODES: &str = "PET_NNODES";

/// torchrun: number of processes per node.
pub const TORCH_ENV_NUM_PROC_PER_NODE: &str = "PET_NPROC_PER_NODE";

/// torchrun: rank of this node.
pub const TORCH_ENV_NODE_RANK: &str = "PET_NODE_RANK";

/// torchrun: address of the rank-0 node.
pub const TORCH_ENV_MASTER_ADDR: &str = "PET_MASTER_ADDR";

/// torchrun: port of the rank-0 node.
pub const TORCH_ENV_MASTER_PORT: &str = "PET_MASTER_PORT";

/// The torchrun variables the Torch plugin owns; a TrainJob must not set them.
pub const TORCH_RESERVED_ENV_NAMES: [&str; 5] = [
    TORCH_ENV_NUM_NODES,
    TORCH_ENV_NUM_PROC_PER_NODE,
    TORCH_ENV_NODE_RANK,
    TORCH_ENV_MASTER_ADDR,
    TORCH_ENV_MASTER_PORT,
];

/// JAX: total number of processes.
pub const JAX_ENV_NUM_PROCESSES: &str = "JAX_NUM_PROCESSES";

/// JAX: id of this process.
pub const JAX_ENV_PROCESS_ID: &str = "JAX_PROCESS_ID";

/// JAX: `host:port` of the coordinator process.
pub const JAX_ENV_COORDINATOR_ADDRESS: &str = "JAX_COORDINATOR_ADDRESS";

/// JAX: port of the coordinator process.
pub const JAX_ENV_COORDINATOR_PORT: &str = "JAX_COORDINATOR_PORT";

/// XGBoost (Rabit/collective): tracker host.
pub const XGBOOST_ENV_TRACKER_URI: &str = "DMLC_TRACKER_URI";

/// XGBoost: tracker port.
pub const XGBOOST_ENV_TRACKER_PORT: &str = "DMLC_TRACKER_PORT";

/// XGBoost: rank of this worker.
pub const XGBOOST_ENV_TASK_ID: &str = "DMLC_TASK_ID";

/// XGBoost: total number of workers.
pub const XGBOOST_ENV_NUM_WORKER: &str = "DMLC_NUM_WORKER";

/// The XGBoost variables the XGBoost plugin owns; a TrainJob must not set them.
pub const XGBOOST_RESERVED_ENV_NAMES: [&str; 4] = [
    XGBOOST_ENV_TRACKER_URI,
    XGBOOST_ENV_TRACKER_PORT,
    XGBOOST_ENV_TASK_ID,
    XGBOOST_ENV_NUM_WORKER,
];

/// OpenMPI: path of the default hostfile.
pub const OPENMPI_ENV_HOSTFILE_LOCATION: &str = "OMPI_MCA_orte_default_hostfile";

/// OpenMPI: whether host names stay fully qualified.
pub const OPENMPI_ENV_KEEP_FQDN_HOSTNAMES: &str = "OMPI_MCA_orte_keep_fqdn_hostnames";

/// OpenMPI: default number of slots per host.
pub const OPENMPI_ENV_DEFAULT_SLOTS: &str = "OMPI_MCA_orte_set_default_slots";

/// OpenMPI: extra arguments for the rsh/ssh launcher.
pub const OPENMPI_ENV_RSH_ARGS: &str = "OMPI_MCA_plm_rsh_args";

/// Value of [`OPENMPI_ENV_RSH_ARGS`] set by the MPI plugin.
pub const OPENMPI_RSH_ARGS_DEFAULT: &str = "-o ConnectionAttempts=10";

// ----- MPI objects -----

/// Suffix of the Secret holding a TrainJob's MPI SSH keys (`<trainjob>-mpi-ssh-auth`).
pub const MPI_SSH_AUTH_SECRET_SUFFIX: &str = "-mpi-ssh-auth";

/// Name of the volume mounting the MPI SSH key Secret.
pub const MPI_SSH_AUTH_VOLUME_NAME: &str = "mpi-ssh-auth";

/// File name of the SSH private key inside the MPI SSH auth mount.
pub const MPI_SSH_PRIVATE_KEY_FILE: &str = "id_rsa";

/// File name of the SSH public key inside the MPI SSH auth mount.
pub const MPI_SSH_PUBLIC_KEY_FILE: &str = "id_rsa.pub";

/// Key of the public key in the MPI SSH auth Secret's data.
pub const MPI_SSH_PUBLIC_KEY: &str = "ssh-publickey";

/// File name of the authorized keys inside the MPI SSH auth mount.
pub const MPI_SSH_AUTHORIZED_KEYS: &str = "authorized_keys";

/// Suffix of the ConfigMap holding a TrainJob's MPI hostfile (`<trainjob>-mpi-hostfile`).
pub const MPI_HOSTFILE_CONFIGMAP_SUFFIX: &str = "-mpi-hostfile";

/// Name of the volume mounting the MPI hostfile ConfigMap.
pub const MPI_HOSTFILE_VOLUME_NAME: &str = "mpi-hostfile";

/// Directory the MPI hostfile ConfigMap is mounted at.
pub const MPI_HOSTFILE_DIR: &str = "/etc/mpi";

/// Key of the hostfile in the MPI hostfile ConfigMap, and its file name under [`MPI_HOSTFILE_DIR`].
pub const MPI_HOSTFILE_NAME: &str = "hostfile";

// ----- Flux objects -----

/// Image of the Flux installer init container: a Spack view with Flux built in, copied into the
/// pod's shared volume. Overridden by the trainer's `FLUX_VIEW_IMAGE` env.
pub const FLUX_INSTALLER_IMAGE: &str = "ghcr.io/converged-computing/flux-view-ubuntu:tag-jammy";

/// Network device the Flux brokers bind to. Overridden by the trainer's `FLUX_NETWORK_DEVICE` env.
pub const FLUX_NETWORK_DEVICE: &str = "eth0";

/// Queue policy of Flux's scheduler (first come, first served). Overridden by the trainer's
/// `FLUX_QUEUE_POLICY` env.
pub const FLUX_QUEUE_POLICY: &str = "fcfs";

/// Trainer env naming the installer image, and the two broker settings it may override.
pub const FLUX_ENV_VIEW_IMAGE: &str = "FLUX_VIEW_IMAGE";
pub const FLUX_ENV_NETWORK_DEVICE: &str = "FLUX_NETWORK_DEVICE";
pub const FLUX_ENV_QUEUE_POLICY: &str = "FLUX_QUEUE_POLICY";

/// Name of the init container that installs Flux; reserved in a Flux runtime's `node` job.
pub const FLUX_INSTALLER_CONTAINER_NAME: &str = "flux-installer";

/// emptyDir volume Flux is installed into, and where it is mounted.
pub const FLUX_INSTALL_VOLUME_NAME: &str = "flux-install";
pub const FLUX_VOLUME_PATH: &str = "/mnt/flux";

/// Where the Flux ConfigMap (named `<trainjob>` + [`FLUX_CONFIGMAP_SUFFIX`]) is mounted.
/// Upstream calls this constant `FluxConfigVolumeName`.
pub const FLUX_CONFIG_DIR: &str = "/etc/flux-config";

/// Secret volume holding the CURVE certificate, and where it is mounted.
pub const FLUX_CURVE_VOLUME_NAME: &str = "flux-curve";
pub const FLUX_CURVE_VOLUME_PATH: &str = "/curve";

/// In-memory emptyDir volume mounted at `/dev/shm`, so that MPI gets the host's shared memory.
pub const FLUX_MEMORY_VOLUME_NAME: &str = "shared-memory";
pub const FLUX_MEMORY_VOLUME_PATH: &str = "/dev/shm";

/// emptyDir volume for the Spack view's software tree, and where the trainer mounts it.
pub const FLUX_SPACK_VIEW_VOLUME_NAME: &str = "spack-install";
pub const FLUX_SPACK_VIEW_VOLUME_PATH: &str = "/opt/software";

/// Name suffix of the ConfigMap with the installer's and the trainer's scripts.
pub const FLUX_CONFIGMAP_SUFFIX: &str = "-flux-entrypoint";

/// Keys of the Flux ConfigMap: the trainer's entrypoint and the installer's script.
pub const FLUX_ENTRYPOINT_KEY: &str = "entrypoint.sh";
pub const FLUX_INIT_KEY: &str = "init.sh";

/// Name suffix of the Secret with the CURVE certificate, and its key.
pub const FLUX_CURVE_SECRET_SUFFIX: &str = "-flux-curve";
pub const FLUX_CURVE_CERT_KEY: &str = "curve.cert";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completion_index_field_path_reads_the_annotation() {
        assert_eq!(
            JOB_COMPLETION_INDEX_FIELD_PATH,
            format!("metadata.annotations['{JOB_COMPLETION_INDEX}']")
        );
    }

    #[test]
    fn public_key_file_is_private_key_with_pub_suffix() {
        assert_eq!(
            MPI_SSH_PUBLIC_KEY_FILE,
            format!("{MPI_SSH_PRIVATE_KEY_FILE}.pub")
        );
    }
}
