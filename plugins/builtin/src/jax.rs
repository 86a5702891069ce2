//! The JAX plugin: `jax.distributed` env on the trainer's `node` container,
//! for runtimes with `mlPolicy.jax`.

use trainhub_plugin_sdk::info;
use trainhub_plugin_sdk::prelude::*;

use crate::common::{
    completion_index_env, master_address, ml_policy, set_trainer_count, trainer_count, trainer_node,
};

/// The JAX plugin.
///
/// Unlike the other ML plugins it reserves no env name: as upstream, a
/// TrainJob may set `JAX_*` itself, and its `trainer.env` replaces what this
/// plugin injects (the JobSet builder applies it last).
#[derive(Default)]
pub struct Jax;

impl Plugin for Jax {
    fn describe(&self) -> Descriptor {
        Descriptor::new("jax", env!("CARGO_PKG_VERSION"))
            .frameworks(["jax"])
            .enforces_ml_policy()
    }

    /// The trainer's count from `trainer.numNodes`; then, when the TrainJob
    /// sets `spec.trainer`, on the trainer's `node` container:
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
        set_trainer_count(info, job);
        let num_nodes = trainer_count(info);
        if let Some(node) = trainer_node(info, job) {
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
        }
        info::refresh_endpoints(info, job)
    }
}
