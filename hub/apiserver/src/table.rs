//! `meta.k8s.io/v1` Table output, what `kubectl get` asks for with
//! `Accept: application/json;as=Table;v=v1;g=meta.k8s.io`: a Name column,
//! then the resource's printer columns (Age when it has none, as a CRD
//! without `additionalPrinterColumns` gets), cells evaluated as
//! apiextensions-apiserver's table convertor evaluates them.

// `ApiError` is the crate-wide error (a `metav1.Status`); boxing it is the
// status module's call.

use jiff::Timestamp;
use serde_json::{Map, Value, json};

use crate::resource::ResourceDef;
use crate::status::ApiError;

/// `ObjectMeta.name`'s description, the Name column's.
const NAME_DESCRIPTION: &str = "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";

/// What each row carries in `object` (`?includeObject=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IncludeObject {
    None,
    /// A `PartialObjectMetadata`: the default.
    #[default]
    Metadata,
    Object,
}

impl IncludeObject {
    /// Parses `?includeObject=`; absent or empty is `Metadata`.
    pub fn parse(value: Option<&str>) -> Result<Self, ApiError> {
        match value.unwrap_or("") {
            "" | "Metadata" => Ok(IncludeObject::Metadata),
            "None" => Ok(IncludeObject::None),
            "Object" => Ok(IncludeObject::Object),
            other => Err(ApiError::bad_request(format!(
                "unrecognized includeObject value: {other:?}"
            ))),
        }
    }
}

/// Whether an `Accept` header asks for a `meta.k8s.io` Table (v1 or
/// v1beta1) among its media types.
pub fn accepts_table(accept: &str) -> bool {
    accept.split(',').any(|media| {
        let mut params = media.split(';').map(str::trim);
        let _type = params.next();
        let (mut as_table, mut group, mut version) = (false, false, false);
        for p in params {
            match p.split_once('=') {
                Some(("as", "Table")) => as_table = true,
                Some(("g", "meta.k8s.io")) => group = true,
                Some(("v", "v1" | "v1beta1")) => version = true,
                _ => {}
            }
        }
        as_table && group && version
    })
}

fn columns(def: &ResourceDef) -> Vec<Value> {
    let mut cols = vec![json!({
        "name": "Name", "type": "string", "format": "name",
        "description": NAME_DESCRIPTION, "priority": 0
    })];
    if def.printer_columns.is_empty() {
        cols.push(json!({
            "name": "Age", "type": "date", "format": "",
            "description": "Custom resource definition column (in JSONPath format): .metadata.creationTimestamp",
            "priority": 0
        }));
    }
    for c in &def.printer_columns {
        let description = if c.description.is_empty() {
            format!(
                "Custom resource definition column (in JSONPath format): {}",
                c.json_path
            )
        } else {
            c.description.clone()
        };
        cols.push(json!({
            "name": c.name, "type": c.type_, "format": "",
            "description": description, "priority": c.priority
        }));
    }
    cols
}

/// How each column's cell is made: its type and JSONPath, or its renderer.
type ColumnSpec = (String, String, Option<fn(&Value) -> Value>);

fn column_specs(def: &ResourceDef) -> Vec<ColumnSpec> {
    if def.printer_columns.is_empty() {
        return vec![("date".into(), ".metadata.creationTimestamp".into(), None)];
    }
    def.printer_columns
        .iter()
        .map(|c| (c.type_.clone(), c.json_path.clone(), c.render))
        .collect()
}

fn row(object: &Value, specs: &[ColumnSpec], include: IncludeObject, now: Timestamp) -> Value {
    let mut cells = vec![
        object
            .pointer("/metadata/name")
            .cloned()
            .unwrap_or(Value::String(String::new())),
    ];
    for (type_, path, render) in specs {
        if let Some(render) = render {
            cells.push(render(object));
            continue;
        }
        let found = jsonpath(object, path);
        cells.push(match found.first() {
            None => Value::Null,
            Some(v) => cell(type_, v, now),
        });
    }
    let object = match include {
        IncludeObject::None => Value::Null,
        IncludeObject::Object => object.clone(),
        IncludeObject::Metadata => json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": object.get("metadata").cloned().unwrap_or_else(|| json!({})),
        }),
    };
    json!({"cells": cells, "object": object})
}

