//! The JobSet plugin: validates a TrainJob against its runtime's template,
//! builds the JobSet the TrainJob runs as, and maps the JobSet's status back
//! to the TrainJob.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use trainhub_plugin_sdk::api::jobset::{JobSet as JobSetObject, JobSetSpec, ReplicatedJobStatus};
use trainhub_plugin_sdk::api::trainer::JobStatus;
use trainhub_plugin_sdk::info;
use trainhub_plugin_sdk::prelude::*;

use crate::common::{job_name, ml_policy, owned_metadata, to_json, upsert_trainer_env};

/// The JobSet plugin. It applies to every TrainJob.
#[derive(Default)]
pub struct JobSet;

/// The volume and mount name an initializer writes its output to.
const INITIALIZER_VOLUME: &str = "initializer";

impl Plugin for JobSet {
    fn describe(&self) -> Descriptor {
        Descriptor::new("jobset", env!("CARGO_PKG_VERSION"))
            .validates()
            .builds()
            .maps_status()
    }

    fn validate(&self, _: &Ctx, job: &TrainJob, runtime: &Runtime) -> Validation {
        let mut validation = Validation::default();
        for (i, patch) in job.spec.runtime_patches.iter().flatten().enumerate() {
            if let Err(detail) = check_domain_prefixed_path(&patch.manager) {
                validation.error(FieldError::invalid(
                    format!("spec.runtimePatches[{i}].manager"),
                    Some(patch.manager.clone()),
                    detail,
                ));
            }
        }
        let info = match info::new_runtime_info(job, runtime) {
            Ok(info) => info,
            Err(errors) => {
                validation.errors.extend(errors);
                return validation;
            }
        };
        validate_initializers(job, &info, &mut validation);
        validate_trainer(job, &info, &mut validation);
        validate_patches(job, runtime, &mut validation);
        validation
    }

    fn build(
        &self,
        _: &Ctx,
        info: &RuntimeInfo,
        job: &TrainJob,
        _: &Target,
    ) -> Result<Vec<Value>, Failure> {
        let jobset = build_jobset(info, job)?;
        Ok(vec![to_json("JobSet", &jobset)?])
    }

    fn status(
        &self,
        _: &Ctx,
        job: &TrainJob,
        observed: &JobSetStatus,
    ) -> Result<Option<TrainJobStatus>, Failure> {
        let current = job.status.clone().unwrap_or_default();
        let status = map_status(job, observed);
        Ok((status != current).then_some(status))
    }
}

/// The JobSet for the TrainJob: the runtime template after its patches, with
/// every pod set written back onto its replicated job.
pub fn build_jobset(info: &RuntimeInfo, job: &TrainJob) -> Result<JobSetObject, Failure> {
    let mut spec: JobSetSpec = info.template_as()?;
    let launcher_as_node = ml_policy(info)?
        .mpi
        .is_some_and(|mpi| mpi.run_launcher_as_node == Some(true));
    for rjob in spec.replicated_jobs.iter_mut().flatten() {
        let Some(set) = info.pod_set(&rjob.name) else {
            continue;
        };
        let count = i32::try_from(set.count).map_err(|_| {
            Failure::new(format!("job {}: {} pods is too many", set.name, set.count))
        })?;
        // The TrainJob's steps run one Job each; other jobs keep their
        // replicas, stated explicitly.
        if set.ancestor.is_some() || rjob.replicas.is_none() {
            rjob.replicas = Some(constants::DEFAULT_JOB_REPLICAS);
        }
        let job_spec = rjob.template.spec.get_or_insert_with(Default::default);
        job_spec.parallelism = Some(count);
        job_spec.completions = Some(count);
        let pod = &mut job_spec.template;
        let pod_spec = pod.spec.get_or_insert_with(Default::default);
        sync_containers(
            &with_trainer_env(set, job, launcher_as_node),
            &mut pod_spec.containers,
        )?;
        let mut init = pod_spec.init_containers.take().unwrap_or_default();
        sync_containers(&set.init_containers, &mut init)?;
        pod_spec.init_containers = (!init.is_empty()).then_some(init);
        let mut volumes = pod_spec.volumes.take().unwrap_or_default();
        for record in &set.volumes {
            let volume = info::volume(record)?;
            match volumes.iter_mut().find(|v| v.name == volume.name) {
                Some(existing) => *existing = volume,
                None => volumes.push(volume),
            }
        }
        pod_spec.volumes = (!volumes.is_empty()).then_some(volumes);
        let metadata = pod.metadata.get_or_insert_with(Default::default);
        merge_map(&mut metadata.labels, &set.pod_labels);
        merge_map(&mut metadata.annotations, &set.pod_annotations);
        if *metadata == ObjectMeta::default() {
            pod.metadata = None;
        }
    }
    spec.suspend = job.spec.suspend;

    let mut metadata = owned_metadata(job, job_name(job).to_string());
    merge_map(&mut metadata.labels, &info.labels);
    merge_map(&mut metadata.annotations, &info.annotations);
    Ok(JobSetObject {
        metadata,
        spec,
        status: None,
    })
}

