//! The PyTorch plugin: torchrun's `PET_*` rendezvous env on the trainer's
//! `node` container, for runtimes with `mlPolicy.torch`.

use trainhub_plugin_sdk::info;
use trainhub_plugin_sdk::prelude::*;

use crate::common::{
    completion_index_env, cpus, gpus, master_address, ml_policy, reserved_env_errors,
    resources_per_node, set_trainer_count,
};

/// The PyTorch plugin.
#[derive(Default)]
pub struct Torch;

/// Env names torchrun reads and this plugin sets.
pub const RESERVED_ENV: [&str; 5] = constants::TORCH_RESERVED_ENV_NAMES;

impl Plugin for Torch {
    fn describe(&self) -> Descriptor {
        Descriptor::new("torch", env!("CARGO_PKG_VERSION"))
            .frameworks(["torch"])
            .reserves_env(RESERVED_ENV)
            .validates()
            .enforces_ml_policy()
    }

    fn validate(&self, _: &Ctx, job: &TrainJob, runtime: &Runtime) -> Validation {
        let mut validation = Validation::default();
        let Some(torch) = runtime
            .spec()
            .ml_policy
            .as_ref()
            .and_then(|p| p.torch.as_ref())
        else {
            return validation;
        };
        validation
            .errors
            .extend(reserved_env_errors(job, &RESERVED_ENV, "PyTorch"));
        if let Some(n) = job.spec.trainer.as_ref().and_then(|t| t.num_proc_per_node)
            && n < 1
        {
            validation.error(FieldError::invalid(
                "spec.trainer.numProcPerNode",
                Some(n.to_string()),
                "numProcPerNode must be greater than or equal to 1",
            ));
        }
        // Every env injection target must exist in the (patched) template.
        if let Some(targets) = torch
            .env_injection
            .as_ref()
            .and_then(|e| e.targets.as_ref())
            && let Ok(info) = info::new_runtime_info(job, runtime)
        {
            for target in targets {
                for name in &target.container_names {
                    if find_container(&info, &target.job_name, name).is_none() {
                        validation.error(FieldError::invalid(
                            "spec.runtimeRef",
                            Some(job.spec.runtime_ref.name.clone()),
                            format!(
                                "envInjection target podSet {:?} container {name:?} not found in runtime template",
                                target.job_name
                            ),
                        ));
                    }
                }
            }
        }
        validation
    }

    /// `PET_NNODES`, `PET_NPROC_PER_NODE` (the TrainJob's `numProcPerNode`;
    /// else `auto`, which without a GPU becomes the node's CPU count rounded
    /// up, at least 1), `PET_NODE_RANK` from the completion index,
    /// `PET_MASTER_ADDR`/`PET_MASTER_PORT` on the first node, and port 29500.
    fn enforce_ml_policy(
        &self,
        _: &Ctx,
        info: &mut RuntimeInfo,
        job: &TrainJob,
    ) -> Result<(), Failure> {
        let policy = ml_policy(info)?;
        let Some(torch) = policy.torch else {
            return Ok(());
        };
        set_trainer_count(info, job)?;

        let nproc = match job.spec.trainer.as_ref().and_then(|t| t.num_proc_per_node) {
            Some(n) => n.to_string(),
            None => {
                let (requests, limits) = resources_per_node(info, job);
                if gpus(&requests, &limits)? == 0 {
                    cpus(&requests, &limits)?.max(1).to_string()
                } else {
                    "auto".to_string()
                }
            }
        };
        let num_nodes = info.trainer()?.count.to_string();
        let pet = |container: &mut Container| {
            container.upsert_env(constants::TORCH_ENV_NUM_NODES, num_nodes.clone());
            container.upsert_env(constants::TORCH_ENV_NUM_PROC_PER_NODE, nproc.clone());
            completion_index_env(container, constants::TORCH_ENV_NODE_RANK);
            container.upsert_env(constants::TORCH_ENV_MASTER_ADDR, master_address(job));
            container.upsert_env(
                constants::TORCH_ENV_MASTER_PORT,
                constants::CONTAINER_TRAINER_PORT.to_string(),
            );
        };

        let node = info.trainer_mut()?.node_container_mut()?;
        pet(node);
        node.upsert_port(constants::CONTAINER_TRAINER_PORT);

        for target in torch
            .env_injection
            .iter()
            .flat_map(|e| e.targets.iter().flatten())
        {
            for name in &target.container_names {
                let container = find_container_mut(info, &target.job_name, name).ok_or_else(|| {
                    Failure::new(format!(
                        "envInjection target podSet {:?} container {name:?} not found in runtime template",
                        target.job_name
                    ))
                })?;
                pet(container);
            }
        }
        info::refresh_endpoints(info, job)
    }
}

fn find_container<'a>(info: &'a RuntimeInfo, job: &str, name: &str) -> Option<&'a Container> {
    let set = info.pod_set(job)?;
    set.containers
        .iter()
        .chain(set.init_containers.iter())
        .find(|c| c.name == name)
}

fn find_container_mut<'a>(
    info: &'a mut RuntimeInfo,
    job: &str,
    name: &str,
) -> Option<&'a mut Container> {
    let set = info.pod_set_mut(job)?;
    set.containers
        .iter_mut()
        .chain(set.init_containers.iter_mut())
        .find(|c| c.name == name)
}
