//! Strategic merge patch, as kubectl sends it and apimachinery's
//! `strategicpatch` applies it: maps merge recursively and `null` deletes;
//! lists with a merge key merge item by item, lists of scalars with a merge
//! strategy merge as a union, other lists are replaced; the directives
//! `$patch` (`replace`, `delete`, `merge`), `$retainKeys`,
//! `$deleteFromPrimitiveList/<field>` and `$setElementOrder/<field>`
//! (the order of the merged list) are honoured.
//!
//! Errors are answered as upstream answers them: malformed directives 400
//! BadRequest, lists of lists and content outside `$retainKeys` 422, other
//! inconsistencies (an item without its merge key, an unknown `$patch`) 500
//! without a reason. Directive keys are stripped from content the patch adds.

use std::cmp::Ordering;

use serde_json::{Map, Value};

use super::keys::ListKeys;
use crate::status::ApiError;

const DIRECTIVE: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const DELETE_FROM_PRIMITIVE_LIST: &str = "$deleteFromPrimitiveList";
const SET_ELEMENT_ORDER: &str = "$setElementOrder";

const ERR_PRIMITIVE_LIST: &str = "invalid patch format of primitive list";
const ERR_RETAIN_KEYS: &str = "invalid patch format of retainKeys";
const ERR_SET_ELEMENT_ORDER: &str = "invalid patch format of setElementOrder list";
const ERR_LIST_OF_LISTS: &str = "lists of lists are not supported";

/// Applies a strategic merge patch to `target` (an object). List merge keys
/// come from `keys`. On error `target` is left unchanged.
pub fn strategic_merge_patch(
    target: &mut Value,
    patch: &Value,
    keys: &dyn ListKeys,
) -> Result<(), ApiError> {
    let Value::Object(patch) = patch else {
        return Err(ApiError::bad_request(format!(
            "json: cannot unmarshal {} into Go value of type map[string]interface {{}}",
            kind_name(patch)
        )));
    };
    let original = match target {
        Value::Object(m) => m.clone(),
        _ => Map::new(),
    };
    let mut names = Vec::new();
    let merged = merge_map(original, patch.clone(), &mut names, keys)?;
    *target = Value::Object(merged);
    Ok(())
}

fn kind_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Go's `%v` of a decoded JSON value, for messages that quote one.
fn go_fmt(v: &Value) -> String {
    match v {
        Value::Null => "<nil>".into(),
        Value::String(s) => s.clone(),
        Value::Array(a) => format!("[{}]", a.iter().map(go_fmt).collect::<Vec<_>>().join(" ")),
        Value::Object(m) => {
            let mut entries: Vec<(&String, &Value)> = m.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            let parts: Vec<String> = entries
                .iter()
                .map(|(k, v)| format!("{k}:{}", go_fmt(v)))
                .collect();
            format!("map[{}]", parts.join(" "))
        }
        other => other.to_string(),
    }
}

fn go_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "<nil>",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float64",
        Value::Number(_) => "int64",
        Value::String(_) => "string",
        Value::Array(_) => "[]interface {}",
        Value::Object(_) => "map[string]interface {}",
    }
}

fn internal(message: String) -> ApiError {
    ApiError::new(500, "", message)
}

fn unprocessable(detail: &str) -> ApiError {
    ApiError::new(
        422,
        "Invalid",
        "the server rejected our request due to an error in our request",
    )
    .with_cause("", detail, "")
}

fn no_merge_key(item: &Value, key: &str) -> ApiError {
    internal(format!(
        "map: {} does not contain declared merge key: {key}",
        go_fmt(item)
    ))
}

fn bad_arg_type(expected: &str, actual: &Value) -> ApiError {
    internal(format!(
        "expected a {expected}, but received a {}",
        go_type(actual)
    ))
}