/// The pod set's containers with `spec.trainer.env` upserted last on the
/// `node` container of the trainer step (and of the `node` job when the MPI
/// launcher runs as a node), as upstream's JobSet builder applies it: the
/// TrainJob's entries win over what the ML plugin injected, in place, and
/// its new names come last.
fn with_trainer_env(set: &PodSet, job: &TrainJob, launcher_as_node: bool) -> Vec<Container> {
    let mut containers = set.containers.clone();
    let takes_env = set.ancestor.as_deref() == Some(constants::ANCESTOR_TRAINER)
        || (launcher_as_node && set.name == constants::NODE);
    if takes_env && let Some(node) = containers.iter_mut().find(|c| c.name == constants::NODE) {
        upsert_trainer_env(node, job);
    }
    containers
}

/// Each record onto the container of its name, or appended when new.
fn sync_containers(
    records: &[Container],
    containers: &mut Vec<core::Container>,
) -> Result<(), Failure> {
    for record in records {
        match containers.iter_mut().find(|c| c.name == record.name) {
            Some(existing) => info::apply_container(record, existing)?,
            None => containers.push(info::new_container(record)?),
        }
    }
    Ok(())
}

fn merge_map(map: &mut Option<BTreeMap<String, String>>, entries: &[KeyValue]) {
    if entries.is_empty() {
        return;
    }
    let map = map.get_or_insert_with(BTreeMap::new);
    for kv in entries {
        map.insert(kv.key.clone(), kv.value.clone());
    }
}

fn containers_of(set: &PodSet) -> impl Iterator<Item = &Container> {
    set.init_containers.iter().chain(set.containers.iter())
}

/// An initializer set on the TrainJob needs its job, its container and the
/// `initializer` volume mount the trainer reads the output from.
fn validate_initializers(job: &TrainJob, info: &RuntimeInfo, validation: &mut Validation) {
    let Some(initializer) = job.spec.initializer.as_ref() else {
        return;
    };
    for (step, set_on_job, what) in [
        (
            constants::DATASET_INITIALIZER,
            initializer.dataset.is_some(),
            "datasetConfig",
        ),
        (
            constants::MODEL_INITIALIZER,
            initializer.model.is_some(),
            "modelConfig",
        ),
    ] {
        if !set_on_job {
            continue;
        }
        let runtime_ref = Some(job.spec.runtime_ref.name.clone());
        let detail = match info.pod_set(step) {
            None => format!("must have {step} job when trainJob is configured with input {what}"),
            Some(set) => match containers_of(set).find(|c| c.name == step) {
                None => format!("must have container with name - {step} in the {step} job"),
                Some(container)
                    if !container
                        .volume_mounts
                        .iter()
                        .any(|m| m.name == INITIALIZER_VOLUME) =>
                {
                    // Upstream refuses this since kubeflow/trainer#3714; its
                    // own examples predate the rule, so it warns here.
                    validation.warn(format!(
                        "spec.runtimeRef: {:?} must have volumeMount with name - {INITIALIZER_VOLUME} in container {step} of the {step} job (kubeflow/trainer refuses this TrainJob since #3714)",
                        job.spec.runtime_ref.name
                    ));
                    continue;
                }
                Some(_) => continue,
            },
        };
        validation.error(FieldError::invalid("spec.runtimeRef", runtime_ref, detail));
    }
}

