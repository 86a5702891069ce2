//! JSON patch (RFC 6902) with kube-apiserver's answers: a body that is not a
//! list of operations is 400 BadRequest, more than 10000 operations 413, and
//! an operation that does not apply (a failed `test`, a missing path) 422
//! Invalid with upstream's fixed message; the operation's own error is in the
//! single cause.
//!
//! The document is bounded while the patch applies, not after: every
//! operation that grows it (`add`, `replace`, `copy`) is measured first, and
//! the one that would take it past [`MAX_OBJECT_BYTES`] is refused (413)
//! before anything is copied, as are copies past
//! [`MAX_JSON_PATCH_COPY_BYTES`] in all (422, as upstream) and values nested
//! past [`MAX_OBJECT_DEPTH`] (422). A patch that doubles a value with `copy`
//! therefore never holds more than the limit.

use serde_json::Value;

use crate::limits::{
    self, MAX_JSON_PATCH_COPY_BYTES, MAX_OBJECT_BYTES, MAX_OBJECT_DEPTH, json_size,
};
use crate::status::ApiError;

/// kube-apiserver's limit on the operations of one JSON patch.
pub const MAX_JSON_PATCH_OPERATIONS: usize = 10000;

/// Applies a JSON patch to `target`. On error `target` may be partly patched:
/// apply to a copy when the original matters (the server does).
pub fn json_patch(target: &mut Value, patch: &Value) -> Result<(), ApiError> {
    let Value::Array(ops) = patch else {
        return Err(ApiError::bad_request(format!(
            "json: cannot unmarshal {} into Go value of type jsonpatch.Patch",
            json_kind(patch)
        )));
    };
    if let Some(bad) = ops.iter().find(|op| !op.is_object()) {
        return Err(ApiError::bad_request(format!(
            "json: cannot unmarshal {} into Go value of type jsonpatch.Operation",
            json_kind(bad)
        )));
    }
    if ops.len() > MAX_JSON_PATCH_OPERATIONS {
        return Err(ApiError::too_large(format!(
            "Request entity too large: The allowed maximum operations in a JSON patch is {MAX_JSON_PATCH_OPERATIONS}, got {}",
            ops.len()
        )));
    }
    let mut bounds = Bounds {
        size: json_size(target, MAX_OBJECT_BYTES).unwrap_or(MAX_OBJECT_BYTES),
        copied: 0,
    };
    for op in ops {
        apply_op(target, op, &mut bounds).map_err(|e| match e {
            OpError::Fails(detail) => does_not_apply(detail),
            OpError::Limit(e) => e,
        })?;
    }
    Ok(())
}

/// Why an operation was not applied.
enum OpError {
    /// It does not apply to the document (upstream's generic 422).
    Fails(String),
    /// It would take the document past a limit.
    Limit(ApiError),
}

impl From<String> for OpError {
    fn from(detail: String) -> Self {
        OpError::Fails(detail)
    }
}

impl From<&str> for OpError {
    fn from(detail: &str) -> Self {
        OpError::Fails(detail.to_string())
    }
}

/// What the patch has made of the document so far: about its size as JSON
/// (exact after additions, an upper bound after removals of keys), and the
/// bytes copied.
struct Bounds {
    size: usize,
    copied: usize,
}

impl Bounds {
    /// Room for `value` to be added under `key` at `path_depth`: its size
    /// (measured at most up to the room left) and nesting are checked
    /// before it is inserted.
    fn grow(&mut self, value: &Value, key: &str, path_depth: usize) -> Result<(), OpError> {
        let room = MAX_OBJECT_BYTES.saturating_sub(self.size);
        let added = json_size(value, room)
            .and_then(|n| n.checked_add(key.len() + 4))
            .filter(|&n| n <= room)
            .ok_or_else(|| OpError::Limit(limits::object_too_large("the patched object")))?;
        if path_depth + limits::depth(value) > MAX_OBJECT_DEPTH {
            return Err(OpError::Limit(limits::too_deep(
                "the patched object",
                MAX_OBJECT_DEPTH,
                "",
            )));
        }
        self.size += added;
        Ok(())
    }

