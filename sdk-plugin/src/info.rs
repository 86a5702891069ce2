//! The runtime info the host computes before the Build phase: the runtime's
//! JobSet template with the TrainJob's runtime patches applied, split into
//! pod sets that carry the TrainJob's overrides (trainer image, command,
//! args and resources; initializer storage URIs, env and secrets). The
//! trainer's env is left to the ML plugin and the JobSet builder, which place
//! it among the env they inject as upstream does.
//!
//! Plugins then refine the info (counts, env, ports, volumes, pod labels)
//! and the JobSet builder writes the pod sets back onto the template.
//!
//! # Counts
//!
//! Every replicated job gets one pod set whose count is the pods each of its
//! Jobs runs (`parallelism` = `completions`):
//!
//! - the trainer job (ancestor step `trainer`): the TrainJob's
//!   `trainer.numNodes`, else the runtime's `mlPolicy.numNodes`, else 1. For
//!   an MPI runtime the trainer step is the launcher, which keeps
//!   `mlPolicy.numNodes` (1 in practice); the MPI plugin sizes the `node` job;
//! - any other job: its template's `parallelism`, else 1.
//!
//! Counts start at least 1, as upstream's; the ML plugins then set the
//! trainer's to the TrainJob's `trainer.numNodes`, which may be 0.

mod convert;
mod merge;

pub use convert::{
    apply_container, container_record, env_record, env_var, new_container, volume, volume_record,
};

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use trainhub_api::constants;
use trainhub_api::jobset::JobSetSpec;
use trainhub_api::trainer::{AssetInitializer, MlPolicy, TrainJob};

pub use crate::helpers::KeyValues;
use crate::{Container, Failure, FieldError, KeyValue, PodSet, Quantity, Runtime, RuntimeInfo};