/// The trainer's overrides need a `node` container in the trainer step.
/// Upstream does not check this and silently drops the overrides; trainhub
/// refuses the TrainJob instead (docs/plugins-upstream.md).
fn validate_trainer(job: &TrainJob, info: &RuntimeInfo, validation: &mut Validation) {
    if job.spec.trainer.is_none() {
        return;
    }
    let runtime_ref = Some(job.spec.runtime_ref.name.clone());
    match info.trainer() {
        Err(_) => validation.error(FieldError::invalid(
            "spec.runtimeRef",
            runtime_ref,
            format!(
                "must have a replicated job labelled {}={} to run spec.trainer",
                constants::LABEL_TRAINJOB_ANCESTOR,
                constants::ANCESTOR_TRAINER,
            ),
        )),
        Ok(set) if set.container(constants::NODE).is_none() => {
            validation.error(FieldError::invalid(
                "spec.runtimeRef",
                runtime_ref,
                format!(
                    "must have container with name - {} in the {} job",
                    constants::NODE,
                    set.name
                ),
            ))
        }
        Ok(_) => {}
    }
}

/// Runtime patches may only name containers the runtime's own template has
/// (a patch cannot add one), and may not set env on the containers whose env
/// the TrainJob owns.
fn validate_patches(job: &TrainJob, runtime: &Runtime, validation: &mut Validation) {
    for (i, patch) in job.spec.runtime_patches.iter().flatten().enumerate() {
        let Some(spec) = patch
            .training_runtime_spec
            .as_ref()
            .and_then(|s| s.template.as_ref())
            .and_then(|t| t.spec.as_ref())
        else {
            continue;
        };
        for (j, rjob) in spec.replicated_jobs.iter().flatten().enumerate() {
            let Some(runtime_pod) = runtime
                .spec()
                .template
                .spec
                .replicated_job(&rjob.name)
                .and_then(|j| j.template.spec.as_ref())
                .and_then(|s| s.template.spec.as_ref())
            else {
                continue;
            };
            let Some(pod_spec) = rjob
                .template
                .as_ref()
                .and_then(|t| t.spec.as_ref())
                .and_then(|s| s.template.as_ref())
                .and_then(|t| t.spec.as_ref())
            else {
                continue;
            };
            let path = format!(
                "spec.runtimePatches[{i}].trainingRuntimeSpec.template.spec.replicatedJobs[{j}].template.spec.template.spec"
            );
            let known = |name: &str| {
                runtime_pod
                    .init_containers
                    .iter()
                    .flatten()
                    .chain(runtime_pod.containers.iter())
                    .any(|c| c.name == name)
            };
            for (list, containers, kind) in [
                (
                    "initContainers",
                    pod_spec.init_containers.as_ref(),
                    "initContainer",
                ),
                ("containers", pod_spec.containers.as_ref(), "container"),
            ] {
                for (k, container) in containers.into_iter().flatten().enumerate() {
                    if !known(&container.name) {
                        validation.error(FieldError::invalid(
                            format!("{path}.{list}[{k}].name"),
                            Some(container.name.clone()),
                            format!(
                                "must not have {kind} that doesn't exist in the runtime job {}",
                                rjob.name
                            ),
                        ));
                    } else if list == "containers"
                        && container.env.as_ref().is_some_and(|env| !env.is_empty())
                        && [
                            constants::DATASET_INITIALIZER,
                            constants::MODEL_INITIALIZER,
                            constants::NODE,
                        ]
                        .contains(&container.name.as_str())
                    {
                        validation.error(FieldError::invalid(
                            format!("{path}.{list}[{k}].env"),
                            None,
                            format!(
                                "must not have envs for the {}, {}, {} containers",
                                constants::DATASET_INITIALIZER,
                                constants::MODEL_INITIALIZER,
                                constants::NODE
                            ),
                        ));
                    }
                }
            }
        }
    }
}

/// Kubernetes' domain-prefixed path, `example.io/platform-team`: a DNS-1123
/// subdomain, a slash, and a non-empty path of URL-safe characters.
fn check_domain_prefixed_path(value: &str) -> Result<(), String> {
    let Some((host, path)) = value.split_once('/') else {
        return Err("must be a domain-prefixed path (such as \"acme.io/foo\")".to_string());
    };
    if host.is_empty() || path.is_empty() {
        return Err("must be a domain-prefixed path (such as \"acme.io/foo\")".to_string());
    }
    let label_ok = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    if host.len() > 253 || !host.split('.').all(label_ok) {
        return Err(format!("{host:?} must be a lowercase RFC 1123 subdomain"));
    }
    let path_ok = path
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "/-._~%!$&'()*+,;=:".contains(c));
    if !path_ok {
        return Err(format!("{path:?} must be a valid path"));
    }
    Ok(())
}