/// The merge key of the list `name` under `names`: `None` for a list that is
/// replaced, `Some("")` for a set of scalars.
fn list_merge_key(keys: &dyn ListKeys, names: &[String], name: &str) -> Option<String> {
    let mut path: Vec<&str> = names.iter().map(String::as_str).collect();
    path.push(name);
    keys.merge_key(&path)
        .map(|ks| ks.into_iter().next().unwrap_or_default())
}

fn merge_map(
    mut original: Map<String, Value>,
    mut patch: Map<String, Value>,
    names: &mut Vec<String>,
    keys: &dyn ListKeys,
) -> Result<Map<String, Value>, ApiError> {
    if let Some(directive) = patch.get(DIRECTIVE).cloned() {
        return match directive.as_str() {
            Some("replace") => {
                patch.remove(DIRECTIVE);
                Ok(patch)
            }
            Some("delete") => Ok(Map::new()),
            _ => Err(internal(format!(
                "unknown patch type: {} in map: {}",
                go_fmt(&directive),
                go_fmt(&Value::Object(patch))
            ))),
        };
    }

    apply_retain_keys(&mut original, &mut patch)?;
    apply_set_element_order(&mut original, &mut patch, names, keys)?;

    for (key, patch_value) in patch {
        let (key, is_delete_list) = match key.strip_prefix(DELETE_FROM_PRIMITIVE_LIST) {
            Some(rest) => match rest.strip_prefix('/') {
                Some(field) => (field.to_string(), true),
                None => return Err(ApiError::bad_request(ERR_PRIMITIVE_LIST)),
            },
            None => (key, false),
        };

        if patch_value.is_null() {
            original.remove(&key);
            continue;
        }

        let Some(original_value) = original.get_mut(&key) else {
            if let (false, Some(v)) = (is_delete_list, new_content(patch_value)) {
                original.insert(key, v);
            }
            continue;
        };

        let same_kind =
            std::mem::discriminant(&*original_value) == std::mem::discriminant(&patch_value);
        if !same_kind {
            if !is_delete_list {
                match new_content(patch_value) {
                    Some(v) => *original_value = v,
                    None => {
                        original.remove(&key);
                    }
                }
            }
            continue;
        }

        match (original_value, patch_value) {
            (Value::Object(o), Value::Object(p)) => {
                let o = std::mem::take(o);
                names.push(key.clone());
                let merged = merge_map(o, p, names, keys);
                names.pop();
                original.insert(key, Value::Object(merged?));
            }
            (Value::Array(o), Value::Array(p)) => {
                let merge_key = list_merge_key(keys, names, &key);
                let merged = if merge_key.is_some() || is_delete_list {
                    let o = std::mem::take(o);
                    names.push(key.clone());
                    let merged = merge_list(
                        o,
                        p,
                        merge_key.as_deref().unwrap_or(""),
                        &key,
                        is_delete_list,
                        names,
                        keys,
                    );
                    names.pop();
                    merged?
                } else {
                    p
                };
                original.insert(key, Value::Array(merged));
            }
            (slot, p) => match remove_directives(p) {
                Some(v) => *slot = v,
                None => {
                    original.remove(&key);
                }
            },
        }
    }
    Ok(original)
}

/// Content the patch adds where the original has nothing to merge with:
/// nulls and directives are dropped.
fn new_content(mut value: Value) -> Option<Value> {
    discard_nulls(&mut value);
    remove_directives(value)
}

fn discard_nulls(value: &mut Value) {
    match value {
        Value::Object(m) => {
            m.retain(|_, v| !v.is_null());
            m.values_mut().for_each(discard_nulls);
        }
        Value::Array(a) => a.iter_mut().for_each(discard_nulls),
        _ => {}
    }
}

