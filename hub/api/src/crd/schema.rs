//! Turns a schemars JSON Schema into a Kubernetes *structural* schema.
//!
//! The API server accepts only structural schemas: no `$ref`, a `type` on every node (or
//! `x-kubernetes-int-or-string`), no `null` types, `anyOf` only without types of its own. schemars
//! emits `$ref`s into `$defs`, `anyOf: [T, null]` or `type: [T, "null"]` for `Option<T>`, and
//! `oneOf` of constants for documented enums. [`structural_schema`] inlines every `$ref`, drops
//! the `null` alternatives, folds constant `oneOf`s into `enum`, and replaces the Kubernetes
//! types whose CRD form differs from their OpenAPI form (embedded `ObjectMeta`, `Quantity`,
//! `IntOrString`) with what controller-gen emits for them, and restores the markers k8s-openapi
//! leaves out of the Kubernetes types (see `core_markers`).

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    JSON, JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool, ValidationRule,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use schemars::JsonSchema;
use schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};

use super::core_markers;

/// Grammar of a Kubernetes resource quantity, as the API server validates it.
const QUANTITY_PATTERN: &str = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";

/// A structural schema and the parts of the source schema it could not represent.
#[derive(Debug)]
pub(crate) struct Structural {
    /// The schema.
    pub(crate) schema: JSONSchemaProps,
    /// One line per dropped keyword or unresolved reference, with its path; empty when the
    /// conversion was lossless. Tests assert it stays empty for every kind.
    #[cfg_attr(not(test), expect(dead_code, reason = "checked by tests"))]
    pub(crate) issues: Vec<String>,
}

/// The structural schema of `T`; see the module documentation.
pub(crate) fn structural_schema<T: JsonSchema>() -> Structural {
    let settings = SchemaSettings::draft2020_12().with(|settings| {
        settings.inline_subschemas = false;
        settings.meta_schema = None;
    });
    let mut root = settings.into_generator().into_root_schema_for::<T>();
    // The type name is not part of the schema of a CRD.
    root.remove("title");
    let root = root.to_value();
    let defs = root
        .get("$defs")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let mut converter = Converter {
        defs: &defs,
        overrides: overrides(),
        expanding: Vec::new(),
        issues: Vec::new(),
    };
    let flat = converter.flatten(&root, "");
    let schema = converter.props(flat, "");
    Structural {
        schema,
        issues: converter.issues,
    }
}

/// Definitions replaced by the form controller-gen gives them inside a CRD.
fn overrides() -> BTreeMap<String, Value> {
    let string_map = json!({ "type": "object", "additionalProperties": { "type": "string" } });
    BTreeMap::from([
        (
            // Only the top-level metadata is validated by the server; embedded object metadata
            // keeps just the fields a template may carry.
            ObjectMeta::schema_name().into_owned(),
            json!({
                "type": "object",
                "properties": {
                    "annotations": string_map,
                    "finalizers": { "type": "array", "items": { "type": "string" } },
                    "labels": string_map,
                    "name": { "type": "string" },
                    "namespace": { "type": "string" },
                },
            }),
        ),
        (
            Quantity::schema_name().into_owned(),
            json!({
                "anyOf": [{ "type": "integer" }, { "type": "string" }],
                "pattern": QUANTITY_PATTERN,
                "x-kubernetes-int-or-string": true,
            }),
        ),
        (
            IntOrString::schema_name().into_owned(),
            json!({
                "anyOf": [{ "type": "integer" }, { "type": "string" }],
                "x-kubernetes-int-or-string": true,
            }),
        ),
    ])
}

struct Converter<'a> {
    defs: &'a Map<String, Value>,
    overrides: BTreeMap<String, Value>,
    /// Definitions being inlined, outermost first, to stop on recursive types.
    expanding: Vec<String>,
    issues: Vec<String>,
}

