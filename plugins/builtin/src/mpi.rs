//! The MPI plugin (OpenMPI), for runtimes with `mlPolicy.mpi`: the `node`
//! job sized to the TrainJob, SSH keys shared by every MPI pod, and a
//! hostfile for the launcher.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, KeyToPath, Secret, SecretVolumeSource, Volume,
};
use trainhub_plugin_sdk::api::trainer::{MpiImplementation, MpiMlPolicySource};
use trainhub_plugin_sdk::info;
use trainhub_plugin_sdk::prelude::*;

use crate::common::{
    gpus, job_name, ml_policy, mount, owned_metadata, pod_count, reserved_env_error,
    resources_per_node, to_json, upsert_mount, upsert_volume,
};
use crate::ssh;

/// The MPI plugin.
#[derive(Default)]
pub struct Mpi;

/// Env names OpenMPI reads and this plugin sets on the launcher.
pub const RESERVED_ENV: [&str; 4] = [
    constants::OPENMPI_ENV_HOSTFILE_LOCATION,
    constants::OPENMPI_ENV_RSH_ARGS,
    constants::OPENMPI_ENV_KEEP_FQDN_HOSTNAMES,
    constants::OPENMPI_ENV_DEFAULT_SLOTS,
];

/// File modes on the SSH secret volume, as upstream sets them.
const SSH_AUTH_DEFAULT_MODE: i32 = 0o400;
const SSH_PRIVATE_KEY_MODE: i32 = 0o640;
const SSH_PUBLIC_KEY_MODE: i32 = 0o644;
const HOSTFILE_MODE: i32 = 0o444;
const SECRET_TYPE_SSH_AUTH: &str = "kubernetes.io/ssh-auth";
const SSH_PRIVATE_KEY: &str = "ssh-privatekey";

impl Plugin for Mpi {
    fn describe(&self) -> Descriptor {
        Descriptor::new("mpi", env!("CARGO_PKG_VERSION"))
            .frameworks(["mpi"])
            .validates()
            .enforces_ml_policy()
            .builds()
    }

    fn validate(&self, _: &Ctx, job: &TrainJob, runtime: &Runtime) -> Validation {
        let mut validation = Validation::default();
        let Some(mpi) = runtime
            .spec()
            .ml_policy
            .as_ref()
            .and_then(|p| p.mpi.clone())
        else {
            return validation;
        };
        let mpi = defaulted(mpi);
        let num_nodes = job.spec.trainer.as_ref().and_then(|t| t.num_nodes);
        if num_nodes.unwrap_or(1) >= 2 && mpi.run_launcher_as_node == Some(true) {
            let jobs = runtime
                .spec()
                .template
                .spec
                .replicated_jobs
                .iter()
                .flatten();
            let has = |name: &str| jobs.clone().any(|j| j.name == name);
            if !has(constants::LAUNCHER) || !has(constants::NODE) {
                validation.error(FieldError::invalid(
                    "spec.trainer.numNodes",
                    num_nodes.map(|n| n.to_string()),
                    "must have 1 when MPI trainingRuntime with enabled runLauncherAsNode does not have either launcher and node",
                ));
            }
        }
        if mpi.mpi_implementation != Some(MpiImplementation::OpenMpi) {
            validation.error(FieldError::not_supported(
                "spec.runtimeRef",
                Some(job.spec.runtime_ref.name.clone()),
                "the runtime's mlPolicy.mpi.mpiImplementation must be OpenMPI",
            ));
        }
        validation
            .errors
            .extend(reserved_env_error(job, &RESERVED_ENV));
        validation
    }

