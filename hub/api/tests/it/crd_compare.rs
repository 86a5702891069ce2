//! The generated CRDs match upstream's: names, scope, versions, subresources, printer columns,
//! and the whole schema: property tree, types, formats, validations, defaults, enums, bounds,
//! required fields, list and map types. Descriptions are not compared (ours are our own words).
//!
//! One difference is allowed, and printed: inside the embedded Kubernetes core types (EnvVar,
//! ResourceRequirements, JobSpec, ...) our schemas come from a newer Kubernetes API (k8s-openapi's
//! latest) than upstream was generated against, so they may have properties upstream lacks.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{Map, Value};
use trainhub_api::crd;

use crate::support::{json_diff, read, trainer_dir};

/// Keywords compared on every trainer-owned node.
const KEYWORDS: &[&str] = &[
    "type",
    "format",
    "required",
    "default",
    "enum",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "pattern",
    "nullable",
    "anyOf",
    "x-kubernetes-validations",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
    "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-embedded-resource",
];

/// The Pod spec patch inside a TrainJob's runtime patches.
const POD_SPEC_PATCH: &str = "spec.runtimePatches.[].trainingRuntimeSpec.template.spec.replicatedJobs.[].template.spec.template.spec";

/// Schema nodes that are embedded Kubernetes core types; `*` matches one path segment.
fn core_type_roots() -> Vec<String> {
    let mut roots: Vec<String> = [
        "spec.initializer.*.env.[]",
        "spec.initializer.*.secretRef",
        "spec.trainer.env.[]",
        "spec.trainer.resourcesPerNode",
        "status.conditions.[]",
        "spec.template.spec.replicatedJobs.[].template.spec",
        "spec.template.spec.volumeClaimPolicies.[].templates.[]",
    ]
    .map(String::from)
    .into();
    for patched in [
        "affinity",
        "*.[].env.[]",
        "*.[].securityContext",
        "*.[].volumeMounts.[]",
        "imagePullSecrets.[]",
        "schedulingGates.[]",
        "securityContext",
        "tolerations.[]",
        "volumes.[]",
    ] {
        roots.push(format!("{POD_SPEC_PATCH}.{patched}"));
    }
    roots
}

fn matches(pattern: &str, path: &[String]) -> bool {
    let pattern: Vec<&str> = pattern.split('.').collect();
    pattern.len() == path.len() && pattern.iter().zip(path).all(|(p, s)| *p == "*" || p == s)
}

#[derive(Default)]
struct Report {
    /// Differences the test fails on.
    owned: Vec<String>,
    /// Properties of core types that only our (newer) Kubernetes API has: printed only.
    core: Vec<String>,
}

/// Numbers compare by value (`1` equals `1.0`), `required` as a set.
fn normalized(keyword: &str, value: &Value) -> Value {
    match (keyword, value) {
        (_, Value::Number(n)) => n.as_f64().map_or(Value::Null, Value::from),
        ("required", Value::Array(names)) => {
            let mut names = names.clone();
            names.sort_by_key(|n| n.to_string());
            Value::Array(names)
        }
        _ => value.clone(),
    }
}

fn compare(
    ours: &Value,
    theirs: &Value,
    path: &mut Vec<String>,
    in_core: bool,
    roots: &[String],
    report: &mut Report,
) {
    let in_core = in_core || roots.iter().any(|root| matches(root, path));
    let location = if path.is_empty() {
        "<root>".to_owned()
    } else {
        path.join(".")
    };
    let empty = Map::new();
    let ours = ours.as_object().unwrap_or(&empty);
    let theirs = theirs.as_object().unwrap_or(&empty);

    for keyword in KEYWORDS {
        let a = ours.get(*keyword).map(|v| normalized(keyword, v));
        let b = theirs.get(*keyword).map(|v| normalized(keyword, v));
        if a != b {
            let show = |v: &Option<Value>| v.as_ref().map_or("absent".to_owned(), Value::to_string);
            report.owned.push(format!(
                "{location}: {keyword}: ours {}, upstream {}",
                show(&a),
                show(&b)
            ));
        }
    }

    let properties = |schema: &Map<String, Value>| {
        schema
            .get("properties")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default()
    };
    let (our_props, their_props) = (properties(ours), properties(theirs));
    for name in our_props.keys().filter(|n| !their_props.contains_key(*n)) {
        let sink = if in_core {
            &mut report.core
        } else {
            &mut report.owned
        };
        sink.push(format!("{location}: property {name} only in ours"));
    }
    for name in their_props.keys().filter(|n| !our_props.contains_key(*n)) {
        report
            .owned
            .push(format!("{location}: property {name} only upstream"));
    }
    let mut children: Vec<(String, &Value, &Value)> = Vec::new();
    for (name, child) in &our_props {
        if let Some(other) = their_props.get(name) {
            children.push((name.clone(), child, other));
        }
    }
    for (segment, keyword) in [("[]", "items"), ("{}", "additionalProperties")] {
        match (ours.get(keyword), theirs.get(keyword)) {
            (Some(a), Some(b)) if a.is_object() && b.is_object() => {
                children.push((segment.into(), a, b))
            }
            (a, b) if a != b => report.owned.push(format!(
                "{location}: {keyword}: ours {}, upstream {}",
                a.map_or("absent".to_owned(), Value::to_string),
                b.map_or("absent".to_owned(), Value::to_string)
            )),
            _ => {}
        }
    }
    for (segment, a, b) in children {
        path.push(segment);
        compare(a, b, path, in_core, roots, report);
        path.pop();
    }
}

