//! The JobSet controller: one Job per replicated Job replica (after its
//! `dependsOn` is reached), replicatedJobsStatus, success and failure
//! policies with restarts, suspend and resume.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use kube::{Resource, ResourceExt};
use serde_json::json;
use sha1::{Digest, Sha1};
use trainhub_api::constants::{
    JOBSET_CONDITION_COMPLETED, JOBSET_CONDITION_FAILED, JOBSET_CONDITION_SUSPENDED,
    LABEL_GLOBAL_REPLICAS, LABEL_JOB_GLOBAL_INDEX, LABEL_JOB_INDEX, LABEL_JOB_KEY,
    LABEL_JOBSET_NAME, LABEL_REPLICATED_JOB_NAME, LABEL_REPLICATED_JOB_REPLICAS,
};
use trainhub_api::jobset::{
    DependsOnStatus, JobSet, JobSetSpec, ReplicatedJob, ReplicatedJobStatus, SuccessPolicyOperator,
};

use super::{Cluster, Snapshot, controller_ref, now, owned_by};

/// Label (and annotation) on Jobs and Pods: the JobSet restart they belong to.
pub const LABEL_RESTART_ATTEMPT: &str = "jobset.sigs.k8s.io/restart-attempt";

/// Condition reasons and messages, as the JobSet controller spells them.
pub const REASON_ALL_JOBS_COMPLETED: &str = "AllJobsCompleted";
pub const MESSAGE_ALL_JOBS_COMPLETED: &str = "jobset completed successfully";
pub const REASON_FAILED_JOBS: &str = "FailedJobs";
pub const MESSAGE_FAILED_JOBS: &str = "jobset failed due to one or more job failures";
pub const REASON_REACHED_MAX_RESTARTS: &str = "ReachedMaxRestarts";
pub const MESSAGE_REACHED_MAX_RESTARTS: &str =
    "jobset failed due to reaching max number of restarts";
pub const REASON_SUSPENDED: &str = "SuspendedJobs";
pub const MESSAGE_SUSPENDED: &str = "jobset is suspended";
pub const REASON_RESUMED: &str = "ResumeJobs";
pub const MESSAGE_RESUMED: &str = "jobset is resumed";

pub(super) async fn reconcile(c: &Cluster, s: &Snapshot) {
    for js in &s.jobsets {
        if js.meta().deletion_timestamp.is_some() {
            continue;
        }
        let jobs: Vec<&Job> = s.jobs.iter().filter(|j| owned_by(*j, js)).collect();
        reconcile_one(c, js, &jobs).await;
    }
    if c.config.collect_orphans {
        let uids: BTreeSet<&str> = s
            .jobsets
            .iter()
            .filter_map(|js| js.meta().uid.as_deref())
            .collect();
        for job in &s.jobs {
            let refs = job.owner_references();
            let owner_gone = refs
                .iter()
                .any(|r| r.kind == "JobSet" && !uids.contains(r.uid.as_str()));
            if owner_gone {
                c.delete(job).await;
            }
        }
    }
}

fn restart_attempt(job: &Job) -> Option<i32> {
    job.labels().get(LABEL_RESTART_ATTEMPT)?.parse().ok()
}

fn condition(job: &Job, type_: &str) -> bool {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == type_ && c.status == "True"))
}

/// Whether a Job finished: `Complete` or `Failed`.
pub(super) fn job_finished(job: &Job) -> Option<bool> {
    if condition(job, "Complete") {
        Some(true)
    } else if condition(job, "Failed") {
        Some(false)
    } else {
        None
    }
}

fn has_condition(js: &JobSet, type_: &str) -> bool {
    js.status
        .as_ref()
        .and_then(|s| s.condition(type_))
        .is_some_and(|c| c.status == "True")
}

