//! `Namespace` (core v1, cluster-scoped): what the object is and how
//! kube-apiserver's namespace strategy shapes it, as pure functions over
//! JSON. The server side (creation into missing or terminating namespaces
//! refused, the namespace controller that empties a deleted namespace, the
//! bootstrap of namespaces already in use) is in `server::namespaces`.
//!
//! - created `Active`, with the `kubernetes` finalizer in `spec.finalizers`
//!   and the label `kubernetes.io/metadata.name` set to its name;
//! - `spec` and `status` do not change through the main resource;
//! - deleted: marked (`deletionTimestamp`, `status.phase: Terminating`)
//!   while the namespace controller deletes its contents, then the
//!   `kubernetes` finalizer goes and with it the namespace.

use serde_json::{Value, json};

use crate::resource::{PrinterColumn, ResourceDef, kind_schema};

/// The store key (and plural) of namespaces.
pub const NAMESPACES: &str = "namespaces";
/// The finalizer in `spec.finalizers` that the namespace controller removes
/// once the namespace is empty.
pub const FINALIZER_KUBERNETES: &str = "kubernetes";
/// The label kube-apiserver sets on every namespace to its name (selectors,
/// Kueue's `namespaceSelector`, network policies select on it).
pub const LABEL_METADATA_NAME: &str = "kubernetes.io/metadata.name";
pub const PHASE_ACTIVE: &str = "Active";
pub const PHASE_TERMINATING: &str = "Terminating";
/// The namespace every client starts in.
pub const DEFAULT: &str = "default";

/// The served `Namespace` resource: `kubectl get ns` shows NAME STATUS AGE.
pub fn resource_def() -> ResourceDef {
    let column = |name: &str, type_: &str, json_path: &str, description: &str| PrinterColumn {
        name: name.into(),
        type_: type_.into(),
        json_path: json_path.into(),
        description: description.into(),
        priority: 0,
        render: None,
    };
    ResourceDef {
        group: String::new(),
        version: "v1".into(),
        kind: "Namespace".into(),
        list_kind: "NamespaceList".into(),
        plural: NAMESPACES.into(),
        singular: "namespace".into(),
        short_names: vec!["ns".into()],
        namespaced: false,
        status_subresource: true,
        printer_columns: vec![
            column(
                "Status",
                "string",
                ".status.phase",
                "The status of the namespace",
            ),
            column(
                "Age",
                "date",
                ".metadata.creationTimestamp",
                "CreationTimestamp is a timestamp representing the server time when this object was created.",
            ),
        ],
        schema: Some(kind_schema(
            "Namespace provides a scope for Names. Use of multiple namespaces is optional.",
            (
                "Spec defines the behavior of the Namespace.",
                json!({
                    "finalizers": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "atomic"},
                }),
            ),
            (
                "Status describes the current status of a Namespace.",
                json!({
                    "phase": {"type": "string", "enum": [PHASE_ACTIVE, PHASE_TERMINATING]},
                    "conditions": {
                        "type": "array",
                        "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                        "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["type"],
                    },
                }),
            ),
        )),
        ..Default::default()
    }
}

/// Whether `def` is the core `namespaces` resource.
pub fn is_namespaces(def: &ResourceDef) -> bool {
    def.group.is_empty() && def.plural == NAMESPACES
}

/// Whether a stored namespace is being deleted.
pub fn is_terminating(namespace: &Value) -> bool {
    !namespace["metadata"]["deletionTimestamp"].is_null()
        || namespace["status"]["phase"] == PHASE_TERMINATING
}

/// The namespace object `name` as the server creates it at start.
pub fn object(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
}

fn set_name_label(namespace: &mut Value, name: &str) {
    let metadata = &mut namespace["metadata"];
    if !metadata["labels"].is_object() {
        metadata["labels"] = json!({});
    }
    metadata["labels"][LABEL_METADATA_NAME] = name.into();
}

/// A namespace about to be created: `Active`, with the `kubernetes`
/// finalizer and the name label, whatever the client sent.
pub fn prepare_create(namespace: &mut Value, name: &str) {
    if !namespace.is_object() {
        return;
    }
    let mut finalizers: Vec<Value> = namespace["spec"]["finalizers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if !finalizers.iter().any(|f| f == FINALIZER_KUBERNETES) {
        finalizers.push(FINALIZER_KUBERNETES.into());
    }
    namespace["spec"] = json!({"finalizers": finalizers});
    namespace["status"] = json!({"phase": PHASE_ACTIVE});
    set_name_label(namespace, name);
}

/// A namespace about to be updated through the main resource: its `spec`
/// (finalizers) and `status` are the stored ones, its name label stays.
pub fn prepare_update(namespace: &mut Value, old: &Value, name: &str) {
    if !namespace.is_object() {
        return;
    }
    for field in ["spec", "status"] {
        match old.get(field) {
            Some(v) => namespace[field] = v.clone(),
            None => {
                if let Some(map) = namespace.as_object_mut() {
                    map.remove(field);
                }
            }
        }
    }
    set_name_label(namespace, name);
}

