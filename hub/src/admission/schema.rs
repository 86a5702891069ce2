//! A CRD's structural schema applied to custom resources as kube-apiserver
//! applies it: defaulting (with non-nullable nulls pruned), OpenAPI value
//! validation, `x-kubernetes-list-type` checks and the
//! `x-kubernetes-validations` rules of [`super::cel`], with validation
//! ratcheting on updates (a value equal to its correlated old value is not
//! validated again).
//!
//! Messages are kube-openapi's (`spec.x in body should be greater than or
//! equal to 1`), turned into field errors the way apiextensions-apiserver
//! does. Unknown fields are left alone: pruning and strict field validation
//! belong to the API server.

use regex::Regex;
use serde_json::{Map, Value};
use trainhub_apiserver::field::{self, ErrorType, FieldError};

use super::cel::{self, Budget, CompileError, ListOrder, NumberKind, Outcome, Rule};

/// A schema that cannot be used: one of its rules does not compile.
#[derive(Debug, Clone, thiserror::Error)]
#[error("x-kubernetes-validations of {location}: {source}")]
pub struct SchemaError {
    /// Where in the schema, as a field path (`<root>`, `spec.items[*]`).
    pub location: String,
    #[source]
    pub source: CompileError,
}

/// `x-kubernetes-list-type`.
#[derive(Debug, Default, PartialEq)]
enum ListType {
    #[default]
    Atomic,
    Set,
    Map(Vec<String>),
}

/// One node of a structural schema.
#[derive(Debug, Default)]
pub struct Schema {
    type_: Option<String>,
    int_or_string: bool,
    nullable: bool,
    format: Option<String>,
    properties: Vec<(String, Schema)>,
    additional: Option<Box<Schema>>,
    items: Option<Box<Schema>>,
    required: Vec<String>,
    enum_: Option<Vec<Value>>,
    minimum: Option<f64>,
    exclusive_minimum: bool,
    maximum: Option<f64>,
    exclusive_maximum: bool,
    multiple_of: Option<f64>,
    min_length: Option<u64>,
    max_length: Option<u64>,
    min_items: Option<u64>,
    max_items: Option<u64>,
    min_properties: Option<u64>,
    max_properties: Option<u64>,
    pattern: Option<(String, Regex)>,
    unique_items: bool,
    default: Option<Value>,
    list: ListType,
    rules: Vec<Rule>,
    all_of: Vec<Schema>,
    any_of: Vec<Schema>,
    one_of: Vec<Schema>,
    not: Option<Box<Schema>>,
}

/// Errors of one validation, in kube-apiserver's order: schema errors, then
/// list-type errors, then rule errors; and the rules' budget.
struct Errors {
    schema: Vec<FieldError>,
    lists: Vec<FieldError>,
    rules: Vec<FieldError>,
    budget: Budget,
    /// The budget ran out: no further rules are evaluated.
    stopped: bool,
}

impl Schema {
    /// The `openAPIV3Schema` of a CRD version, as JSON, with every rule
    /// compiled.
    ///
    /// # Errors
    ///
    /// The first rule that does not compile (see [`super::cel`]).
    pub fn compile(node: &Value) -> Result<Schema, SchemaError> {
        Schema::compile_at(node, "")
    }

