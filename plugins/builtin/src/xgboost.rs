//! The XGBoost plugin: the DMLC tracker env on the trainer's `node`
//! container, for runtimes with `mlPolicy.xgboost`.

use trainhub_plugin_sdk::info;
use trainhub_plugin_sdk::prelude::*;

use crate::common::{
    completion_index_env, gpus, master_address, ml_policy, reserved_env_errors, resources_per_node,
    set_trainer_count,
};

/// The XGBoost plugin.
#[derive(Default)]
pub struct Xgboost;

/// Env names XGBoost's collective reads and this plugin sets.
pub const RESERVED_ENV: [&str; 4] = constants::XGBOOST_RESERVED_ENV_NAMES;

impl Plugin for Xgboost {
    fn describe(&self) -> Descriptor {
        Descriptor::new("xgboost", env!("CARGO_PKG_VERSION"))
            .frameworks(["xgboost"])
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
            .is_some_and(|p| p.xgboost.is_some())
        {
            validation
                .errors
                .extend(reserved_env_errors(job, &RESERVED_ENV, "XGBoost"));
        }
        validation
    }

    /// `DMLC_TRACKER_URI` = the first node, `DMLC_TRACKER_PORT` = 29500,
    /// `DMLC_TASK_ID` from the completion index, `DMLC_NUM_WORKER` = nodes ×
    /// GPUs per node (one worker per node without GPUs), and port 29500.
    fn enforce_ml_policy(
        &self,
        _: &Ctx,
        info: &mut RuntimeInfo,
        job: &TrainJob,
    ) -> Result<(), Failure> {
        if ml_policy(info)?.xgboost.is_none() {
            return Ok(());
        }
        set_trainer_count(info, job)?;
        let (requests, limits) = resources_per_node(info, job);
        let workers_per_node = gpus(&requests, &limits)?.max(1);
        let num_nodes = i128::from(info.trainer()?.count);
        let workers = num_nodes
            .checked_mul(workers_per_node)
            .ok_or_else(|| Failure::new("DMLC_NUM_WORKER overflows"))?;
        let node = info.trainer_mut()?.node_container_mut()?;
        node.upsert_env(constants::XGBOOST_ENV_TRACKER_URI, master_address(job));
        node.upsert_env(
            constants::XGBOOST_ENV_TRACKER_PORT,
            constants::CONTAINER_TRAINER_PORT.to_string(),
        );
        completion_index_env(node, constants::XGBOOST_ENV_TASK_ID);
        node.upsert_env(constants::XGBOOST_ENV_NUM_WORKER, workers.to_string());
        node.upsert_port(constants::CONTAINER_TRAINER_PORT);
        info::refresh_endpoints(info, job)
    }
}