impl Converter<'_> {
    /// Resolves `$ref`, nullable wrappers and constant `oneOf`s of `node` into one flat object.
    fn flatten(&mut self, node: &Value, path: &str) -> Map<String, Value> {
        let mut siblings = match node {
            Value::Object(object) => object.clone(),
            Value::Bool(true) => Map::new(),
            other => {
                self.issue(path, format!("unsupported schema {other}"));
                return Map::new();
            }
        };
        siblings.remove("$defs");

        let mut flat = Map::new();
        if let Some(reference) = siblings.remove("$ref") {
            flat = self.resolve(&reference, path);
        }
        if let Some(inner) = take_nullable_alternative(&mut siblings) {
            merge(&mut flat, self.flatten(&inner, path));
        }
        merge(&mut flat, siblings);

        if let Some(Value::Array(types)) = flat.get("type") {
            let types: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
            match <[Value; 1]>::try_from(types) {
                Ok([single]) => {
                    flat.insert("type".into(), single);
                }
                Err(types) => self.issue(path, format!("ambiguous type {types:?}")),
            }
        }
        if let Some(Value::Array(variants)) = flat.get("oneOf")
            && let Some((type_, values)) = constant_variants(variants)
        {
            flat.remove("oneOf");
            flat.insert("type".into(), type_);
            flat.insert("enum".into(), Value::Array(values));
        }
        flat
    }

    fn resolve(&mut self, reference: &Value, path: &str) -> Map<String, Value> {
        let Some(name) = reference
            .as_str()
            .and_then(|r| r.strip_prefix("#/$defs/"))
            .map(|name| name.replace("~1", "/").replace("~0", "~"))
        else {
            self.issue(path, format!("unsupported $ref {reference}"));
            return Map::new();
        };
        if self.expanding.contains(&name) {
            self.issue(path, format!("recursive type {name} cannot be inlined"));
            return Map::new();
        }
        let Some(target) = self
            .overrides
            .get(&name)
            .or_else(|| self.defs.get(&name))
            .cloned()
        else {
            self.issue(path, format!("unresolved $ref {name}"));
            return Map::new();
        };
        self.expanding.push(name);
        let mut flat = self.flatten(&target, path);
        if let Some(name) = self.expanding.pop() {
            core_markers::apply(&name, &mut flat);
        }
        flat
    }

    /// Converts a flattened node, recursing into its children.
    fn props(&mut self, mut node: Map<String, Value>, path: &str) -> JSONSchemaProps {
        let mut props = JSONSchemaProps {
            type_: self.take_string(&mut node, "type", path),
            format: self.take_string(&mut node, "format", path),
            description: self
                .take_string(&mut node, "description", path)
                .map(|text| plain_description(&text)),
            pattern: self.take_string(&mut node, "pattern", path),
            default: node.remove("default").map(JSON),
            enum_: self.take(&mut node, "enum", path, |v: Vec<Value>| {
                v.into_iter().map(JSON).collect()
            }),
            minimum: self.take(&mut node, "minimum", path, |v: f64| v),
            maximum: self.take(&mut node, "maximum", path, |v: f64| v),
            min_length: self.take(&mut node, "minLength", path, |v: i64| v),
            max_length: self.take(&mut node, "maxLength", path, |v: i64| v),
            min_items: self.take(&mut node, "minItems", path, |v: i64| v),
            max_items: self.take(&mut node, "maxItems", path, |v: i64| v),
            min_properties: self.take(&mut node, "minProperties", path, |v: i64| v),
            max_properties: self.take(&mut node, "maxProperties", path, |v: i64| v),
            nullable: self.take(&mut node, "nullable", path, |v: bool| v),
            x_kubernetes_int_or_string: self.take(
                &mut node,
                "x-kubernetes-int-or-string",
                path,
                |v: bool| v,
            ),
            x_kubernetes_preserve_unknown_fields: self.take(
                &mut node,
                "x-kubernetes-preserve-unknown-fields",
                path,
                |v: bool| v,
            ),
            x_kubernetes_embedded_resource: self.take(
                &mut node,
                "x-kubernetes-embedded-resource",
                path,
                |v: bool| v,
            ),
            x_kubernetes_list_type: self.take_string(&mut node, "x-kubernetes-list-type", path),
            x_kubernetes_map_type: self.take_string(&mut node, "x-kubernetes-map-type", path),
            x_kubernetes_list_map_keys: self.take(
                &mut node,
                "x-kubernetes-list-map-keys",
                path,
                |v: Vec<String>| v,
            ),
            x_kubernetes_validations: self.take(
                &mut node,
                "x-kubernetes-validations",
                path,
                |v: Vec<ValidationRule>| v,
            ),
            required: self.take(&mut node, "required", path, |mut v: Vec<String>| {
                v.sort();
                v.dedup();
                v
            }),
            ..JSONSchemaProps::default()
        };

        if let Some(Value::Object(properties)) = node.remove("properties") {
            let properties: BTreeMap<String, JSONSchemaProps> = properties
                .into_iter()
                .map(|(name, child)| {
                    let child_path = format!("{path}.{name}");
                    let flat = self.flatten(&child, &child_path);
                    (name, self.props(flat, &child_path))
                })
                .collect();
            props.properties = (!properties.is_empty()).then_some(properties);
        }
        if let Some(items) = node.remove("items") {
            let items_path = format!("{path}[]");
            let flat = self.flatten(&items, &items_path);
            props.items = Some(JSONSchemaPropsOrArray::Schema(Box::new(
                self.props(flat, &items_path),
            )));
        }
        match node.remove("additionalProperties") {
            None => {}
            Some(Value::Bool(allowed)) => {
                props.additional_properties = Some(JSONSchemaPropsOrBool::Bool(allowed));
            }
            Some(values) => {
                let values_path = format!("{path}{{*}}");
                let flat = self.flatten(&values, &values_path);
                props.additional_properties = Some(JSONSchemaPropsOrBool::Schema(Box::new(
                    self.props(flat, &values_path),
                )));
            }
        }
        if let Some(Value::Array(alternatives)) = node.remove("anyOf") {
            props.any_of = Some(
                alternatives
                    .iter()
                    .map(|alternative| {
                        let flat = self.flatten(alternative, path);
                        self.props(flat, path)
                    })
                    .collect(),
            );
        }

        // Kubernetes rejects `uniqueItems: true`; list semantics come from x-kubernetes-list-type.
        node.remove("uniqueItems");
        for keyword in node.keys() {
            self.issues
                .push(format!("{}: unsupported keyword {keyword}", display(path)));
        }
        props
    }

    fn take_string(
        &mut self,
        node: &mut Map<String, Value>,
        keyword: &str,
        path: &str,
    ) -> Option<String> {
        self.take(node, keyword, path, |v: String| v)
    }

    /// Removes `keyword` from `node` and converts its value, recording an issue when the value
    /// has the wrong shape.
    fn take<T, U>(
        &mut self,
        node: &mut Map<String, Value>,
        keyword: &str,
        path: &str,
        convert: impl FnOnce(T) -> U,
    ) -> Option<U>
    where
        T: serde::de::DeserializeOwned,
    {
        let value = node.remove(keyword)?;
        match serde_json::from_value(value) {
            Ok(value) => Some(convert(value)),
            Err(error) => {
                self.issue(path, format!("invalid {keyword}: {error}"));
                None
            }
        }
    }

    fn issue(&mut self, path: &str, message: String) {
        self.issues.push(format!("{}: {message}", display(path)));
    }
}