fn schema(crd: &Value) -> &Value {
    &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
}

fn check(ours: CustomResourceDefinition, upstream_file: &str) {
    let ours = serde_json::to_value(&ours).unwrap();
    let theirs: Value =
        serde_saphyr::from_str(&read(&trainer_dir().join("crds").join(upstream_file))).unwrap();

    let mut mismatches = Vec::new();
    for field in ["group", "names", "scope"] {
        mismatches.extend(
            json_diff(&ours["spec"][field], &theirs["spec"][field])
                .into_iter()
                .map(|d| format!("spec.{field}{d}")),
        );
    }
    assert_eq!(theirs["spec"]["versions"].as_array().map(Vec::len), Some(1));
    for field in [
        "name",
        "served",
        "storage",
        "subresources",
        "additionalPrinterColumns",
    ] {
        let (a, b) = (
            &ours["spec"]["versions"][0][field],
            &theirs["spec"]["versions"][0][field],
        );
        mismatches.extend(
            json_diff(a, b)
                .into_iter()
                .map(|d| format!("versions[0].{field}{d}")),
        );
        if a != b && json_diff(a, b).is_empty() {
            mismatches.push(format!("versions[0].{field}: ours {a}, upstream {b}"));
        }
    }
    assert_eq!(ours["metadata"]["name"], theirs["metadata"]["name"]);

    let mut report = Report::default();
    compare(
        schema(&ours),
        schema(&theirs),
        &mut Vec::new(),
        false,
        &core_type_roots(),
        &mut report,
    );
    mismatches.extend(report.owned);

    println!(
        "{upstream_file}: {} properties of embedded Kubernetes types only in our newer API:",
        report.core.len()
    );
    for line in &report.core {
        println!("  newer kubernetes: {line}");
    }
    assert!(
        mismatches.is_empty(),
        "{upstream_file} differs from upstream:\n  {}",
        mismatches.join("\n  ")
    );
}

#[test]
fn trainjob_crd_matches_upstream() {
    check(crd::trainjob_crd(), "trainer.kubeflow.org_trainjobs.yaml");
}

#[test]
fn training_runtime_crd_matches_upstream() {
    check(
        crd::training_runtime_crd(),
        "trainer.kubeflow.org_trainingruntimes.yaml",
    );
}

#[test]
fn cluster_training_runtime_crd_matches_upstream() {
    check(
        crd::cluster_training_runtime_crd(),
        "trainer.kubeflow.org_clustertrainingruntimes.yaml",
    );
}

#[test]
fn comparison_catches_changes_in_owned_and_core_schema() {
    let mut ours = serde_json::to_value(crd::trainjob_crd()).unwrap();
    let theirs = ours.clone();
    ours["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["suspend"]["default"] = Value::Bool(true);
    let mut report = Report::default();
    compare(
        schema(&ours),
        schema(&theirs),
        &mut Vec::new(),
        false,
        &core_type_roots(),
        &mut report,
    );
    assert_eq!(
        report.owned,
        ["spec.suspend: default: ours true, upstream false"]
    );

    let env =
        "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/trainer/properties/env";
    let mut ours = theirs.clone();
    ours.pointer_mut(&format!("{env}/items"))
        .and_then(Value::as_object_mut)
        .unwrap()
        .insert("x-kubernetes-map-type".into(), "atomic".into());
    let mut report = Report::default();
    compare(
        schema(&ours),
        schema(&theirs),
        &mut Vec::new(),
        false,
        &core_type_roots(),
        &mut report,
    );
    assert_eq!(report.owned.len(), 1, "{:?}", report.owned);
}
