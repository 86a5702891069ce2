//! The hub's API: which resources it serves, read from the CRDs in
//! `manifests/crds/` (so discovery, OpenAPI, printer columns and field
//! pruning follow the same schema a real API server would enforce): the
//! trainer kinds, Kueue's kinds (see [`crate::kueue`]) and the hub's own
//! `Spoke` (see [`crate::spokes`]), plus the read-only core views of what
//! spokes report (pods, events), the configuration clients read
//! (configmaps), namespaces (the tenants) and the self reviews of `kubectl
//! auth`.

use std::sync::Arc;

use anyhow::{Context, Result, anyhow};
use serde_json::Value;
use trainhub_apiserver::resource::{
    Conversion, NoConversion, PrinterColumn, ResourceDef, StorageVersion,
};

const CRDS: &[(&str, &str)] = &[
    (
        "trainer.kubeflow.org_trainjobs.yaml",
        include_str!("../../../manifests/crds/trainer.kubeflow.org_trainjobs.yaml"),
    ),
    (
        "trainer.kubeflow.org_trainingruntimes.yaml",
        include_str!("../../../manifests/crds/trainer.kubeflow.org_trainingruntimes.yaml"),
    ),
    (
        "trainer.kubeflow.org_clustertrainingruntimes.yaml",
        include_str!("../../../manifests/crds/trainer.kubeflow.org_clustertrainingruntimes.yaml"),
    ),
    (
        "trainhub.kubeflow.org_spokes.yaml",
        include_str!("../../../manifests/crds/trainhub.kubeflow.org_spokes.yaml"),
    ),
    (
        "trainhub.kubeflow.org_trainerplugins.yaml",
        include_str!("../../../manifests/crds/trainhub.kubeflow.org_trainerplugins.yaml"),
    ),
];

/// Store keys of the trainer kinds.
pub const TRAINJOBS: &str = "trainer.kubeflow.org/trainjobs";
pub const TRAINING_RUNTIMES: &str = "trainer.kubeflow.org/trainingruntimes";
pub const CLUSTER_TRAINING_RUNTIMES: &str = "trainer.kubeflow.org/clustertrainingruntimes";
/// Store key of the hub's Spoke kind (cluster-scoped).
pub const SPOKES: &str = "trainhub.kubeflow.org/spokes";
pub const PODS: &str = "pods";
pub const EVENTS: &str = "events";
pub const CONFIGMAPS: &str = "configmaps";

/// Every resource the hub serves.
pub fn resources() -> Result<Vec<ResourceDef>> {
    let mut defs = Vec::new();
    for (file, text) in CRDS {
        let crd: Value = serde_saphyr::from_str(text).with_context(|| format!("parsing {file}"))?;
        compile_rules(&crd).with_context(|| format!("compiling the rules of {file}"))?;
        defs.extend(from_crd(&crd, None).with_context(|| format!("reading {file}"))?);
    }
    defs.extend(crate::kueue::api::resources()?);
    if let Some(trainjobs) = defs.iter_mut().find(|d| d.store_key() == TRAINJOBS) {
        trainjobs.printer_columns.push(spoke_column());
        trainjobs.printer_columns.extend(progress_columns());
    }
    defs.extend(core_resources());
    defs.push(trainhub_apiserver::namespace::resource_def());
    defs.push(trainhub_apiserver::quota::resource_def());
    defs.extend(trainhub_apiserver::review::resource_defs());
    Ok(defs)
}

/// Compiles the `x-kubernetes-validations` rules of every version of a
/// CRD: a CRD is served only if each of its rules compiles (see
/// [`crate::admission::Schema::compile`]).
fn compile_rules(crd: &Value) -> Result<()> {
    for version in crd["spec"]["versions"].as_array().into_iter().flatten() {
        if let Some(schema) = version.pointer("/schema/openAPIV3Schema") {
            crate::admission::Schema::compile(schema)
                .with_context(|| format!("version {}", version["name"]))?;
        }
    }
    Ok(())
}

