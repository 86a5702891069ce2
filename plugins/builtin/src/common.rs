//! What several plugins share: object metadata owned by the TrainJob,
//! reserved-env validation, trainer lookups, the TrainJob's env, and
//! resource counts.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde::Serialize;
use trainhub_plugin_sdk::api::trainer::MlPolicy;
use trainhub_plugin_sdk::info;
use trainhub_plugin_sdk::prelude::*;

use crate::quantity::Quantity as Amount;

/// The TrainJob's name (empty if it has none).
pub(crate) fn job_name(job: &TrainJob) -> &str {
    job.metadata.name.as_deref().unwrap_or_default()
}

/// `metadata` of an object the TrainJob owns: its name, the TrainJob's
/// namespace, and a controller reference to the TrainJob, so that deleting
/// the TrainJob deletes it.
pub(crate) fn owned_metadata(job: &TrainJob, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: job.metadata.namespace.clone(),
        owner_references: Some(vec![OwnerReference {
            api_version: format!(
                "{}/{}",
                trainhub_plugin_sdk::api::trainer::GROUP,
                trainhub_plugin_sdk::api::trainer::VERSION
            ),
            kind: "TrainJob".to_string(),
            name: job_name(job).to_string(),
            uid: job.metadata.uid.clone().unwrap_or_default(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]),
        ..Default::default()
    }
}

pub(crate) fn to_json<T: Serialize>(what: &str, value: &T) -> Result<Value, Failure> {
    serde_json::to_value(value)
        .map_err(|e| Failure::new(format!("cannot serialise the {what}: {e}")))
}

/// The one error upstream's torch and MPI plugins give when
/// `spec.trainer.env` sets names they reserve: on the whole list, naming the
/// offending names sorted.
pub(crate) fn reserved_env_error(job: &TrainJob, reserved: &[&str]) -> Option<FieldError> {
    let env = job.spec.trainer.as_ref()?.env.as_ref()?;
    let mut names: Vec<&str> = env
        .iter()
        .map(|var| var.name.as_str())
        .filter(|name| reserved.contains(name))
        .collect();
    if names.is_empty() {
        return None;
    }
    names.sort_unstable();
    names.dedup();
    Some(FieldError::invalid(
        "spec.trainer.env",
        serde_json::to_string(env).ok(),
        format!(
            "must not have reserved envs, invalid envs configured: [{}]",
            names.join(" ")
        ),
    ))
}

/// The parsed `mlPolicy` of the runtime info.
pub(crate) fn ml_policy(info: &RuntimeInfo) -> Result<MlPolicy, Failure> {
    info.ml_policy()
}

/// The trainer step's count set to the TrainJob's `trainer.numNodes`, when
/// both exist. 0 is kept, as upstream keeps it.
pub(crate) fn set_trainer_count(info: &mut RuntimeInfo, job: &TrainJob) {
    if let Some(nodes) = job.spec.trainer.as_ref().and_then(|t| t.num_nodes)
        && let Ok(trainer) = info.trainer_mut()
    {
        trainer.count = pod_count(nodes);
    }
}

/// The trainer step's count, 1 without a trainer step (as upstream reads it).
pub(crate) fn trainer_count(info: &RuntimeInfo) -> u32 {
    info.trainer().map_or(1, |t| t.count)
}

/// A node count as a pod set holds it. The API refuses a negative one; it
/// would count as 0.
pub(crate) fn pod_count(value: i32) -> u32 {
    u32::try_from(value).unwrap_or(0)
}

/// The trainer's `node` container, which upstream's ML plugins touch only
/// when the TrainJob sets `spec.trainer`: in the replicated job labelled as
/// the trainer step.
pub(crate) fn trainer_node<'a>(
    info: &'a mut RuntimeInfo,
    job: &TrainJob,
) -> Option<&'a mut Container> {
    job.spec.trainer.as_ref()?;
    info.trainer_mut().ok()?.container_mut(constants::NODE)
}

/// `spec.trainer.env` upserted onto `container` as upstream merges it: an
/// entry replaces the one of its name in place, a new name is appended, in
/// the TrainJob's order.
pub(crate) fn upsert_trainer_env(container: &mut Container, job: &TrainJob) {
    for var in job.spec.trainer.iter().flat_map(|t| t.env.iter().flatten()) {
        container.upsert_env_var(info::env_record(var));
    }
}

