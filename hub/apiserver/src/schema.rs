//! Structural-schema pruning, as kube-apiserver does for custom resources:
//! fields the `openAPIV3Schema` does not declare are dropped, and reported so
//! that `fieldValidation=Strict` can refuse them and `Warn` can say so.

use serde_json::Value;

/// `metadata` fields of `ObjectMeta` that clients may send.
const OBJECT_META: &[&str] = &[
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
];

/// Removes what `schema` does not declare from `value` (an object of the
/// resource) and returns the removed fields' paths, e.g. `spec.foo`,
/// `spec.template.spec.replicatedJobs[0].bar`.
pub fn prune(value: &mut Value, schema: &Value) -> Vec<String> {
    let mut unknown = Vec::new();
    walk(value, schema, "", true, &mut unknown);
    unknown
}

fn join(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_string()
    } else {
        format!("{path}.{field}")
    }
}

fn walk(value: &mut Value, schema: &Value, path: &str, embedded: bool, unknown: &mut Vec<String>) {
    let preserve = schema
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        == Some(true);
    let embedded = embedded
        || schema
            .get("x-kubernetes-embedded-resource")
            .and_then(Value::as_bool)
            == Some(true);
    match value {
        Value::Object(map) => {
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            let keys: Vec<String> = map.keys().cloned().collect();
            for key in keys {
                let child_path = join(path, &key);
                if embedded && matches!(key.as_str(), "apiVersion" | "kind") {
                    continue;
                }
                if embedded && key == "metadata" {
                    if let Some(Value::Object(meta)) = map.get_mut("metadata") {
                        let fields: Vec<String> = meta.keys().cloned().collect();
                        for f in fields {
                            if !OBJECT_META.contains(&f.as_str()) {
                                meta.remove(&f);
                                unknown.push(join(&child_path, &f));
                            }
                        }
                    }
                    continue;
                }
                let child_schema = properties.and_then(|p| p.get(&key)).or(additional);
                match child_schema {
                    Some(s) => {
                        if let Some(child) = map.get_mut(&key) {
                            walk(child, s, &child_path, false, unknown);
                        }
                    }
                    // An object without declared properties keeps what it
                    // holds (lenient where a structural schema would prune).
                    None if preserve || properties.is_none() => {}
                    None => {
                        map.remove(&key);
                        unknown.push(child_path);
                    }
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    walk(item, item_schema, &format!("{path}[{i}]"), false, unknown);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn prunes_undeclared_fields_and_keeps_declared_ones() {
        let schema = json!({
            "type": "object",
            "properties": {
                "apiVersion": {"type": "string"},
                "kind": {"type": "string"},
                "metadata": {"type": "object"},
                "spec": {"type": "object", "properties": {
                    "a": {"type": "integer"},
                    "list": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}}},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                }},
            },
        });
        let mut v = json!({
            "apiVersion": "x/v1", "kind": "K",
            "metadata": {"name": "n", "bogus": 1},
            "spec": {"a": 1, "b": 2, "list": [{"name": "x", "extra": true}], "labels": {"k": "v"}, "free": {"anything": {"goes": 1}}},
        });
        let unknown = prune(&mut v, &schema);
        assert_eq!(
            unknown,
            vec!["metadata.bogus", "spec.b", "spec.list[0].extra"]
        );
        assert_eq!(v["spec"]["free"]["anything"]["goes"], 1);
        assert_eq!(v["spec"]["labels"]["k"], "v");
        assert!(v["spec"].get("b").is_none());
    }
}