/// Drops maps carrying `$patch` and the keys of the other directives.
fn remove_directives(value: Value) -> Option<Value> {
    match value {
        Value::Object(m) => {
            if m.contains_key(DIRECTIVE) {
                return None;
            }
            let mut out = Map::new();
            for (k, v) in m {
                if k == RETAIN_KEYS
                    || k.starts_with(SET_ELEMENT_ORDER)
                    || k.starts_with(DELETE_FROM_PRIMITIVE_LIST)
                {
                    continue;
                }
                if let Some(v) = remove_directives(v) {
                    out.insert(k, v);
                }
            }
            Some(Value::Object(out))
        }
        Value::Array(a) => Some(Value::Array(
            a.into_iter().filter_map(remove_directives).collect(),
        )),
        other => Some(other),
    }
}

/// `$retainKeys`: fields of the original not listed are cleared; every field
/// the patch sets must be listed.
fn apply_retain_keys(
    original: &mut Map<String, Value>,
    patch: &mut Map<String, Value>,
) -> Result<(), ApiError> {
    let Some(retain) = patch.remove(RETAIN_KEYS) else {
        return Ok(());
    };
    let Value::Array(retain) = retain else {
        return Err(ApiError::bad_request(ERR_RETAIN_KEYS));
    };
    let listed = |k: &str| retain.iter().any(|r| r.as_str() == Some(k));
    for (k, v) in patch.iter() {
        if v.is_null()
            || k.starts_with(DELETE_FROM_PRIMITIVE_LIST)
            || k.starts_with(SET_ELEMENT_ORDER)
        {
            continue;
        }
        if !listed(k) {
            return Err(ApiError::bad_request(ERR_RETAIN_KEYS));
        }
    }
    original.retain(|k, _| listed(k));
    Ok(())
}

/// `$setElementOrder/<field>`: merges the field's list and orders the result:
/// the directive's order first, then the patch's, then the live object's.
fn apply_set_element_order(
    original: &mut Map<String, Value>,
    patch: &mut Map<String, Value>,
    names: &mut Vec<String>,
    keys: &dyn ListKeys,
) -> Result<(), ApiError> {
    let directives: Vec<String> = patch
        .keys()
        .filter(|k| k.starts_with(SET_ELEMENT_ORDER))
        .cloned()
        .collect();
    for directive in directives {
        let Some(order) = patch.remove(&directive) else {
            continue;
        };
        let Some(field) = directive
            .strip_prefix(SET_ELEMENT_ORDER)
            .and_then(|r| r.strip_prefix('/'))
        else {
            return Err(ApiError::bad_request(ERR_SET_ELEMENT_ORDER));
        };
        let field = field.to_string();
        let Value::Array(order) = order else {
            return Err(bad_arg_type("[]interface {}", &order));
        };
        let original_list = match original.get(&field) {
            None => None,
            Some(Value::Array(a)) => Some(a.clone()),
            Some(other) => return Err(bad_arg_type("[]interface {}", other)),
        };
        let patch_list = match patch.get(&field) {
            None => None,
            Some(Value::Array(a)) => Some(a.clone()),
            Some(other) => return Err(bad_arg_type("[]interface {}", other)),
        };
        let merge_key = list_merge_key(keys, names, &field);
        let mk = merge_key.as_deref().unwrap_or("");
        validate_with_order(patch_list.as_deref().unwrap_or(&[]), &order, mk)?;

        let merged = match (&original_list, patch_list) {
            (Some(o), None) => o.clone(),
            (None, Some(p)) => match remove_directives(Value::Array(p)) {
                Some(Value::Array(a)) => a,
                _ => continue,
            },
            (Some(o), Some(p)) => {
                if merge_key.is_some() {
                    names.push(field.clone());
                    let merged = merge_list(o.clone(), p, mk, &field, false, names, keys);
                    names.pop();
                    merged?
                } else {
                    p
                }
            }
            (None, None) => continue,
        };
        let (in_order, server_only) = partition(&merged, &order, mk);
        let server_order = original_list.unwrap_or_default();
        let all = normalize_order(in_order, server_only, &order, &server_order, mk);
        original.insert(field.clone(), Value::Array(all));
        patch.remove(&field);
    }
    Ok(())
}