/// The runtime info for `job` on `runtime`, as the host computes it before
/// the Build phase (and before PreExecution validation, which checks the
/// same patched template).
///
/// # Errors
///
/// Field errors when the TrainJob's runtime patches cannot apply to the
/// runtime: a patch names a replicated job the runtime does not have, or the
/// patched template is no longer a valid JobSet spec.
pub fn new_runtime_info(job: &TrainJob, runtime: &Runtime) -> Result<RuntimeInfo, Vec<FieldError>> {
    let spec = runtime.spec();
    let ml_policy = spec.ml_policy.clone().map(|mut policy| {
        policy.default_fields();
        policy
    });
    let pod_group_policy = spec.pod_group_policy.clone().map(|mut policy| {
        policy.default_fields();
        policy
    });

    let (labels, annotations) = jobset_metadata(job, runtime);
    let mut template = patched_template(job, runtime)?;
    let job_name = job.metadata.name.as_deref().unwrap_or_default();
    let subdomain = subdomain(&template, job_name);
    let run_launcher_as_node = run_launcher_as_node(ml_policy.as_ref());

    let mut pod_sets = Vec::new();
    for rjob in template.replicated_jobs.iter_mut().flatten() {
        let ancestor = rjob
            .template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.as_ref())
            .and_then(|l| l.get(constants::LABEL_TRAINJOB_ANCESTOR))
            .cloned();
        let is_trainer = ancestor.as_deref() == Some(constants::ANCESTOR_TRAINER);
        let parallelism = rjob.template.spec.as_ref().and_then(|s| s.parallelism);
        let count = if is_trainer {
            trainer_count(job, ml_policy.as_ref(), parallelism)
        } else {
            parallelism.unwrap_or(1)
        };
        let count = u32::try_from(count.max(1)).unwrap_or(1);

        // Resource claims have no place in the records: merge them on the
        // template, which the builder keeps.
        let trainer_resources = (is_trainer && ml_policy.is_some())
            || (run_launcher_as_node && rjob.name == constants::NODE);
        if trainer_resources
            && let Some(claims) = job
                .spec
                .trainer
                .as_ref()
                .and_then(|t| t.resources_per_node.as_ref())
                .and_then(|r| r.claims.as_ref())
            && let Some(node) = rjob
                .template
                .spec
                .as_mut()
                .and_then(|s| s.template.spec.as_mut())
                .and_then(|s| s.containers.iter_mut().find(|c| c.name == constants::NODE))
        {
            let merged = node
                .resources
                .get_or_insert_with(Default::default)
                .claims
                .get_or_insert_with(Vec::new);
            for claim in claims {
                match merged.iter_mut().find(|c| c.name == claim.name) {
                    Some(existing) => *existing = claim.clone(),
                    None => merged.push(claim.clone()),
                }
            }
        }

        let pod_template = rjob.template.spec.as_ref().map(|s| &s.template);
        let metadata = pod_template.and_then(|t| t.metadata.as_ref());
        let pod_spec = pod_template.and_then(|t| t.spec.as_ref());
        let mut set = PodSet {
            name: rjob.name.clone(),
            ancestor: ancestor.clone(),
            count,
            containers: pod_spec
                .map(|s| s.containers.iter().map(container_record).collect())
                .unwrap_or_default(),
            init_containers: pod_spec
                .and_then(|s| s.init_containers.as_ref())
                .map(|cs| cs.iter().map(container_record).collect())
                .unwrap_or_default(),
            volumes: pod_spec
                .and_then(|s| s.volumes.as_ref())
                .map(|vs| vs.iter().map(volume_record).collect())
                .unwrap_or_default(),
            pod_labels: key_values(metadata.and_then(|m| m.labels.as_ref())),
            pod_annotations: key_values(metadata.and_then(|m| m.annotations.as_ref())),
            endpoints: Vec::new(),
        };

        if let Some(node) = set
            .containers
            .iter_mut()
            .find(|c| c.name == constants::NODE)
        {
            apply_trainer(job, node, is_trainer, trainer_resources);
        }
        if let Some(initializer) = job.spec.initializer.as_ref() {
            for (step, source) in [
                (
                    constants::ANCESTOR_DATASET_INITIALIZER,
                    initializer.dataset.as_ref(),
                ),
                (
                    constants::ANCESTOR_MODEL_INITIALIZER,
                    initializer.model.as_ref(),
                ),
            ] {
                if ancestor.as_deref() == Some(step)
                    && let Some(source) = source
                    && let Some(container) = set.containers.iter_mut().find(|c| c.name == step)
                {
                    apply_initializer(source, container);
                }
            }
        }

        let replicas = replicas(ancestor.as_deref(), rjob.replicas);
        set.endpoints = endpoints(job_name, &set.name, replicas, count, &subdomain);
        pod_sets.push(set);
    }

    let template_json = serde_json::to_string(&template).map_err(|e| {
        vec![FieldError::invalid(
            "spec.runtimeRef",
            None,
            format!("the runtime template cannot be serialised: {e}"),
        )]
    })?;
    let ml_policy_json = match &ml_policy {
        Some(policy) => serde_json::to_string(policy),
        None => Ok("{}".to_string()),
    }
    .map_err(|e| {
        vec![FieldError::invalid(
            "spec.runtimeRef",
            None,
            format!("mlPolicy cannot be serialised: {e}"),
        )]
    })?;
    let pod_group_policy_json = pod_group_policy
        .as_ref()
        .map(serde_json::to_string)
        .transpose()
        .map_err(|e| {
            vec![FieldError::invalid(
                "spec.runtimeRef",
                None,
                format!("podGroupPolicy cannot be serialised: {e}"),
            )]
        })?;

    Ok(RuntimeInfo {
        labels,
        annotations,
        ml_policy: ml_policy_json,
        pod_group_policy: pod_group_policy_json,
        framework: runtime.framework().map(str::to_string),
        pod_sets,
        template: template_json,
    })
}

/// Recomputes every pod set's endpoints from its count, after a plugin
/// changed counts. Every phase that changes a count calls it, so that later
/// phases (the MPI hostfile) see the pods that will run.
pub fn refresh_endpoints(info: &mut RuntimeInfo, job: &TrainJob) -> Result<(), Failure> {
    let template: shape::Template = info.template_as()?;
    let job_name = job.metadata.name.as_deref().unwrap_or_default();
    let subdomain = template
        .network
        .and_then(|n| n.subdomain)
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| job_name.to_string());
    let rjobs = template.replicated_jobs.unwrap_or_default();
    for set in &mut info.pod_sets {
        let replicas = rjobs
            .iter()
            .find(|rjob| rjob.name == set.name)
            .map_or(1, |rjob| replicas(set.ancestor.as_deref(), rjob.replicas));
        set.endpoints = endpoints(job_name, &set.name, replicas, set.count, &subdomain);
    }
    Ok(())
}

