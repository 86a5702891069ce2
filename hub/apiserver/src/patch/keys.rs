//! How lists merge: the list-map keys of strategic merge patches and
//! server-side apply, from a resource's OpenAPI v3 schema
//! (`x-kubernetes-list-type`, `x-kubernetes-list-map-keys`,
//! `x-kubernetes-patch-merge-key`) with a built-in table for the core
//! Kubernetes types that CRDs embed.

use serde_json::Value;

/// How the list at a path merges.
///
/// `path` holds the field names from the object's root to the list; list
/// items are not counted, e.g. `["spec", "template", "spec", "replicatedJobs"]`
/// or `["spec", "template", "spec", "replicatedJobs", "template", "spec",
/// "template", "spec", "containers"]`.
pub trait ListKeys {
    /// `None`: the list is atomic (a patch or an apply replaces it whole);
    /// `Some([])`: a set of scalars (merged as a union); `Some(keys)`: a map
    /// whose items are identified by the values of `keys`.
    ///
    /// Strategic merge patches use the first key only, as the Go struct tags
    /// of the core types do (`ports` merge on `containerPort`).
    fn merge_key(&self, path: &[&str]) -> Option<Vec<String>>;

    /// The default of a key field that an item of the list at `path` omits,
    /// e.g. `protocol: TCP` for container ports.
    fn key_default(&self, path: &[&str], key: &str) -> Option<Value> {
        builtin_key_default(path, key)
    }
}

/// The built-in table alone: for objects without a schema.
#[derive(Debug, Clone, Copy, Default)]
pub struct BuiltinListKeys;

impl ListKeys for BuiltinListKeys {
    fn merge_key(&self, path: &[&str]) -> Option<Vec<String>> {
        builtin_merge_key(path)
    }
}

/// Every list atomic: what a JSON merge patch does.
#[derive(Debug, Clone, Copy, Default)]
pub struct AtomicLists;

impl ListKeys for AtomicLists {
    fn merge_key(&self, _path: &[&str]) -> Option<Vec<String>> {
        None
    }
    fn key_default(&self, _path: &[&str], _key: &str) -> Option<Value> {
        None
    }
}

/// List keys read from an OpenAPI v3 schema (a CRD version's
/// `openAPIV3Schema`), falling back to the built-in table where the schema has
/// no list markers or does not describe the path
/// (`x-kubernetes-preserve-unknown-fields`).
#[derive(Debug, Clone)]
pub struct SchemaListKeys {
    schema: Value,
}

impl SchemaListKeys {
    pub fn new(schema: Value) -> Self {
        SchemaListKeys { schema }
    }

    /// The schema of `version` in a CustomResourceDefinition object.
    pub fn from_crd(crd: &Value, version: &str) -> Option<Self> {
        crd.pointer("/spec/versions")?
            .as_array()?
            .iter()
            .find(|v| v.get("name").and_then(Value::as_str) == Some(version))
            .and_then(|v| v.pointer("/schema/openAPIV3Schema"))
            .map(|s| SchemaListKeys::new(s.clone()))
    }

    /// The schema node of the list at `path`, when the schema describes it.
    fn node(&self, path: &[&str]) -> Option<&Value> {
        let mut node = &self.schema;
        for name in path {
            // A list's items are not counted in the path.
            if node.get("type").and_then(Value::as_str) == Some("array") {
                node = node.get("items")?;
            }
            node = match node.get("properties").and_then(|p| p.get(*name)) {
                Some(n) => n,
                None => match node.get("additionalProperties") {
                    Some(ap) if ap.is_object() => ap,
                    _ => return None,
                },
            };
        }
        Some(node)
    }
}

impl ListKeys for SchemaListKeys {
    fn merge_key(&self, path: &[&str]) -> Option<Vec<String>> {
        let Some(node) = self.node(path) else {
            return builtin_merge_key(path);
        };
        match node.get("x-kubernetes-list-type").and_then(Value::as_str) {
            Some("atomic") => return None,
            Some("set") => return Some(Vec::new()),
            Some("map") => {
                let keys: Vec<String> = node
                    .get("x-kubernetes-list-map-keys")
                    .and_then(Value::as_array)
                    .map(|ks| {
                        ks.iter()
                            .filter_map(Value::as_str)
                            .map(String::from)
                            .collect()
                    })
                    .unwrap_or_default();
                if !keys.is_empty() {
                    return Some(keys);
                }
            }
            _ => {}
        }
        if let Some(key) = node
            .get("x-kubernetes-patch-merge-key")
            .and_then(Value::as_str)
        {
            return Some(vec![key.to_string()]);
        }
        if node
            .get("x-kubernetes-patch-strategy")
            .and_then(Value::as_str)
            .is_some_and(|s| s.split(',').any(|s| s == "merge"))
        {
            return Some(Vec::new());
        }
        builtin_merge_key(path)
    }