    /// The schema node at `location` (a field path; `[*]` for items and
    /// map values).
    fn compile_at(node: &Value, location: &str) -> Result<Schema, SchemaError> {
        let str_of = |k: &str| node.get(k).and_then(Value::as_str).map(str::to_string);
        let u64_of = |k: &str| node.get(k).and_then(Value::as_u64);
        let f64_of = |k: &str| node.get(k).and_then(Value::as_f64);
        let bool_of = |k: &str| node.get(k).and_then(Value::as_bool).unwrap_or(false);
        let list_of = |k: &str| -> Result<Vec<Schema>, SchemaError> {
            node.get(k)
                .and_then(Value::as_array)
                .map(|a| a.iter().map(|b| Schema::compile_at(b, location)).collect())
                .unwrap_or(Ok(Vec::new()))
        };
        let child = |k: &str, at: String| -> Result<Option<Box<Schema>>, SchemaError> {
            node.get(k)
                .filter(|v| v.is_object())
                .map(|v| Schema::compile_at(v, &at).map(Box::new))
                .transpose()
        };
        let list = match node.get("x-kubernetes-list-type").and_then(Value::as_str) {
            Some("set") => ListType::Set,
            Some("map") => ListType::Map(
                node.get("x-kubernetes-list-map-keys")
                    .and_then(Value::as_array)
                    .map(|keys| {
                        keys.iter()
                            .filter_map(Value::as_str)
                            .map(str::to_string)
                            .collect()
                    })
                    .unwrap_or_default(),
            ),
            _ => ListType::Atomic,
        };
        let pattern = str_of("pattern").and_then(|p| match Regex::new(&p) {
            Ok(re) => Some((p, re)),
            Err(e) => {
                tracing::warn!(pattern = %p, error = %e, "schema pattern not understood; not enforced");
                None
            }
        });
        let wildcard = format!("{location}[*]");
        let mut properties = Vec::new();
        if let Some(props) = node.get("properties").and_then(Value::as_object) {
            for (k, v) in props {
                properties.push((
                    k.clone(),
                    Schema::compile_at(v, &field::child(location, k))?,
                ));
            }
        }
        let mut rules = Vec::new();
        if let Some(entries) = node
            .get("x-kubernetes-validations")
            .and_then(Value::as_array)
        {
            for entry in entries {
                rules.push(Rule::compile(entry, node).map_err(|source| SchemaError {
                    location: if location.is_empty() {
                        "<root>".to_string()
                    } else {
                        location.to_string()
                    },
                    source,
                })?);
            }
        }
        Ok(Schema {
            type_: str_of("type"),
            int_or_string: bool_of("x-kubernetes-int-or-string"),
            nullable: bool_of("nullable"),
            format: str_of("format"),
            properties,
            additional: child("additionalProperties", wildcard.clone())?,
            items: child("items", wildcard)?,
            required: node
                .get("required")
                .and_then(Value::as_array)
                .map(|r| {
                    r.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default(),
            enum_: node.get("enum").and_then(Value::as_array).cloned(),
            minimum: f64_of("minimum"),
            exclusive_minimum: bool_of("exclusiveMinimum"),
            maximum: f64_of("maximum"),
            exclusive_maximum: bool_of("exclusiveMaximum"),
            multiple_of: f64_of("multipleOf"),
            min_length: u64_of("minLength"),
            max_length: u64_of("maxLength"),
            min_items: u64_of("minItems"),
            max_items: u64_of("maxItems"),
            min_properties: u64_of("minProperties"),
            max_properties: u64_of("maxProperties"),
            pattern,
            unique_items: bool_of("uniqueItems"),
            default: node.get("default").cloned(),
            list,
            rules,
            all_of: list_of("allOf")?,
            any_of: list_of("anyOf")?,
            one_of: list_of("oneOf")?,
            not: child("not", location.to_string())?,
        })
    }

    /// The schema of property `name`.
    pub fn property(&self, name: &str) -> Option<&Schema> {
        self.properties
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, s)| s)
    }

    /// The schema of the value under key `name` of an object of this schema.
    pub(crate) fn member(&self, name: &str) -> Option<&Schema> {
        self.property(name).or(self.additional.as_deref())
    }

    /// The schema of the items of a list of this schema.
    pub(crate) fn item_schema(&self) -> Option<&Schema> {
        self.items.as_deref()
    }

    /// How CEL compares lists of this schema.
    pub(crate) fn list_order(&self) -> ListOrder {
        match self.list {
            ListType::Atomic => ListOrder::Ordered,
            ListType::Set | ListType::Map(_) => ListOrder::Unordered,
        }
    }

    /// How CEL types numbers of this schema: `double` under `type:
    /// number`, else `int` when integral.
    pub(crate) fn cel_number(&self) -> NumberKind {
        if self.type_.as_deref() == Some("number") && !self.int_or_string {
            NumberKind::Double
        } else {
            NumberKind::Int
        }
    }