/// The few fields of a JobSet spec that endpoints depend on. Parsing only
/// these (serde skips the rest without building it) keeps
/// [`refresh_endpoints`], which every ML plugin calls, cheap.
mod shape {
    use serde::Deserialize;

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub(super) struct Template {
        #[serde(default)]
        pub replicated_jobs: Option<Vec<ReplicatedJob>>,
        #[serde(default)]
        pub network: Option<Network>,
    }

    #[derive(Deserialize)]
    pub(super) struct ReplicatedJob {
        pub name: String,
        #[serde(default)]
        pub replicas: Option<i32>,
    }

    #[derive(Deserialize)]
    pub(super) struct Network {
        #[serde(default)]
        pub subdomain: Option<String>,
    }
}

/// Pod DNS names of a replicated job: `<job>-<replicatedJob>-<replica>-<pod>.<subdomain>`.
pub fn endpoints(
    job_name: &str,
    rjob: &str,
    replicas: u32,
    count: u32,
    subdomain: &str,
) -> Vec<String> {
    (0..replicas)
        .flat_map(|replica| {
            (0..count).map(move |pod| format!("{job_name}-{rjob}-{replica}-{pod}.{subdomain}"))
        })
        .collect()
}

/// The JobSet's labels and annotations: the runtime template's, then each
/// runtime patch's in order (a later patch wins). The runtime object's own
/// labels stay on the runtime.
fn jobset_metadata(job: &TrainJob, runtime: &Runtime) -> (Vec<KeyValue>, Vec<KeyValue>) {
    let template_meta = runtime.spec().template.metadata.as_ref();
    let mut labels = key_values(template_meta.and_then(|m| m.labels.as_ref()));
    let mut annotations = key_values(template_meta.and_then(|m| m.annotations.as_ref()));
    for patch in job.spec.runtime_patches.iter().flatten() {
        let Some(meta) = patch
            .training_runtime_spec
            .as_ref()
            .and_then(|s| s.template.as_ref())
            .and_then(|t| t.metadata.as_ref())
        else {
            continue;
        };
        for (key, value) in meta.labels.iter().flatten() {
            labels.upsert(key, value);
        }
        for (key, value) in meta.annotations.iter().flatten() {
            annotations.upsert(key, value);
        }
    }
    (labels, annotations)
}