    /// Sizes the `node` job (`trainer.numNodes`, less the launcher when it
    /// runs as a node, then at least 1), settles the slots per node (the TrainJob's
    /// `numProcPerNode`; else the runtime's, or the GPUs per node when that is
    /// 1), mounts the SSH keys on every `node` container of the `node` and
    /// `launcher` jobs, and the hostfile and OpenMPI env on the launcher's.
    /// The settled slots are written back to the info's `mlPolicy`.
    fn enforce_ml_policy(
        &self,
        _: &Ctx,
        info: &mut RuntimeInfo,
        job: &TrainJob,
    ) -> Result<(), Failure> {
        let mut policy = ml_policy(info)?;
        let Some(mpi) = policy.mpi.take() else {
            return Ok(());
        };
        let mut mpi = defaulted(mpi);
        let run_launcher_as_node = mpi.run_launcher_as_node == Some(true);

        if let Some(n) = job.spec.trainer.as_ref().and_then(|t| t.num_nodes)
            && let Some(node) = info.pod_set_mut(constants::NODE)
        {
            // One node runs as the launcher, but the node job keeps a pod.
            node.count = pod_count(if run_launcher_as_node {
                n.saturating_sub(1).max(1)
            } else {
                n
            });
        }

        if let Some(n) = job.spec.trainer.as_ref().and_then(|t| t.num_proc_per_node) {
            mpi.num_proc_per_node = Some(n);
        } else if mpi.num_proc_per_node == Some(1) {
            let (requests, limits) = resources_per_node(info, job);
            let gpus = gpus(&requests, &limits)?;
            if gpus > 1 {
                mpi.num_proc_per_node = Some(
                    i32::try_from(gpus)
                        .map_err(|_| Failure::new(format!("{gpus} GPUs per node is too many")))?,
                );
            }
        }
        let slots = mpi.num_proc_per_node.unwrap_or(1);
        if mpi.mpi_implementation != Some(MpiImplementation::OpenMpi) {
            return Err(Failure::new(format!(
                "MPI implementation {:?} is not supported: use OpenMPI",
                mpi.mpi_implementation
            )));
        }
        let mount_path = mpi
            .ssh_auth_mount_path
            .clone()
            .unwrap_or_else(|| MpiMlPolicySource::DEFAULT_SSH_AUTH_MOUNT_PATH.to_string());

        let name = job_name(job);
        let ssh_volume = info::volume_record(&ssh_auth_volume(name));
        let hostfile_volume = info::volume_record(&hostfile_volume(name));
        for set in &mut info.pod_sets {
            let launcher = set.name == constants::LAUNCHER;
            if set.name != constants::NODE && !launcher {
                continue;
            }
            upsert_volume(set, ssh_volume.clone());
            if launcher {
                upsert_volume(set, hostfile_volume.clone());
            }
            for container in set
                .containers
                .iter_mut()
                .filter(|c| c.name == constants::NODE)
            {
                upsert_mount(
                    container,
                    mount(constants::MPI_SSH_AUTH_VOLUME_NAME, &mount_path, None),
                );
                if launcher {
                    upsert_mount(
                        container,
                        mount(
                            constants::MPI_HOSTFILE_VOLUME_NAME,
                            constants::MPI_HOSTFILE_DIR,
                            None,
                        ),
                    );
                    container.upsert_env(
                        constants::OPENMPI_ENV_HOSTFILE_LOCATION,
                        format!(
                            "{}/{}",
                            constants::MPI_HOSTFILE_DIR,
                            constants::MPI_HOSTFILE_NAME
                        ),
                    );
                    container.upsert_env(constants::OPENMPI_ENV_KEEP_FQDN_HOSTNAMES, "true");
                    container.upsert_env(constants::OPENMPI_ENV_DEFAULT_SLOTS, slots.to_string());
                    container.upsert_env(
                        constants::OPENMPI_ENV_RSH_ARGS,
                        constants::OPENMPI_RSH_ARGS_DEFAULT,
                    );
                }
            }
        }

        policy.mpi = Some(mpi);
        info.ml_policy =
            serde_json::to_string(&policy).map_err(|e| Failure::new(format!("mlPolicy: {e}")))?;
        info::refresh_endpoints(info, job)
    }