async fn reconcile_one(c: &Cluster, js: &JobSet, jobs: &[&Job]) {
    let status = js.status.clone().unwrap_or_default();
    let restarts = status.restarts.unwrap_or(0);
    let (current, previous): (Vec<&Job>, Vec<&Job>) = jobs
        .iter()
        .partition(|j| restart_attempt(j).unwrap_or(0) == restarts);
    for job in previous {
        c.delete(job).await;
    }
    let finished = status.terminal_state.is_some()
        || has_condition(js, JOBSET_CONDITION_COMPLETED)
        || has_condition(js, JOBSET_CONDITION_FAILED);
    if finished {
        // A finished JobSet keeps its finished Jobs and deletes the active ones.
        for job in current.iter().filter(|j| job_finished(j).is_none()) {
            c.delete(*job).await;
        }
        return;
    }
    let spec = &js.spec;
    let rjobs_status = replicated_jobs_status(spec, &current);
    let mut conditions = status.conditions.clone().unwrap_or_default();
    let mut patch = json!({"replicatedJobsStatus": rjobs_status});

    if current.iter().any(|j| job_finished(j) == Some(false)) {
        let towards_max = status.restarts_count_towards_max.unwrap_or(0);
        match &spec.failure_policy {
            Some(policy) if towards_max < policy.max_restarts.unwrap_or(0) => {
                patch["restarts"] = (restarts + 1).into();
                patch["restartsCountTowardsMax"] = (towards_max + 1).into();
            }
            policy => {
                let (reason, message) = if policy.is_some() {
                    (REASON_REACHED_MAX_RESTARTS, MESSAGE_REACHED_MAX_RESTARTS)
                } else {
                    (REASON_FAILED_JOBS, MESSAGE_FAILED_JOBS)
                };
                set_condition(
                    &mut conditions,
                    JOBSET_CONDITION_FAILED,
                    "True",
                    reason,
                    message,
                );
                patch["terminalState"] = JOBSET_CONDITION_FAILED.into();
            }
        }
    } else if success_policy_met(spec, &current) {
        set_condition(
            &mut conditions,
            JOBSET_CONDITION_COMPLETED,
            "True",
            REASON_ALL_JOBS_COMPLETED,
            MESSAGE_ALL_JOBS_COMPLETED,
        );
        patch["terminalState"] = JOBSET_CONDITION_COMPLETED.into();
    } else {
        let suspended = spec.suspend == Some(true);
        for job in &current {
            let job_suspended = job.spec.as_ref().and_then(|s| s.suspend) == Some(true);
            if job_suspended != suspended && job_finished(job).is_none() {
                c.patch(*job, json!({"spec": {"suspend": suspended}})).await;
            }
        }
        if suspended {
            set_condition(
                &mut conditions,
                JOBSET_CONDITION_SUSPENDED,
                "True",
                REASON_SUSPENDED,
                MESSAGE_SUSPENDED,
            );
        } else if has_condition(js, JOBSET_CONDITION_SUSPENDED) {
            set_condition(
                &mut conditions,
                JOBSET_CONDITION_SUSPENDED,
                "False",
                REASON_RESUMED,
                MESSAGE_RESUMED,
            );
        }
        let existing: BTreeSet<String> = current.iter().map(|j| j.name_any()).collect();
        for job in jobs_to_create(js, &rjobs_status, &existing, restarts) {
            c.create(&js.namespace().unwrap_or_default(), &job).await;
        }
    }
    if conditions != status.conditions.clone().unwrap_or_default() {
        patch["conditions"] = json!(conditions);
    }
    let unchanged = Some(&rjobs_status) == status.replicated_jobs_status.as_ref()
        && patch.as_object().is_some_and(|p| p.len() == 1);
    if !unchanged {
        c.patch_status(js, patch).await;
    }
}

/// Sets (or adds) the condition `type_`, moving its transition time only
/// when its status changes.
fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
) {
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) if c.status == status && c.reason == reason => {}
        Some(c) => {
            if c.status != status {
                c.last_transition_time = now();
            }
            c.status = status.into();
            c.reason = reason.into();
            c.message = message.into();
        }
        None => conditions.push(Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: now(),
            observed_generation: None,
        }),
    }
}