/// The runtime's JobSet spec with the TrainJob's runtime patches merged in,
/// in list order, replicated jobs kept in the runtime's order.
pub fn patched_template(job: &TrainJob, runtime: &Runtime) -> Result<JobSetSpec, Vec<FieldError>> {
    let original = &runtime.spec().template.spec;
    let order: Vec<&str> = original
        .replicated_jobs
        .iter()
        .flatten()
        .map(|j| j.name.as_str())
        .collect();
    let invalid = |field: String, detail: String| vec![FieldError::invalid(field, None, detail)];

    let patches_template = job.spec.runtime_patches.iter().flatten().any(|patch| {
        patch
            .training_runtime_spec
            .as_ref()
            .and_then(|s| s.template.as_ref())
            .and_then(|t| t.spec.as_ref())
            .is_some()
    });
    if !patches_template {
        // Nothing to merge: the template as it is (what the JSON round trip
        // below would give back).
        return Ok(original.clone());
    }

    let mut errors = Vec::new();
    let mut merged = serde_json::to_value(original).map_err(|e| {
        invalid(
            "spec.runtimeRef".into(),
            format!("the runtime template cannot be serialised: {e}"),
        )
    })?;
    for (i, patch) in job.spec.runtime_patches.iter().flatten().enumerate() {
        let Some(spec) = patch
            .training_runtime_spec
            .as_ref()
            .and_then(|s| s.template.as_ref())
            .and_then(|t| t.spec.as_ref())
        else {
            continue;
        };
        let path =
            format!("spec.runtimePatches[{i}].trainingRuntimeSpec.template.spec.replicatedJobs");
        for (j, rjob) in spec.replicated_jobs.iter().flatten().enumerate() {
            if !order.contains(&rjob.name.as_str()) {
                errors.push(FieldError::invalid(
                    format!("{path}[{j}].name"),
                    Some(rjob.name.clone()),
                    "must not have replicated job that doesn't exist in the runtime job template",
                ));
            }
        }
        let patch = serde_json::to_value(spec).map_err(|e| {
            invalid(
                format!("spec.runtimePatches[{i}]"),
                format!("cannot be serialised: {e}"),
            )
        })?;
        merge::strategic_merge(&mut merged, &patch);
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let mut spec: JobSetSpec = serde_json::from_value(merged).map_err(|e| {
        invalid(
            "spec.runtimePatches".into(),
            format!("the patched runtime template is not a valid JobSet spec: {e}"),
        )
    })?;
    if let Some(jobs) = spec.replicated_jobs.as_mut() {
        jobs.sort_by_key(|j| order.iter().position(|name| *name == j.name));
    }
    Ok(spec)
}

fn trainer_count(job: &TrainJob, ml_policy: Option<&MlPolicy>, parallelism: Option<i32>) -> i32 {
    let requested = job.spec.trainer.as_ref().and_then(|t| t.num_nodes);
    match ml_policy {
        Some(policy) if policy.mpi.is_some() => policy.num_nodes.unwrap_or(1),
        Some(policy) => requested.or(policy.num_nodes).unwrap_or(1),
        None => requested.or(parallelism).unwrap_or(1),
    }
}

fn run_launcher_as_node(ml_policy: Option<&MlPolicy>) -> bool {
    ml_policy
        .and_then(|p| p.mpi.as_ref())
        .and_then(|mpi| mpi.run_launcher_as_node)
        .unwrap_or(false)
}

/// Replicas of a replicated job: 1 for the TrainJob's steps, as the JobSet
/// builder sets them; the template's otherwise (default 1).
fn replicas(ancestor: Option<&str>, template: Option<i32>) -> u32 {
    if ancestor.is_some() {
        return 1;
    }
    u32::try_from(template.unwrap_or(constants::DEFAULT_JOB_REPLICAS)).unwrap_or(0)
}

fn subdomain(template: &JobSetSpec, job_name: &str) -> String {
    template
        .network
        .as_ref()
        .and_then(|n| n.subdomain.as_deref())
        .filter(|s| !s.is_empty())
        .unwrap_or(job_name)
        .to_string()
}

/// The TrainJob's `trainer` on the `node` container: image, command and args
/// on the trainer step; `resourcesPerNode` merged key by key where
/// `with_resources`.
///
/// `trainer.env` is not applied here: as upstream, the ML plugin decides
/// where it goes among the env it injects (torch and plainml merge it before
/// their own), and the JobSet builder upserts it last.
fn apply_trainer(job: &TrainJob, node: &mut Container, is_trainer: bool, with_resources: bool) {
    let Some(trainer) = job.spec.trainer.as_ref() else {
        return;
    };
    if is_trainer {
        if trainer.image.is_some() {
            node.image.clone_from(&trainer.image);
        }
        if trainer.command.is_some() {
            node.command.clone_from(&trainer.command);
        }
        if trainer.args.is_some() {
            node.args.clone_from(&trainer.args);
        }
    }
    if with_resources && let Some(resources) = &trainer.resources_per_node {
        merge_quantities(&mut node.requests, resources.requests.as_ref());
        merge_quantities(&mut node.limits, resources.limits.as_ref());
    }
}

/// An initializer's storage URI, env and secret on its container.
fn apply_initializer(source: &AssetInitializer, container: &mut Container) {
    if let Some(uri) = &source.storage_uri {
        container.upsert_env(constants::ENV_STORAGE_URI, uri.clone());
    }
    for var in source.env.iter().flatten() {
        container.upsert_env_var(env_record(var));
    }
    if let Some(secret) = &source.secret_ref {
        let env_from = core::EnvFromSource {
            secret_ref: Some(core::SecretEnvSource {
                name: secret.name.clone(),
                optional: None,
            }),
            ..Default::default()
        };
        if let Ok(json) = serde_json::to_string(&env_from) {
            container.env_from.push(json);
        }
    }
}

fn merge_quantities(list: &mut Vec<Quantity>, over: Option<&BTreeMap<String, K8sQuantity>>) {
    for (name, value) in over.into_iter().flatten() {
        match list.iter_mut().find(|q| q.name == *name) {
            Some(existing) => existing.value.clone_from(&value.0),
            None => list.push(Quantity {
                name: name.clone(),
                value: value.0.clone(),
            }),
        }
    }
}

fn key_values(map: Option<&BTreeMap<String, String>>) -> Vec<KeyValue> {
    map.into_iter()
        .flatten()
        .map(|(key, value)| KeyValue {
            key: key.clone(),
            value: value.clone(),
        })
        .collect()
}
