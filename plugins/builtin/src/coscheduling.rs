//! The coscheduling plugin: gang scheduling with the scheduler-plugins
//! coscheduling plugin, for runtimes with `podGroupPolicy.coscheduling`.

use trainhub_plugin_sdk::api::podgroup::coscheduling::{PodGroup, PodGroupSpec};
use trainhub_plugin_sdk::prelude::*;

use crate::common::{job_name, owned_metadata, to_json};
use crate::podgroup::{min_member, min_resources};

/// The coscheduling plugin.
#[derive(Default)]
pub struct Coscheduling;

impl Plugin for Coscheduling {
    fn describe(&self) -> Descriptor {
        Descriptor::new("coscheduling", env!("CARGO_PKG_VERSION"))
            .pod_group_policies(["coscheduling"])
            .enforces_pod_group_policy()
            .builds()
    }

    /// Every pod joins the group: label `scheduling.x-k8s.io/pod-group=J`.
    fn enforce_pod_group_policy(
        &self,
        _: &Ctx,
        info: &mut RuntimeInfo,
        job: &TrainJob,
    ) -> Result<(), Failure> {
        if policy(info)?.is_none() {
            return Ok(());
        }
        for set in &mut info.pod_sets {
            set.upsert_pod_label(constants::LABEL_COSCHEDULING_POD_GROUP, job_name(job));
        }
        Ok(())
    }

    /// The PodGroup `J`: every pod, their summed requests, and the runtime's
    /// `scheduleTimeoutSeconds` (60 by default).
    fn build(
        &self,
        _: &Ctx,
        info: &RuntimeInfo,
        job: &TrainJob,
        _: &Target,
    ) -> Result<Vec<Value>, Failure> {
        let Some(policy) = policy(info)? else {
            return Ok(Vec::new());
        };
        let group = PodGroup {
            metadata: owned_metadata(job, job_name(job).to_string()),
            spec: PodGroupSpec {
                min_member: Some(min_member(info)?),
                min_resources: Some(min_resources(info)?),
                schedule_timeout_seconds: Some(
                    policy
                        .schedule_timeout_seconds
                        .unwrap_or(constants::DEFAULT_SCHEDULE_TIMEOUT_SECONDS),
                ),
            },
            status: None,
        };
        Ok(vec![to_json("PodGroup", &group)?])
    }
}

fn policy(
    info: &RuntimeInfo,
) -> Result<Option<trainhub_plugin_sdk::api::trainer::CoschedulingPodGroupPolicySource>, Failure> {
    Ok(info.pod_group_policy()?.and_then(|p| p.coscheduling))
}
