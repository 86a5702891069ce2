//! Housekeeping of runtime snapshots, by the leader: snapshots whose
//! TrainJob is gone, and runtime versions no snapshot names any more.
//!
//! A runtime version is written by the first create that needs it and
//! then only referred to, so removing one races with a create that saw it
//! a moment ago. It is removed only when no snapshot names it at two
//! sweeps in a row (a create commits within one sweep interval) and no
//! runtime stored now has it as its current version.

use std::collections::HashSet;

use trainhub_apiserver::store::{Object, Op};

/// The snapshots whose TrainJob (by uid) is not among `trainjobs`. The
/// snapshots must be listed before the TrainJobs: a snapshot is committed
/// with its TrainJob, so one listed first whose TrainJob is not listed
/// after is an orphan.
pub(super) fn orphans(snapshots: &[Object], trainjobs: &[Object]) -> Vec<Op> {
    let uids: HashSet<&str> = trainjobs
        .iter()
        .filter_map(|o| o.value["metadata"]["uid"].as_str())
        .collect();
    snapshots
        .iter()
        .filter(|s| !uids.contains(s.key.name.as_str()))
        .map(|s| Op::Remove { key: s.key.clone() })
        .collect()
}

/// The runtime versions to remove now, and those unreferenced now (to
/// pass as `unreferenced_before` to the next sweep).
pub(super) fn unused_versions(
    versions: &[Object],
    snapshots: &[Object],
    current: &HashSet<String>,
    unreferenced_before: &HashSet<String>,
) -> (Vec<Op>, HashSet<String>) {
    let named: HashSet<&str> = snapshots
        .iter()
        .filter_map(|s| s.value["runtimeVersion"].as_str())
        .collect();
    let mut remove = Vec::new();
    let mut unreferenced = HashSet::new();
    for version in versions {
        let name = version.key.name.as_str();
        if named.contains(name) || current.contains(name) {
            continue;
        }
        if unreferenced_before.contains(name) {
            remove.push(Op::Remove {
                key: version.key.clone(),
            });
        } else {
            unreferenced.insert(name.to_string());
        }
    }
    (remove, unreferenced)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;
    use trainhub_apiserver::store::Key;

    use super::*;
    use crate::admission::{RUNTIME_SNAPSHOTS, runtime_version_key, snapshot_key};

    fn object(key: Key, value: serde_json::Value) -> Object {
        Object {
            key,
            value: Arc::new(value),
            rv: 1,
        }
    }

    fn snapshot(uid: &str, version: &str) -> Object {
        object(
            snapshot_key("ns", uid),
            json!({"uid": uid, "runtimeVersion": version}),
        )
    }

    fn removed(ops: &[Op]) -> Vec<String> {
        let mut names: Vec<String> = ops
            .iter()
            .map(|op| match op {
                Op::Remove { key } => key.name.clone(),
                other => panic!("not a removal: {other:?}"),
            })
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_snapshot_is_an_orphan_when_its_trainjob_is_gone() {
        let snapshots = [snapshot("u1", "v"), snapshot("u2", "v")];
        let trainjobs = [object(
            Key::new("trainer.kubeflow.org/trainjobs", Some("ns"), "a"),
            json!({"metadata": {"uid": "u1"}}),
        )];
        let ops = orphans(&snapshots, &trainjobs);
        assert_eq!(removed(&ops), ["u2"]);
        assert!(matches!(&ops[0], Op::Remove { key } if key.resource == RUNTIME_SNAPSHOTS));
    }

    #[test]
    fn a_version_goes_only_when_unreferenced_at_two_sweeps_and_not_current() {
        let versions: Vec<Object> = ["named", "current", "idle", "idle-before"]
            .iter()
            .map(|n| object(runtime_version_key(n), json!({"runtime": {}})))
            .collect();
        let snapshots = [snapshot("u1", "named")];
        let current: HashSet<String> = ["current".to_string()].into();
        // First sweep: nothing goes; the two idle ones are remembered.
        let (ops, unreferenced) = unused_versions(&versions, &snapshots, &current, &HashSet::new());
        assert!(ops.is_empty());
        let mut idle: Vec<&String> = unreferenced.iter().collect();
        idle.sort();
        assert_eq!(idle, ["idle", "idle-before"]);
        // Meanwhile a create names `idle`: only `idle-before` goes.
        let snapshots = [snapshot("u1", "named"), snapshot("u2", "idle")];
        let (ops, unreferenced) = unused_versions(&versions, &snapshots, &current, &unreferenced);
        assert_eq!(removed(&ops), ["idle-before"]);
        assert!(unreferenced.is_empty());
        // A current runtime's version stays even when never named.
        let (ops, again) = unused_versions(&versions, &[], &current, &["current".into()].into());
        assert!(!removed(&ops).contains(&"current".to_string()));
        assert!(!again.contains("current"));
    }
}
