//! Kubernetes Events for what a backend observes of its pods, derived the
//! way a kubelet and scheduler would record them: `Scheduled` when a pod
//! appears, `Started` when one of its containers starts, `Killing` when a
//! running pod is deleted, and a `Warning` `Failed` when a container ends
//! with a non-zero exit code. A backend that has real Events (a Kubernetes
//! cluster) sends those instead.
//!
//! Event names are derived from what they say, so a report resent after a
//! reconnect names the same Events again and the hub writes them once.

use std::collections::{BTreeMap, hash_map::DefaultHasher};
use std::hash::{Hash, Hasher};

use serde_json::{Value, json};

/// Who records the events: `source.component` / `reportingComponent`.
pub const COMPONENT: &str = "trainspoke";

/// The events for the change from `before` to `after` (Pod objects, as in
/// run reports), recorded on `host` at `now` (RFC 3339).
pub fn pod_events(before: &[Value], after: &[Value], host: &str, now: &str) -> Vec<Value> {
    let old: BTreeMap<&str, &Value> = before
        .iter()
        .filter_map(|p| Some((p["metadata"]["name"].as_str()?, p)))
        .collect();
    let mut events = Vec::new();
    for pod in after {
        let Some(name) = pod["metadata"]["name"].as_str() else {
            continue;
        };
        let previous = old.get(name).copied();
        let namespace = pod["metadata"]["namespace"].as_str().unwrap_or("default");
        let mut record = |kind: &str, reason: &str, message: String, field: Option<String>| {
            events.push(event(pod, kind, reason, &message, field, host, now));
        };
        if previous.is_none() {
            record(
                "Normal",
                "Scheduled",
                format!("Successfully assigned {namespace}/{name} to {host}"),
                None,
            );
        }
        let deleted = !pod["metadata"]["deletionTimestamp"].is_null();
        let was_deleted = previous.is_some_and(|p| !p["metadata"]["deletionTimestamp"].is_null());
        if deleted && !was_deleted && pod["status"]["phase"] == "Running" {
            record("Normal", "Killing", "Stopping pod".to_string(), None);
        }
        for (list, path) in [
            ("initContainerStatuses", "spec.initContainers"),
            ("containerStatuses", "spec.containers"),
        ] {
            let statuses = pod["status"][list].as_array().map(Vec::as_slice);
            for status in statuses.unwrap_or_default() {
                let Some(container) = status["name"].as_str() else {
                    continue;
                };
                let prior = previous.and_then(|p| {
                    p["status"][list]
                        .as_array()?
                        .iter()
                        .find(|s| s["name"] == container)
                });
                let field = Some(format!("{path}{{{container}}}"));
                let started = |s: &Value| {
                    s["state"]["running"]["startedAt"]
                        .as_str()
                        .or_else(|| s["state"]["terminated"]["startedAt"].as_str())
                        .map(String::from)
                };
                let restarts = |s: &Value| s["restartCount"].as_i64().unwrap_or(0);
                let now_started = started(status);
                if now_started.is_some()
                    && (prior.and_then(started) != now_started
                        || prior.map(restarts) != Some(restarts(status)))
                {
                    record(
                        "Normal",
                        "Started",
                        format!("Started container {container}"),
                        field.clone(),
                    );
                }
                let terminated = &status["state"]["terminated"];
                let was_terminated = prior.is_some_and(|p| {
                    !p["state"]["terminated"].is_null() && restarts(p) == restarts(status)
                });
                let code = terminated["exitCode"].as_i64().unwrap_or(0);
                if !terminated.is_null() && !was_terminated && code != 0 {
                    let detail = terminated["message"]
                        .as_str()
                        .map(|m| format!(": {m}"))
                        .unwrap_or_default();
                    record(
                        "Warning",
                        "Failed",
                        format!("Container {container} exited with code {code}{detail}"),
                        field,
                    );
                }
            }
        }
    }
    events
}