/// A Table of `objects` (a list): `list_resource_version` is the list's.
pub fn to_table(
    def: &ResourceDef,
    objects: &[&Value],
    list_resource_version: Option<&str>,
    include: IncludeObject,
    now: Timestamp,
) -> Value {
    let specs = column_specs(def);
    let mut meta = Map::new();
    if let Some(rv) = list_resource_version {
        meta.insert("resourceVersion".into(), rv.into());
    }
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": columns(def),
        "rows": objects.iter().map(|o| row(o, &specs, include, now)).collect::<Vec<_>>(),
    })
}

/// The Table of one object (a get): one row, the object's resourceVersion.
pub fn object_table(
    def: &ResourceDef,
    object: &Value,
    include: IncludeObject,
    now: Timestamp,
) -> Value {
    let rv = object
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str);
    to_table(def, &[object], rv, include, now)
}

fn cell(type_: &str, value: &Value, now: Timestamp) -> Value {
    match type_ {
        "string" => match value {
            Value::Null => Value::Null,
            Value::String(s) => Value::String(s.clone()),
            other => Value::String(other.to_string()),
        },
        "integer" => match value {
            Value::Number(n) => n
                .as_i64()
                .or_else(|| n.as_f64().map(|f| f as i64))
                .map_or(Value::Null, Value::from),
            _ => Value::Null,
        },
        "number" => match value {
            Value::Number(n) => n.as_f64().map_or(Value::Null, Value::from),
            _ => Value::Null,
        },
        "boolean" => match value {
            Value::Bool(b) => Value::Bool(*b),
            _ => Value::Null,
        },
        "date" => match value {
            Value::String(s) => Value::String(match s.parse::<Timestamp>() {
                Ok(t) => {
                    let ms = now.as_millisecond() - t.as_millisecond();
                    human_duration(ms / 1000)
                }
                Err(_) => "<invalid>".into(),
            }),
            _ => Value::Null,
        },
        _ => Value::Null,
    }
}

/// Upstream's `duration.HumanDuration` of `seconds`: `45s`, `5m10s`, `3h5m`,
/// `2d3h`, `1y20d`, with ~2-3 significant figures.
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".into();
    }
    if seconds < 0 {
        return "0s".into();
    }
    if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let dy = (hours / 24) % 365;
        return if dy == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{dy}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

#[derive(Debug, Clone, PartialEq)]
enum Step {
    Field(String),
    Wildcard,
    Index(i64),
    Slice(Option<i64>, Option<i64>),
    Filter(Vec<Step>, FilterOp),
}

#[derive(Debug, Clone, PartialEq)]
enum FilterOp {
    Exists,
    Eq(Value),
    Ne(Value),
}

/// Evaluates the JSONPath subset that printer columns use: `.a.b`,
/// `.a[0]`, `.a[-1:]`, `.a[*].b`, `['a.b']`, `[?(@.type=="Ready")]`.
/// An unparsable path finds nothing.
pub fn jsonpath(root: &Value, path: &str) -> Vec<Value> {
    let path = path.trim();
    let path = path
        .strip_prefix('{')
        .and_then(|p| p.strip_suffix('}'))
        .unwrap_or(path);
    let Some(steps) = parse_path(path.strip_prefix('$').unwrap_or(path)) else {
        return Vec::new();
    };
    eval(vec![root.clone()], &steps)
}