/// `J-node-0-0.J`: the first trainer pod, where rendezvous happens.
pub(crate) fn master_address(job: &TrainJob) -> String {
    let name = job_name(job);
    format!("{name}-{}-0-0.{name}", constants::NODE)
}

/// The env var taking the pod's completion index.
pub(crate) fn completion_index_env(container: &mut Container, name: &str) {
    container.upsert_env_from_field(name, constants::JOB_COMPLETION_INDEX_FIELD_PATH);
}

/// The requests and limits of one trainer node, as upstream reads them: the
/// TrainJob's `resourcesPerNode` when set, else the resources of the `node`
/// container of the first replicated job that is named `node` or is the
/// trainer step and has resources set.
pub(crate) fn resources_per_node(
    info: &RuntimeInfo,
    job: &TrainJob,
) -> (Vec<Quantity>, Vec<Quantity>) {
    if let Some(resources) = job
        .spec
        .trainer
        .as_ref()
        .and_then(|t| t.resources_per_node.as_ref())
    {
        let list = |map: Option<
            &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
        >| {
            map.into_iter()
                .flatten()
                .map(|(name, q)| Quantity {
                    name: name.clone(),
                    value: q.0.clone(),
                })
                .collect::<Vec<_>>()
        };
        return (
            list(resources.requests.as_ref()),
            list(resources.limits.as_ref()),
        );
    }
    info.pod_sets
        .iter()
        .filter(|p| {
            p.name == constants::NODE || p.ancestor.as_deref() == Some(constants::ANCESTOR_TRAINER)
        })
        .filter_map(|p| p.container(constants::NODE))
        .find(|c| !c.requests.is_empty() || !c.limits.is_empty())
        .map(|c| (c.requests.clone(), c.limits.clone()))
        .unwrap_or_default()
}

/// GPUs per node: the first resource whose name mentions `gpu`, from the
/// requests, else the limits; 0 without one.
pub(crate) fn gpus(requests: &[Quantity], limits: &[Quantity]) -> Result<i128, Failure> {
    let count = |list: &[Quantity]| -> Result<i128, Failure> {
        match list
            .iter()
            .find(|q| q.name.to_ascii_lowercase().contains("gpu"))
        {
            Some(q) => Ok(amount(q)?.ceil()),
            None => Ok(0),
        }
    };
    let requested = count(requests)?;
    if requested != 0 {
        return Ok(requested);
    }
    count(limits)
}

/// CPUs per node, rounded up: the request, else the limit; 0 without either.
pub(crate) fn cpus(requests: &[Quantity], limits: &[Quantity]) -> Result<i128, Failure> {
    let find = |list: &[Quantity]| -> Result<Option<Amount>, Failure> {
        list.iter()
            .find(|q| q.name == "cpu")
            .map(amount)
            .transpose()
    };
    match find(requests)? {
        Some(request) if !request.is_zero() => Ok(request.ceil()),
        _ => Ok(find(limits)?.map_or(0, |limit| limit.ceil())),
    }
}

pub(crate) fn amount(q: &Quantity) -> Result<Amount, Failure> {
    Amount::parse(&q.value).map_err(|e| Failure::new(format!("resource {}: {e}", q.name)))
}

/// Adds `volume` to the pod set, replacing the volume of the same name in
/// place (upstream's `apply.UpsertVolumes`).
pub(crate) fn upsert_volume(set: &mut PodSet, volume: Volume) {
    match set.volumes.iter_mut().find(|v| v.name == volume.name) {
        Some(existing) => *existing = volume,
        None => set.volumes.push(volume),
    }
}

/// A mount of `volume` at `path`.
pub(crate) fn mount(volume: &str, path: &str, read_only: Option<bool>) -> VolumeMount {
    VolumeMount {
        name: volume.to_string(),
        mount_path: path.to_string(),
        read_only,
        sub_path: None,
    }
}

/// Adds `mount` to the container, replacing the mount at the same path in
/// place (upstream's `apply.UpsertVolumeMounts`).
pub(crate) fn upsert_mount(container: &mut Container, mount: VolumeMount) {
    match container
        .volume_mounts
        .iter_mut()
        .find(|m| m.mount_path == mount.mount_path)
    {
        Some(existing) => *existing = mount,
        None => container.volume_mounts.push(mount),
    }
}