/// The relative order of the patch list's items must agree with the
/// `$setElementOrder` list, and the patch list may only hold items it names.
fn validate_with_order(patch: &[Value], order: &[Value], merge_key: &str) -> Result<(), ApiError> {
    if patch.is_empty() || order.is_empty() {
        return Ok(());
    }
    let non_delete: Vec<&Value> = patch
        .iter()
        .filter(|v| merge_key.is_empty() || !is_delete_item(v))
        .collect();
    let (mut pi, mut oi) = (0, 0);
    while pi < non_delete.len() && oi < order.len() {
        if non_delete[pi]
            .as_object()
            .is_some_and(|m| m.contains_key(DIRECTIVE))
        {
            pi += 1;
            continue;
        }
        if key_equal(non_delete[pi], &order[oi], merge_key)? {
            pi += 1;
        }
        oi += 1;
    }
    if pi < non_delete.len() && oi >= order.len() {
        return Err(internal(format!(
            "The order in patch list:\n{}\n doesn't match {SET_ELEMENT_ORDER} list:\n{}\n",
            go_fmt(&Value::Array(patch.to_vec())),
            go_fmt(&Value::Array(order.to_vec()))
        )));
    }
    Ok(())
}

fn is_delete_item(v: &Value) -> bool {
    v.get(DIRECTIVE).and_then(Value::as_str) == Some("delete")
}

fn key_equal(a: &Value, b: &Value, merge_key: &str) -> Result<bool, ApiError> {
    if merge_key.is_empty() {
        return Ok(a == b);
    }
    let ka = a
        .as_object()
        .ok_or_else(|| bad_arg_type("map[string]interface {}", a))?
        .get(merge_key)
        .ok_or_else(|| no_merge_key(a, merge_key))?;
    let kb = b
        .as_object()
        .ok_or_else(|| bad_arg_type("map[string]interface {}", b))?
        .get(merge_key)
        .ok_or_else(|| no_merge_key(b, merge_key))?;
    Ok(ka == kb)
}

/// What identifies an item in order lists: its merge key's value, or itself.
fn identity<'a>(item: &'a Value, merge_key: &str) -> Option<&'a Value> {
    if merge_key.is_empty() {
        Some(item)
    } else {
        item.get(merge_key)
    }
}

fn position(list: &[Value], item: &Value, merge_key: &str) -> Option<usize> {
    let id = identity(item, merge_key);
    list.iter().position(|v| identity(v, merge_key) == id)
}

/// Splits `merged` into the items present in `by` and the others.
fn partition(merged: &[Value], by: &[Value], merge_key: &str) -> (Vec<Value>, Vec<Value>) {
    merged
        .iter()
        .cloned()
        .partition(|v| position(by, v, merge_key).is_some())
}

/// Orders `patch_items` by `patch_order` and `server_only` by `server_order`,
/// then interleaves them keeping both relative orders, placing server-only
/// items before patch items they preceded in the live list.
fn normalize_order(
    mut patch_items: Vec<Value>,
    mut server_only: Vec<Value>,
    patch_order: &[Value],
    server_order: &[Value],
    merge_key: &str,
) -> Vec<Value> {
    let by = |order: &[Value]| {
        let order = order.to_vec();
        move |a: &Value, b: &Value| match (
            position(&order, a, merge_key),
            position(&order, b, merge_key),
        ) {
            (Some(x), Some(y)) => x.cmp(&y),
            _ => Ordering::Equal,
        }
    };
    patch_items.sort_by(by(patch_order));
    server_only.sort_by(by(server_order));

    let mut out = Vec::with_capacity(patch_items.len() + server_only.len());
    let mut left = server_only.into_iter().peekable();
    let mut right = patch_items.into_iter().peekable();
    loop {
        match (left.peek(), right.peek()) {
            (Some(l), Some(r)) => {
                let li = position(server_order, l, merge_key);
                let ri = position(server_order, r, merge_key);
                let take_left = matches!((li, ri), (Some(a), Some(b)) if a < b);
                let next = if take_left { left.next() } else { right.next() };
                out.extend(next);
            }
            (Some(_), None) => out.extend(left.next()),
            (None, Some(_)) => out.extend(right.next()),
            (None, None) => break,
        }
    }
    out
}

