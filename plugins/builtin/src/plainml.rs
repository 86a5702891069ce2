//! The plain ML plugin: runtimes without a torch, MPI or JAX policy run the
//! trainer as it is, on the TrainJob's node count with its env.

use trainhub_plugin_sdk::info;
use trainhub_plugin_sdk::prelude::*;

use crate::common::{ml_policy, set_trainer_count, trainer_node, upsert_trainer_env};

/// The plain ML plugin.
#[derive(Default)]
pub struct PlainMl;

impl Plugin for PlainMl {
    fn describe(&self) -> Descriptor {
        Descriptor::new("plainml", env!("CARGO_PKG_VERSION"))
            .frameworks(["plainml"])
            .enforces_ml_policy()
    }

    /// The trainer's count from `trainer.numNodes`, and the TrainJob's env on
    /// the trainer's `node` container.
    fn enforce_ml_policy(
        &self,
        _: &Ctx,
        info: &mut RuntimeInfo,
        job: &TrainJob,
    ) -> Result<(), Failure> {
        let policy = ml_policy(info)?;
        if policy.torch.is_some() || policy.mpi.is_some() || policy.jax.is_some() {
            return Ok(());
        }
        set_trainer_count(info, job);
        if let Some(node) = trainer_node(info, job) {
            upsert_trainer_env(node, job);
        }
        info::refresh_endpoints(info, job)
    }
}