    /// Every rule of this schema and below (`allOf` branches included), in
    /// no particular order.
    pub(crate) fn rules(&self) -> Vec<&Rule> {
        let mut out: Vec<&Rule> = self.rules.iter().collect();
        let children = self
            .properties
            .iter()
            .map(|(_, s)| s)
            .chain(self.additional.as_deref())
            .chain(self.items.as_deref())
            .chain(&self.all_of);
        for child in children {
            out.extend(child.rules());
        }
        out
    }

    /// Applies the schema's defaults to `value`, as kube-apiserver does on
    /// every write: absent properties with a default get it; a null in a
    /// non-nullable property is replaced by the default, or removed when
    /// there is none. Idempotent.
    pub fn apply_defaults(&self, value: &mut Value) {
        match value {
            Value::Object(map) => {
                for (name, prop) in &self.properties {
                    match map.get(name) {
                        None => {
                            if let Some(d) = &prop.default {
                                map.insert(name.clone(), d.clone());
                            }
                        }
                        Some(Value::Null) if !prop.nullable => match &prop.default {
                            Some(d) => {
                                map.insert(name.clone(), d.clone());
                            }
                            None => {
                                map.remove(name);
                            }
                        },
                        Some(_) => {}
                    }
                }
                for (name, child) in map.iter_mut() {
                    if let Some(schema) = self.member(name) {
                        schema.apply_defaults(child);
                    }
                }
            }
            Value::Array(items) => {
                if let Some(schema) = &self.items {
                    for item in items {
                        schema.apply_defaults(item);
                    }
                }
            }
            _ => {}
        }
    }

    /// Validates `value` (at field path `path`, empty for the object's
    /// root) against the schema; `old` is the stored value on updates.
    pub fn validate(&self, value: &Value, old: Option<&Value>, path: &str) -> Vec<FieldError> {
        let mut errors = Errors {
            schema: Vec::new(),
            lists: Vec::new(),
            rules: Vec::new(),
            budget: Budget::new(cel::PER_OBJECT_LIMIT),
            stopped: false,
        };
        self.walk(value, old, path, &mut errors);
        let mut out = errors.schema;
        out.extend(errors.lists);
        out.extend(errors.rules);
        out
    }

    /// Equality as CEL and ratcheting see it: numbers by value, lists of type
    /// set and map without regard to order.
    pub fn equal(&self, a: &Value, b: &Value) -> bool {
        match (a, b) {
            (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
                (Some(x), Some(y)) => x == y,
                _ => x.as_f64() == y.as_f64(),
            },
            (Value::Object(x), Value::Object(y)) => {
                x.len() == y.len()
                    && x.iter().all(|(k, v)| {
                        y.get(k).is_some_and(|w| match self.member(k) {
                            Some(s) => s.equal(v, w),
                            None => v == w,
                        })
                    })
            }
            (Value::Array(x), Value::Array(y)) => {
                if x.len() != y.len() {
                    return false;
                }
                if self.list == ListType::Atomic {
                    let eq = |v: &Value, w: &Value| match self.items.as_deref() {
                        Some(s) => s.equal(v, w),
                        None => v == w,
                    };
                    return x.iter().zip(y).all(|(v, w)| eq(v, w));
                }
                // The same elements in any order: sorted canonical forms
                // compare in O(n log n) where pairing them would be O(n²).
                let sorted = |list: &[Value]| {
                    let mut forms: Vec<String> = list
                        .iter()
                        .map(|v| canonical(self.items.as_deref(), v))
                        .collect();
                    forms.sort_unstable();
                    forms
                };
                sorted(x) == sorted(y)
            }
            _ => a == b,
        }
    }

    /// The type name kube-apiserver reports for this node.
    fn type_name(&self) -> &str {
        if self.int_or_string {
            return "integer,string";
        }
        self.type_.as_deref().unwrap_or("object")
    }

    fn accepts(&self, actual: &str) -> bool {
        if self.int_or_string {
            return matches!(actual, "integer" | "string");
        }
        match self.type_.as_deref() {
            None | Some("") => true,
            Some("number") => matches!(actual, "integer" | "number"),
            Some(t) => t == actual,
        }
    }