/// `spec.finalizers` of a namespace.
pub fn spec_finalizers(namespace: &Value) -> Vec<String> {
    namespace["spec"]["finalizers"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Marks a namespace as being deleted (`deletionTimestamp`, `Terminating`).
pub fn mark_terminating(namespace: &mut Value, now: &str) {
    if namespace["metadata"]["deletionTimestamp"].is_null() {
        namespace["metadata"]["deletionTimestamp"] = now.into();
        namespace["metadata"]["deletionGracePeriodSeconds"] = 0.into();
    }
    if !namespace["status"].is_object() {
        namespace["status"] = json!({});
    }
    namespace["status"]["phase"] = PHASE_TERMINATING.into();
}

/// A terminating namespace once its contents are gone: without the
/// `kubernetes` finalizer.
pub fn finalize(namespace: &mut Value) {
    let rest: Vec<String> = spec_finalizers(namespace)
        .into_iter()
        .filter(|f| f != FINALIZER_KUBERNETES)
        .collect();
    namespace["spec"]["finalizers"] = json!(rest);
}

/// The `NamespaceContentRemaining` condition kube's namespace controller
/// sets while objects remain (`remaining` as `kind: count`).
pub fn set_content_remaining(namespace: &mut Value, remaining: &[(String, usize)], now: &str) {
    let message = if remaining.is_empty() {
        "All content successfully removed".to_string()
    } else {
        let parts: Vec<String> = remaining
            .iter()
            .map(|(resource, n)| format!("{resource} has {n} resource instances"))
            .collect();
        format!("Some resources are remaining: {}", parts.join(", "))
    };
    let (status, reason) = if remaining.is_empty() {
        ("False", "ContentRemoved")
    } else {
        ("True", "SomeResourcesRemain")
    };
    let condition = json!({
        "type": "NamespaceContentRemaining",
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now,
    });
    if !namespace["status"].is_object() {
        namespace["status"] = json!({});
    }
    let conditions = &mut namespace["status"]["conditions"];
    if !conditions.is_array() {
        *conditions = json!([]);
    }
    if let Some(list) = conditions.as_array_mut() {
        match list
            .iter_mut()
            .find(|c| c["type"] == "NamespaceContentRemaining")
        {
            Some(c) if c["status"] == status && c["message"] == condition["message"] => {}
            Some(c) => *c = condition,
            None => list.push(condition),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_active_with_finalizer_and_name_label() {
        let mut ns = json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "team-a", "labels": {"tier": "gold", LABEL_METADATA_NAME: "spoofed"}},
            "spec": {"finalizers": ["example.com/keep"]}, "status": {"phase": "Terminating"}});
        prepare_create(&mut ns, "team-a");
        assert_eq!(ns["status"]["phase"], "Active");
        assert_eq!(
            spec_finalizers(&ns),
            vec!["example.com/keep".to_string(), "kubernetes".into()]
        );
        assert_eq!(ns["metadata"]["labels"][LABEL_METADATA_NAME], "team-a");
        assert_eq!(ns["metadata"]["labels"]["tier"], "gold");
        assert!(!is_terminating(&ns));
    }

    #[test]
    fn updates_keep_spec_status_and_name_label() {
        let mut old = object("a");
        prepare_create(&mut old, "a");
        let mut new = json!({"metadata": {"name": "a", "labels": {"x": "y"}},
            "spec": {"finalizers": []}, "status": {"phase": "Terminating"}});
        prepare_update(&mut new, &old, "a");
        assert_eq!(new["spec"], old["spec"]);
        assert_eq!(new["status"]["phase"], "Active");
        assert_eq!(new["metadata"]["labels"][LABEL_METADATA_NAME], "a");
        assert_eq!(new["metadata"]["labels"]["x"], "y");
    }

    #[test]
    fn terminating_then_finalized() {
        let mut ns = object("a");
        prepare_create(&mut ns, "a");
        mark_terminating(&mut ns, "2026-01-01T00:00:00Z");
        assert!(is_terminating(&ns));
        assert_eq!(ns["status"]["phase"], "Terminating");
        set_content_remaining(
            &mut ns,
            &[("trainjobs.trainer.kubeflow.org".into(), 2)],
            "t",
        );
        assert_eq!(
            ns["status"]["conditions"][0]["message"],
            "Some resources are remaining: trainjobs.trainer.kubeflow.org has 2 resource instances"
        );
        finalize(&mut ns);
        assert!(spec_finalizers(&ns).is_empty());
    }

    #[test]
    fn the_resource_is_cluster_scoped_ns() {
        let def = resource_def();
        assert!(is_namespaces(&def) && !def.namespaced);
        assert_eq!(def.short_names, vec!["ns"]);
        assert_eq!(def.store_key(), NAMESPACES);
        assert_eq!(def.printer_columns[0].name, "Status");
    }
}