    /// The SSH Secret (`J-mpi-ssh-auth`, immutable, a fresh P-521 key pair
    /// from the host's entropy) and the hostfile ConfigMap (`J-mpi-hostfile`:
    /// one `<pod> slots=<n>` line per pod of the `node` job, and of the
    /// `launcher` job when it runs as a node, in template order).
    ///
    /// The Secret is immutable and its key random: a spoke creates it once and
    /// keeps the first one, as upstream's controller does.
    fn build(
        &self,
        _: &Ctx,
        info: &RuntimeInfo,
        job: &TrainJob,
        _: &Target,
    ) -> Result<Vec<Value>, Failure> {
        let Some(mpi) = ml_policy(info)?.mpi else {
            return Ok(Vec::new());
        };
        let mpi = defaulted(mpi);
        let name = job_name(job);

        let keys = ssh::generate(trainhub_plugin_sdk::random_bytes).map_err(Failure::new)?;
        let secret = Secret {
            metadata: owned_metadata(
                job,
                format!("{name}{}", constants::MPI_SSH_AUTH_SECRET_SUFFIX),
            ),
            type_: Some(SECRET_TYPE_SSH_AUTH.to_string()),
            immutable: Some(true),
            data: Some(BTreeMap::from([
                (
                    SSH_PRIVATE_KEY.to_string(),
                    ByteString(keys.private_pem.into_bytes()),
                ),
                (
                    constants::MPI_SSH_PUBLIC_KEY.to_string(),
                    ByteString(keys.public_authorized_key.into_bytes()),
                ),
            ])),
            ..Default::default()
        };

        let config_map = ConfigMap {
            metadata: owned_metadata(
                job,
                format!("{name}{}", constants::MPI_HOSTFILE_CONFIGMAP_SUFFIX),
            ),
            data: Some(BTreeMap::from([(
                constants::MPI_HOSTFILE_NAME.to_string(),
                hostfile(info, job, &mpi)?,
            )])),
            ..Default::default()
        };
        Ok(vec![
            to_json("SSH Secret", &secret)?,
            to_json("hostfile ConfigMap", &config_map)?,
        ])
    }
}

/// The hostfile: `<pod endpoint> slots=<numProcPerNode>` per MPI node.
pub fn hostfile(
    info: &RuntimeInfo,
    job: &TrainJob,
    mpi: &MpiMlPolicySource,
) -> Result<String, Failure> {
    let run_launcher_as_node = mpi.run_launcher_as_node == Some(true);
    let slots = mpi.num_proc_per_node.unwrap_or(1);
    // Endpoints follow the counts; recompute them in case a phase after the
    // last refresh changed one.
    let mut info = info.clone();
    info::refresh_endpoints(&mut info, job)?;
    let mut out = String::new();
    for set in &info.pod_sets {
        if set.name == constants::NODE || (run_launcher_as_node && set.name == constants::LAUNCHER)
        {
            for endpoint in &set.endpoints {
                out.push_str(&format!("{endpoint} slots={slots}\n"));
            }
        }
    }
    Ok(out)
}

fn defaulted(mut mpi: MpiMlPolicySource) -> MpiMlPolicySource {
    mpi.default_fields();
    mpi
}

fn ssh_auth_volume(job: &str) -> Volume {
    let item = |key: &str, path: &str, mode: i32| KeyToPath {
        key: key.to_string(),
        path: path.to_string(),
        mode: Some(mode),
        ..Default::default()
    };
    Volume {
        name: constants::MPI_SSH_AUTH_VOLUME_NAME.to_string(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(format!("{job}{}", constants::MPI_SSH_AUTH_SECRET_SUFFIX)),
            default_mode: Some(SSH_AUTH_DEFAULT_MODE),
            items: Some(vec![
                item(
                    SSH_PRIVATE_KEY,
                    constants::MPI_SSH_PRIVATE_KEY_FILE,
                    SSH_PRIVATE_KEY_MODE,
                ),
                item(
                    constants::MPI_SSH_PUBLIC_KEY,
                    constants::MPI_SSH_PUBLIC_KEY_FILE,
                    SSH_PUBLIC_KEY_MODE,
                ),
                item(
                    constants::MPI_SSH_PUBLIC_KEY,
                    constants::MPI_SSH_AUTHORIZED_KEYS,
                    SSH_PUBLIC_KEY_MODE,
                ),
            ]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn hostfile_volume(job: &str) -> Volume {
    Volume {
        name: constants::MPI_HOSTFILE_VOLUME_NAME.to_string(),
        config_map: Some(ConfigMapVolumeSource {
            name: format!("{job}{}", constants::MPI_HOSTFILE_CONFIGMAP_SUFFIX),
            items: Some(vec![KeyToPath {
                key: constants::MPI_HOSTFILE_NAME.to_string(),
                path: constants::MPI_HOSTFILE_NAME.to_string(),
                mode: Some(HOSTFILE_MODE),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}