    fn walk(&self, value: &Value, old: Option<&Value>, path: &str, errors: &mut Errors) {
        // Ratcheting: an unchanged value stays valid.
        if let Some(old) = old
            && self.equal(value, old)
        {
            return;
        }
        let actual = json_type(value);
        if value.is_null() && (self.nullable || (self.type_.is_none() && !self.int_or_string)) {
            return;
        }
        if !self.accepts(actual) {
            errors.schema.push(FieldError::new(
                ErrorType::TypeInvalid,
                path,
                Some(Value::String(actual.into())),
                format!(
                    "{path} in body must be of type {}: \"{actual}\"",
                    self.type_name()
                ),
            ));
            return;
        }
        self.check_value(value, path, &mut errors.schema);
        for branch in &self.all_of {
            branch.check_composite(value, path, &mut errors.schema);
        }
        if !self.any_of.is_empty() && !self.any_of.iter().any(|b| b.passes(value, path)) {
            errors.schema.push(FieldError::invalid(
                path,
                value.clone(),
                format!("{path} in body must validate at least one schema (anyOf)"),
            ));
        }
        if !self.one_of.is_empty()
            && self.one_of.iter().filter(|b| b.passes(value, path)).count() != 1
        {
            errors.schema.push(FieldError::invalid(
                path,
                value.clone(),
                format!("{path} in body must validate one and only one schema (oneOf)"),
            ));
        }
        if let Some(not) = &self.not
            && not.passes(value, path)
        {
            errors.schema.push(FieldError::invalid(
                path,
                value.clone(),
                format!("{path} in body must not validate the schema (not)"),
            ));
        }

        match value {
            Value::Object(map) => {
                for (name, child) in map {
                    if let Some(schema) = self.member(name) {
                        let old_child = old.and_then(|o| o.get(name));
                        schema.walk(child, old_child, &field::child(path, name), errors);
                    }
                }
            }
            Value::Array(items) => {
                self.check_list(items, path, &mut errors.lists);
                if let Some(schema) = &self.items {
                    // Items of a map list correlate with the first old item
                    // of the same key.
                    let mut old_by_key = std::collections::HashMap::new();
                    if let (ListType::Map(keys), Some(old_items)) =
                        (&self.list, old.and_then(Value::as_array))
                    {
                        for o in old_items {
                            old_by_key.entry(map_key(keys, o)).or_insert(o);
                        }
                    }
                    for (i, item) in items.iter().enumerate() {
                        let old_item = match &self.list {
                            ListType::Map(keys) if !old_by_key.is_empty() => {
                                old_by_key.get(&map_key(keys, item)).copied()
                            }
                            _ => None,
                        };
                        schema.walk(item, old_item, &field::index(path, i), errors);
                    }
                }
            }
            _ => {}
        }
        // After the children's, as this hub has always listed rule errors
        // (kube-apiserver evaluates a node's rules before its children's).
        self.evaluate_rules(value, old, path, errors);
    }

    /// The node's rules, then those of its `allOf` branches.
    fn evaluate_rules(&self, value: &Value, old: Option<&Value>, path: &str, errors: &mut Errors) {
        let type_name = self.type_.as_deref().unwrap_or_default();
        let rules = self
            .rules
            .iter()
            .chain(self.all_of.iter().flat_map(|b| &b.rules));
        for rule in rules {
            if errors.stopped {
                return;
            }
            match rule.evaluate(value, old, self, path, type_name, &errors.budget) {
                Outcome::Pass | Outcome::Skipped => {}
                Outcome::Error(e) => errors.rules.push(e),
                Outcome::Stop(e) => {
                    errors.rules.push(e);
                    errors.stopped = true;
                }
            }
        }
    }

    /// Whether `value` satisfies this (composite branch) schema.
    fn passes(&self, value: &Value, path: &str) -> bool {
        let mut errors = Vec::new();
        self.check_composite(value, path, &mut errors);
        errors.is_empty()
    }

    /// A composite (allOf/anyOf/oneOf/not) branch: value validations only,
    /// as structural schemas allow there.
    fn check_composite(&self, value: &Value, path: &str, out: &mut Vec<FieldError>) {
        if !(self.accepts(json_type(value)) || value.is_null() && self.nullable) {
            out.push(FieldError::new(
                ErrorType::TypeInvalid,
                path,
                Some(Value::String(json_type(value).into())),
                format!(
                    "{path} in body must be of type {}: \"{}\"",
                    self.type_name(),
                    json_type(value)
                ),
            ));
            return;
        }
        self.check_value(value, path, out);
    }