/// The counts of Jobs per replicated Job, as the JobSet controller computes
/// them: ready (succeeded plus ready pods reach the Job's pod count), active
/// (some pod active), suspended, succeeded, failed.
pub fn replicated_jobs_status(spec: &JobSetSpec, jobs: &[&Job]) -> Vec<ReplicatedJobStatus> {
    let mut by_name: BTreeMap<&str, ReplicatedJobStatus> = BTreeMap::new();
    for rjob in spec.replicated_jobs.iter().flatten() {
        by_name.insert(
            &rjob.name,
            ReplicatedJobStatus {
                name: rjob.name.clone(),
                ..ReplicatedJobStatus::default()
            },
        );
    }
    for job in jobs {
        let Some(counts) = job
            .labels()
            .get(LABEL_REPLICATED_JOB_NAME)
            .and_then(|n| by_name.get_mut(n.as_str()))
        else {
            continue;
        };
        let js = job.status.clone().unwrap_or_default();
        match job_finished(job) {
            Some(true) => counts.succeeded += 1,
            Some(false) => counts.failed += 1,
            None => {
                let spec = job.spec.clone().unwrap_or_default();
                let parallelism = spec.parallelism.unwrap_or(1);
                let pods = spec.completions.map_or(parallelism, |c| c.min(parallelism));
                if js.succeeded.unwrap_or(0) + js.ready.unwrap_or(0) >= pods {
                    counts.ready += 1;
                }
                if js.active.unwrap_or(0) > 0 {
                    counts.active += 1;
                }
                if spec.suspend == Some(true) {
                    counts.suspended += 1;
                }
            }
        }
    }
    spec.replicated_jobs
        .iter()
        .flatten()
        .filter_map(|r| by_name.remove(r.name.as_str()))
        .collect()
}

/// Whether the success policy is met: All (default) needs every Job of the
/// target replicated Jobs (all when none is named) complete, Any needs one.
pub fn success_policy_met(spec: &JobSetSpec, jobs: &[&Job]) -> bool {
    let (operator, targets) = match &spec.success_policy {
        Some(p) => (
            p.operator,
            p.target_replicated_jobs.clone().unwrap_or_default(),
        ),
        None => (SuccessPolicyOperator::All, Vec::new()),
    };
    let targeted = |name: &str| targets.is_empty() || targets.iter().any(|t| t == name);
    let succeeded = jobs
        .iter()
        .filter(|j| job_finished(j) == Some(true))
        .filter(|j| {
            j.labels()
                .get(LABEL_REPLICATED_JOB_NAME)
                .is_some_and(|n| targeted(n))
        })
        .count();
    let expected: i32 = match operator {
        SuccessPolicyOperator::Any => 1,
        SuccessPolicyOperator::All => spec
            .replicated_jobs
            .iter()
            .flatten()
            .filter(|r| targeted(&r.name))
            .map(ReplicatedJob::replicas_or_default)
            .sum(),
    };
    expected > 0 && succeeded >= usize::try_from(expected).unwrap_or(usize::MAX)
}

/// Whether the replicated Jobs `rjob` depends on reached the status it waits for.
pub fn dependencies_reached(
    spec: &JobSetSpec,
    rjob: &ReplicatedJob,
    status: &[ReplicatedJobStatus],
) -> bool {
    rjob.depends_on.iter().flatten().all(|dep| {
        let Some(actual) = status.iter().find(|s| s.name == dep.name) else {
            return false;
        };
        let replicas = spec
            .replicated_job(&dep.name)
            .map_or(1, ReplicatedJob::replicas_or_default);
        match dep.status {
            DependsOnStatus::Complete => actual.succeeded == replicas,
            DependsOnStatus::Ready => actual.failed + actual.ready + actual.succeeded == replicas,
        }
    })
}

/// The Jobs of the current attempt that do not exist yet and may start.
fn jobs_to_create(
    js: &JobSet,
    status: &[ReplicatedJobStatus],
    existing: &BTreeSet<String>,
    restarts: i32,
) -> Vec<Job> {
    let spec = &js.spec;
    let global_replicas: i32 = spec
        .replicated_jobs
        .iter()
        .flatten()
        .map(ReplicatedJob::replicas_or_default)
        .sum();
    let mut global_index = 0;
    let mut jobs = Vec::new();
    for rjob in spec.replicated_jobs.iter().flatten() {
        let replicas = rjob.replicas_or_default();
        let ready = dependencies_reached(spec, rjob, status);
        for index in 0..replicas {
            let name = format!("{}-{}-{index}", js.name_any(), rjob.name);
            if ready && !existing.contains(&name) {
                let ids = JobIds {
                    index,
                    global_index: global_index + index,
                    global_replicas,
                    restarts,
                };
                jobs.push(build_job(js, rjob, &name, &ids));
            }
        }
        global_index += replicas;
    }
    jobs
}

struct JobIds {
    index: i32,
    global_index: i32,
    global_replicas: i32,
    restarts: i32,
}