fn eval(mut nodes: Vec<Value>, steps: &[Step]) -> Vec<Value> {
    for step in steps {
        let mut next = Vec::new();
        for node in nodes {
            match (step, node) {
                (Step::Field(name), Value::Object(mut m)) => next.extend(m.remove(name)),
                (Step::Wildcard, Value::Object(m)) => next.extend(m.into_iter().map(|(_, v)| v)),
                (Step::Wildcard, Value::Array(a)) => next.extend(a),
                (Step::Index(i), Value::Array(a)) => {
                    let len = a.len() as i64;
                    let i = if *i < 0 { i + len } else { *i };
                    if (0..len).contains(&i) {
                        next.extend(a.into_iter().nth(i as usize));
                    }
                }
                (Step::Slice(start, end), Value::Array(a)) => {
                    let len = a.len() as i64;
                    let norm = |x: i64| if x < 0 { (x + len).max(0) } else { x.min(len) };
                    let s = start.map_or(0, norm);
                    let e = end.map_or(len, norm);
                    if s < e {
                        next.extend(a.into_iter().skip(s as usize).take((e - s) as usize));
                    }
                }
                (Step::Filter(sub, op), Value::Array(a)) => {
                    for item in a {
                        let found = eval(vec![item.clone()], sub);
                        let keep = match op {
                            FilterOp::Exists => !found.is_empty(),
                            FilterOp::Eq(v) => found.first() == Some(v),
                            FilterOp::Ne(v) => found.first().is_some_and(|f| f != v),
                        };
                        if keep {
                            next.push(item);
                        }
                    }
                }
                _ => {}
            }
        }
        nodes = next;
    }
    nodes
}

fn parse_path(path: &str) -> Option<Vec<Step>> {
    let chars: Vec<char> = path.chars().collect();
    let mut steps = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '.' => {
                i += 1;
                let start = i;
                while i < chars.len() && chars[i] != '.' && chars[i] != '[' {
                    i += 1;
                }
                let name: String = chars[start..i].iter().collect();
                match name.as_str() {
                    "" => {}
                    "*" => steps.push(Step::Wildcard),
                    _ => steps.push(Step::Field(name)),
                }
            }
            '[' => {
                let start = i + 1;
                let mut depth = 0;
                let mut quote: Option<char> = None;
                let mut j = start;
                while j < chars.len() {
                    let c = chars[j];
                    match quote {
                        Some(q) if c == q => quote = None,
                        Some(_) => {}
                        None if c == '\'' || c == '"' => quote = Some(c),
                        None if c == '(' => depth += 1,
                        None if c == ')' => depth -= 1,
                        None if c == ']' && depth == 0 => break,
                        None => {}
                    }
                    j += 1;
                }
                if j >= chars.len() {
                    return None;
                }
                let inner: String = chars[start..j].iter().collect();
                steps.push(parse_bracket(inner.trim())?);
                i = j + 1;
            }
            _ => {
                // A leading bare name, as in `metadata.name`.
                let start = i;
                while i < chars.len() && chars[i] != '.' && chars[i] != '[' {
                    i += 1;
                }
                steps.push(Step::Field(chars[start..i].iter().collect()));
            }
        }
    }
    Some(steps)
}

fn unquote(s: &str) -> Option<String> {
    let s = s.trim();
    for q in ['\'', '"'] {
        if let Some(inner) = s.strip_prefix(q).and_then(|r| r.strip_suffix(q)) {
            return Some(inner.to_string());
        }
    }
    None
}

fn parse_bracket(inner: &str) -> Option<Step> {
    if inner == "*" {
        return Some(Step::Wildcard);
    }
    if let Some(name) = unquote(inner) {
        return Some(Step::Field(name));
    }
    if let Some(expr) = inner.strip_prefix("?(").and_then(|r| r.strip_suffix(')')) {
        return parse_filter(expr.trim());
    }
    if inner.contains(':') {
        let mut parts = inner.split(':');
        let num = |s: Option<&str>| -> Option<Option<i64>> {
            match s.map(str::trim) {
                None | Some("") => Some(None),
                Some(n) => n.parse().ok().map(Some),
            }
        };
        let start = num(parts.next())?;
        let end = num(parts.next())?;
        return Some(Step::Slice(start, end));
    }
    inner.parse().ok().map(Step::Index)
}