#[derive(PartialEq)]
enum ItemKind {
    Scalar,
    Map,
}

fn element_kind(original: &[Value], patch: &[Value]) -> Result<Option<ItemKind>, ApiError> {
    let mut kind: Option<std::mem::Discriminant<Value>> = None;
    let mut first: Option<&Value> = None;
    for v in original.iter().chain(patch) {
        if v.is_array() {
            return Err(unprocessable(ERR_LIST_OF_LISTS));
        }
        let d = std::mem::discriminant(v);
        match kind {
            None => {
                kind = Some(d);
                first = Some(v);
            }
            Some(k) if k != d => {
                return Err(internal(format!(
                    "list element types are not identical: [{} {}]",
                    go_fmt(&Value::Array(original.to_vec())),
                    go_fmt(&Value::Array(patch.to_vec()))
                )));
            }
            Some(_) => {}
        }
    }
    Ok(first.map(|v| {
        if v.is_object() {
            ItemKind::Map
        } else {
            ItemKind::Scalar
        }
    }))
}

fn merge_list(
    original: Vec<Value>,
    patch: Vec<Value>,
    merge_key: &str,
    field: &str,
    is_delete_list: bool,
    names: &mut Vec<String>,
    keys: &dyn ListKeys,
) -> Result<Vec<Value>, ApiError> {
    if original.is_empty() && patch.is_empty() {
        return Ok(original);
    }
    let Some(kind) = element_kind(&original, &patch)? else {
        return Ok(original);
    };

    if kind == ItemKind::Scalar {
        if is_delete_list {
            return Ok(original
                .into_iter()
                .filter(|v| !patch.contains(v))
                .collect());
        }
        let mut merged: Vec<Value> = Vec::with_capacity(original.len() + patch.len());
        for v in original.iter().chain(&patch) {
            if !merged.contains(v) {
                merged.push(v.clone());
            }
        }
        let (patch_items, server_only) = partition(&merged, &patch, "");
        return Ok(normalize_order(
            patch_items,
            server_only,
            &patch,
            &original,
            "",
        ));
    }

    if merge_key.is_empty() {
        return Err(internal(format!(
            "cannot merge lists without merge key for {field}"
        )));
    }

    // Special items: `$patch: delete` removes by key, `$patch: replace`
    // replaces the list with the other items.
    let mut original = original;
    let mut plain = Vec::with_capacity(patch.len());
    let mut replace = false;
    for item in patch {
        let directive = item.get(DIRECTIVE).cloned();
        match directive {
            None => plain.push(item),
            Some(d) => match d.as_str() {
                Some("delete") => {
                    let key = item
                        .get(merge_key)
                        .cloned()
                        .ok_or_else(|| no_merge_key(&item, merge_key))?;
                    original.retain(|o| o.get(merge_key) != Some(&key));
                }
                Some("replace") => replace = true,
                Some("merge") => {
                    return Err(internal(
                        "merging lists cannot yet be specified in the patch".into(),
                    ));
                }
                _ => {
                    return Err(internal(format!(
                        "unknown patch type: {} in map: {}",
                        go_fmt(&d),
                        go_fmt(&item)
                    )));
                }
            },
        }
    }
    let (original, patch) = if replace {
        (plain, Vec::new())
    } else {
        (original, plain)
    };

    let mut merged = original.clone();
    for item in &patch {
        let Value::Object(p) = item else {
            return Err(bad_arg_type("map[string]interface {}", item));
        };
        let key = p
            .get(merge_key)
            .ok_or_else(|| no_merge_key(item, merge_key))?;
        let mut found = None;
        for (i, o) in merged.iter().enumerate() {
            let Value::Object(om) = o else {
                return Err(internal(format!("value for key {i} is not a map")));
            };
            if om.get(merge_key) == Some(key) {
                found = Some(i);
                break;
            }
        }
        match found {
            Some(i) => {
                let o = match std::mem::take(&mut merged[i]) {
                    Value::Object(m) => m,
                    _ => Map::new(),
                };
                merged[i] = Value::Object(merge_map(o, p.clone(), names, keys)?);
            }
            None => merged.extend(new_content(item.clone())),
        }
    }

    for v in merged.iter().chain(&patch).chain(&original) {
        if v.get(merge_key).is_none() {
            return Err(no_merge_key(v, merge_key));
        }
    }
    let (patch_items, server_only) = partition(&merged, &patch, merge_key);
    Ok(normalize_order(
        patch_items,
        server_only,
        &patch,
        &original,
        merge_key,
    ))
}

