//! What a spoke may write: the pods and events of the runs placed on it,
//! and nothing else. Pure checks over the reported objects; the runner
//! adds what only the store knows (who wrote an existing object).
//!
//! A run's objects are named after its TrainJob, as JobSet names them:
//! the JobSet is the TrainJob's name, its pods `NAME-RJOB-J-I-…`, the
//! spoke's events `POD.HASH` or `NAME.HASH`. A report's pod or event is
//! taken only if
//! - its name is the TrainJob's name followed by `-` or `.` (pods: `-`);
//! - no other TrainJob in the namespace is a longer match (TrainJob `a`
//!   cannot claim pod `a-b-node-0-0` of TrainJob `a-b`);
//! - its namespace, if it names one, is the TrainJob's;
//! - its `jobset.sigs.k8s.io/jobset-name` label, if any, is the TrainJob's
//!   name (the SDK and `kubectl` select a TrainJob's pods by it);
//! - an Event's involved object, if named, is the TrainJob's or one of its
//!   objects (by the same name rule).

use serde_json::Value;
use trainhub_api::constants::LABEL_JOBSET_NAME;

use super::core::JobKey;

/// Why a reported object was refused.
pub type Refusal = String;

/// Whether `name` is `job` or one of `job`'s objects (`job` then one of
/// `separators`, then more).
fn named_after(name: &str, job: &str, separators: &[u8]) -> bool {
    name == job
        || name
            .strip_prefix(job)
            .and_then(|rest| rest.as_bytes().first())
            .is_some_and(|b| separators.contains(b))
}

/// The names of other TrainJobs `name` could belong to: its prefixes,
/// longer than `job`, that end before a `-` or `.`. The caller refuses the
/// object if one of them is a TrainJob of the namespace.
pub fn longer_owners<'a>(name: &'a str, job: &str) -> impl Iterator<Item = &'a str> + 'a {
    let start = job.len();
    name.char_indices()
        .filter(move |(at, c)| *at > start && (*c == '-' || *c == '.'))
        .map(move |(at, _)| &name[..at])
}

/// Whether `name` is a pod name of TrainJob `job` with pod sets
/// `pod_sets`: `JOB-SET-…` for one of them.
pub fn of_pod_sets(name: &str, job: &str, pod_sets: &[&str]) -> bool {
    name.strip_prefix(job)
        .and_then(|rest| rest.strip_prefix('-'))
        .is_some_and(|rest| {
            pod_sets.iter().any(|set| {
                rest.strip_prefix(set)
                    .is_some_and(|tail| tail.starts_with('-'))
            })
        })
}

/// Lowercase alphanumerics, `-` and `.`, at most 253 bytes, alphanumeric
/// at both ends: a Kubernetes object name (DNS-1123 subdomain).
fn is_object_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 253
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-' || *c == b'.')
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
}

fn check_namespace(meta: &Value, job: &JobKey) -> Result<(), Refusal> {
    match meta["namespace"].as_str() {
        None | Some("") => Ok(()),
        Some(ns) if ns == job.namespace => Ok(()),
        Some(ns) => Err(format!(
            "metadata.namespace {ns:?} is not the TrainJob's namespace {:?}",
            job.namespace
        )),
    }
}

/// The name of a pod a report shows for TrainJob `job`, if the run's
/// spoke may write it.
pub fn check_pod(pod: &Value, job: &JobKey) -> Result<String, Refusal> {
    let meta = &pod["metadata"];
    let Some(name) = meta["name"].as_str() else {
        return Err("a pod without metadata.name".into());
    };
    if !is_object_name(name) {
        return Err(format!(
            "pod name {:?} is not a DNS-1123 subdomain",
            trimmed(name)
        ));
    }
    if !named_after(name, &job.name, b"-") || name == job.name {
        return Err(format!(
            "pod {name:?} is not named after TrainJob {:?} (NAME-…)",
            job.name
        ));
    }
    check_namespace(meta, job).map_err(|e| format!("pod {name:?}: {e}"))?;
    match &meta["labels"][LABEL_JOBSET_NAME] {
        Value::Null => {}
        Value::String(s) if *s == job.name => {}
        other => {
            return Err(format!(
                "pod {name:?}: label {LABEL_JOBSET_NAME}={other} is not the TrainJob's name {:?}",
                job.name
            ));
        }
    }
    Ok(name.to_string())
}

/// The name of an Event a report carries for TrainJob `job`, if the run's
/// spoke may write it.
pub fn check_event(event: &Value, job: &JobKey) -> Result<String, Refusal> {
    let meta = &event["metadata"];
    let Some(name) = meta["name"].as_str() else {
        return Err("an event without metadata.name".into());
    };
    if !is_object_name(name) {
        return Err(format!(
            "event name {:?} is not a DNS-1123 subdomain",
            trimmed(name)
        ));
    }
    if !named_after(name, &job.name, b"-.") || name == job.name {
        return Err(format!(
            "event {name:?} is not named after TrainJob {:?} (NAME-… or NAME.…)",
            job.name
        ));
    }
    check_namespace(meta, job).map_err(|e| format!("event {name:?}: {e}"))?;
    let involved = &event["involvedObject"];
    if !involved.is_null() && !involved.is_object() {
        return Err(format!("event {name:?}: involvedObject is not an object"));
    }
    check_namespace(involved, job).map_err(|e| format!("event {name:?}: involvedObject: {e}"))?;
    match &involved["name"] {
        Value::Null => {}
        Value::String(s) if named_after(s, &job.name, b"-.") => {}
        other => {
            return Err(format!(
                "event {name:?}: involvedObject.name {other} is not TrainJob {:?} or one of its objects",
                job.name
            ));
        }
    }
    Ok(name.to_string())
}