fn display(path: &str) -> &str {
    if path.is_empty() { "<root>" } else { path }
}

/// A doc comment as `kubectl explain` should show it: rustdoc links reduced to their text and
/// the lines of each paragraph joined.
fn plain_description(doc: &str) -> String {
    let mut text = String::with_capacity(doc.len());
    let mut rest = doc;
    // "[`Name`]" and "[`Name`](path)" become "`Name`".
    while let Some(start) = rest.find("[`") {
        let Some(len) = rest[start..].find("`]") else {
            break;
        };
        let end = start + len;
        text.push_str(&rest[..start]);
        text.push_str(&rest[start + 1..end + 1]);
        rest = &rest[end + 2..];
        if rest.starts_with('(')
            && let Some(close) = rest.find(')')
        {
            rest = &rest[close + 1..];
        }
    }
    text.push_str(rest);
    text.split("\n\n")
        .map(|paragraph| {
            paragraph
                .split('\n')
                .map(str::trim)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// Removes an `anyOf` of exactly one schema and `{"type": "null"}` from `node`, returning the
/// schema.
fn take_nullable_alternative(node: &mut Map<String, Value>) -> Option<Value> {
    let Some(Value::Array(alternatives)) = node.get("anyOf") else {
        return None;
    };
    let is_null = |v: &Value| v.get("type").is_some_and(|t| t == "null");
    let [first, second] = alternatives.as_slice() else {
        return None;
    };
    let inner = match (is_null(first), is_null(second)) {
        (false, true) => first.clone(),
        (true, false) => second.clone(),
        _ => return None,
    };
    node.remove("anyOf");
    Some(inner)
}

/// The common type and values of `oneOf` variants that are all constants (a documented Rust
/// enum), or `None`.
fn constant_variants(variants: &[Value]) -> Option<(Value, Vec<Value>)> {
    let mut type_ = None;
    let mut values = Vec::new();
    for variant in variants {
        match (variant.get("const"), variant.get("enum")) {
            (Some(value), _) => values.push(value.clone()),
            (None, Some(Value::Array(enum_values))) => values.extend(enum_values.iter().cloned()),
            _ => return None,
        }
        let variant_type = variant.get("type")?;
        if type_.get_or_insert(variant_type) != &variant_type {
            return None;
        }
    }
    Some((type_?.clone(), values))
}

/// Overlays `overlay` onto `base`; `x-kubernetes-validations` lists are concatenated, every
/// other keyword of `overlay` wins.
fn merge(base: &mut Map<String, Value>, overlay: Map<String, Value>) {
    for (keyword, value) in overlay {
        match (base.get_mut(&keyword), value) {
            (Some(Value::Array(existing)), Value::Array(more))
                if keyword == "x-kubernetes-validations" =>
            {
                existing.extend(more);
            }
            (_, value) => {
                base.insert(keyword, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(JsonSchema)]
    #[allow(dead_code)]
    struct Sample {
        /// A documented, defaulted, validated optional field.
        #[schemars(extend("default" = 3, "x-kubernetes-validations" = [{"rule": "self >= 1"}]))]
        count: Option<i32>,
        quantity: Option<Quantity>,
        inner: Option<Inner>,
        mode: Mode,
    }

    /// Inner docs.
    #[derive(JsonSchema)]
    #[allow(dead_code)]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "true"}]))]
    struct Inner {
        names: Vec<String>,
    }

    #[derive(JsonSchema)]
    #[allow(dead_code)]
    enum Mode {
        /// First.
        A,
        /// Second.
        B,
    }

    fn to_value(schema: &JSONSchemaProps) -> Value {
        serde_json::to_value(schema).unwrap()
    }

    #[test]
    fn inlines_refs_and_drops_null_alternatives() {
        let Structural { schema, issues } = structural_schema::<Sample>();
        assert!(issues.is_empty(), "{issues:#?}");
        let properties = schema.properties.unwrap();

        assert_eq!(
            to_value(&properties["count"]),
            json!({
                "default": 3,
                "description": "A documented, defaulted, validated optional field.",
                "format": "int32",
                "type": "integer",
                "x-kubernetes-validations": [{"rule": "self >= 1"}],
            })
        );
        assert_eq!(
            properties["quantity"].x_kubernetes_int_or_string,
            Some(true)
        );
        assert_eq!(properties["quantity"].type_, None);

        let inner = &properties["inner"];
        assert_eq!(inner.type_.as_deref(), Some("object"));
        assert_eq!(inner.required.as_deref(), Some(&["names".to_owned()][..]));
        assert_eq!(inner.x_kubernetes_validations.as_ref().unwrap().len(), 1);

        assert_eq!(
            to_value(&properties["mode"]),
            json!({"enum": ["A", "B"], "type": "string"})
        );
        assert_eq!(
            schema.required,
            Some(vec!["mode".to_owned()]),
            "only non-optional fields are required"
        );
    }

    #[test]
    fn descriptions_read_as_plain_text() {
        assert_eq!(
            plain_description(
                "The state of a [`TrainJob`] and\nits [`Trainer`](super::Trainer).\n\nMore."
            ),
            "The state of a `TrainJob` and its `Trainer`.\n\nMore."
        );
        assert_eq!(
            plain_description("[not a link] [`open"),
            "[not a link] [`open"
        );
    }

    #[test]
    fn embedded_object_meta_keeps_template_fields() {
        #[derive(JsonSchema)]
        #[allow(dead_code)]
        struct Template {
            metadata: Option<ObjectMeta>,
        }
        let Structural { schema, issues } = structural_schema::<Template>();
        assert!(issues.is_empty(), "{issues:#?}");
        let metadata = &schema.properties.unwrap()["metadata"];
        let fields: Vec<&str> = metadata
            .properties
            .as_ref()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            fields,
            ["annotations", "finalizers", "labels", "name", "namespace"]
        );
    }

    #[test]
    fn reports_what_it_cannot_represent() {
        #[derive(JsonSchema)]
        #[allow(dead_code)]
        struct Odd {
            #[schemars(extend("if" = {"type": "string"}))]
            field: String,
        }
        let Structural { issues, .. } = structural_schema::<Odd>();
        assert_eq!(issues, [".field: unsupported keyword if"]);
    }
}