fn event(
    pod: &Value,
    kind: &str,
    reason: &str,
    message: &str,
    field: Option<String>,
    host: &str,
    now: &str,
) -> Value {
    let meta = &pod["metadata"];
    let name = meta["name"].as_str().unwrap_or_default();
    let mut hasher = DefaultHasher::new();
    (meta["uid"].as_str(), reason, message, &field, now).hash(&mut hasher);
    let mut involved = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "name": name,
    });
    for k in ["namespace", "uid"] {
        if let Some(v) = meta[k].as_str() {
            involved[k] = v.into();
        }
    }
    if let Some(field) = field {
        involved["fieldPath"] = field.into();
    }
    json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": format!("{name}.{:016x}", hasher.finish())},
        "involvedObject": involved,
        "type": kind,
        "reason": reason,
        "message": message,
        "source": {"component": COMPONENT, "host": host},
        "reportingComponent": COMPONENT,
        "reportingInstance": host,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(phase: &str, state: Value, restarts: i64) -> Value {
        json!({
            "metadata": {"name": "j-node-0-0-abcde", "namespace": "ml", "uid": "u1"},
            "status": {
                "phase": phase,
                "containerStatuses": [{"name": "node", "state": state, "restartCount": restarts}],
            },
        })
    }

    fn reasons(events: &[Value]) -> Vec<(String, String)> {
        events
            .iter()
            .map(|e| {
                (
                    e["reason"].as_str().unwrap_or_default().to_string(),
                    e["message"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect()
    }

    #[test]
    fn a_pod_is_scheduled_started_and_its_failure_recorded_once() {
        let t = "2026-01-01T00:00:00Z";
        let pending = pod(
            "Pending",
            json!({"waiting": {"reason": "ContainerCreating"}}),
            0,
        );
        let running = pod("Running", json!({"running": {"startedAt": t}}), 0);
        let failed = pod(
            "Failed",
            json!({"terminated": {"exitCode": 3, "startedAt": t, "message": "boom"}}),
            0,
        );
        let first = pod_events(&[], std::slice::from_ref(&pending), "spoke-a", t);
        assert_eq!(
            reasons(&first),
            [(
                "Scheduled".to_string(),
                "Successfully assigned ml/j-node-0-0-abcde to spoke-a".to_string()
            )]
        );
        assert_eq!(first[0]["involvedObject"]["uid"], "u1");
        assert_eq!(first[0]["source"]["host"], "spoke-a");
        let started = pod_events(
            std::slice::from_ref(&pending),
            std::slice::from_ref(&running),
            "spoke-a",
            t,
        );
        assert_eq!(
            reasons(&started),
            [("Started".to_string(), "Started container node".to_string())]
        );
        assert_eq!(
            started[0]["involvedObject"]["fieldPath"],
            "spec.containers{node}"
        );
        let ended = pod_events(
            std::slice::from_ref(&running),
            std::slice::from_ref(&failed),
            "spoke-a",
            t,
        );
        assert_eq!(ended.len(), 1);
        assert_eq!(ended[0]["type"], "Warning");
        assert_eq!(
            ended[0]["message"],
            "Container node exited with code 3: boom"
        );
        // Nothing changed: nothing recorded.
        assert!(
            pod_events(
                std::slice::from_ref(&failed),
                std::slice::from_ref(&failed),
                "spoke-a",
                t
            )
            .is_empty()
        );
    }

    #[test]
    fn names_are_stable_for_the_same_event() {
        let t = "2026-01-01T00:00:00Z";
        let running = pod("Running", json!({"running": {"startedAt": t}}), 0);
        let a = pod_events(&[], std::slice::from_ref(&running), "s", t);
        let b = pod_events(&[], std::slice::from_ref(&running), "s", t);
        assert_eq!(a, b);
        assert_eq!(a.len(), 2, "scheduled and started");
        assert_ne!(a[0]["metadata"]["name"], a[1]["metadata"]["name"]);
    }

    #[test]
    fn a_restarted_container_starts_again() {
        let t = "2026-01-01T00:00:00Z";
        let t2 = "2026-01-01T00:01:00Z";
        let before = pod("Running", json!({"running": {"startedAt": t}}), 0);
        let after = pod("Running", json!({"running": {"startedAt": t2}}), 1);
        assert_eq!(
            reasons(&pod_events(&[before], &[after], "s", t2)),
            [("Started".to_string(), "Started container node".to_string())]
        );
    }
}
