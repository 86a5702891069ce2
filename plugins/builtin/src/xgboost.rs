//! The XGBoost plugin: the DMLC tracker env on the trainer's `node`
//! container, for runtimes with `mlPolicy.xgboost`.

use trainhub_plugin_sdk::info;
use trainhub_plugin_sdk::prelude::*;

use crate::common::{
    completion_index_env, gpus, master_address, ml_policy, resources_per_node, set_trainer_count,
    trainer_count, trainer_node,
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
            .validates()
            .enforces_ml_policy()
    }

    /// As upstream: each `spec.trainer.env` entry naming a reserved variable
    /// is forbidden.
    fn validate(&self, _: &Ctx, job: &TrainJob, runtime: &Runtime) -> Validation {
        let mut validation = Validation::default();
        if runtime
            .spec()
            .ml_policy
            .as_ref()
            .is_none_or(|p| p.xgboost.is_none())
        {
            return validation;
        }
        let env = job.spec.trainer.iter().flat_map(|t| t.env.iter().flatten());
        for (i, var) in env.enumerate() {
            if RESERVED_ENV.contains(&var.name.as_str()) {
                validation.error(FieldError::forbidden(
                    format!("spec.trainer.env[{i}]"),
                    format!("{} is reserved for the XGBoost runtime", var.name),
                ));
            }
        }
        validation
    }

    /// The trainer's count from `trainer.numNodes`; then, when the TrainJob
    /// sets `spec.trainer`, on the trainer's `node` container:
    /// `DMLC_TRACKER_URI` = the first node, `DMLC_TRACKER_PORT` = 29500,
    /// `DMLC_TASK_ID` from the completion index, `DMLC_NUM_WORKER` = nodes ×
    /// GPUs per node (one worker per node without GPUs), and port 29500.
    fn enforce_ml_policy(
        &self,
        _: &Ctx,
        info: &mut RuntimeInfo,
        job: &TrainJob,
    ) -> Result<(), Failure> {
        if ml_policy(info)?.xgboost.is_none() || info.trainer().is_err() {
            return Ok(());
        }
        set_trainer_count(info, job);
        let (requests, limits) = resources_per_node(info, job);
        let workers_per_node = gpus(&requests, &limits)?.max(1);
        let workers = i128::from(trainer_count(info))
            .checked_mul(workers_per_node)
            .ok_or_else(|| Failure::new("DMLC_NUM_WORKER overflows"))?;
        if let Some(node) = trainer_node(info, job) {
            node.upsert_env(constants::XGBOOST_ENV_TRACKER_URI, master_address(job));
            node.upsert_env(
                constants::XGBOOST_ENV_TRACKER_PORT,
                constants::CONTAINER_TRAINER_PORT.to_string(),
            );
            completion_index_env(node, constants::XGBOOST_ENV_TASK_ID);
            node.upsert_env(constants::XGBOOST_ENV_NUM_WORKER, workers.to_string());
            node.upsert_port(constants::CONTAINER_TRAINER_PORT);
        }
        info::refresh_endpoints(info, job)
    }
}