    fn key_default(&self, path: &[&str], key: &str) -> Option<Value> {
        self.node(path)
            .and_then(|n| n.pointer(&format!("/items/properties/{key}/default")))
            .cloned()
            .or_else(|| builtin_key_default(path, key))
    }
}

/// The list keys of the core Kubernetes types embedded in Trainer and JobSet
/// objects (pod templates, conditions), by the list's field name, as their Go
/// types declare them (`+listType=map`, `+listMapKey`, `+patchMergeKey`).
pub fn builtin_merge_key(path: &[&str]) -> Option<Vec<String>> {
    let name = *path.last()?;
    let keys: &[&str] = match name {
        "containers" | "initContainers" | "ephemeralContainers" => &["name"],
        "env"
        | "volumes"
        | "imagePullSecrets"
        | "replicatedJobs"
        | "resourceClaims"
        | "schedulingGates"
        | "claims"
        | "dependsOn"
        | "jobsStatus"
        | "replicatedJobsStatus" => &["name"],
        "ports" => &["containerPort", "protocol"],
        "volumeMounts" => &["mountPath"],
        "volumeDevices" => &["devicePath"],
        "hostAliases" => &["ip"],
        "conditions" => &["type"],
        "topologySpreadConstraints" => &["topologyKey", "whenUnsatisfiable"],
        "ownerReferences" => &["uid"],
        "runtimePatches" => &["manager"],
        "finalizers" => &[],
        // tolerations, args, command, envFrom and the rest are atomic.
        _ => return None,
    };
    Some(keys.iter().map(|k| k.to_string()).collect())
}

/// Defaults of key fields in the built-in table: container ports' protocol.
pub fn builtin_key_default(path: &[&str], key: &str) -> Option<Value> {
    match (path.last().copied(), key) {
        (Some("ports"), "protocol") => Some(Value::String("TCP".into())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd(file: &str) -> Value {
        let path = format!("{}/../../manifests/crds/{file}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(path).unwrap();
        serde_saphyr::from_str(&text).unwrap()
    }

    #[test]
    fn reads_list_map_keys_from_the_trainingruntime_crd() {
        let keys = SchemaListKeys::from_crd(
            &crd("trainer.kubeflow.org_trainingruntimes.yaml"),
            "v1alpha1",
        )
        .unwrap();
        let rj = ["spec", "template", "spec", "replicatedJobs"];
        assert_eq!(keys.merge_key(&rj), Some(vec!["name".to_string()]));
        let pod = [
            "spec",
            "template",
            "spec",
            "replicatedJobs",
            "template",
            "spec",
            "template",
            "spec",
        ];
        let at = |tail: &[&str]| {
            let mut p = pod.to_vec();
            p.extend_from_slice(tail);
            keys.merge_key(&p)
        };
        assert_eq!(at(&["containers"]), Some(vec!["name".into()]));
        assert_eq!(at(&["containers", "env"]), Some(vec!["name".into()]));
        assert_eq!(
            at(&["containers", "ports"]),
            Some(vec!["containerPort".into(), "protocol".into()])
        );
        assert_eq!(
            at(&["containers", "volumeMounts"]),
            Some(vec!["mountPath".into()])
        );
        // Explicitly atomic in the schema.
        assert_eq!(at(&["containers", "args"]), None);
        assert_eq!(at(&["tolerations"]), None);
        let mut ports = pod.to_vec();
        ports.extend(["containers", "ports"]);
        assert_eq!(keys.key_default(&ports, "protocol"), Some("TCP".into()));
    }

    #[test]
    fn trainjob_crd_keys_and_builtin_fallback() {
        let keys =
            SchemaListKeys::from_crd(&crd("trainer.kubeflow.org_trainjobs.yaml"), "v1alpha1")
                .unwrap();
        assert_eq!(
            keys.merge_key(&["status", "conditions"]),
            Some(vec!["type".into()])
        );
        assert_eq!(
            keys.merge_key(&["spec", "trainer", "env"]),
            Some(vec!["name".into()])
        );
        // Not described by the schema: the built-in table answers.
        assert_eq!(
            keys.merge_key(&["metadata", "finalizers"]),
            Some(Vec::<String>::new())
        );
        assert_eq!(keys.merge_key(&["spec", "trainer", "command"]), None);
    }

    #[test]
    fn builtin_table() {
        assert_eq!(
            BuiltinListKeys.merge_key(&["spec", "volumes"]),
            Some(vec!["name".into()])
        );
        assert_eq!(BuiltinListKeys.merge_key(&["spec", "tolerations"]), None);
        assert_eq!(
            BuiltinListKeys.merge_key(&["spec", "hostAliases"]),
            Some(vec!["ip".into()])
        );
    }
}