    /// `value` was taken out of the document.
    fn shrink(&mut self, value: &Value) {
        let removed = json_size(value, self.size).unwrap_or(self.size);
        self.size = self.size.saturating_sub(removed);
    }

    /// Counts a copy of `value` against upstream's copy limit, measuring at
    /// most what the limit leaves.
    fn copy(&mut self, value: &Value) -> Result<(), OpError> {
        let room = MAX_JSON_PATCH_COPY_BYTES.saturating_sub(self.copied);
        match json_size(value, room) {
            Some(n) => {
                self.copied += n;
                Ok(())
            }
            None => Err(OpError::Limit(ApiError::new(
                422,
                "Invalid",
                format!(
                    "Unable to complete the copy, the accumulated size increase of copy is more than {MAX_JSON_PATCH_COPY_BYTES} bytes, exceeding the limit {MAX_JSON_PATCH_COPY_BYTES}"
                ),
            ))),
        }
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Upstream answers a patch that does not apply with a generic 422 whose
/// message does not say why; the reason is kept in a cause.
fn does_not_apply(detail: String) -> ApiError {
    ApiError::new(
        422,
        "Invalid",
        "the server rejected our request due to an error in our request",
    )
    .with_cause("", &detail, "")
}

fn str_field<'a>(op: &'a Value, name: &str) -> Result<Option<&'a str>, String> {
    match op.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(format!(
            "json: cannot unmarshal {} into Go value of type string: {name}",
            json_kind(other)
        )),
    }
}

fn apply_op(doc: &mut Value, op: &Value, bounds: &mut Bounds) -> Result<(), OpError> {
    let kind = str_field(op, "op")?.unwrap_or("unknown");
    let path = str_field(op, "path")?;
    let value = op.get("value");
    let null = Value::Null;
    match kind {
        "add" => {
            let path = path.ok_or("add operation does not apply: missing path")?;
            add(doc, path, value.unwrap_or(&null), "add", bounds)
        }
        "remove" => {
            let path = path.ok_or("remove operation does not apply: missing path")?;
            let removed = remove(doc, path)?;
            bounds.shrink(&removed);
            Ok(())
        }
        "replace" => {
            let path = path.ok_or("replace operation does not apply: missing path")?;
            let value = value.unwrap_or(&null);
            let tokens = parse_pointer(path)?;
            let missing = || {
                format!(
                    "replace operation does not apply: doc is missing key: {path}: missing value"
                )
            };
            let old = get(doc, &tokens).ok_or_else(missing)?;
            bounds.shrink(old);
            bounds.grow(value, "", tokens.len())?;
            let slot = get_mut(doc, &tokens).ok_or_else(missing)?;
            *slot = value.clone();
            Ok(())
        }
        "move" => {
            let path = path.ok_or("move operation does not apply: missing path")?;
            let from =
                str_field(op, "from")?.ok_or("move operation does not apply: missing from path")?;
            if path != from && path.starts_with(&format!("{from}/")) {
                return Err(format!(
                    "move operation does not apply: {path} is a child of the from path {from}"
                )
                .into());
            }
            let moved = remove(doc, from).map_err(|_| {
                format!(
                    "move operation does not apply: doc is missing from path: {from}: missing value"
                )
            })?;
            bounds.shrink(&moved);
            add(doc, path, &moved, "move", bounds)
        }
        "copy" => {
            let path = path.ok_or("copy operation does not apply: missing path")?;
            let from =
                str_field(op, "from")?.ok_or("copy operation does not apply: missing from path")?;
            let tokens = parse_pointer(from)?;
            let copied = get(doc, &tokens).ok_or_else(|| {
                format!(
                    "copy operation does not apply: doc is missing from path: {from}: missing value"
                )
            })?;
            // Measured (and refused) before it is cloned: first against
            // the object limit, then against upstream's copy limit.
            let room = MAX_OBJECT_BYTES.saturating_sub(bounds.size);
            if json_size(copied, room).is_none() {
                return Err(OpError::Limit(limits::object_too_large(
                    "the patched object",
                )));
            }
            bounds.copy(copied)?;
            let copied = copied.clone();
            add(doc, path, &copied, "copy", bounds)
        }
        "test" => {
            let path = path.ok_or("test operation does not apply: missing path")?;
            let tokens = parse_pointer(path)?;
            let found = get(doc, &tokens).unwrap_or(&Value::Null);
            if found == value.unwrap_or(&null) {
                Ok(())
            } else {
                Err(format!("testing value {path} failed: test failed").into())
            }
        }
        other => Err(format!("Unexpected kind: {other}").into()),
    }
}

