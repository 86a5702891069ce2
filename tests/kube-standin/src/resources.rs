//! The resources the stand-in serves: the kinds a spoke's cluster has that
//! its kube backend touches.

use trainhub_apiserver::resource::{PrinterColumn, ResourceDef};

/// One resource: group, version, kind, plural, namespaced.
struct Kind {
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    namespaced: bool,
    status: bool,
    short_names: &'static [&'static str],
}

const KINDS: &[Kind] = &[
    Kind {
        group: "",
        version: "v1",
        kind: "Namespace",
        plural: "namespaces",
        namespaced: false,
        status: true,
        short_names: &["ns"],
    },
    Kind {
        group: "",
        version: "v1",
        kind: "Node",
        plural: "nodes",
        namespaced: false,
        status: true,
        short_names: &["no"],
    },
    Kind {
        group: "",
        version: "v1",
        kind: "Pod",
        plural: "pods",
        namespaced: true,
        status: true,
        short_names: &["po"],
    },
    Kind {
        group: "",
        version: "v1",
        kind: "ConfigMap",
        plural: "configmaps",
        namespaced: true,
        status: false,
        short_names: &["cm"],
    },
    Kind {
        group: "",
        version: "v1",
        kind: "Secret",
        plural: "secrets",
        namespaced: true,
        status: false,
        short_names: &[],
    },
    Kind {
        group: "",
        version: "v1",
        kind: "Service",
        plural: "services",
        namespaced: true,
        status: true,
        short_names: &["svc"],
    },
    Kind {
        group: "",
        version: "v1",
        kind: "Event",
        plural: "events",
        namespaced: true,
        status: false,
        short_names: &["ev"],
    },
    Kind {
        group: "batch",
        version: "v1",
        kind: "Job",
        plural: "jobs",
        namespaced: true,
        status: true,
        short_names: &[],
    },
    Kind {
        group: "jobset.x-k8s.io",
        version: "v1alpha2",
        kind: "JobSet",
        plural: "jobsets",
        namespaced: true,
        status: true,
        short_names: &[],
    },
    Kind {
        group: "scheduling.x-k8s.io",
        version: "v1alpha1",
        kind: "PodGroup",
        plural: "podgroups",
        namespaced: true,
        status: true,
        short_names: &["pg", "pgs"],
    },
    Kind {
        group: "scheduling.volcano.sh",
        version: "v1beta1",
        kind: "PodGroup",
        plural: "podgroups",
        namespaced: true,
        status: true,
        short_names: &["pg", "podgroup-v1beta1"],
    },
];

fn column(name: &str, type_: &str, json_path: &str, priority: i32) -> PrinterColumn {
    PrinterColumn {
        name: name.into(),
        type_: type_.into(),
        json_path: json_path.into(),
        description: String::new(),
        priority,
        render: None,
    }
}

/// The printer columns `kubectl get` shows, close to kube-apiserver's own.
fn columns(plural: &str) -> Vec<PrinterColumn> {
    let age = column("Age", "date", ".metadata.creationTimestamp", 0);
    match plural {
        "pods" => vec![
            column("Status", "string", ".status.phase", 0),
            column(
                "Restarts",
                "integer",
                ".status.containerStatuses[0].restartCount",
                0,
            ),
            age,
            column("IP", "string", ".status.podIP", 1),
            column("Node", "string", ".spec.nodeName", 1),
        ],
        "namespaces" => vec![column("Status", "string", ".status.phase", 0), age],
        "jobs" => vec![
            column("Status", "string", ".status.conditions[-1:].type", 0),
            column("Completions", "integer", ".status.succeeded", 0),
            age,
        ],
        "jobsets" => vec![
            column("TerminalState", "string", ".status.terminalState", 0),
            column("Restarts", "integer", ".status.restarts", 0),
            column("Suspended", "boolean", ".spec.suspend", 0),
            age,
        ],
        _ => vec![age],
    }
}

/// Every served resource.
pub fn all() -> Vec<ResourceDef> {
    KINDS
        .iter()
        .map(|k| {
            let singular = k.kind.to_lowercase();
            ResourceDef {
                group: k.group.into(),
                version: k.version.into(),
                kind: k.kind.into(),
                list_kind: format!("{}List", k.kind),
                plural: k.plural.into(),
                singular,
                short_names: k.short_names.iter().map(|s| s.to_string()).collect(),
                categories: if k.group.is_empty() {
                    Vec::new()
                } else {
                    vec!["all".into()]
                },
                namespaced: k.namespaced,
                status_subresource: k.status,
                read_only: false,
                log_subresource: k.plural == "pods",
                printer_columns: columns(k.plural),
                schema: None,
                selectable_fields: match k.plural {
                    "pods" => vec!["spec.nodeName".into(), "status.phase".into()],
                    "events" => vec![
                        "involvedObject.name".into(),
                        "involvedObject.kind".into(),
                        "involvedObject.uid".into(),
                        "reason".into(),
                        "type".into(),
                    ],
                    _ => Vec::new(),
                },
                storage: None,
                deprecation_warning: None,
            }
        })
        .collect()
}

/// The store key of the namespaces resource.
pub const NAMESPACES: &str = "namespaces";