#[cfg(test)]
mod tests {
    use super::super::keys::{BuiltinListKeys, SchemaListKeys};
    use super::*;
    use serde_json::json;

    fn smp(target: Value, patch: Value) -> Result<Value, ApiError> {
        let mut t = target;
        strategic_merge_patch(&mut t, &patch, &BuiltinListKeys)?;
        Ok(t)
    }

    fn jobset() -> Value {
        json!({
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {"name": "pytorch-dist", "finalizers": ["a", "b"]},
            "spec": {
                "replicatedJobs": [
                    {"name": "dataset-initializer", "replicas": 1},
                    {"name": "node", "replicas": 1, "template": {"spec": {"template": {"spec": {
                        "containers": [{
                            "name": "node",
                            "image": "pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime",
                            "command": ["torchrun", "train.py"],
                            "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                            "ports": [{"containerPort": 29500}]
                        }],
                        "tolerations": [{"key": "gpu", "operator": "Exists"}]
                    }}}}}
                ]
            }
        })
    }

    const POD: &str = "/spec/replicatedJobs/1/template/spec/template/spec";

    #[test]
    fn maps_merge_and_null_deletes() {
        let out = smp(
            jobset(),
            json!({"metadata": {"labels": {"a": "b", "gone": null}}, "spec": {"suspend": true}}),
        )
        .unwrap();
        assert_eq!(out["metadata"]["labels"], json!({"a": "b"}));
        assert_eq!(out["spec"]["suspend"], json!(true));
        assert_eq!(out["spec"]["replicatedJobs"].as_array().unwrap().len(), 2);
        let out = smp(out, json!({"spec": {"suspend": null}})).unwrap();
        assert!(out["spec"].get("suspend").is_none());
    }

    #[test]
    fn lists_with_merge_keys_merge_by_key_others_replace() {
        let out = smp(
            jobset(),
            json!({"spec": {"replicatedJobs": [{"name": "node", "replicas": 4,
                "template": {"spec": {"template": {"spec": {
                    "containers": [{"name": "node", "image": "pytorch/pytorch:2.8",
                                    "env": [{"name": "B", "value": "3"}, {"name": "C", "value": "4"}],
                                    "command": ["python"]}],
                    "tolerations": [{"key": "tpu", "operator": "Exists"}]}}}}}]}}),
        )
        .unwrap();
        let rj = &out["spec"]["replicatedJobs"];
        assert_eq!(rj[0]["name"], "dataset-initializer");
        assert_eq!(rj[1]["replicas"], 4);
        let pod = out.pointer(POD).unwrap();
        let c = &pod["containers"][0];
        assert_eq!(c["image"], "pytorch/pytorch:2.8");
        // Atomic lists (command, tolerations) are replaced.
        assert_eq!(c["command"], json!(["python"]));
        assert_eq!(
            pod["tolerations"],
            json!([{"key": "tpu", "operator": "Exists"}])
        );
        // env merges by name; patch items come in patch order after the
        // server-only items that preceded them.
        assert_eq!(
            c["env"],
            json!([{"name": "A", "value": "1"}, {"name": "B", "value": "3"}, {"name": "C", "value": "4"}])
        );
        assert_eq!(c["ports"], json!([{"containerPort": 29500}]));
    }

