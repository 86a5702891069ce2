//! The Job controller: pods for each Job (Indexed or NonIndexed, up to
//! `parallelism`), retries up to `backoffLimit`, the Job's status and its
//! `Complete` / `Failed` conditions, suspension.

use std::collections::BTreeSet;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource, ResourceExt};
use serde_json::json;
use trainhub_api::constants::{JOB_COMPLETION_INDEX, JOB_COMPLETION_INDEX_FIELD_PATH};

use super::jobset::job_finished;
use super::{Cluster, Snapshot, controller_ref, now, owned_by};

/// Labels the Job controller puts on its pods.
pub const LABEL_JOB_NAME: &str = "batch.kubernetes.io/job-name";
pub const LABEL_CONTROLLER_UID: &str = "batch.kubernetes.io/controller-uid";
/// The env var with the completion index of an Indexed Job's pod.
pub const ENV_JOB_COMPLETION_INDEX: &str = "JOB_COMPLETION_INDEX";

pub(super) async fn reconcile(c: &Cluster, s: &Snapshot) {
    for job in &s.jobs {
        if job.meta().deletion_timestamp.is_some() {
            continue;
        }
        let pods: Vec<&Pod> = s.pods.iter().filter(|p| owned_by(*p, job)).collect();
        reconcile_one(c, job, &pods).await;
    }
    if c.config.collect_orphans {
        let uids: BTreeSet<&str> = s
            .jobs
            .iter()
            .filter_map(|j| j.meta().uid.as_deref())
            .collect();
        for pod in &s.pods {
            let owner_gone = pod
                .owner_references()
                .iter()
                .any(|r| r.kind == "Job" && !uids.contains(r.uid.as_str()));
            if owner_gone {
                c.delete(pod).await;
            }
        }
    }
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

fn active(pod: &Pod) -> bool {
    !matches!(phase(pod), "Succeeded" | "Failed") && pod.meta().deletion_timestamp.is_none()
}

fn ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The completion index of an Indexed Job's pod.
pub fn completion_index(pod: &Pod) -> Option<i32> {
    pod.annotations().get(JOB_COMPLETION_INDEX)?.parse().ok()
}

/// `1,3-5` for indexes 1, 3, 4, 5, as `status.completedIndexes` spells them.
pub fn compress_indexes(indexes: &BTreeSet<i32>) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut run: Option<(i32, i32)> = None;
    for &i in indexes {
        run = match run {
            Some((start, end)) if i == end + 1 => Some((start, i)),
            Some(r) => {
                parts.push(range(r));
                Some((i, i))
            }
            None => Some((i, i)),
        };
    }
    if let Some(r) = run {
        parts.push(range(r));
    }
    parts.join(",")
}

fn range((start, end): (i32, i32)) -> String {
    if start == end {
        start.to_string()
    } else {
        format!("{start}-{end}")
    }
}

async fn reconcile_one(c: &Cluster, job: &Job, pods: &[&Pod]) {
    if job_finished(job).is_some() {
        for pod in pods.iter().filter(|p| active(p)) {
            c.delete(*pod).await;
        }
        return;
    }
    let spec = job.spec.clone().unwrap_or_default();
    let indexed = spec.completion_mode.as_deref() == Some("Indexed");
    let parallelism = spec.parallelism.unwrap_or(1);
    let completions = spec.completions.unwrap_or(parallelism);
    let backoff_limit = spec.backoff_limit.unwrap_or(6);
    let suspended = spec.suspend == Some(true);

    let failed = pods.iter().filter(|p| phase(p) == "Failed").count();
    let failed = i32::try_from(failed).unwrap_or(i32::MAX);
    let running: Vec<&&Pod> = pods.iter().filter(|p| active(p)).collect();
    let succeeded_indexes: BTreeSet<i32> = pods
        .iter()
        .filter(|p| phase(p) == "Succeeded")
        .map(|p| completion_index(p).unwrap_or(0))
        .collect();
    let succeeded = if indexed {
        i32::try_from(succeeded_indexes.len()).unwrap_or(i32::MAX)
    } else {
        i32::try_from(pods.iter().filter(|p| phase(p) == "Succeeded").count()).unwrap_or(i32::MAX)
    };
    let mut status = json!({
        "active": if suspended { 0 } else { running.len() },
        "ready": running.iter().filter(|p| ready(p)).count(),
        "succeeded": succeeded,
        "failed": failed,
        "terminating": 0,
    });
    if indexed {
        status["completedIndexes"] = compress_indexes(&succeeded_indexes).into();
    }
    let old = job.status.clone().unwrap_or_default();
    if old.start_time.is_none() && !suspended {
        status["startTime"] = json!(now());
    }
    let time = json!(now());
    let condition = |type_: &str, reason: &str, message: &str| {
        json!({"type": type_, "status": "True", "reason": reason, "message": message,
               "lastProbeTime": time, "lastTransitionTime": time})
    };
    if failed > backoff_limit {
        status["conditions"] = json!([
            condition(
                "FailureTarget",
                "BackoffLimitExceeded",
                "Job has reached the specified backoff limit"
            ),
            condition(
                "Failed",
                "BackoffLimitExceeded",
                "Job has reached the specified backoff limit"
            ),
        ]);
        for pod in &running {
            c.delete(**pod).await;
        }
    } else if succeeded >= completions {
        status["conditions"] = json!([
            condition(
                "SuccessCriteriaMet",
                "CompletionsReached",
                "Reached expected number of succeeded pods"
            ),
            condition(
                "Complete",
                "CompletionsReached",
                "Reached expected number of succeeded pods"
            ),
        ]);
        status["completionTime"] = json!(now());
        status["active"] = 0.into();
    } else if suspended {
        for pod in &running {
            c.delete(**pod).await;
        }
        status["conditions"] = json!([condition("Suspended", "JobSuspended", "Job suspended")]);
    } else {
        let busy: BTreeSet<i32> = running
            .iter()
            .map(|p| completion_index(p).unwrap_or(0))
            .collect();
        let room = parallelism - i32::try_from(running.len()).unwrap_or(i32::MAX);
        let wanted: Vec<Option<i32>> = if indexed {
            (0..completions)
                .filter(|i| !succeeded_indexes.contains(i) && !busy.contains(i))
                .map(Some)
                .take(usize::try_from(room).unwrap_or(0))
                .collect()
        } else {
            let missing = completions - succeeded - i32::try_from(running.len()).unwrap_or(0);
            (0..missing.min(room)).map(|_| None).collect()
        };
        for index in wanted {
            c.create(&job.namespace().unwrap_or_default(), &build_pod(job, index))
                .await;
        }
        if old
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Suspended")
        {
            status["conditions"] = json!([]);
        }
    }
    let changed = ["active", "ready", "succeeded", "failed"].iter().any(|k| {
        let before = serde_json::to_value(&old).unwrap_or_default();
        before[*k].as_i64().unwrap_or(0) != status[*k].as_i64().unwrap_or(0)
    }) || status.get("conditions").is_some()
        || status.get("startTime").is_some();
    if changed {
        c.patch_status(job, status).await;
    }
}