/// The reference tokens of a JSON pointer (RFC 6901).
fn parse_pointer(path: &str) -> Result<Vec<String>, String> {
    if path.is_empty() {
        return Ok(Vec::new());
    }
    let Some(rest) = path.strip_prefix('/') else {
        return Err(format!(
            "JSON pointer must be empty or start with a \"/\": {path}"
        ));
    };
    Ok(rest
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect())
}

/// An index into a list of `len` items; negative counts from the end, as
/// upstream's JSON patch library allows.
fn index(token: &str, len: usize, allow_end: bool) -> Result<usize, String> {
    let invalid = || format!("Unable to access invalid index: {token}: invalid index referenced");
    let i: i64 = token.parse().map_err(|_| invalid())?;
    let len_i = i64::try_from(len).map_err(|_| invalid())?;
    let i = if i < 0 { i + len_i } else { i };
    let max = if allow_end { len_i } else { len_i - 1 };
    if i < 0 || i > max {
        return Err(invalid());
    }
    usize::try_from(i).map_err(|_| invalid())
}

fn get<'a>(doc: &'a Value, tokens: &[String]) -> Option<&'a Value> {
    let mut node = doc;
    for t in tokens {
        node = match node {
            Value::Object(m) => m.get(t)?,
            Value::Array(a) => a.get(index(t, a.len(), false).ok()?)?,
            _ => return None,
        };
    }
    Some(node)
}

fn get_mut<'a>(doc: &'a mut Value, tokens: &[String]) -> Option<&'a mut Value> {
    let mut node = doc;
    for t in tokens {
        node = match node {
            Value::Object(m) => m.get_mut(t)?,
            Value::Array(a) => {
                let i = index(t, a.len(), false).ok()?;
                a.get_mut(i)?
            }
            _ => return None,
        };
    }
    Some(node)
}

/// Adds `value` at `path`, within `bounds`; the value is cloned only once
/// the bounds allow it.
fn add(
    doc: &mut Value,
    path: &str,
    value: &Value,
    op: &str,
    bounds: &mut Bounds,
) -> Result<(), OpError> {
    let tokens = parse_pointer(path)?;
    let Some((last, parent)) = tokens.split_last() else {
        bounds.size = 0;
        bounds.grow(value, "", 0)?;
        *doc = value.clone();
        return Ok(());
    };
    let missing =
        || format!("{op} operation does not apply: doc is missing path: \"{path}\": missing value");
    match get_mut(doc, parent).ok_or_else(missing)? {
        Value::Object(m) => {
            // A value replaced makes room first.
            if let Some(old) = m.get(last.as_str()) {
                bounds.shrink(old);
            }
            bounds.grow(value, last, tokens.len())?;
            m.insert(last.clone(), value.clone());
            Ok(())
        }
        Value::Array(a) => {
            let i = if last == "-" {
                a.len()
            } else {
                index(last, a.len(), true)?
            };
            bounds.grow(value, "", tokens.len())?;
            a.insert(i, value.clone());
            Ok(())
        }
        _ => Err(missing().into()),
    }
}

