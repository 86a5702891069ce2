//! ACME's in-house training framework, as a trainhub plugin.
//!
//! Runtimes labelled `trainer.kubeflow.org/framework: acme` get:
//! - validation: the TrainJob must set `ACME_PROJECT` in `spec.trainer.env`;
//! - on every trainer pod: `ACME_CLUSTER` (from the plugin's settings),
//!   `ACME_NUM_NODES`, `ACME_RANK` (the pod's completion index) and
//!   `ACME_COORDINATOR` (the first pod, port 7777), which the plugin reserves;
//! - a sidecar `acme-agent` running the image the settings name.
//!
//! Settings (`acme.yaml` beside `acme.wasm` in the plugins directory):
//! `settings: {cluster: <name>, agentImage: <image>}`; `cluster` is required.

use trainhub_plugin_sdk::prelude::*;

const COORDINATOR_PORT: i32 = 7777;
const INJECTED: [&str; 4] = [
    "ACME_CLUSTER",
    "ACME_NUM_NODES",
    "ACME_RANK",
    "ACME_COORDINATOR",
];

#[derive(Default)]
pub struct Acme;

impl Plugin for Acme {
    fn describe(&self) -> Descriptor {
        Descriptor::new("acme", env!("CARGO_PKG_VERSION"))
            .frameworks(["acme"])
            .reserves_env(INJECTED)
            .validates()
            .enforces_ml_policy()
    }

    fn validate_settings(&self, settings: &Value) -> Vec<FieldError> {
        match settings.get("cluster").and_then(Value::as_str) {
            Some(c) if !c.is_empty() => Vec::new(),
            _ => vec![FieldError::required(
                "settings.cluster",
                "the ACME cluster name is required",
            )],
        }
    }

    fn validate(&self, _: &Ctx, job: &TrainJob, _: &Runtime) -> Validation {
        let mut result = Validation::default();
        let env = job.spec.trainer.as_ref().and_then(|t| t.env.as_ref());
        if !env.is_some_and(|env| env.iter().any(|e| e.name == "ACME_PROJECT")) {
            result.error(FieldError::required(
                "spec.trainer.env",
                "ACME_PROJECT must be set: ACME bills every run to a project",
            ));
        }
        result
    }

    fn enforce_ml_policy(
        &self,
        ctx: &Ctx,
        info: &mut RuntimeInfo,
        _: &TrainJob,
    ) -> Result<(), Failure> {
        let settings = ctx.settings();
        let cluster = settings
            .get("cluster")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let agent_image = settings
            .get("agentImage")
            .and_then(Value::as_str)
            .unwrap_or("acme/agent:1")
            .to_string();
        let trainer = info.trainer_mut()?;
        let nodes = trainer.count.to_string();
        let coordinator = match trainer.endpoints.first() {
            Some(first) => format!("{first}:{COORDINATOR_PORT}"),
            None => return Err(Failure::new("the trainer job has no pods")),
        };
        let node = trainer.node_container_mut()?;
        node.upsert_env("ACME_CLUSTER", cluster);
        node.upsert_env("ACME_NUM_NODES", nodes);
        node.upsert_env_from_field(
            "ACME_RANK",
            "metadata.annotations['batch.kubernetes.io/job-completion-index']",
        );
        node.upsert_env("ACME_COORDINATOR", coordinator);
        node.upsert_port(COORDINATOR_PORT);

        let mut agent = Container::new("acme-agent");
        agent.image = Some(agent_image);
        agent.args = Some(vec!["--report-to".into(), "acme-control-plane".into()]);
        trainer.upsert_container(agent);
        Ok(())
    }
}

export_plugin!(Acme);