    /// The checks of one node on its own value (not its children).
    fn check_value(&self, value: &Value, path: &str, out: &mut Vec<FieldError>) {
        if let Some(allowed) = &self.enum_
            && !allowed.iter().any(|a| self.equal(a, value))
        {
            let names: Vec<String> = allowed
                .iter()
                .map(|a| match a {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect();
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            out.push(FieldError::not_supported(path, value.clone(), &names));
        }
        match value {
            Value::Number(n) => self.check_number(n, value, path, out),
            Value::String(s) => self.check_string(s, value, path, out),
            Value::Array(items) => {
                let len = items.len() as u64;
                count_bounds(path, len, self.max_items, self.min_items, "items", out);
                if self.unique_items
                    && items
                        .iter()
                        .enumerate()
                        .any(|(i, a)| items[..i].iter().any(|b| a == b))
                {
                    out.push(FieldError::invalid(
                        path,
                        value.clone(),
                        format!("{path} in body shouldn't contain duplicates"),
                    ));
                }
            }
            Value::Object(map) => {
                for name in &self.required {
                    if !map.contains_key(name) {
                        out.push(FieldError::required(field::child(path, name), ""));
                    }
                }
                let len = map.len() as u64;
                count_bounds(
                    path,
                    len,
                    self.max_properties,
                    self.min_properties,
                    "properties",
                    out,
                );
            }
            Value::Null | Value::Bool(_) => {}
        }
    }

    fn check_number(
        &self,
        n: &serde_json::Number,
        value: &Value,
        path: &str,
        out: &mut Vec<FieldError>,
    ) {
        let Some(x) = n.as_f64() else {
            return;
        };
        if let Some(min) = self.minimum {
            let (bad, rel) = if self.exclusive_minimum {
                (x <= min, "greater than")
            } else {
                (x < min, "greater than or equal to")
            };
            if bad {
                out.push(FieldError::invalid(
                    path,
                    value.clone(),
                    format!("{path} in body should be {rel} {}", number(min)),
                ));
            }
        }
        if let Some(max) = self.maximum {
            let (bad, rel) = if self.exclusive_maximum {
                (x >= max, "less than")
            } else {
                (x > max, "less than or equal to")
            };
            if bad {
                out.push(FieldError::invalid(
                    path,
                    value.clone(),
                    format!("{path} in body should be {rel} {}", number(max)),
                ));
            }
        }
        if let Some(m) = self.multiple_of
            && m > 0.0
            && (x / m).fract() != 0.0
        {
            out.push(FieldError::invalid(
                path,
                value.clone(),
                format!("{path} in body should be a multiple of {}", number(m)),
            ));
        }
    }

    fn check_string(&self, s: &str, value: &Value, path: &str, out: &mut Vec<FieldError>) {
        let len = s.chars().count() as u64;
        if let Some(max) = self.max_length
            && len > max
        {
            out.push(FieldError::new(
                ErrorType::TooLong,
                path,
                Some(value.clone()),
                format!("may not be more than {max} {}", plural(max, "byte")),
            ));
        }
        if let Some(min) = self.min_length
            && len < min
        {
            out.push(FieldError::invalid(
                path,
                value.clone(),
                format!("{path} in body should be at least {min} chars long"),
            ));
        }
        if let Some((pattern, re)) = &self.pattern
            && !re.is_match(s)
        {
            out.push(FieldError::invalid(
                path,
                value.clone(),
                format!("{path} in body should match '{pattern}'"),
            ));
        }
        if self.format.as_deref() == Some("date-time") && !is_date_time(s) {
            out.push(FieldError::invalid(
                path,
                value.clone(),
                format!("{path} in body must be of type date-time: \"{s}\""),
            ));
        }
    }

    /// Duplicates in lists of type set and map, found in one pass (a list
    /// may hold hundreds of thousands of items).
    fn check_list(&self, items: &[Value], path: &str, out: &mut Vec<FieldError>) {
        match &self.list {
            ListType::Atomic => {}
            ListType::Set => {
                let mut seen = std::collections::HashSet::new();
                for (i, item) in items.iter().enumerate() {
                    if !seen.insert(canonical(self.items.as_deref(), item)) {
                        out.push(FieldError::duplicate(field::index(path, i), item.clone()));
                    }
                }
            }
            ListType::Map(keys) => {
                let mut seen = std::collections::HashSet::new();
                for (i, item) in items.iter().enumerate() {
                    let Some(obj) = item.as_object() else {
                        continue;
                    };
                    let key: Map<String, Value> = keys
                        .iter()
                        .filter_map(|k| obj.get(k).map(|v| (k.clone(), v.clone())))
                        .collect();
                    let key = Value::Object(key);
                    if !seen.insert(canonical(None, &key)) {
                        out.push(FieldError::duplicate(field::index(path, i), key));
                    }
                }
            }
        }
    }
}

/// A string that two values share exactly when [`Schema::equal`] (under
/// `schema`; exact JSON equality without one) holds for them: numbers by
/// value, object keys sorted, set and map lists sorted.
fn canonical(schema: Option<&Schema>, value: &Value) -> String {
    let mut out = String::new();
    write_canonical(schema, value, &mut out);
    out
}

fn write_canonical(schema: Option<&Schema>, value: &Value, out: &mut String) {
    match value {
        Value::Number(n) if schema.is_some() => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => out.push_str(&i.to_string()),
            (None, Some(f)) if f.fract() == 0.0 && f >= i64::MIN as f64 && f < i64::MAX as f64 => {
                out.push_str(&(f as i64).to_string());
            }
            _ => out.push_str(&n.to_string()),
        },
        Value::Object(map) => {
            let mut entries: Vec<(&String, String)> = map
                .iter()
                .map(|(k, v)| (k, canonical(schema.and_then(|s| s.member(k)), v)))
                .collect();
            entries.sort_unstable();
            out.push('{');
            for (k, v) in entries {
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                out.push_str(&v);
                out.push(',');
            }
            out.push('}');
        }
        Value::Array(items) => {
            let items_schema = schema.and_then(|s| s.items.as_deref());
            let mut forms: Vec<String> = items.iter().map(|v| canonical(items_schema, v)).collect();
            if schema.is_some_and(|s| s.list != ListType::Atomic) {
                forms.sort_unstable();
            }
            out.push('[');
            for f in forms {
                out.push_str(&f);
                out.push(',');
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// The key of a map-list item: its values at `keys`, absent ones included.
fn map_key(keys: &[String], item: &Value) -> String {
    let mut out = String::new();
    for k in keys {
        match item.get(k) {
            Some(v) => out.push_str(&canonical(None, v)),
            None => out.push('\u{1}'),
        }
        out.push('\u{0}');
    }
    out
}

/// The OpenAPI type of a JSON value; integral numbers are `integer`.
fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) => {
            if n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0) {
                "integer"
            } else {
                "number"
            }
        }
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// A number as Go's `%v` prints a float64 bound: `1`, `0.5`.
fn number(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        format!("{x}")
    }
}

fn plural(n: u64, word: &str) -> String {
    if n == 1 {
        word.to_string()
    } else {
        format!("{word}s")
    }
}

/// RFC 3339 date-time, as `strfmt` accepts it: `2006-01-02T15:04:05Z`,
/// with optional fractional seconds and a numeric offset.
fn is_date_time(s: &str) -> bool {
    let b = s.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| b.get(r).is_some_and(|d| d.iter().all(u8::is_ascii_digit));
    if b.len() < 20
        || !digits(0..4)
        || b[4] != b'-'
        || !digits(5..7)
        || b[7] != b'-'
        || !digits(8..10)
        || !matches!(b[10], b'T' | b't' | b' ')
        || !digits(11..13)
        || b[13] != b':'
        || !digits(14..16)
        || b[16] != b':'
        || !digits(17..19)
    {
        return false;
    }
    let mut rest = &s[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let n = frac.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 {
            return false;
        }
        rest = &frac[n..];
    }
    match rest.as_bytes() {
        [b'Z' | b'z'] => true,
        [b'+' | b'-', h1, h2, b':', m1, m2] => [h1, h2, m1, m2].iter().all(|d| d.is_ascii_digit()),
        _ => false,
    }
}

/// `maxItems`/`minItems` and `maxProperties`/`minProperties`, with
/// kube-apiserver's wording (`noun` is `items` or `properties`).
fn count_bounds(
    path: &str,
    len: u64,
    max: Option<u64>,
    min: Option<u64>,
    noun: &str,
    out: &mut Vec<FieldError>,
) {
    if let Some(max) = max
        && len > max
    {
        out.push(FieldError::new(
            ErrorType::TooMany,
            path,
            Some(len.into()),
            format!("must have at most {max} {}", plural(max, "item")),
        ));
    }
    if let Some(min) = min
        && len < min
    {
        out.push(FieldError::invalid(
            path,
            len,
            format!("{path} in body should have at least {min} {noun}"),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Schema {
        compile(json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {
                        "name": {"type": "string", "minLength": 1, "maxLength": 5},
                        "count": {"type": "integer", "minimum": 1, "default": 1},
                        "mode": {"type": "string", "enum": ["A", ""], "default": "A"},
                        "flag": {"type": "boolean"},
                        "size": {
                            "anyOf": [{"type": "integer"}, {"type": "string"}],
                            "x-kubernetes-int-or-string": true,
                            "pattern": "^[0-9]+[KMG]?$"
                        },
                        "at": {"type": "string", "format": "date-time"},
                        "ref": {
                            "type": "string",
                            "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "field is immutable"}]
                        },
                        "items": {
                            "type": "array",
                            "maxItems": 2,
                            "x-kubernetes-list-type": "map",
                            "x-kubernetes-list-map-keys": ["name"],
                            "items": {
                                "type": "object",
                                "properties": {
                                    "name": {"type": "string"},
                                    "v": {
                                        "type": "integer",
                                        "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "v is immutable"}]
                                    }
                                }
                            }
                        },
                        "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}}
                    }
                }
            }
        }))
    }

    fn compile(node: Value) -> Schema {
        Schema::compile(&node).unwrap()
    }

    fn messages(errors: &[FieldError]) -> Vec<String> {
        errors.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn defaults_fill_absent_and_null_fields() {
        let s = schema();
        let mut v = json!({"spec": {"name": "a", "count": null, "flag": null}});
        s.apply_defaults(&mut v);
        assert_eq!(v, json!({"spec": {"name": "a", "count": 1, "mode": "A"}}));
        let once = v.clone();
        s.apply_defaults(&mut v);
        assert_eq!(v, once);
    }

    #[test]
    fn messages_read_as_kube_apiserver_prints_them() {
        let s = schema();
        let v = json!({"spec": {
            "count": 0,
            "mode": "B",
            "flag": "yes",
            "size": "12X",
            "at": "yesterday",
            "items": [{"name": "a"}, {"name": "a"}, {"name": "b"}],
            "tags": ["x", "x"],
        }});
        assert_eq!(
            messages(&s.validate(&v, None, "")),
            [
                "spec.name: Required value",
                "spec.at: Invalid value: \"yesterday\": spec.at in body must be of type date-time: \"yesterday\"",
                "spec.count: Invalid value: 0: spec.count in body should be greater than or equal to 1",
                "spec.flag: Invalid value: \"string\": spec.flag in body must be of type boolean: \"string\"",
                "spec.items: Too many: must have at most 2 items",
                "spec.mode: Unsupported value: \"B\": supported values: \"A\", \"\"",
                "spec.size: Invalid value: \"12X\": spec.size in body should match '^[0-9]+[KMG]?$'",
                "spec.items[1]: Duplicate value: {\"name\":\"a\"}",
                "spec.tags[1]: Duplicate value: \"x\"",
            ]
        );
        let long = json!({"spec": {"name": "abcdef", "size": 3, "at": "2025-01-01T00:00:00Z"}});
        assert_eq!(
            messages(&s.validate(&long, None, "")),
            ["spec.name: Too long: may not be more than 5 bytes"]
        );
    }

    #[test]
    fn transition_rules_and_ratcheting_on_update() {
        let s = schema();
        let old = json!({"spec": {"name": "a", "ref": "r1", "count": 0, "items": [{"name": "a", "v": 1}, {"name": "b", "v": 2}]}});
        // count 0 was stored before the minimum existed: unchanged, it ratchets.
        let same = old.clone();
        assert!(s.validate(&same, Some(&old), "").is_empty());
        // Reordering a map list keeps each item correlated by key.
        let reordered = json!({"spec": {"name": "a", "ref": "r1", "count": 0, "items": [{"name": "b", "v": 2}, {"name": "a", "v": 1}]}});
        assert!(s.validate(&reordered, Some(&old), "").is_empty());
        let changed = json!({"spec": {"name": "a", "ref": "r2", "count": 0, "items": [{"name": "a", "v": 3}, {"name": "b", "v": 2}]}});
        assert_eq!(
            messages(&s.validate(&changed, Some(&old), "")),
            [
                "spec.items[0].v: Invalid value: \"integer\": v is immutable",
                "spec.ref: Invalid value: \"string\": field is immutable",
            ]
        );
        // On create, transition rules are not evaluated.
        assert!(
            s.validate(&changed, None, "")
                .iter()
                .all(|e| !e.detail.contains("immutable"))
        );
    }

    /// Set and map lists of hostile length are checked for duplicates,
    /// correlated and compared without pairing every item with every other.
    #[test]
    fn big_lists_are_checked_in_linear_time() {
        let s = schema();
        let n = 50_000;
        let items: Vec<Value> = (0..n)
            .map(|i| json!({"name": format!("n{i}"), "v": i}))
            .collect();
        let tags: Vec<Value> = (0..n).map(|i| json!(format!("t{i}"))).collect();
        let mut old = json!({"spec": {"name": "a", "items": items, "tags": tags}});
        let started = std::time::Instant::now();
        assert_eq!(
            messages(&s.validate(&old, None, "")),
            ["spec.items: Too many: must have at most 2 items"]
        );
        let mut new = old.clone();
        for list in ["items", "tags"] {
            if let Some(list) = new["spec"][list].as_array_mut() {
                list.reverse();
            }
        }
        // Reordered set and map lists equal the old ones: nothing to report.
        assert!(s.validate(&new, Some(&old), "").is_empty());
        // A changed item is found by its key, wherever it moved.
        new["spec"]["items"][0]["v"] = json!(-1);
        old["spec"]["tags"][7] = json!("t8");
        assert_eq!(
            messages(&s.validate(&new, Some(&old), "")),
            [
                "spec.items: Too many: must have at most 2 items",
                "spec.items[0].v: Invalid value: \"integer\": v is immutable",
            ]
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(60));
        assert_eq!(
            messages(&s.validate(&old, None, "")),
            [
                "spec.items: Too many: must have at most 2 items",
                "spec.tags[8]: Duplicate value: \"t8\"",
            ]
        );
    }

    #[test]
    fn canonical_forms_follow_equality() {
        let s = schema();
        let spec = s.property("spec").unwrap();
        let a = json!({"count": 1, "tags": ["x", "y"], "name": "n"});
        let b = json!({"name": "n", "tags": ["y", "x"], "count": 1.0});
        assert!(spec.equal(&a, &b));
        assert_eq!(canonical(Some(spec), &a), canonical(Some(spec), &b));
        let c = json!({"name": "n", "tags": ["y", "x"], "count": 2});
        assert!(!spec.equal(&a, &c));
        assert_ne!(canonical(Some(spec), &a), canonical(Some(spec), &c));
        // Without a schema, equality is exact JSON equality.
        assert_ne!(canonical(None, &json!(1)), canonical(None, &json!(1.0)));
        assert_eq!(
            canonical(None, &json!({"a": 1, "b": 2})),
            canonical(None, &json!({"b": 2, "a": 1}))
        );
    }

    #[test]
    fn date_times() {
        assert!(is_date_time("2025-06-15T12:00:00Z"));
        assert!(is_date_time("2025-06-15T12:00:00.123+02:00"));
        assert!(!is_date_time("2025-06-15"));
        assert!(!is_date_time("2025-06-15T12:00:00"));
    }
}
