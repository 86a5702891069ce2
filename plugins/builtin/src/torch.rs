//! The PyTorch plugin: torchrun's `PET_*` rendezvous env on the trainer's
//! `node` container, for runtimes with `mlPolicy.torch`, and the TorchTune
//! command when the TrainJob runs `tune run` (see [`crate::torchtune`]).

use trainhub_plugin_sdk::api::trainer::{TorchEnvInjectionTarget, TorchMlPolicySource};
use trainhub_plugin_sdk::info;
use trainhub_plugin_sdk::prelude::*;

use crate::common::{
    completion_index_env, cpus, gpus, master_address, ml_policy, reserved_env_error,
    resources_per_node, set_trainer_count, trainer_count, trainer_node, upsert_trainer_env,
};
use crate::torchtune::{self, ProcsPerNode, Shape};

/// The PyTorch plugin.
#[derive(Default)]
pub struct Torch;

/// Env names torchrun reads and this plugin sets.
pub const RESERVED_ENV: [&str; 5] = constants::TORCH_RESERVED_ENV_NAMES;

impl Plugin for Torch {
    fn describe(&self) -> Descriptor {
        Descriptor::new("torch", env!("CARGO_PKG_VERSION"))
            .frameworks(["torch"])
            .validates()
            .enforces_ml_policy()
    }

    /// As upstream: every `envInjection` target must exist in the (patched)
    /// template; with `spec.trainer`, no reserved env, and the TorchTune
    /// checks when the command is `tune run`.
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
        // A runtime info that cannot be computed is the JobSet plugin's error.
        let info = info::new_runtime_info(job, runtime).ok();
        if let Some(info) = &info {
            validation.errors.extend(env_injection_errors(torch, info));
        }
        let Some(trainer) = job.spec.trainer.as_ref() else {
            return validation;
        };
        validation
            .errors
            .extend(reserved_env_error(job, &RESERVED_ENV));
        if torchtune::is_entrypoint(trainer.command.as_deref()) {
            let gpus = info.as_ref().map_or(0, |info| {
                let (requests, limits) = resources_per_node(info, job);
                gpus(&requests, &limits).unwrap_or_default()
            });
            validation
                .errors
                .extend(torchtune::validate(job, trainer, gpus));
        }
        validation
    }

    /// The trainer's count from `trainer.numNodes`; then, when the TrainJob
    /// sets `spec.trainer`, on the trainer's `node` container: the TrainJob's
    /// env, `PET_NNODES`, `PET_NPROC_PER_NODE` (the TrainJob's
    /// `numProcPerNode`; else `auto`, which without a GPU becomes the node's
    /// CPU count rounded up, at least 1), `PET_NODE_RANK` from the completion
    /// index, `PET_MASTER_ADDR`/`PET_MASTER_PORT` on the first node (or, for
    /// `tune run`, the TorchTune command instead), and port 29500. Every
    /// `envInjection` target gets the `PET_*` env, master included.
    fn enforce_ml_policy(
        &self,
        _: &Ctx,
        info: &mut RuntimeInfo,
        job: &TrainJob,
    ) -> Result<(), Failure> {
        let Some(torch) = ml_policy(info)?.torch else {
            return Ok(());
        };
        set_trainer_count(info, job);
        let num_nodes = trainer_count(info);
        let (requests, limits) = resources_per_node(info, job);
        let gpus = gpus(&requests, &limits)?;
        let procs = match job.spec.trainer.as_ref().and_then(|t| t.num_proc_per_node) {
            Some(n) => ProcsPerNode::Count(n.into()),
            None if gpus == 0 => ProcsPerNode::Count(cpus(&requests, &limits)?.max(1)),
            None => ProcsPerNode::Auto,
        };
        let tune_command = match job.spec.trainer.as_ref() {
            Some(trainer) if torchtune::is_entrypoint(trainer.command.as_deref()) => {
                let shape = Shape {
                    num_nodes: num_nodes.into(),
                    procs,
                    gpus,
                    args: trainer.args.as_deref().unwrap_or_default(),
                    runtime_name: &job.spec.runtime_ref.name,
                };
                Some(torchtune::command(
                    job,
                    &shape,
                    &torchtune::runtime_command(info)?,
                ))
            }
            _ => None,
        };
        let pet = |container: &mut Container| {
            container.upsert_env(constants::TORCH_ENV_NUM_NODES, num_nodes.to_string());
            container.upsert_env(constants::TORCH_ENV_NUM_PROC_PER_NODE, procs.to_string());
            completion_index_env(container, constants::TORCH_ENV_NODE_RANK);
        };
        let master = |container: &mut Container| {
            container.upsert_env(constants::TORCH_ENV_MASTER_ADDR, master_address(job));
            container.upsert_env(
                constants::TORCH_ENV_MASTER_PORT,
                constants::CONTAINER_TRAINER_PORT.to_string(),
            );
        };

        if let Some(node) = trainer_node(info, job) {
            upsert_trainer_env(node, job);
            pet(node);
            match tune_command {
                Some(command) => node.command = Some(command),
                None => master(node),
            }
            node.upsert_port(constants::CONTAINER_TRAINER_PORT);
        }
        for (target, name) in targets(&torch) {
            let container = find_container_mut(info, &target.job_name, name)
                .ok_or_else(|| Failure::new(target_not_found(target, name)))?;
            pet(container);
            master(container);
        }
        info::refresh_endpoints(info, job)
    }
}

/// Each `envInjection` target container, with its target.
fn targets(
    torch: &TorchMlPolicySource,
) -> impl Iterator<Item = (&TorchEnvInjectionTarget, &String)> {
    torch
        .env_injection
        .iter()
        .flat_map(|e| e.targets.iter().flatten())
        .flat_map(|target| target.container_names.iter().map(move |n| (target, n)))
}

fn target_not_found(target: &TorchEnvInjectionTarget, name: &str) -> String {
    format!(
        "envInjection target podSet {:?} container {name:?} not found in runtime template",
        target.job_name
    )
}

fn env_injection_errors(torch: &TorchMlPolicySource, info: &RuntimeInfo) -> Vec<FieldError> {
    targets(torch)
        .filter(|(target, name)| find_container(info, &target.job_name, name).is_none())
        .map(|(target, name)| {
            FieldError::invalid(
                "spec.runtimeRef",
                serde_json::to_string(target).ok(),
                target_not_found(target, name),
            )
        })
        .collect()
}

/// A container of the named pod set: its containers first, then its init
/// containers.
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