/// At most 64 characters of a text, for a message.
fn trimmed(text: &str) -> &str {
    match text.char_indices().nth(64) {
        Some((at, _)) => &text[..at],
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn job(name: &str) -> JobKey {
        JobKey {
            namespace: "ml".into(),
            name: name.into(),
        }
    }

    #[test]
    fn a_pod_of_the_run_is_taken() {
        let pod = json!({"metadata": {"name": "a-node-0-0-x1", "namespace": "ml",
            "labels": {LABEL_JOBSET_NAME: "a"}}});
        assert_eq!(check_pod(&pod, &job("a")).unwrap(), "a-node-0-0-x1");
        let bare = json!({"metadata": {"name": "a-node-0-0"}});
        assert_eq!(check_pod(&bare, &job("a")).unwrap(), "a-node-0-0");
    }

    #[test]
    fn pods_of_other_trainjobs_are_refused() {
        for (pod, rule) in [
            (
                json!({"metadata": {"name": "b-node-0-0"}}),
                "not named after",
            ),
            (
                json!({"metadata": {"name": "ab-node-0-0"}}),
                "not named after",
            ),
            (json!({"metadata": {"name": "a"}}), "not named after"),
            (
                json!({"metadata": {"name": "a-node-0-0", "namespace": "other"}}),
                "not the TrainJob's namespace",
            ),
            (
                json!({"metadata": {"name": "a-node-0-0", "labels": {LABEL_JOBSET_NAME: "b"}}}),
                "is not the TrainJob's name",
            ),
            (
                json!({"metadata": {"name": "a-node-0-0", "labels": {LABEL_JOBSET_NAME: 1}}}),
                "is not the TrainJob's name",
            ),
            (json!({"metadata": {"name": "a-Node"}}), "DNS-1123"),
            (json!({"metadata": {"name": "a-x/y"}}), "DNS-1123"),
            (json!({"metadata": {}}), "without metadata.name"),
            (json!("a-node-0-0"), "without metadata.name"),
        ] {
            let e = check_pod(&pod, &job("a")).unwrap_err();
            assert!(e.contains(rule), "{pod}: {e}");
        }
    }

    #[test]
    fn events_must_name_the_run_and_its_objects() {
        let ok = json!({"metadata": {"name": "a-node-0-0.17f0"},
            "involvedObject": {"kind": "Pod", "name": "a-node-0-0", "namespace": "ml"}});
        assert_eq!(check_event(&ok, &job("a")).unwrap(), "a-node-0-0.17f0");
        let on_job = json!({"metadata": {"name": "a.17f0"}, "involvedObject": {"name": "a"}});
        assert!(check_event(&on_job, &job("a")).is_ok());
        for (event, rule) in [
            (json!({"metadata": {"name": "b.1"}}), "not named after"),
            (
                json!({"metadata": {"name": "a.1"}, "involvedObject": {"name": "b-node-0-0"}}),
                "involvedObject.name",
            ),
            (
                json!({"metadata": {"name": "a.1"}, "involvedObject": {"name": "a", "namespace": "x"}}),
                "not the TrainJob's namespace",
            ),
            (
                json!({"metadata": {"name": "a.1"}, "involvedObject": "a"}),
                "not an object",
            ),
        ] {
            let e = check_event(&event, &job("a")).unwrap_err();
            assert!(e.contains(rule), "{event}: {e}");
        }
    }

    #[test]
    fn pod_names_follow_the_pod_sets() {
        assert!(of_pod_sets("a-node-0-0-x", "a", &["node"]));
        assert!(!of_pod_sets("a-node-0-0-x", "a", &["launcher"]));
        assert!(!of_pod_sets("a-nodes-0-0", "a", &["node"]));
        assert!(of_pod_sets("a-b-node-0-0", "a-b", &["node"]));
        assert!(!of_pod_sets("a-b-node-0-0", "a", &["node"]));
    }

    #[test]
    fn longer_trainjob_names_are_candidate_owners() {
        let owners: Vec<&str> = longer_owners("a-b-node-0-0", "a").collect();
        assert_eq!(owners, ["a-b", "a-b-node", "a-b-node-0"]);
        let none: Vec<&str> = longer_owners("a-node", "a").collect();
        assert!(none.is_empty(), "{none:?}");
        let events: Vec<&str> = longer_owners("a-b.17", "a").collect();
        assert_eq!(events, ["a-b"]);
    }
}