/// The SPOKE column of `kubectl get trainjobs`: where the TrainJob runs,
/// from the annotation dispatch writes with its placement. It comes after
/// upstream's own columns, which stay as upstream's CRD has them.
fn spoke_column() -> PrinterColumn {
    PrinterColumn {
        name: "Spoke".into(),
        type_: "string".into(),
        json_path: format!(
            ".metadata.annotations['{}']",
            crate::dispatch::ANNOTATION_SPOKE
        ),
        description: "The spoke the TrainJob is placed on.".into(),
        priority: 0,
        render: None,
    }
}

/// PROGRESS and ETA of `kubectl get trainjobs`: what the training pods
/// last posted to `status.trainerStatus` (percent done, seconds left), as
/// numbers: a column's cells are what its JSONPath finds.
fn progress_columns() -> [PrinterColumn; 2] {
    [
        PrinterColumn {
            name: "Progress".into(),
            type_: "integer".into(),
            json_path: ".status.trainerStatus.progressPercentage".into(),
            description: "Training progress in percent, as the trainer last reported it.".into(),
            priority: 0,
            render: None,
        },
        PrinterColumn {
            name: "ETA".into(),
            type_: "integer".into(),
            json_path: ".status.trainerStatus.estimatedRemainingSeconds".into(),
            description:
                "Estimated training time left in seconds, as the trainer last reported it.".into(),
            priority: 0,
            render: None,
        },
    ]
}

/// The served versions of a CustomResourceDefinition, one [`ResourceDef`]
/// each, the storage version first. The other versions are stored at the
/// storage version and go through `conversion`; without one, as a CRD
/// without a conversion webhook (`strategy: None`), only their
/// `apiVersion` changes. A deprecated version warns as kube-apiserver does:
/// its `deprecationWarning`, or `GROUP/VERSION KIND is deprecated; use
/// GROUP/PREFERRED KIND`.
pub fn from_crd(crd: &Value, conversion: Option<Arc<dyn Conversion>>) -> Result<Vec<ResourceDef>> {
    let spec = &crd["spec"];
    let names = &spec["names"];
    let text = |v: &Value, what: &str| -> Result<String> {
        v.as_str()
            .map(str::to_string)
            .ok_or_else(|| anyhow!("{what} is missing"))
    };
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    };
    let group = text(&spec["group"], "spec.group")?;
    let kind = text(&names["kind"], "spec.names.kind")?;
    let served: Vec<&Value> = spec["versions"]
        .as_array()
        .map(|vs| {
            vs.iter()
                .filter(|v| v["served"].as_bool() != Some(false))
                .collect()
        })
        .unwrap_or_default();
    let storage = match served.as_slice() {
        [] => return Err(anyhow!("spec.versions has no served version")),
        [only] => *only,
        _ => served
            .iter()
            .copied()
            .find(|v| v["storage"].as_bool() == Some(true))
            .ok_or_else(|| anyhow!("spec.versions: no served version is the storage version"))?,
    };
    let storage_name = text(&storage["name"], "spec.versions[].name")?;
    // Where kubectl goes by default: the storage version unless deprecated.
    let preferred = served
        .iter()
        .find(|v| v["deprecated"].as_bool() != Some(true))
        .map_or(storage_name.clone(), |v| {
            v["name"].as_str().unwrap_or_default().to_string()
        });
    let conversion: Arc<dyn Conversion> = conversion.unwrap_or_else(|| Arc::new(NoConversion));
    let mut ordered = vec![storage];
    ordered.extend(
        served
            .iter()
            .copied()
            .filter(|v| !std::ptr::eq(*v, storage)),
    );
    let mut defs = Vec::new();
    for version in ordered {
        let name = text(&version["name"], "spec.versions[].name")?;
        let deprecation_warning = (version["deprecated"].as_bool() == Some(true)).then(|| {
            version["deprecationWarning"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| {
                    format!("{group}/{name} {kind} is deprecated; use {group}/{preferred} {kind}")
                })
        });
        defs.push(ResourceDef {
            group: group.clone(),
            version: name.clone(),
            kind: kind.clone(),
            list_kind: names["listKind"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| format!("{kind}List")),
            plural: text(&names["plural"], "spec.names.plural")?,
            singular: names["singular"].as_str().unwrap_or_default().to_string(),
            short_names: strings(&names["shortNames"]),
            categories: strings(&names["categories"]),
            namespaced: spec["scope"].as_str() == Some("Namespaced"),
            status_subresource: version["subresources"]["status"].is_object(),
            printer_columns: printer_columns(version),
            schema: version["schema"]["openAPIV3Schema"]
                .as_object()
                .map(|o| Value::Object(o.clone())),
            selectable_fields: version["selectableFields"]
                .as_array()
                .map(|fs| {
                    fs.iter()
                        .filter_map(|f| f["jsonPath"].as_str())
                        .map(|p| p.trim_start_matches('.').to_string())
                        .collect()
                })
                .unwrap_or_default(),
            storage: (name != storage_name).then(|| StorageVersion {
                version: storage_name.clone(),
                conversion: conversion.clone(),
            }),
            deprecation_warning,
            ..Default::default()
        });
    }
    Ok(defs)
}

