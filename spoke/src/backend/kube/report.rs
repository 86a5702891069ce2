//! Run reports from what the cluster shows: the JobSet and its pods.

use serde_json::Value;

use super::objects::{LABEL_JOBSET_UID, LABEL_REPLICATED_JOB};
use crate::backend::{RunKey, RunReport, events};

/// Whether a JobSet status says the JobSet has ended: a `Completed` or
/// `Failed` condition that is True.
pub fn finished(status: &Value) -> bool {
    status["conditions"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .any(|c| {
            matches!(c["type"].as_str(), Some("Completed" | "Failed")) && c["status"] == "True"
        })
}

/// Whether the JobSet is suspended (`spec.suspend`), as it is while Kueue
/// has not admitted it.
pub fn suspended(jobset: &Value) -> bool {
    jobset["spec"]["suspend"] == true
}

/// Whether a pod belongs to this JobSet (and not to an earlier JobSet of the
/// same name): its JobSet uid label, where the JobSet controller sets one,
/// is the JobSet's.
pub fn pod_of(jobset: &Value, pod: &Value) -> bool {
    match (
        pod["metadata"]["labels"][LABEL_JOBSET_UID].as_str(),
        jobset["metadata"]["uid"].as_str(),
    ) {
        (Some(pod_uid), Some(uid)) => pod_uid == uid,
        _ => true,
    }
}

/// An object as the backend keeps it and the hub is shown it: without
/// `managedFields`.
pub fn trimmed(pod: &Value) -> Value {
    let mut pod = pod.clone();
    if let Some(meta) = pod["metadata"].as_object_mut() {
        meta.remove("managedFields");
    }
    pod
}

/// The report of a run from its JobSet and pods (sorted by name), with the
/// events since `previous`, observed at `now` (RFC 3339).
pub fn build(
    key: &RunKey,
    jobset: &Value,
    pods: Vec<Value>,
    previous: Option<&RunReport>,
    now: &str,
) -> RunReport {
    let mut pods = pods;
    pods.sort_by(|a, b| {
        a["metadata"]["name"]
            .as_str()
            .cmp(&b["metadata"]["name"].as_str())
    });
    let status = match &jobset["status"] {
        Value::Null => Value::Object(Default::default()),
        s => s.clone(),
    };
    let mut report = RunReport {
        key: key.clone(),
        finished: finished(&status),
        jobset_status: status,
        pods,
        events: Vec::new(),
    };
    report.events = pod_events(previous.map(|p| p.pods.as_slice()), &report.pods, now);
    report
}

/// Events of the pods bound to a node, recorded on that node: a pod counts
/// as scheduled when it is bound, as the scheduler records it.
fn pod_events(before: Option<&[Value]>, after: &[Value], now: &str) -> Vec<Value> {
    let bound = |p: &&Value| {
        p["spec"]["nodeName"]
            .as_str()
            .is_some_and(|n| !n.is_empty())
    };
    let before: Vec<Value> = before
        .unwrap_or_default()
        .iter()
        .filter(bound)
        .cloned()
        .collect();
    after
        .iter()
        .filter(bound)
        .flat_map(|pod| {
            let host = pod["spec"]["nodeName"].as_str().unwrap_or_default();
            events::pod_events(&before, std::slice::from_ref(pod), host, now)
        })
        .collect()
}

/// How many pods of each replicated job are bound and not terminal.
pub fn placed_per_set<'a>(
    pods: impl IntoIterator<Item = &'a Value>,
) -> std::collections::BTreeMap<String, u32> {
    let mut out = std::collections::BTreeMap::new();
    for pod in pods {
        let bound = pod["spec"]["nodeName"]
            .as_str()
            .is_some_and(|n| !n.is_empty());
        let terminal = matches!(
            pod["status"]["phase"].as_str(),
            Some("Succeeded" | "Failed")
        );
        let Some(set) = pod["metadata"]["labels"][LABEL_REPLICATED_JOB].as_str() else {
            continue;
        };
        if bound && !terminal {
            *out.entry(set.to_owned()).or_insert(0u32) += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn key() -> RunKey {
        RunKey {
            run_id: "r".into(),
            generation: 1,
        }
    }

    fn pod(name: &str, node: Option<&str>, phase: &str) -> Value {
        json!({
            "metadata": {
                "name": name, "namespace": "ml", "uid": format!("u-{name}"),
                "labels": {"jobset.sigs.k8s.io/jobset-name": "j", LABEL_REPLICATED_JOB: "node", LABEL_JOBSET_UID: "js1"},
                "managedFields": [{"manager": "kubelet"}],
            },
            "spec": {"nodeName": node, "containers": [{"name": "node"}]},
            "status": {"phase": phase, "containerStatuses": [{"name": "node", "restartCount": 0,
                "state": if phase == "Running" { json!({"running": {"startedAt": "2026-01-01T00:00:00Z"}}) } else { json!({"waiting": {}}) }}]},
        })
    }

    fn jobset(status: Value) -> Value {
        json!({"metadata": {"name": "j", "uid": "js1"}, "spec": {}, "status": status})
    }

    #[test]
    fn a_report_carries_the_status_and_sorted_pods() {
        let status = json!({
            "replicatedJobsStatus": [{"name": "node", "ready": 1, "succeeded": 0, "failed": 0, "active": 2, "suspended": 0}],
        });
        let pods = vec![
            trimmed(&pod("j-node-0-1", Some("n1"), "Running")),
            trimmed(&pod("j-node-0-0", None, "Pending")),
        ];
        let r = build(
            &key(),
            &jobset(status.clone()),
            pods,
            None,
            "2026-01-01T00:00:01Z",
        );
        assert_eq!(r.jobset_status, status);
        assert!(!r.finished);
        assert_eq!(r.pods[0]["metadata"]["name"], "j-node-0-0");
        assert!(r.pods[0]["metadata"]["managedFields"].is_null());
        // Only the bound pod is scheduled (and started) on its node.
        let reasons: Vec<(&str, &str)> = r
            .events
            .iter()
            .map(|e| {
                (
                    e["reason"].as_str().unwrap(),
                    e["source"]["host"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(reasons, [("Scheduled", "n1"), ("Started", "n1")]);
        // The same pods again: nothing new.
        let again = build(
            &key(),
            &jobset(status),
            r.pods.clone(),
            Some(&r),
            "2026-01-01T00:00:02Z",
        );
        assert!(again.same_state(&r));
        assert!(again.events.is_empty());
    }

    #[test]
    fn completed_or_failed_true_finishes_the_run() {
        for (conditions, done) in [
            (json!([{"type": "Completed", "status": "True"}]), true),
            (json!([{"type": "Failed", "status": "True"}]), true),
            (
                json!([{"type": "Failed", "status": "False"}, {"type": "Suspended", "status": "True"}]),
                false,
            ),
            (json!(null), false),
        ] {
            let r = build(
                &key(),
                &jobset(json!({"conditions": conditions})),
                vec![],
                None,
                "t",
            );
            assert_eq!(r.finished, done, "{conditions}");
        }
        // No status yet: an empty one.
        let r = build(
            &key(),
            &json!({"metadata": {"name": "j"}}),
            vec![],
            None,
            "t",
        );
        assert_eq!(r.jobset_status, json!({}));
    }

    #[test]
    fn pods_of_an_earlier_jobset_of_the_same_name_are_not_the_runs() {
        let js = jobset(json!({}));
        assert!(pod_of(&js, &pod("a", None, "Pending")));
        let mut old = pod("a", None, "Pending");
        old["metadata"]["labels"][LABEL_JOBSET_UID] = "js0".into();
        assert!(!pod_of(&js, &old));
        let mut unlabelled = pod("a", None, "Pending");
        unlabelled["metadata"]["labels"] = json!({});
        assert!(pod_of(&js, &unlabelled));
        assert!(suspended(&json!({"spec": {"suspend": true}})));
        assert!(!suspended(&json!({"spec": {}})));
    }

    #[test]
    fn bound_live_pods_are_counted_per_replicated_job() {
        let pods = [
            pod("a", Some("n1"), "Running"),
            pod("b", Some("n1"), "Succeeded"),
            pod("c", None, "Pending"),
            pod("d", Some("n2"), "Pending"),
        ];
        assert_eq!(placed_per_set(&pods), [("node".to_string(), 2)].into());
    }
}