fn parse_filter(expr: &str) -> Option<Step> {
    let (lhs, op, rhs) = if let Some((l, r)) = expr.split_once("==") {
        (l, "==", Some(r))
    } else if let Some((l, r)) = expr.split_once("!=") {
        (l, "!=", Some(r))
    } else {
        (expr, "", None)
    };
    let sub = parse_path(lhs.trim().strip_prefix('@')?)?;
    let literal = |r: &str| -> Option<Value> {
        let r = r.trim();
        unquote(r)
            .map(Value::String)
            .or_else(|| serde_json::from_str(r).ok())
    };
    let op = match (op, rhs) {
        ("==", Some(r)) => FilterOp::Eq(literal(r)?),
        ("!=", Some(r)) => FilterOp::Ne(literal(r)?),
        _ => FilterOp::Exists,
    };
    Some(Step::Filter(sub, op))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::PrinterColumn;

    fn def(columns: Vec<PrinterColumn>) -> ResourceDef {
        ResourceDef {
            group: "trainer.kubeflow.org".into(),
            version: "v1alpha1".into(),
            kind: "TrainJob".into(),
            list_kind: "TrainJobList".into(),
            plural: "trainjobs".into(),
            singular: "trainjob".into(),
            short_names: vec![],
            categories: vec![],
            namespaced: true,
            status_subresource: true,
            read_only: false,
            log_subresource: false,
            printer_columns: columns,
            ..Default::default()
        }
    }

    fn col(name: &str, type_: &str, path: &str) -> PrinterColumn {
        PrinterColumn {
            name: name.into(),
            type_: type_.into(),
            json_path: path.into(),
            description: String::new(),
            priority: 0,
            render: None,
        }
    }

    fn trainjob_columns() -> Vec<PrinterColumn> {
        // As in the TrainJob CRD.
        vec![
            col("State", "string", ".status.conditions[-1:].type"),
            col("Age", "date", ".metadata.creationTimestamp"),
        ]
    }

    fn now() -> Timestamp {
        "2025-06-01T12:00:00Z".parse().unwrap()
    }

    fn job(name: &str, created: &str, conditions: Value) -> Value {
        json!({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
               "metadata": {"name": name, "namespace": "team-a", "creationTimestamp": created,
                            "resourceVersion": "42", "labels": {"a": "b"}},
               "spec": {"runtimeRef": {"name": "torch-distributed"}, "suspend": false},
               "status": {"conditions": conditions}})
    }

    #[test]
    fn trainjob_table_like_kubectl_get() {
        let a = job(
            "pytorch-dist",
            "2025-06-01T11:55:00Z",
            json!([{"type": "Created", "status": "True"}, {"type": "Complete", "status": "True"}]),
        );
        let b = job("fresh", "2025-06-01T08:55:00Z", json!([]));
        let t = to_table(
            &def(trainjob_columns()),
            &[&a, &b],
            Some("100"),
            IncludeObject::default(),
            now(),
        );
        assert_eq!(t["kind"], "Table");
        assert_eq!(t["apiVersion"], "meta.k8s.io/v1");
        assert_eq!(t["metadata"], json!({"resourceVersion": "100"}));
        let names: Vec<&str> = t["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["Name", "State", "Age"]);
        assert_eq!(t["columnDefinitions"][0]["format"], "name");
        assert_eq!(
            t["columnDefinitions"][1]["description"],
            "Custom resource definition column (in JSONPath format): .status.conditions[-1:].type"
        );
        assert_eq!(
            t["rows"][0]["cells"],
            json!(["pytorch-dist", "Complete", "5m"])
        );
        // No condition: the cell is null.
        assert_eq!(t["rows"][1]["cells"], json!(["fresh", null, "3h5m"]));
        assert_eq!(
            t["rows"][0]["object"],
            json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                   "metadata": a["metadata"].clone()})
        );
    }

    #[test]
    fn single_object_and_include_object() {
        let a = job("pytorch-dist", "2025-05-30T12:00:00Z", json!([]));
        let t = object_table(&def(vec![]), &a, IncludeObject::Object, now());
        assert_eq!(t["metadata"]["resourceVersion"], "42");
        // No printer columns: Name and Age.
        assert_eq!(t["columnDefinitions"].as_array().unwrap().len(), 2);
        assert_eq!(t["columnDefinitions"][1]["type"], "date");
        assert_eq!(t["rows"].as_array().unwrap().len(), 1);
        assert_eq!(t["rows"][0]["cells"], json!(["pytorch-dist", "2d"]));
        assert_eq!(t["rows"][0]["object"], a);
        let t = object_table(&def(vec![]), &a, IncludeObject::None, now());
        assert_eq!(t["rows"][0]["object"], Value::Null);
        assert_eq!(IncludeObject::parse(None).unwrap(), IncludeObject::Metadata);
        assert_eq!(
            IncludeObject::parse(Some("Object")).unwrap(),
            IncludeObject::Object
        );
        let e = IncludeObject::parse(Some("All")).unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (400, "unrecognized includeObject value: \"All\"")
        );
    }

    #[test]
    fn jobset_columns_with_filters_and_types() {
        let js = json!({"metadata": {"name": "pytorch-dist", "creationTimestamp": "not a time"},
                        "spec": {"suspend": true, "replicatedJobs": [{"name": "node", "replicas": 2}]},
                        "status": {"restarts": 3, "terminalState": "Completed",
                                   "conditions": [{"type": "Suspended", "status": "False"},
                                                  {"type": "Completed", "status": "True"}]}});
        let d = def(vec![
            col("TerminalState", "string", ".status.terminalState"),
            col("Restarts", "string", ".status.restarts"),
            col(
                "Completed",
                "string",
                ".status.conditions[?(@.type==\"Completed\")].status",
            ),
            col("Suspended", "string", ".spec.suspend"),
            col("Replicas", "integer", ".spec.replicatedJobs[*].replicas"),
            col("Jobs", "string", ".spec.replicatedJobs[0]['name']"),
            col("Ratio", "number", ".status.restarts"),
            col("Flag", "boolean", ".spec.suspend"),
            col("Age", "date", ".metadata.creationTimestamp"),
        ]);
        let t = to_table(&d, &[&js], None, IncludeObject::None, now());
        assert_eq!(
            t["rows"][0]["cells"],
            json!([
                "pytorch-dist",
                "Completed",
                "3",
                "True",
                "true",
                2,
                "node",
                3.0,
                true,
                "<invalid>"
            ])
        );
        assert_eq!(t["metadata"], json!({}));
    }

    #[test]
    fn human_durations_like_upstream() {
        let cases = [
            (-5, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (5 * 60 + 10, "5m10s"),
            (10 * 60 + 30, "10m"),
            (179 * 60, "179m"),
            (3 * 3600 + 5 * 60, "3h5m"),
            (8 * 3600 + 59 * 60, "8h"),
            (47 * 3600, "47h"),
            (2 * 86400 + 3 * 3600, "2d3h"),
            (8 * 86400, "8d"),
            (729 * 86400, "729d"),
            (2 * 365 * 86400 + 20 * 86400, "2y20d"),
            (9 * 365 * 86400, "9y"),
        ];
        for (s, want) in cases {
            assert_eq!(human_duration(s), want, "{s}");
        }
    }

    #[test]
    fn accept_headers() {
        assert!(accepts_table(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
        ));
        assert!(!accepts_table("application/json"));
        assert!(!accepts_table(
            "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io"
        ));
    }
}
