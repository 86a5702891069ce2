//! The permissions the backend uses, as `(apiGroup, resource, verb)`: what
//! `manifests/rbac/trainspoke-clusterrole.yaml` must grant. A test checks
//! the file against this table both ways, so the role is exact.

/// Every call the backend makes, by API group, resource and verb.
pub const USED: &[(&str, &str, &str)] = &[
    // start: read back the JobSet, apply it (server-side apply is a patch
    // that may create); restart: list by label; watch; stop: delete.
    ("jobset.x-k8s.io", "jobsets", "get"),
    ("jobset.x-k8s.io", "jobsets", "list"),
    ("jobset.x-k8s.io", "jobsets", "watch"),
    ("jobset.x-k8s.io", "jobsets", "create"),
    ("jobset.x-k8s.io", "jobsets", "patch"),
    ("jobset.x-k8s.io", "jobsets", "delete"),
    // The run's other objects: applied (an immutable Secret created once),
    // deleted by label on a stop.
    ("scheduling.x-k8s.io", "podgroups", "create"),
    ("scheduling.x-k8s.io", "podgroups", "patch"),
    ("scheduling.x-k8s.io", "podgroups", "deletecollection"),
    ("scheduling.volcano.sh", "podgroups", "create"),
    ("scheduling.volcano.sh", "podgroups", "patch"),
    ("scheduling.volcano.sh", "podgroups", "deletecollection"),
    ("", "configmaps", "create"),
    ("", "configmaps", "patch"),
    ("", "configmaps", "deletecollection"),
    ("", "secrets", "create"),
    ("", "secrets", "patch"),
    ("", "secrets", "deletecollection"),
    // Watchers (list, then watch) of pods and nodes; logs.
    ("", "pods", "list"),
    ("", "pods", "watch"),
    ("", "pods/log", "get"),
    ("", "nodes", "list"),
    ("", "nodes", "watch"),
    // The run's namespace: checked, created with --create-namespaces.
    ("", "namespaces", "get"),
    ("", "namespaces", "create"),
];

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::Value;

    use super::USED;
    use crate::backend::kube::objects::Kind;

    const ROLE: &str = include_str!("../../../../manifests/rbac/trainspoke-clusterrole.yaml");

    /// Every `(group, resource, verb)` the role grants.
    fn granted() -> BTreeSet<(String, String, String)> {
        let role: Value = serde_saphyr::from_str(ROLE).expect("the ClusterRole is YAML");
        assert_eq!(role["kind"], "ClusterRole");
        assert_eq!(role["metadata"]["name"], "trainspoke");
        let strings = |v: &Value| -> Vec<String> {
            v.as_array()
                .expect("a list")
                .iter()
                .map(|s| s.as_str().expect("a string").to_owned())
                .collect()
        };
        let mut out = BTreeSet::new();
        for rule in role["rules"].as_array().expect("rules") {
            for group in strings(&rule["apiGroups"]) {
                for resource in strings(&rule["resources"]) {
                    for verb in strings(&rule["verbs"]) {
                        assert_ne!(verb, "*", "no wildcard verbs");
                        assert_ne!(resource, "*", "no wildcard resources");
                        out.insert((group.clone(), resource.clone(), verb));
                    }
                }
            }
        }
        out
    }

    fn used() -> BTreeSet<(String, String, String)> {
        USED.iter()
            .map(|(g, r, v)| ((*g).to_owned(), (*r).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn the_cluster_role_grants_every_call_the_backend_makes() {
        let granted = granted();
        let missing: Vec<_> = used().difference(&granted).cloned().collect();
        assert!(missing.is_empty(), "not granted: {missing:?}");
    }

    #[test]
    fn the_cluster_role_grants_nothing_else() {
        let extra: Vec<_> = granted().difference(&used()).cloned().collect();
        assert!(extra.is_empty(), "granted but never used: {extra:?}");
    }

    #[test]
    fn every_kind_the_backend_applies_can_be_applied_and_deleted() {
        for kind in Kind::ALL {
            let ar = kind.api_resource();
            for verb in ["create", "patch"] {
                assert!(
                    USED.contains(&(ar.group.as_str(), ar.plural.as_str(), verb)),
                    "{} {verb}",
                    kind.describe()
                );
            }
            let delete = if kind == Kind::JobSet {
                "delete"
            } else {
                "deletecollection"
            };
            assert!(
                USED.contains(&(ar.group.as_str(), ar.plural.as_str(), delete)),
                "{} {delete}",
                kind.describe()
            );
        }
    }
}
