//! The four ways to change an object without sending all of it, as
//! kube-apiserver applies them, over `serde_json::Value`:
//!
//! - [`merge_patch`]: JSON merge patch (RFC 7386, `application/merge-patch+json`);
//! - [`json_patch`]: JSON patch (RFC 6902, `application/json-patch+json`);
//! - [`strategic_merge_patch`]: strategic merge patch
//!   (`application/strategic-merge-patch+json`) with its directives;
//! - [`apply`]: server-side apply (`application/apply-patch+yaml`) with field
//!   ownership in `metadata.managedFields`, and [`record_update`] for the
//!   ownership that other writes take.
//!
//! Lists merge by the keys a [`ListKeys`] gives: [`SchemaListKeys`] reads them
//! from a resource's OpenAPI schema.

// `ApiError` is the crate-wide error (a `metav1.Status`); boxing it is the
// status module's call.

mod apply;
mod fieldset;
mod json;
mod keys;
mod smp;

pub use apply::{ManagerScope, apply, apply_in, record_update, record_update_in};
pub use json::json_patch;
pub use keys::{
    AtomicLists, BuiltinListKeys, ListKeys, SchemaListKeys, builtin_key_default, builtin_merge_key,
};
pub use smp::strategic_merge_patch;

use serde_json::Value;

/// Applies a JSON merge patch (RFC 7386): objects merge recursively, `null`
/// removes a field, anything else (lists included) replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(serde_json::Map::new());
    }
    if let Value::Object(map) = target {
        for (key, value) in patch {
            if value.is_null() {
                map.remove(key);
            } else {
                merge_patch(map.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_follows_rfc7386() {
        // The RFC's own example.
        let mut doc = json!({
            "title": "Goodbye!",
            "author": {"givenName": "John", "familyName": "Doe"},
            "tags": ["example", "sample"],
            "content": "This will be unchanged"
        });
        merge_patch(
            &mut doc,
            &json!({
                "title": "Hello!",
                "phoneNumber": "+01-555-555-5555",
                "author": {"familyName": null},
                "tags": ["example"]
            }),
        );
        assert_eq!(
            doc,
            json!({
                "title": "Hello!",
                "author": {"givenName": "John"},
                "tags": ["example"],
                "content": "This will be unchanged",
                "phoneNumber": "+01-555-555-5555"
            })
        );
    }

    #[test]
    fn merge_patch_on_a_trainjob() {
        let mut job = json!({
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": "pytorch-dist", "labels": {"team": "a"}},
            "spec": {"runtimeRef": {"name": "torch-distributed"}, "suspend": true,
                     "trainer": {"numNodes": 2, "command": ["torchrun", "train.py"]}}
        });
        merge_patch(
            &mut job,
            &json!({"metadata": {"labels": {"team": null, "tier": "gold"}},
                    "spec": {"suspend": false, "trainer": {"command": ["python"]}}}),
        );
        assert_eq!(job["metadata"]["labels"], json!({"tier": "gold"}));
        assert_eq!(job["spec"]["suspend"], json!(false));
        assert_eq!(job["spec"]["trainer"]["numNodes"], json!(2));
        assert_eq!(job["spec"]["trainer"]["command"], json!(["python"]));
        // A non-object patch replaces the document; an object patch on a
        // scalar starts from an empty object.
        let mut v = json!(3);
        merge_patch(&mut v, &json!({"a": {"b": null, "c": 1}}));
        assert_eq!(v, json!({"a": {"c": 1}}));
        merge_patch(&mut v, &json!([1]));
        assert_eq!(v, json!([1]));
    }
}