    #[test]
    fn patch_directives_on_items_and_maps() {
        // Delete an item by key.
        let out = smp(
            jobset(),
            json!({"spec": {"replicatedJobs": [{"name": "dataset-initializer", "$patch": "delete"}]}}),
        )
        .unwrap();
        assert_eq!(out["spec"]["replicatedJobs"].as_array().unwrap().len(), 1);
        assert_eq!(out["spec"]["replicatedJobs"][0]["name"], "node");
        // Replace the list.
        let out = smp(
            jobset(),
            json!({"spec": {"replicatedJobs": [{"$patch": "replace"}, {"name": "launcher", "replicas": 1}]}}),
        )
        .unwrap();
        assert_eq!(
            out["spec"]["replicatedJobs"],
            json!([{"name": "launcher", "replicas": 1}])
        );
        // Replace a map.
        let out = smp(
            json!({"spec": {"a": {"x": 1, "y": 2}}}),
            json!({"spec": {"a": {"$patch": "replace", "z": 3}}}),
        )
        .unwrap();
        assert_eq!(out["spec"]["a"], json!({"z": 3}));
        // Delete a map: upstream leaves it empty.
        let out = smp(
            json!({"spec": {"a": {"x": 1}}}),
            json!({"spec": {"a": {"$patch": "delete"}}}),
        )
        .unwrap();
        assert_eq!(out["spec"]["a"], json!({}));
        // `$patch: merge` in a list is refused, an unknown directive too.
        let e = smp(
            jobset(),
            json!({"spec": {"replicatedJobs": [{"$patch": "merge"}]}}),
        )
        .unwrap_err();
        assert_eq!(e.code, 500);
        assert_eq!(
            e.message,
            "merging lists cannot yet be specified in the patch"
        );
        let e = smp(jobset(), json!({"spec": {"$patch": "bogus"}})).unwrap_err();
        assert!(
            e.message.starts_with("unknown patch type: bogus in map:"),
            "{}",
            e.message
        );
    }

    #[test]
    fn missing_merge_key_is_an_error() {
        let e = smp(
            jobset(),
            json!({"spec": {"replicatedJobs": [{"replicas": 3}]}}),
        )
        .unwrap_err();
        assert_eq!(e.code, 500);
        assert_eq!(
            e.message,
            "map: map[replicas:3] does not contain declared merge key: name"
        );
    }