/// The TrainJob status for an observed JobSet status, as upstream's
/// controller writes it:
///
/// - `Suspended` True ("TrainJob is suspended") while `spec.suspend` is
///   true, False ("TrainJob is resumed") once it no longer is;
/// - the JobSet's `Completed` and `Failed` conditions, when True, as
///   `Complete` and `Failed` (reason and message as the JobSet gives them);
/// - a `Failed` condition with reason `DeadlineExceeded`, which the host sets
///   when `activeDeadlineSeconds` passes, is kept;
/// - `jobsStatus` from the JobSet's replicated jobs.
///
/// Conditions of other types stay as they are, and a condition's
/// `lastTransitionTime` changes only when its status flips. A plugin has no
/// clock: a flip takes the time of the JobSet condition it mirrors, or, for
/// `Suspended`, of the JobSet's own `Suspended` condition, else the latest
/// time the JobSet status carries, else the TrainJob's creation.
pub fn map_status(job: &TrainJob, observed: &JobSetStatus) -> TrainJobStatus {
    let mut status = job.status.clone().unwrap_or_default();
    let mut conditions = status.conditions.take().unwrap_or_default();
    let deadline = conditions
        .iter()
        .find(|c| {
            c.type_ == constants::CONDITION_FAILED
                && c.reason == constants::REASON_DEADLINE_EXCEEDED
        })
        .cloned();
    let now = observed_time(job, observed);

    let suspended_now = job.spec.suspend.unwrap_or(false);
    let was_suspended = conditions
        .iter()
        .any(|c| c.type_ == constants::CONDITION_SUSPENDED && c.status == "True");
    if suspended_now || was_suspended {
        let (status, reason, message) = if suspended_now {
            (
                "True",
                constants::REASON_SUSPENDED,
                constants::MESSAGE_SUSPENDED,
            )
        } else {
            (
                "False",
                constants::REASON_RESUMED,
                constants::MESSAGE_RESUMED,
            )
        };
        let time = observed
            .condition(constants::JOBSET_CONDITION_SUSPENDED)
            .map_or_else(|| now.clone(), |c| c.last_transition_time.clone());
        set_condition(
            &mut conditions,
            Condition {
                type_: constants::CONDITION_SUSPENDED.to_string(),
                status: status.to_string(),
                reason: reason.to_string(),
                message: message.to_string(),
                last_transition_time: time,
                observed_generation: None,
            },
        );
    }

    for (jobset_type, trainjob_type) in [
        (
            constants::JOBSET_CONDITION_COMPLETED,
            constants::CONDITION_COMPLETE,
        ),
        (
            constants::JOBSET_CONDITION_FAILED,
            constants::CONDITION_FAILED,
        ),
    ] {
        if let Some(condition) = observed.condition(jobset_type)
            && condition.status == "True"
        {
            let mut mapped = condition.clone();
            mapped.type_ = trainjob_type.to_string();
            set_condition(&mut conditions, mapped);
        }
    }
    if let Some(deadline) = deadline {
        set_condition(&mut conditions, deadline);
    }

    status.conditions = (!conditions.is_empty()).then_some(conditions);
    status.jobs_status = observed
        .replicated_jobs_status
        .as_ref()
        .filter(|jobs| !jobs.is_empty())
        .map(|jobs| jobs.iter().map(job_status).collect());
    status
}

fn job_status(job: &ReplicatedJobStatus) -> JobStatus {
    JobStatus {
        name: job.name.clone(),
        ready: job.ready,
        succeeded: job.succeeded,
        failed: job.failed,
        active: job.active,
        suspended: job.suspended,
    }
}

/// Adds or updates the condition of `new`'s type, as Kubernetes'
/// `meta.SetStatusCondition` does: its transition time moves only when its
/// status changes.
fn set_condition(conditions: &mut Vec<Condition>, new: Condition) {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        None => conditions.push(new),
        Some(existing) => {
            if existing.status != new.status {
                existing.status = new.status;
                existing.last_transition_time = new.last_transition_time;
            }
            existing.reason = new.reason;
            existing.message = new.message;
            existing.observed_generation = new.observed_generation;
        }
    }
}

/// The best stand-in for "now" the observed status offers.
fn observed_time(job: &TrainJob, observed: &JobSetStatus) -> Time {
    observed
        .conditions
        .iter()
        .flatten()
        .map(|c| &c.last_transition_time)
        .max_by_key(|t| t.0)
        .cloned()
        .or_else(|| job.metadata.creation_timestamp.clone())
        .unwrap_or(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH))
}
