//! The plain ML plugin: runtimes without a torch, MPI or JAX policy run the
//! trainer as it is, on the TrainJob's node count with its env.

use trainhub_plugin_sdk::info;
use trainhub_plugin_sdk::prelude::*;

use crate::common::{ml_policy, set_trainer_count};

/// The plain ML plugin.
#[derive(Default)]
pub struct PlainMl;

impl Plugin for PlainMl {
    fn describe(&self) -> Descriptor {
        Descriptor::new("plainml", env!("CARGO_PKG_VERSION"))
            .frameworks(["plainml"])
            .enforces_ml_policy()
    }

    /// The trainer's count from `trainer.numNodes`. The TrainJob's env is
    /// already on the `node` container (the host put it in the runtime info).
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
        if info.trainer().is_err() {
            // Nothing to size: a runtime of initializers only.
            return Ok(());
        }
        set_trainer_count(info, job)?;
        info::refresh_endpoints(info, job)
    }
}