    #[test]
    fn primitive_lists_union_and_delete_from_primitive_list() {
        let out = smp(jobset(), json!({"metadata": {"finalizers": ["c", "a"]}})).unwrap();
        // A union in the patch's order; a server-only item goes before a
        // patch item it preceded in the live list.
        assert_eq!(out["metadata"]["finalizers"], json!(["c", "a", "b"]));
        let out = smp(
            out,
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["b", "zzz"]}}),
        )
        .unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["c", "a"]));
        let out = smp(
            json!({"metadata": {"finalizers": ["a", "b"]}}),
            json!({"metadata": {"finalizers": ["b", "c"]}}),
        )
        .unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["a", "b", "c"]));
        let e = smp(
            jobset(),
            json!({"metadata": {"$deleteFromPrimitiveList": ["a"]}}),
        )
        .unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (400, ERR_PRIMITIVE_LIST));
    }

    #[test]
    fn set_element_order_is_honoured() {
        // kubectl's patch for reordering env and changing B.
        let patch = json!({"spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {"template": {"spec": {
            "containers": [{"name": "node",
                "$setElementOrder/env": [{"name": "C"}, {"name": "B"}, {"name": "A"}],
                "env": [{"name": "C", "value": "c"}, {"name": "B", "value": "b"}]}]}}}}}],
            "$setElementOrder/replicatedJobs": [{"name": "node"}, {"name": "dataset-initializer"}]}});
        let out = smp(jobset(), patch).unwrap();
        let names: Vec<&str> = out["spec"]["replicatedJobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["node", "dataset-initializer"]);
        let env = &out["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"]
            [0]["env"];
        assert_eq!(
            env,
            &json!([{"name": "C", "value": "c"}, {"name": "B", "value": "b"}, {"name": "A", "value": "1"}])
        );
        // Primitive lists too.
        let out = smp(
            jobset(),
            json!({"metadata": {"$setElementOrder/finalizers": ["b", "x", "a"], "finalizers": ["x"]}}),
        )
        .unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["b", "x", "a"]));
        // The patch list must follow the directive's order.
        let e = smp(
            jobset(),
            json!({"metadata": {"$setElementOrder/finalizers": ["a", "b"], "finalizers": ["b", "a"]}}),
        )
        .unwrap_err();
        assert_eq!(e.code, 500);
        assert!(
            e.message.starts_with("The order in patch list:"),
            "{}",
            e.message
        );
    }

    #[test]
    fn retain_keys_clears_unlisted_fields() {
        let vol = json!({"spec": {"volume": {"name": "data", "emptyDir": {}, "other": 1}}});
        let out = smp(
            vol.clone(),
            json!({"spec": {"volume": {"$retainKeys": ["name", "persistentVolumeClaim"],
                                        "persistentVolumeClaim": {"claimName": "c"}}}}),
        )
        .unwrap();
        assert_eq!(
            out["spec"]["volume"],
            json!({"name": "data", "persistentVolumeClaim": {"claimName": "c"}})
        );
        let e = smp(
            vol,
            json!({"spec": {"volume": {"$retainKeys": ["name"], "emptyDir": {}}}}),
        )
        .unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (400, ERR_RETAIN_KEYS));
    }

    #[test]
    fn lists_of_lists_are_422_and_non_objects_400() {
        let e = smp(
            json!({"metadata": {"finalizers": [["a"]]}}),
            json!({"metadata": {"finalizers": [["b"]]}}),
        )
        .unwrap_err();
        assert_eq!(e.code, 422);
        let e = smp(jobset(), json!([1])).unwrap_err();
        assert_eq!(e.code, 400);
    }

    #[test]
    fn new_content_loses_nulls_and_directives() {
        let out = smp(
            json!({}),
            json!({"spec": {"a": {"b": null, "c": 1, "$retainKeys": ["c"]}}}),
        )
        .unwrap();
        assert_eq!(out, json!({"spec": {"a": {"c": 1}}}));
    }

    #[test]
    fn uses_the_crd_schema_keys() {
        let path = format!(
            "{}/../../manifests/crds/trainer.kubeflow.org_trainjobs.yaml",
            env!("CARGO_MANIFEST_DIR")
        );
        let crd: Value = serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let keys = SchemaListKeys::from_crd(&crd, "v1alpha1").unwrap();
        let mut job = json!({"spec": {"trainer": {"env": [{"name": "A", "value": "1"}],
                                                   "command": ["a"]}}});
        strategic_merge_patch(
            &mut job,
            &json!({"spec": {"trainer": {"env": [{"name": "B", "value": "2"}], "command": ["b"]}}}),
            &keys,
        )
        .unwrap();
        // Without `$setElementOrder`, upstream puts new patch items before
        // server-only items it cannot place.
        assert_eq!(
            job["spec"]["trainer"]["env"],
            json!([{"name": "B", "value": "2"}, {"name": "A", "value": "1"}])
        );
        assert_eq!(job["spec"]["trainer"]["command"], json!(["b"]));
    }
}