fn remove(doc: &mut Value, path: &str) -> Result<Value, String> {
    let tokens = parse_pointer(path)?;
    let Some((last, parent)) = tokens.split_last() else {
        return Err("remove operation does not apply: cannot remove the whole document".into());
    };
    let missing = || {
        format!("remove operation does not apply: doc is missing path: \"{path}\": missing value")
    };
    match get_mut(doc, parent).ok_or_else(missing)? {
        Value::Object(m) => m
            .remove(last)
            .ok_or_else(|| format!("Unable to remove nonexistent key: {last}: missing value")),
        Value::Array(a) => {
            let i = index(last, a.len(), false)?;
            Ok(a.remove(i))
        }
        _ => Err(missing()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn trainjob() -> Value {
        json!({
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": "pytorch-dist", "namespace": "team-a"},
            "spec": {
                "runtimeRef": {"name": "torch-distributed"},
                "suspend": true,
                "trainer": {"numNodes": 2, "command": ["torchrun", "train.py"],
                            "env": [{"name": "A", "value": "1"}]}
            }
        })
    }

    #[test]
    fn every_operation() {
        let mut job = trainjob();
        json_patch(
            &mut job,
            &json!([
                {"op": "test", "path": "/spec/suspend", "value": true},
                {"op": "replace", "path": "/spec/suspend", "value": false},
                {"op": "add", "path": "/spec/trainer/command/-", "value": "--epochs=3"},
                {"op": "add", "path": "/spec/trainer/command/0", "value": "exec"},
                {"op": "remove", "path": "/spec/trainer/env/0"},
                {"op": "add", "path": "/metadata/labels", "value": {"kueue.x-k8s.io/queue-name": "q"}},
                {"op": "copy", "from": "/spec/trainer/numNodes", "path": "/spec/trainer/numProcPerNode"},
                {"op": "move", "from": "/metadata/labels", "path": "/metadata/annotations"},
                {"op": "test", "path": "/metadata/annotations/kueue.x-k8s.io~1queue-name", "value": "q"}
            ]),
        )
        .unwrap();
        assert_eq!(job["spec"]["suspend"], json!(false));
        assert_eq!(
            job["spec"]["trainer"]["command"],
            json!(["exec", "torchrun", "train.py", "--epochs=3"])
        );
        assert_eq!(job["spec"]["trainer"]["env"], json!([]));
        assert_eq!(job["spec"]["trainer"]["numProcPerNode"], json!(2));
        assert!(job["metadata"].get("labels").is_none());
        assert_eq!(
            job["metadata"]["annotations"]["kueue.x-k8s.io/queue-name"],
            json!("q")
        );
    }

    #[test]
    fn failed_test_is_422_invalid() {
        let mut job = trainjob();
        let e = json_patch(
            &mut job,
            &json!([{"op": "test", "path": "/spec/suspend", "value": false}]),
        )
        .unwrap_err();
        assert_eq!(e.code, 422);
        assert_eq!(e.reason, "Invalid");
        assert_eq!(
            e.message,
            "the server rejected our request due to an error in our request"
        );
        assert_eq!(
            e.causes[0].message,
            "testing value /spec/suspend failed: test failed"
        );
    }

    #[test]
    fn missing_paths_are_422() {
        let mut job = trainjob();
        for (patch, detail) in [
            (
                json!([{"op": "replace", "path": "/spec/nope", "value": 1}]),
                "replace operation does not apply: doc is missing key: /spec/nope: missing value",
            ),
            (
                json!([{"op": "remove", "path": "/spec/nope"}]),
                "Unable to remove nonexistent key: nope: missing value",
            ),
            (
                json!([{"op": "add", "path": "/spec/a/b", "value": 1}]),
                "add operation does not apply: doc is missing path: \"/spec/a/b\": missing value",
            ),
            (
                json!([{"op": "add", "path": "/spec/trainer/command/7", "value": "x"}]),
                "Unable to access invalid index: 7: invalid index referenced",
            ),
            (
                json!([{"op": "frobnicate", "path": "/spec"}]),
                "Unexpected kind: frobnicate",
            ),
        ] {
            let e = json_patch(&mut job, &patch).unwrap_err();
            assert_eq!(e.code, 422, "{patch}");
            assert_eq!(e.causes[0].message, detail);
        }
    }

    #[test]
    fn unparseable_patch_is_400_and_too_many_ops_413() {
        let mut job = trainjob();
        let e = json_patch(&mut job, &json!({"op": "add"})).unwrap_err();
        assert_eq!((e.code, e.reason), (400, "BadRequest"));
        let e = json_patch(&mut job, &json!(["add"])).unwrap_err();
        assert_eq!(e.code, 400);
        let ops: Vec<Value> = (0..10001)
            .map(|_| json!({"op": "test", "path": "/kind", "value": "TrainJob"}))
            .collect();
        let e = json_patch(&mut job, &Value::Array(ops)).unwrap_err();
        assert_eq!(e.code, 413);
        assert!(e.message.ends_with("is 10000, got 10001"), "{}", e.message);
    }

    #[test]
    fn a_doubling_patch_is_refused_before_it_outgrows_the_limit() {
        // The bomb: a 64 KiB string copied into itself 14 times
        // would be 1 GiB; the copy that passes 3 MiB is refused first.
        let mut job = trainjob();
        job["spec"]["blob"] = json!(["x".repeat(64 * 1024)]);
        let ops: Vec<Value> = (0..14)
            .map(|_| json!({"op": "copy", "from": "/spec/blob", "path": "/spec/blob/-"}))
            .collect();
        let e = json_patch(&mut job, &Value::Array(ops)).unwrap_err();
        assert_eq!(
            (e.code, e.reason),
            (413, "RequestEntityTooLarge"),
            "{}",
            e.message
        );
        assert!(e.message.contains("3145728 bytes"), "{}", e.message);
        // What was built stayed under the limit.
        assert!(json_size(&job, MAX_OBJECT_BYTES).is_some());
    }

    #[test]
    fn copies_count_against_upstreams_copy_limit() {
        // Copy 1 MiB and remove it again: the document stays small, the
        // copies add up.
        let mut job = trainjob();
        job["spec"]["blob"] = json!("x".repeat(1024 * 1024));
        let mut ops = vec![];
        for _ in 0..4 {
            ops.push(json!({"op": "copy", "from": "/spec/blob", "path": "/spec/copy"}));
            ops.push(json!({"op": "remove", "path": "/spec/copy"}));
        }
        let e = json_patch(&mut job, &Value::Array(ops.clone())).unwrap_err();
        assert_eq!(e.code, 422, "{}", e.message);
        assert!(
            e.message.contains("exceeding the limit 3145728"),
            "{}",
            e.message
        );
        // Two rounds are within it.
        let mut job2 = trainjob();
        job2["spec"]["blob"] = json!("x".repeat(1024 * 1024));
        json_patch(&mut job2, &Value::Array(ops[..4].to_vec())).unwrap();
    }

    #[test]
    fn a_copy_that_deepens_past_the_limit_is_refused() {
        // A chain copied into its own leaf doubles its depth each time.
        let mut chain = json!(1);
        for _ in 0..60 {
            chain = json!({"a": chain});
        }
        let mut doc = json!({"c": chain});
        let leaf = format!("/c{}", "/a".repeat(59));
        let ops = json!([{"op": "copy", "from": "/c", "path": format!("{leaf}/b")}]);
        let e = json_patch(&mut doc, &ops).unwrap_err();
        assert_eq!((e.code, e.reason), (422, "Invalid"), "{}", e.message);
        assert!(e.message.contains("more than 110 levels"), "{}", e.message);
        assert!(limits::depth(&doc) <= MAX_OBJECT_DEPTH);
    }

    #[test]
    fn a_large_add_is_refused_and_replacing_frees_room() {
        let mut doc = json!({"a": "x".repeat(2 * 1024 * 1024)});
        let big = "y".repeat(2 * 1024 * 1024);
        let e = json_patch(
            &mut doc,
            &json!([{"op": "add", "path": "/b", "value": big}]),
        )
        .unwrap_err();
        assert_eq!(e.code, 413);
        // Replacing the 2 MiB value with another one fits.
        json_patch(
            &mut doc,
            &json!([{"op": "replace", "path": "/a", "value": big}]),
        )
        .unwrap();
        json_patch(
            &mut doc,
            &json!([{"op": "add", "path": "/a", "value": big}]),
        )
        .unwrap();
        assert_eq!(doc["a"].as_str().map(str::len), Some(big.len()));
    }

    #[test]
    fn negative_indexes_and_root() {
        let mut v = json!({"a": [1, 2, 3]});
        json_patch(&mut v, &json!([{"op": "remove", "path": "/a/-1"}])).unwrap();
        assert_eq!(v, json!({"a": [1, 2]}));
        json_patch(
            &mut v,
            &json!([{"op": "replace", "path": "", "value": {"b": 1}}]),
        )
        .unwrap();
        assert_eq!(v, json!({"b": 1}));
    }
}