/// The Job the JobSet controller builds for one replica of `rjob`.
fn build_job(js: &JobSet, rjob: &ReplicatedJob, name: &str, ids: &JobIds) -> Job {
    let namespace = js.namespace().unwrap_or_default();
    // As the JobSet controller names it: the SHA-1 of `namespace/name`,
    // 40 hex digits (a label value is at most 63).
    let key = hex::encode(Sha1::digest(format!("{namespace}/{name}")));
    let ours: BTreeMap<String, String> = [
        (LABEL_JOBSET_NAME, js.name_any()),
        (LABEL_REPLICATED_JOB_NAME, rjob.name.clone()),
        (
            LABEL_REPLICATED_JOB_REPLICAS,
            rjob.replicas_or_default().to_string(),
        ),
        (LABEL_JOB_INDEX, ids.index.to_string()),
        (LABEL_JOB_GLOBAL_INDEX, ids.global_index.to_string()),
        (LABEL_GLOBAL_REPLICAS, ids.global_replicas.to_string()),
        (LABEL_RESTART_ATTEMPT, ids.restarts.to_string()),
        (LABEL_JOB_KEY, key),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let template = &rjob.template;
    let mut spec = template.spec.clone().unwrap_or_default();
    spec.suspend = Some(js.spec.suspend == Some(true));
    let pod_meta = spec
        .template
        .metadata
        .get_or_insert_with(ObjectMeta::default);
    pod_meta.labels.get_or_insert_default().extend(ours.clone());
    pod_meta
        .annotations
        .get_or_insert_default()
        .extend(ours.clone());
    let network = js.spec.network.clone().unwrap_or_default();
    if network.enable_dns_hostnames != Some(false)
        && let Some(pod_spec) = spec.template.spec.as_mut()
    {
        pod_spec.subdomain = Some(network.subdomain.unwrap_or_else(|| js.name_any()));
    }
    let meta = template.metadata.clone().unwrap_or_default();
    let mut labels = meta.labels.unwrap_or_default();
    labels.extend(ours.clone());
    let mut annotations = meta.annotations.unwrap_or_default();
    annotations.extend(ours);
    Job {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![controller_ref(js)]),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn spec(value: Value) -> JobSetSpec {
        serde_json::from_value(value).unwrap_or_default()
    }

    fn job(rjob: &str, condition: Option<&str>, active: i32, ready: i32) -> Job {
        let conditions: Vec<Value> = condition
            .map(|c| vec![json!({"type": c, "status": "True"})])
            .unwrap_or_default();
        serde_json::from_value(json!({
            "metadata": {"labels": {LABEL_REPLICATED_JOB_NAME: rjob}},
            "spec": {"parallelism": 1, "completions": 1, "template": {}},
            "status": {"active": active, "ready": ready, "conditions": conditions},
        }))
        .unwrap_or_default()
    }

    #[test]
    fn counts_and_policies_follow_the_jobset_controller() {
        let s = spec(json!({"replicatedJobs": [
            {"name": "init", "replicas": 1, "template": {}},
            {"name": "node", "replicas": 2, "template": {},
             "dependsOn": [{"name": "init", "status": "Complete"}]},
        ]}));
        let init_running = job("init", None, 1, 1);
        let status = replicated_jobs_status(&s, &[&init_running]);
        assert_eq!((status[0].active, status[0].ready), (1, 1));
        let node = s
            .replicated_job("node")
            .cloned()
            .unwrap_or_else(|| panic!("node is a replicated job"));
        assert!(!dependencies_reached(&s, &node, &status));

        let init_done = job("init", Some("Complete"), 0, 0);
        let status = replicated_jobs_status(&s, &[&init_done]);
        assert_eq!(status[0].succeeded, 1);
        assert!(dependencies_reached(&s, &node, &status));

        let n0 = job("node", Some("Complete"), 0, 0);
        let n1 = job("node", None, 1, 0);
        assert!(!success_policy_met(&s, &[&init_done, &n0, &n1]));
        let n1 = job("node", Some("Complete"), 0, 0);
        assert!(success_policy_met(&s, &[&init_done, &n0, &n1]));

        let any = spec(json!({
            "replicatedJobs": [{"name": "node", "replicas": 2, "template": {}}],
            "successPolicy": {"operator": "Any", "targetReplicatedJobs": ["node"]},
        }));
        assert!(success_policy_met(&any, &[&n0]));
    }
}