/// The `additionalPrinterColumns` of a CRD version.
fn printer_columns(version: &Value) -> Vec<PrinterColumn> {
    version["additionalPrinterColumns"]
        .as_array()
        .map(|cols| {
            cols.iter()
                .map(|c| PrinterColumn {
                    name: c["name"].as_str().unwrap_or_default().to_string(),
                    type_: c["type"].as_str().unwrap_or("string").to_string(),
                    json_path: c["jsonPath"].as_str().unwrap_or_default().to_string(),
                    description: c["description"].as_str().unwrap_or_default().to_string(),
                    priority: c["priority"].as_i64().unwrap_or(0) as i32,
                    render: None,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The core/v1 views: pods (with logs) and events of TrainJobs as spokes
/// report them, and configmaps the hub publishes (the Kubeflow SDK reads
/// `kubeflow-system/kubeflow-trainer-public` for the trainer version).
fn core_resources() -> Vec<ResourceDef> {
    let core = |kind: &str, plural: &str, short: &[&str]| ResourceDef {
        group: String::new(),
        version: "v1".into(),
        kind: kind.into(),
        list_kind: format!("{kind}List"),
        plural: plural.into(),
        singular: kind.to_ascii_lowercase(),
        short_names: short.iter().map(|s| s.to_string()).collect(),
        namespaced: true,
        read_only: true,
        ..Default::default()
    };
    let column = |name: &str, type_: &str, json_path: &str| PrinterColumn {
        name: name.into(),
        type_: type_.into(),
        json_path: json_path.into(),
        description: String::new(),
        priority: 0,
        render: None,
    };
    let mut pods = core("Pod", "pods", &["po"]);
    pods.log_subresource = true;
    pods.categories = vec!["all".into()];
    pods.selectable_fields = vec!["spec.nodeName".into(), "status.phase".into()];
    pods.printer_columns = vec![
        column("Status", "string", ".status.phase"),
        column(
            "Restarts",
            "integer",
            ".status.containerStatuses[0].restartCount",
        ),
        column("Node", "string", ".spec.nodeName"),
        column("Age", "date", ".metadata.creationTimestamp"),
    ];
    let mut events = core("Event", "events", &["ev"]);
    events.selectable_fields = [
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    events.printer_columns = vec![
        column("Last Seen", "date", ".lastTimestamp"),
        column("Type", "string", ".type"),
        column("Reason", "string", ".reason"),
        column("Object", "string", ".involvedObject.name"),
        column("Message", "string", ".message"),
    ];
    let mut configmaps = core("ConfigMap", "configmaps", &["cm"]);
    configmaps.printer_columns = vec![column("Age", "date", ".metadata.creationTimestamp")];
    vec![pods, events, configmaps]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_served_version_of_a_crd_is_a_resource_the_storage_version_first() {
        let version = |name: &str, storage: bool, extra: Value| {
            let mut v = serde_json::json!({
                "name": name, "served": true, "storage": storage,
                "schema": {"openAPIV3Schema": {"type": "object"}},
                "additionalPrinterColumns": [{"name": "Size", "type": "integer", "jsonPath": format!(".spec.{name}")}],
            });
            if let (Some(v), Some(extra)) = (v.as_object_mut(), extra.as_object()) {
                v.extend(extra.clone());
            }
            v
        };
        let crd = serde_json::json!({"spec": {
            "group": "example.com",
            "names": {"kind": "Gadget", "plural": "gadgets", "singular": "gadget"},
            "scope": "Namespaced",
            "versions": [
                version("v1alpha1", false, serde_json::json!({"deprecated": true})),
                version("v1", true, serde_json::json!({})),
                version("v1beta1", false, serde_json::json!({"deprecated": true, "deprecationWarning": "gone soon"})),
                version("v0", false, serde_json::json!({"served": false})),
            ],
        }});
        let defs = from_crd(&crd, None).unwrap();
        let versions: Vec<&str> = defs.iter().map(|d| d.version.as_str()).collect();
        assert_eq!(versions, ["v1", "v1alpha1", "v1beta1"]);
        assert!(defs[0].is_storage_version() && defs[0].deprecation_warning.is_none());
        assert_eq!(defs[1].storage_version(), "v1");
        assert_eq!(
            defs[1].deprecation_warning.as_deref(),
            Some("example.com/v1alpha1 Gadget is deprecated; use example.com/v1 Gadget")
        );
        assert_eq!(defs[2].deprecation_warning.as_deref(), Some("gone soon"));
        assert_eq!(defs[2].printer_columns[0].json_path, ".spec.v1beta1");
        assert!(
            defs.iter()
                .all(|d| d.list_kind == "GadgetList" && d.namespaced)
        );
        let no_storage = serde_json::json!({"spec": {
            "group": "example.com", "names": {"kind": "Gadget", "plural": "gadgets"},
            "versions": [version("v1", false, serde_json::json!({})), version("v2", false, serde_json::json!({}))],
        }});
        assert!(from_crd(&no_storage, None).is_err());
    }

    #[test]
    fn trainer_resources_come_from_the_crds() {
        let defs = resources().unwrap();
        let tj = defs.iter().find(|d| d.plural == "trainjobs").unwrap();
        assert_eq!(tj.group, "trainer.kubeflow.org");
        assert_eq!(tj.version, "v1alpha1");
        assert_eq!(tj.kind, "TrainJob");
        assert!(tj.namespaced && tj.status_subresource);
        let columns: Vec<&str> = tj.printer_columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(columns, ["State", "Age", "Spoke", "Progress", "ETA"]);
        let placed = serde_json::json!({"metadata": {"annotations": {"trainhub.kubeflow.org/spoke": "gpu-1"}}});
        assert_eq!(
            trainhub_apiserver::table::jsonpath(&placed, &tj.printer_columns[2].json_path),
            [Value::from("gpu-1")]
        );
        assert_eq!(tj.store_key(), TRAINJOBS);
        let ctr = defs
            .iter()
            .find(|d| d.plural == "clustertrainingruntimes")
            .unwrap();
        assert!(!ctr.namespaced);
        assert_eq!(ctr.store_key(), CLUSTER_TRAINING_RUNTIMES);
        assert!(
            defs.iter()
                .any(|d| d.store_key() == PODS && d.read_only && d.log_subresource)
        );
        let spokes = defs.iter().find(|d| d.plural == "spokes").unwrap();
        assert_eq!(spokes.group, "trainhub.kubeflow.org");
        assert_eq!(spokes.kind, "Spoke");
        assert!(!spokes.namespaced && spokes.status_subresource);
        assert_eq!(spokes.short_names, ["sp"]);
        assert_eq!(spokes.store_key(), SPOKES);
        let columns: Vec<&str> = spokes
            .printer_columns
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(
            columns,
            [
                "Status",
                "Backend",
                "Capacity",
                "Free",
                "Running",
                "Flavors",
                "Queues",
                "Last Heartbeat",
                "Cert Expires",
                "Age",
                "Labels"
            ]
        );
        assert_eq!(spokes.printer_columns[6].priority, 1);
        assert_eq!(spokes.printer_columns[10].priority, 1);
        let ns = defs.iter().find(|d| d.plural == "namespaces").unwrap();
        assert!(!ns.namespaced && ns.short_names == ["ns"]);
        for plural in [
            "selfsubjectaccessreviews",
            "selfsubjectrulesreviews",
            "selfsubjectreviews",
        ] {
            let review = defs.iter().find(|d| d.plural == plural).unwrap();
            assert_eq!(review.verbs(), ["create"]);
        }
    }
}
