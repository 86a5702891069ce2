//! The JAX plugin: `jax.distributed` env on the trainer's `node` container,
//! for runtimes with `mlPolicy.jax`.

use trainhub_plugin_sdk::info;
use trainhub_plugin_sdk::prelude::*;

use crate::common::{
    completion_index_env, master_address, ml_policy, reserved_env_errors, set_trainer_count,
};

/// The JAX plugin.
#[derive(Default)]
pub struct Jax;

/// Env names `jax.distributed.initialize` reads and this plugin sets.
pub const RESERVED_ENV: [&str; 3] = [
    constants::JAX_ENV_NUM_PROCESSES,
    constants::JAX_ENV_PROCESS_ID,
    constants::JAX_ENV_COORDINATOR_ADDRESS,
];

impl Plugin for Jax {
    fn describe(&self) -> Descriptor {
        Descriptor::new("jax", env!("CARGO_PKG_VERSION"))
            .frameworks(["jax"])
            .reserves_env(RESERVED_ENV)
            .validates()
            .enforces_ml_policy()
    }

    fn validate(&self, _: &Ctx, job: &TrainJob, runtime: &Runtime) -> Validation {
        let mut validation = Validation::default();
        if runtime
            .spec()
            .ml_policy
            .as_ref()
            .is_some_and(|p| p.jax.is_some())
        {
            validation
                .errors
                .extend(reserved_env_errors(job, &RESERVED_ENV, "JAX"));
        }
        validation
    }

    /// `JAX_NUM_PROCESSES` = the node count, `JAX_PROCESS_ID` from the
    /// completion index, `JAX_COORDINATOR_ADDRESS` = the first node on port
    /// 29500, and that port.
    fn enforce_ml_policy(
        &self,
        _: &Ctx,
        info: &mut RuntimeInfo,
        job: &TrainJob,
    ) -> Result<(), Failure> {
        if ml_policy(info)?.jax.is_none() {
            return Ok(());
        }
        set_trainer_count(info, job)?;
        let num_nodes = info.trainer()?.count;
        let node = info.trainer_mut()?.node_container_mut()?;
        node.upsert_env(constants::JAX_ENV_NUM_PROCESSES, num_nodes.to_string());
        completion_index_env(node, constants::JAX_ENV_PROCESS_ID);
        node.upsert_env(
            constants::JAX_ENV_COORDINATOR_ADDRESS,
            format!(
                "{}:{}",
                master_address(job),
                constants::CONTAINER_TRAINER_PORT
            ),
        );
        node.upsert_port(constants::CONTAINER_TRAINER_PORT);
        info::refresh_endpoints(info, job)
    }
}
