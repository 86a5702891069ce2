//! The Python plugin: the rendezvous env of `torch.distributed`'s `env://`
//! init method on the trainer's `node` container, for runtimes labelled
//! `trainer.kubeflow.org/framework: python` (such as `python-distributed`).
//!
//! A plain Python program reads the same four names to find its rank and
//! the first pod; one process runs per node.

use trainhub_plugin_sdk::info;
use trainhub_plugin_sdk::prelude::*;

use crate::common::{
    completion_index_env, master_address, reserved_env_error, set_trainer_count, upsert_trainer_env,
};

/// The Python plugin.
#[derive(Default)]
pub struct Python;

/// The framework label value this plugin handles.
pub const FRAMEWORK: &str = "python";

/// Env names this plugin sets on the trainer, in the order it sets them.
pub const RESERVED_ENV: [&str; 4] = ["WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT"];

impl Plugin for Python {
    fn describe(&self) -> Descriptor {
        Descriptor::new("python", env!("CARGO_PKG_VERSION"))
            .frameworks([FRAMEWORK])
            .validates()
            .enforces_ml_policy()
    }

    /// Rejects `spec.trainer.env` entries naming a reserved variable, and
    /// warns that `numProcPerNode` above 1 is not honoured.
    fn validate(&self, _: &Ctx, job: &TrainJob, runtime: &Runtime) -> Validation {
        let mut validation = Validation::default();
        if runtime.framework() != Some(FRAMEWORK) {
            return validation;
        }
        validation
            .errors
            .extend(reserved_env_error(job, &RESERVED_ENV));
        if let Some(n) = job.spec.trainer.as_ref().and_then(|t| t.num_proc_per_node)
            && n != 1
        {
            validation.warn(format!(
                "spec.trainer.numProcPerNode: {n} is ignored: the python runtime runs one process per node (WORLD_SIZE = numNodes)"
            ));
        }
        validation
    }

