//! The Volcano plugin: gang scheduling with the Volcano scheduler, for
//! runtimes with `podGroupPolicy.volcano`.

use trainhub_plugin_sdk::api::jobset::JobSetSpec;
use trainhub_plugin_sdk::api::podgroup::volcano::{PodGroup, PodGroupSpec};
use trainhub_plugin_sdk::api::trainer::VolcanoPodGroupPolicySource;
use trainhub_plugin_sdk::info::{self, KeyValues as _};
use trainhub_plugin_sdk::prelude::*;

use crate::common::{job_name, owned_metadata, to_json};
use crate::podgroup::{min_member, min_resources};

/// The Volcano plugin.
#[derive(Default)]
pub struct Volcano;

impl Plugin for Volcano {
    fn describe(&self) -> Descriptor {
        Descriptor::new("volcano", env!("CARGO_PKG_VERSION"))
            .pod_group_policies(["volcano"])
            .validates()
            .enforces_pod_group_policy()
            .builds()
    }

    /// A queue named by the JobSet annotation `scheduling.volcano.sh/queue-name`
    /// must not be empty. (Upstream also checks that a pod template's
    /// PriorityClass exists, which needs the spoke cluster's API.)
    fn validate(&self, _: &Ctx, job: &TrainJob, runtime: &Runtime) -> Validation {
        let mut validation = Validation::default();
        if runtime
            .spec()
            .pod_group_policy
            .as_ref()
            .is_none_or(|p| p.volcano.is_none())
        {
            return validation;
        }
        if let Ok(info) = info::new_runtime_info(job, runtime)
            && info.annotations.get_value(constants::VOLCANO_QUEUE_NAME) == Some("")
        {
            validation.error(FieldError::invalid(
                format!("spec.annotations[{}]", constants::VOLCANO_QUEUE_NAME),
                Some(String::new()),
                "Volcano queue name must not be empty",
            ));
        }
        validation
    }

    /// Every pod joins the group: annotation `scheduling.k8s.io/group-name=J`.
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
            set.upsert_pod_annotation(constants::ANNOTATION_VOLCANO_GROUP_NAME, job_name(job));
        }
        Ok(())
    }

    /// The PodGroup `J`: every pod, their summed requests, the queue from the
    /// JobSet's `scheduling.volcano.sh/queue-name` annotation, the pod
    /// templates' priority class (the last one set), and the runtime's network
    /// topology.
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
        let template: JobSetSpec = info.template_as()?;
        let priority_class_name = template
            .replicated_jobs
            .iter()
            .flatten()
            .filter_map(|j| {
                j.template
                    .spec
                    .as_ref()?
                    .template
                    .spec
                    .as_ref()?
                    .priority_class_name
                    .clone()
            })
            .next_back();
        let network_topology = policy.network_topology.map(|mut topology| {
            topology.default_fields();
            topology
        });
        let group = PodGroup {
            metadata: owned_metadata(job, job_name(job).to_string()),
            spec: PodGroupSpec {
                min_member: Some(min_member(info)?),
                min_resources: Some(min_resources(info)?),
                queue: info
                    .annotations
                    .get_value(constants::VOLCANO_QUEUE_NAME)
                    .map(str::to_string),
                priority_class_name,
                network_topology,
                ..Default::default()
            },
            status: None,
        };
        Ok(vec![to_json("PodGroup", &group)?])
    }
}

fn policy(info: &RuntimeInfo) -> Result<Option<VolcanoPodGroupPolicySource>, Failure> {
    Ok(info.pod_group_policy()?.and_then(|p| p.volcano))
}
