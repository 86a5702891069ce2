//! JSON patch (RFC 6902) with kube-apiserver's answers: a body that is not a
//! list of operations is 400 BadRequest, more than 10000 operations 413, and
//! an operation that does not apply (a failed `test`, a missing path) 422
//! Invalid with upstream's fixed message; the operation's own error is in the
//! single cause.

use serde_json::Value;

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
    for op in ops {
        apply_op(target, op).map_err(does_not_apply)?;
    }
    Ok(())
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

fn apply_op(doc: &mut Value, op: &Value) -> Result<(), String> {
    let kind = str_field(op, "op")?.unwrap_or("unknown");
    let path = str_field(op, "path")?;
    let value = op.get("value").cloned().unwrap_or(Value::Null);
    match kind {
        "add" => {
            let path = path.ok_or("add operation does not apply: missing path")?;
            add(doc, path, value, "add")
        }
        "remove" => {
            let path = path.ok_or("remove operation does not apply: missing path")?;
            remove(doc, path).map(|_| ())
        }
        "replace" => {
            let path = path.ok_or("replace operation does not apply: missing path")?;
            let tokens = parse_pointer(path)?;
            match get_mut(doc, &tokens) {
                Some(slot) => {
                    *slot = value;
                    Ok(())
                }
                None => Err(format!(
                    "replace operation does not apply: doc is missing key: {path}: missing value"
                )),
            }
        }
        "move" => {
            let path = path.ok_or("move operation does not apply: missing path")?;
            let from =
                str_field(op, "from")?.ok_or("move operation does not apply: missing from path")?;
            if path != from && path.starts_with(&format!("{from}/")) {
                return Err(format!(
                    "move operation does not apply: {path} is a child of the from path {from}"
                ));
            }
            let moved = remove(doc, from).map_err(|_| {
                format!(
                    "move operation does not apply: doc is missing from path: {from}: missing value"
                )
            })?;
            add(doc, path, moved, "move")
        }
        "copy" => {
            let path = path.ok_or("copy operation does not apply: missing path")?;
            let from =
                str_field(op, "from")?.ok_or("copy operation does not apply: missing from path")?;
            let tokens = parse_pointer(from)?;
            let copied = get(doc, &tokens).cloned().ok_or_else(|| {
                format!(
                    "copy operation does not apply: doc is missing from path: {from}: missing value"
                )
            })?;
            add(doc, path, copied, "copy")
        }
        "test" => {
            let path = path.ok_or("test operation does not apply: missing path")?;
            let tokens = parse_pointer(path)?;
            let found = get(doc, &tokens).unwrap_or(&Value::Null);
            if *found == value {
                Ok(())
            } else {
                Err(format!("testing value {path} failed: test failed"))
            }
        }
        other => Err(format!("Unexpected kind: {other}")),
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

fn add(doc: &mut Value, path: &str, value: Value, op: &str) -> Result<(), String> {
    let tokens = parse_pointer(path)?;
    let Some((last, parent)) = tokens.split_last() else {
        *doc = value;
        return Ok(());
    };
    let missing =
        || format!("{op} operation does not apply: doc is missing path: \"{path}\": missing value");
    match get_mut(doc, parent).ok_or_else(missing)? {
        Value::Object(m) => {
            m.insert(last.clone(), value);
            Ok(())
        }
        Value::Array(a) => {
            let i = if last == "-" {
                a.len()
            } else {
                index(last, a.len(), true)?
            };
            a.insert(i, value);
            Ok(())
        }
        _ => Err(missing()),
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
            .shift_remove(last)
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