    /// The trainer's count from `trainer.numNodes`, then on its `node`
    /// container: the TrainJob's env, `WORLD_SIZE` = the node count, `RANK` from the completion
    /// index, `MASTER_ADDR` = the first trainer pod's DNS name,
    /// `MASTER_PORT` = 29500, and that container port.
    fn enforce_ml_policy(
        &self,
        _: &Ctx,
        info: &mut RuntimeInfo,
        job: &TrainJob,
    ) -> Result<(), Failure> {
        if info.framework.as_deref() != Some(FRAMEWORK) || info.trainer().is_err() {
            // Not a python runtime, or nothing to size (initializers only).
            return Ok(());
        }
        set_trainer_count(info, job);
        info::refresh_endpoints(info, job)?;
        let trainer = info.trainer_mut()?;
        let world_size = trainer.count.to_string();
        // The first endpoint follows the template's subdomain; without one
        // it is `J-node-0-0.J`, as the other plugins address rank 0.
        let master = trainer
            .endpoints
            .first()
            .cloned()
            .unwrap_or_else(|| master_address(job));
        let node = trainer.node_container_mut()?;
        upsert_trainer_env(node, job);
        let [world, rank, addr, port] = RESERVED_ENV;
        node.upsert_env(world, world_size);
        completion_index_env(node, rank);
        node.upsert_env(addr, master);
        node.upsert_env(port, constants::CONTAINER_TRAINER_PORT.to_string());
        node.upsert_port(constants::CONTAINER_TRAINER_PORT);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;
    use trainhub_plugin_sdk::testing::Harness;

    use super::*;

    fn runtime(framework: &str, network: serde_json::Value) -> Runtime {
        serde_json::from_value(json!({
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "ClusterTrainingRuntime",
            "metadata": {"name": "py", "labels": {"trainer.kubeflow.org/framework": framework}},
            "spec": {
                "mlPolicy": {"numNodes": 1},
                "template": {"spec": {
                    "network": network,
                    "replicatedJobs": [{
                        "name": "node",
                        "template": {
                            "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                            "spec": {"template": {"spec": {"containers": [{
                                "name": "node",
                                "image": "python:3.11-slim",
                                "ports": [{"containerPort": 29500}],
                            }]}}},
                        },
                    }],
                }},
            },
        }))
        .unwrap()
    }

    fn job(trainer: serde_json::Value) -> TrainJob {
        serde_json::from_value(json!({
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": "lr", "namespace": "default"},
            "spec": {"runtimeRef": {"name": "py"}, "trainer": trainer},
        }))
        .unwrap()
    }

    fn enforced(runtime: &Runtime, job: &TrainJob) -> RuntimeInfo {
        let harness = Harness::<Python>::new();
        let info = harness.runtime_info(job, runtime).unwrap();
        harness.enforce_ml_policy(info, job).unwrap()
    }

    fn env_of(info: &RuntimeInfo) -> Vec<(String, Option<String>)> {
        let node = info.trainer().unwrap().container(constants::NODE).unwrap();
        node.env
            .iter()
            .map(|e| (e.name.clone(), e.value.clone()))
            .collect()
    }

    #[test]
    fn sets_the_env_in_a_stable_order_after_the_trainjobs_own() {
        let job = job(json!({"numNodes": 3, "env": [{"name": "EPOCHS", "value": "5"}]}));
        let info = enforced(&runtime(FRAMEWORK, json!(null)), &job);
        assert_eq!(info.trainer().unwrap().count, 3);
        let env = env_of(&info);
        let names: Vec<&str> = env.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            ["EPOCHS", "WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT"]
        );
        assert_eq!(env[1].1.as_deref(), Some("3"));
        assert_eq!(env[3].1.as_deref(), Some("lr-node-0-0.lr"));
        assert_eq!(env[4].1.as_deref(), Some("29500"));
        let node = info.trainer().unwrap().container(constants::NODE).unwrap();
        let rank = node.env("RANK").unwrap();
        assert_eq!(rank.value, None);
        assert!(
            rank.value_from
                .as_deref()
                .unwrap()
                .contains(constants::JOB_COMPLETION_INDEX_FIELD_PATH)
        );
        // The runtime already declares the port: it is not added twice.
        assert_eq!(node.ports.len(), 1);
    }

    #[test]
    fn enforcing_twice_gives_the_same_info() {
        let job = job(json!({"numNodes": 2}));
        let runtime = runtime(FRAMEWORK, json!(null));
        let once = enforced(&runtime, &job);
        let twice = Harness::<Python>::new()
            .enforce_ml_policy(once.clone(), &job)
            .unwrap();
        assert_eq!(env_of(&once), env_of(&twice));
        assert_eq!(
            format!("{:?}", once.pod_sets),
            format!("{:?}", twice.pod_sets)
        );
    }

    #[test]
    fn master_addr_follows_the_template_subdomain() {
        let job = job(json!({"numNodes": 2}));
        let info = enforced(&runtime(FRAMEWORK, json!({"subdomain": "mesh"})), &job);
        let node = info.trainer().unwrap().container(constants::NODE).unwrap();
        assert_eq!(
            node.env("MASTER_ADDR").unwrap().value.as_deref(),
            Some("lr-node-0-0.mesh")
        );
    }

    #[test]
    fn other_frameworks_are_left_alone() {
        let job = job(json!({"numNodes": 2, "env": [{"name": "RANK", "value": "7"}]}));
        let runtime = runtime("plainml", json!(null));
        let info = enforced(&runtime, &job);
        // The TrainJob's env reaches the container through the JobSet
        // builder; this plugin adds nothing.
        assert_eq!(env_of(&info), []);
        assert!(
            Harness::<Python>::new()
                .validate(&job, &runtime)
                .errors
                .is_empty()
        );
    }

    #[test]
    fn reserved_env_is_rejected_and_extra_processes_warned_about() {
        let job = job(json!({
            "numProcPerNode": 4,
            "env": [{"name": "SEED", "value": "1"}, {"name": "MASTER_PORT", "value": "1"}],
        }));
        let validation = Harness::<Python>::new().validate(&job, &runtime(FRAMEWORK, json!(null)));
        assert_eq!(validation.errors.len(), 1);
        assert_eq!(validation.errors[0].field, "spec.trainer.env");
        assert_eq!(
            validation.errors[0].detail,
            "must not have reserved envs, invalid envs configured: [MASTER_PORT]"
        );
        assert_eq!(validation.warnings.len(), 1);
        assert!(validation.warnings[0].contains("numProcPerNode"));
    }
}
