//! Strategic merge of a runtime patch into a JobSet spec, on JSON.
//!
//! Kubernetes' strategic merge patch, restricted to what a typed runtime
//! patch can express (no `$patch` directives): objects merge key by key,
//! lists of objects with a merge key merge item by item, every other list is
//! replaced. The merge keys are those the JobSet, batch and core types
//! declare for the fields a JobSet spec contains.
//!
//! Item order follows the API server's algorithm: the patch's items in patch
//! order, with the items only the original has woven back in at their
//! original relative positions; a new item therefore comes first.

use serde_json::{Map, Value};

/// How the list under a field merges.
enum ListStrategy {
    /// Replaced whole by the patch's list.
    Replace,
    /// Merged item by item on this key.
    MergeOn(&'static str),
    /// A list of scalars merged as a set (`metadata.finalizers`).
    Union,
}

/// The strategy for a list field, by field name. Within a JobSet spec each of
/// these names means one Kubernetes field, so the name alone decides.
fn list_strategy(field: &str) -> ListStrategy {
    match field {
        "replicatedJobs"
        | "dependsOn"
        | "volumes"
        | "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "imagePullSecrets"
        | "schedulingGates"
        | "resourceClaims"
        | "env" => ListStrategy::MergeOn("name"),
        "ports" => ListStrategy::MergeOn("containerPort"),
        "volumeMounts" => ListStrategy::MergeOn("mountPath"),
        "volumeDevices" => ListStrategy::MergeOn("devicePath"),
        "hostAliases" => ListStrategy::MergeOn("ip"),
        "topologySpreadConstraints" => ListStrategy::MergeOn("topologyKey"),
        "ownerReferences" => ListStrategy::MergeOn("uid"),
        "finalizers" => ListStrategy::Union,
        _ => ListStrategy::Replace,
    }
}

/// Merges `patch` into `original`: the value a strategic merge patch gives.
pub(crate) fn strategic_merge(original: &mut Value, patch: &Value) {
    merge_value(original, patch, None);
}

fn merge_value(original: &mut Value, patch: &Value, field: Option<&str>) {
    match (original, patch) {
        (Value::Object(base), Value::Object(over)) => merge_object(base, over),
        (Value::Array(base), Value::Array(over)) => {
            match field.map_or(ListStrategy::Replace, list_strategy) {
                ListStrategy::MergeOn(key)
                    if all_objects_with(base, key) && all_objects_with(over, key) =>
                {
                    *base = merge_list(std::mem::take(base), over, key);
                }
                ListStrategy::Union => {
                    for item in over {
                        if !base.contains(item) {
                            base.push(item.clone());
                        }
                    }
                }
                _ => *base = over.clone(),
            }
        }
        (original, patch) => *original = patch.clone(),
    }
}

fn merge_object(base: &mut Map<String, Value>, over: &Map<String, Value>) {
    for (key, value) in over {
        if value.is_null() {
            base.remove(key);
            continue;
        }
        match base.get_mut(key) {
            Some(existing) if !existing.is_null() => merge_value(existing, value, Some(key)),
            _ => {
                base.insert(key.clone(), value.clone());
            }
        }
    }
}

fn all_objects_with(items: &[Value], key: &str) -> bool {
    items.iter().all(|item| item.get(key).is_some())
}

fn merge_list(original: Vec<Value>, patch: &[Value], key: &str) -> Vec<Value> {
    let original_keys: Vec<Value> = original.iter().map(|item| item[key].clone()).collect();
    let patch_keys: Vec<&Value> = patch.iter().map(|item| &item[key]).collect();

    // Original items, each merged with its patch item; then the new ones.
    let mut merged = original;
    for item in patch {
        match merged.iter_mut().find(|m| m[key] == item[key]) {
            Some(existing) => merge_value(existing, item, None),
            None => merged.push(item.clone()),
        }
    }

    // Partition: items the patch names (in patch order), and the others (in
    // original order).
    let mut from_patch: Vec<Option<Value>> = vec![None; patch_keys.len()];
    let mut original_only = Vec::new();
    for item in merged {
        match patch_keys.iter().position(|k| **k == item[key]) {
            Some(index) if from_patch[index].is_none() => from_patch[index] = Some(item),
            _ => original_only.push(item),
        }
    }
    let from_patch: Vec<Value> = from_patch.into_iter().flatten().collect();

    // Weave the original-only items into the patch's, as the API server does.
    let position = |item: &Value| original_keys.iter().position(|k| *k == item[key]);
    let mut out = Vec::with_capacity(from_patch.len() + original_only.len());
    let (mut left, mut right) = (
        original_only.into_iter().peekable(),
        from_patch.into_iter().peekable(),
    );
    loop {
        match (left.peek(), right.peek()) {
            (None, None) => break,
            (Some(_), None) => out.extend(left.by_ref()),
            (None, Some(_)) => out.extend(right.by_ref()),
            (Some(l), Some(r)) => {
                let take_left =
                    matches!((position(l), position(r)), (Some(li), Some(ri)) if li < ri);
                let next = if take_left { left.next() } else { right.next() };
                out.extend(next);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn objects_merge_and_null_deletes() {
        let mut base = json!({"a": {"x": 1, "y": 2}, "b": 1});
        strategic_merge(&mut base, &json!({"a": {"y": 3, "z": 4}, "b": null}));
        assert_eq!(base, json!({"a": {"x": 1, "y": 3, "z": 4}}));
    }

    #[test]
    fn keyed_lists_merge_by_key_and_keep_original_order() {
        let mut base = json!({"env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}, {"name": "C"}]});
        strategic_merge(&mut base, &json!({"env": [{"name": "B", "value": "x"}]}));
        assert_eq!(
            base,
            json!({"env": [{"name": "A", "value": "1"}, {"name": "B", "value": "x"}, {"name": "C"}]})
        );
    }

    #[test]
    fn new_items_come_first_as_the_api_server_orders_them() {
        let mut base = json!({"volumes": [{"name": "a"}, {"name": "b"}]});
        strategic_merge(
            &mut base,
            &json!({"volumes": [{"name": "n", "emptyDir": {}}]}),
        );
        assert_eq!(
            base,
            json!({"volumes": [{"name": "n", "emptyDir": {}}, {"name": "a"}, {"name": "b"}]})
        );
    }

    #[test]
    fn unkeyed_lists_are_replaced() {
        let mut base = json!({"tolerations": [{"key": "a"}], "args": ["x"]});
        strategic_merge(
            &mut base,
            &json!({"tolerations": [{"key": "b"}], "args": ["y", "z"]}),
        );
        assert_eq!(
            base,
            json!({"tolerations": [{"key": "b"}], "args": ["y", "z"]})
        );
    }

    #[test]
    fn volume_mounts_merge_by_mount_path() {
        let mut base = json!({"volumeMounts": [{"name": "a", "mountPath": "/a"}]});
        strategic_merge(
            &mut base,
            &json!({"volumeMounts": [{"name": "a", "mountPath": "/a", "readOnly": true}]}),
        );
        assert_eq!(
            base,
            json!({"volumeMounts": [{"name": "a", "mountPath": "/a", "readOnly": true}]})
        );
    }

    #[test]
    fn finalizers_merge_as_a_set() {
        let mut base = json!({"finalizers": ["a"]});
        strategic_merge(&mut base, &json!({"finalizers": ["a", "b"]}));
        assert_eq!(base, json!({"finalizers": ["a", "b"]}));
    }
}