/// Five characters of kube's name-suffix alphabet.
fn suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    uuid::Uuid::new_v4()
        .into_bytes()
        .iter()
        .take(5)
        .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char)
        .collect()
}

/// The pod the Job controller creates for `index` (Indexed Jobs) of `job`.
fn build_pod(job: &Job, index: Option<i32>) -> Pod {
    let job_name = job.name_any();
    let template = job
        .spec
        .as_ref()
        .map(|s| s.template.clone())
        .unwrap_or_default();
    let meta = template.metadata.unwrap_or_default();
    let mut labels = meta.labels.unwrap_or_default();
    let mut annotations = meta.annotations.unwrap_or_default();
    let uid = job.meta().uid.clone().unwrap_or_default();
    labels.insert(LABEL_JOB_NAME.into(), job_name.clone());
    labels.insert("job-name".into(), job_name.clone());
    labels.insert(LABEL_CONTROLLER_UID.into(), uid.clone());
    labels.insert("controller-uid".into(), uid);
    let mut spec = template.spec.unwrap_or_default();
    let name = match index {
        Some(i) => {
            labels.insert(JOB_COMPLETION_INDEX.into(), i.to_string());
            annotations.insert(JOB_COMPLETION_INDEX.into(), i.to_string());
            if spec.subdomain.is_some() {
                spec.hostname = Some(format!("{job_name}-{i}"));
            }
            for container in spec
                .containers
                .iter_mut()
                .chain(spec.init_containers.iter_mut().flatten())
            {
                let env = container.env.get_or_insert_default();
                if !env.iter().any(|e| e.name == ENV_JOB_COMPLETION_INDEX) {
                    env.push(EnvVar {
                        name: ENV_JOB_COMPLETION_INDEX.into(),
                        value: None,
                        value_from: Some(EnvVarSource {
                            field_ref: Some(ObjectFieldSelector {
                                api_version: None,
                                field_path: JOB_COMPLETION_INDEX_FIELD_PATH.into(),
                            }),
                            ..EnvVarSource::default()
                        }),
                    });
                }
            }
            format!("{job_name}-{i}-{}", suffix())
        }
        None => format!("{job_name}-{}", suffix()),
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: job.namespace(),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![controller_ref(job)]),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// How many pods of the same Job and completion index as `pod` failed, the
/// kubelet's count of earlier attempts.
pub(super) fn failed_before(pods: &[Pod], pod: &Pod) -> usize {
    let Some(owner) = pod.owner_references().first().map(|r| r.uid.clone()) else {
        return 0;
    };
    let index = completion_index(pod);
    pods.iter()
        .filter(|p| p.owner_references().iter().any(|r| r.uid == owner))
        .filter(|p| completion_index(p) == index && phase(p) == "Failed")
        .count()
}

#[cfg(test)]
mod tests {
    use super::compress_indexes;

    #[test]
    fn completed_indexes_as_ranges() {
        assert_eq!(compress_indexes(&[0, 1, 2, 4, 6, 7].into()), "0-2,4,6-7");
        assert_eq!(compress_indexes(&[].into()), "");
    }
}
