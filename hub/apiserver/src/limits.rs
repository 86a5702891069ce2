//! Bounds on what one request can make the server hold, and the decoders
//! that enforce them while reading.
//!
//! kube-apiserver's numbers carry over: a request body is at most 3 MiB, a
//! JSON patch has at most 10,000 operations and copies at most 3 MiB in all,
//! and no write may produce an object larger than a request may be. Nesting
//! depth is bounded below what the store can decode again: serde_json, which
//! the store reads with, refuses input nested 128 levels deep, and the store's
//! event log wraps every object in one more level
//! ([`STORE_READABLE_DEPTH`]). Every decode of client input here checks depth
//! and size as it builds the value, so a hostile document is refused before
//! it is held in full.
//!
//! Depth counts nested arrays and objects: `1` and `"a"` are depth 0, `{}` and
//! `[]` depth 1, `{"a": [1]}` depth 2.

use std::cell::Cell;
use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

use crate::status::ApiError;

/// The largest request body read (kube-apiserver's `--max-request-bytes`
/// default, 3 MiB).
pub const MAX_REQUEST_BYTES: usize = 3 * 1024 * 1024;

/// The largest object (as JSON) a write may produce: a create, an update, or
/// the result of any kind of patch. kube-apiserver bounds a patched object by
/// its request limit.
pub const MAX_OBJECT_BYTES: usize = MAX_REQUEST_BYTES;

/// kube-apiserver's limit on the bytes one JSON patch may copy, across all its
/// `copy` operations (`JSONPatchMaxCopyBytes`).
pub const MAX_JSON_PATCH_COPY_BYTES: usize = 3 * 1024 * 1024;

/// The deepest nesting accepted in a request body or patch (JSON or YAML).
pub const MAX_REQUEST_DEPTH: usize = 100;

/// The deepest nesting of an object the server stores: room above
/// [`MAX_REQUEST_DEPTH`] for `metadata.managedFields`, whose field sets
/// mirror the object a few levels down.
pub const MAX_OBJECT_DEPTH: usize = MAX_REQUEST_DEPTH + 10;

/// The deepest object the store can read back after a restart: serde_json
/// decodes at most 127 nested levels, and an event record adds one.
pub const STORE_READABLE_DEPTH: usize = 126;

const _: () = assert!(MAX_REQUEST_DEPTH < MAX_OBJECT_DEPTH);
const _: () = assert!(MAX_OBJECT_DEPTH < STORE_READABLE_DEPTH);

/// The nesting depth of `value`, computed without recursion (a value built
/// by a patch may be deeper than the stack allows to walk recursively).
pub fn depth(value: &Value) -> usize {
    // Only containers are stacked (with their own depth): a scalar adds no
    // level, and every write is walked, so the stack stays small.
    let container = |v: &&Value| v.is_array() || v.is_object();
    let mut deepest = 0;
    let mut stack: Vec<(&Value, usize)> = Vec::new();
    if container(&value) {
        stack.push((value, 1));
    }
    while let Some((v, d)) = stack.pop() {
        deepest = deepest.max(d);
        match v {
            Value::Array(a) => stack.extend(a.iter().filter(container).map(|c| (c, d + 1))),
            Value::Object(m) => stack.extend(m.values().filter(container).map(|c| (c, d + 1))),
            _ => {}
        }
    }
    deepest
}

/// The size of `value` as compact JSON, or `None` as soon as it exceeds
/// `limit` (so that measuring a huge value costs no more than `limit`).
pub fn json_size(value: &Value, limit: usize) -> Option<usize> {
    encoded_size(value, limit)
}

/// The size of any serialisable `value` as compact JSON, or `None` as soon
/// as it exceeds `limit` (or cannot be serialised): what caches of typed
/// objects weigh them by.
pub fn encoded_size<T: serde::Serialize + ?Sized>(value: &T, limit: usize) -> Option<usize> {
    struct Counter {
        written: usize,
        limit: usize,
    }
    impl std::io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.written = self.written.saturating_add(buf.len());
            if self.written > self.limit {
                return Err(std::io::Error::other("over the limit"));
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter { written: 0, limit };
    serde_json::to_writer(&mut counter, value).ok()?;
    Some(counter.written)
}

/// The weight of a shared value in a cache bounded by bytes
/// ([`crate::recent::Recent::with_budget`]): its size as compact JSON (a
/// value that cannot be serialised weighs too much to keep).
pub fn encoded_weight<T: serde::Serialize + ?Sized>(value: &std::sync::Arc<T>) -> usize {
    encoded_size(&**value, usize::MAX).unwrap_or(usize::MAX)
}

/// 413 for an object over [`MAX_OBJECT_BYTES`].
pub fn object_too_large(what: &str) -> ApiError {
    ApiError::too_large(format!(
        "Request entity too large: {what} is larger than {MAX_OBJECT_BYTES} bytes, the limit on an object's size"
    ))
}

/// 422 for nesting deeper than `limit`, at `field` (a path such as
/// `spec.deep[0][0]`, or empty when unknown).
pub fn too_deep(what: &str, limit: usize, field: &str) -> ApiError {
    ApiError::new(
        422,
        "Invalid",
        format!(
            "{what} is nested too deeply: more than {limit} levels of objects and arrays (the limit on nesting depth)"
        ),
    )
    .with_cause(
        "FieldValueInvalid",
        &format!(
            "nested too deeply: must have at most {limit} levels of nested objects and arrays (the limit on nesting depth)"
        ),
        field,
    )
}

/// Refuses `value` (`what`: "the object", "the patched object") when it is
/// larger than [`MAX_OBJECT_BYTES`] (413) or deeper than
/// [`MAX_OBJECT_DEPTH`] (422): what a write may store.
pub fn check_object(value: &Value, what: &str) -> Result<(), ApiError> {
    if json_size(value, MAX_OBJECT_BYTES).is_none() {
        return Err(object_too_large(what));
    }
    if depth(value) > MAX_OBJECT_DEPTH {
        return Err(too_deep(what, MAX_OBJECT_DEPTH, ""));
    }
    Ok(())
}

/// Which limit a decode ran into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Breach {
    Depth,
    Size,
}

/// The budget of one decode.
struct Budget {
    max_depth: usize,
    max_bytes: usize,
    used: Cell<usize>,
    breach: Cell<Option<Breach>>,
    /// Where a depth breach happened, innermost first, gathered as the
    /// error travels out.
    path: std::cell::RefCell<Vec<Segment>>,
}

enum Segment {
    Key(String),
    Index(usize),
}

impl Budget {
    fn new(max_depth: usize, max_bytes: usize) -> Self {
        Budget {
            max_depth,
            max_bytes,
            used: Cell::new(0),
            breach: Cell::new(None),
            path: std::cell::RefCell::default(),
        }
    }

    /// Counts `bytes` more of decoded output (about what it takes as JSON).
    fn charge<E: de::Error>(&self, bytes: usize) -> Result<(), E> {
        let used = self.used.get().saturating_add(bytes);
        self.used.set(used);
        if used > self.max_bytes {
            self.breach.set(Some(Breach::Size));
            return Err(E::custom(format!(
                "the decoded document is larger than {} bytes",
                self.max_bytes
            )));
        }
        Ok(())
    }

    fn enter<E: de::Error>(&self, depth: usize) -> Result<usize, E> {
        let inner = depth + 1;
        if inner > self.max_depth {
            self.breach.set(Some(Breach::Depth));
            return Err(E::custom(format!(
                "nesting deeper than {} levels",
                self.max_depth
            )));
        }
        Ok(inner)
    }

    /// Notes `segment` of the path to a depth breach, on the error's way out.
    fn unwinding(&self, segment: impl FnOnce() -> Segment) {
        if self.breach.get() == Some(Breach::Depth) {
            self.path.borrow_mut().push(segment());
        }
    }

    /// The path to a depth breach, as Kubernetes writes field paths, cut
    /// short past a dozen segments.
    fn breach_path(&self) -> String {
        let path = self.path.borrow();
        let mut out = String::new();
        for (i, segment) in path.iter().rev().enumerate() {
            if i == 12 {
                out.push_str("...");
                break;
            }
            match segment {
                Segment::Key(k) if out.is_empty() => out.push_str(k),
                Segment::Key(k) => {
                    out.push('.');
                    out.push_str(k);
                }
                Segment::Index(n) => out.push_str(&format!("[{n}]")),
            }
        }
        out
    }

    /// What a decode that failed with `message` ran into.
    fn error(&self, message: impl fmt::Display) -> DecodeError {
        match self.breach.get() {
            Some(Breach::Depth) => DecodeError::TooDeep {
                limit: self.max_depth,
                path: self.breach_path(),
            },
            Some(Breach::Size) => DecodeError::TooLarge {
                limit: self.max_bytes,
            },
            None => DecodeError::Malformed(message.to_string()),
        }
    }
}

/// Why a bounded decode failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("{path}: nested more than {limit} levels deep")]
    TooDeep { limit: usize, path: String },
    #[error("decodes to more than {limit} bytes")]
    TooLarge { limit: usize },
    #[error("{0}")]
    Malformed(String),
}

impl DecodeError {
    /// The API error about `what` ("the request body"): 422 Invalid when too
    /// deep, 413 RequestEntityTooLarge when too large, and `malformed` of the
    /// parser's message otherwise.
    pub fn into_api(self, what: &str, malformed: impl FnOnce(String) -> ApiError) -> ApiError {
        match self {
            DecodeError::TooDeep { limit, path } => too_deep(what, limit, &path),
            DecodeError::TooLarge { limit } => ApiError::too_large(format!(
                "Request entity too large: {what} decodes to more than {limit} bytes, the limit on an object's size"
            )),
            DecodeError::Malformed(message) => malformed(message),
        }
    }
}

/// A value at `depth` levels of nesting, decoded within the budget.
#[derive(Clone, Copy)]
struct Node<'a> {
    budget: &'a Budget,
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for Node<'_> {
    type Value = Value;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

/// A map key: a string, or a scalar YAML gives (`1: a`, `true: b`) spelled
/// as one.
struct Key<'a>(&'a Budget);

impl<'de> DeserializeSeed<'de> for Key<'_> {
    type Value = String;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Key<'_> {
    type Value = String;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string key")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        self.0.charge::<E>(v.len() + 4)?;
        Ok(v.to_string())
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<String, E> {
        self.0.charge::<E>(v.len() + 4)?;
        Ok(v)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<String, E> {
        self.visit_string(v.to_string())
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
        self.visit_string(v.to_string())
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
        self.visit_string(v.to_string())
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<String, E> {
        self.visit_string(v.to_string())
    }
    fn visit_unit<E: de::Error>(self) -> Result<String, E> {
        self.visit_string("null".to_string())
    }
}

impl<'de> Visitor<'de> for Node<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        self.budget.charge::<E>(5)?;
        Ok(Value::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        self.budget.charge::<E>(8)?;
        Ok(Value::Number(v.into()))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        self.budget.charge::<E>(8)?;
        Ok(Value::Number(v.into()))
    }
    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Value, E> {
        self.budget.charge::<E>(16)?;
        Number::from_i128(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom(format!("the number {v} is out of range")))
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Value, E> {
        self.budget.charge::<E>(16)?;
        Number::from_u128(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom(format!("the number {v} is out of range")))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        self.budget.charge::<E>(8)?;
        // As serde_json's own Value: a NaN or infinity (YAML `.nan`) is null.
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        self.budget.charge::<E>(v.len() + 2)?;
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        self.budget.charge::<E>(v.len() + 2)?;
        Ok(Value::String(v))
    }
    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Value, E> {
        self.budget.charge::<E>(v.len().saturating_mul(4) + 2)?;
        Ok(Value::Array(v.iter().map(|&b| Value::from(b)).collect()))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        self.budget.charge::<E>(4)?;
        Ok(Value::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        self.visit_unit()
    }
    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_newtype_struct<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let child = Node {
            budget: self.budget,
            depth: self.budget.enter::<A::Error>(self.depth)?,
        };
        self.budget.charge::<A::Error>(2)?;
        let mut items = Vec::new();
        loop {
            match seq.next_element_seed(child) {
                Ok(Some(item)) => items.push(item),
                Ok(None) => break,
                Err(e) => {
                    self.budget.unwinding(|| Segment::Index(items.len()));
                    return Err(e);
                }
            }
            self.budget.charge::<A::Error>(1)?;
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let child = Node {
            budget: self.budget,
            depth: self.budget.enter::<A::Error>(self.depth)?,
        };
        self.budget.charge::<A::Error>(2)?;
        let mut object = Map::new();
        while let Some(key) = map.next_key_seed(Key(self.budget))? {
            match map.next_value_seed(child) {
                Ok(value) => {
                    object.insert(key, value);
                }
                Err(e) => {
                    self.budget.unwinding(|| Segment::Key(key));
                    return Err(e);
                }
            }
        }
        Ok(Value::Object(object))
    }
}

/// Decodes JSON `bytes` at most `max_depth` deep, whose decoded value takes
/// at most `max_bytes` (about its size as JSON).
pub fn decode_json(bytes: &[u8], max_depth: usize, max_bytes: usize) -> Result<Value, DecodeError> {
    let budget = Budget::new(max_depth, max_bytes);
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = Node {
        budget: &budget,
        depth: 0,
    }
    .deserialize(&mut de)
    .and_then(|v| de.end().map(|()| v))
    .map_err(|e| budget.error(e))?;
    Ok(value)
}

/// Decodes one YAML document (JSON is YAML too) within the same bounds as
/// [`decode_json`]. Aliases count as what they expand to, so an alias bomb
/// runs into `max_bytes`.
pub fn decode_yaml(text: &str, max_depth: usize, max_bytes: usize) -> Result<Value, DecodeError> {
    let budget = Budget::new(max_depth, max_bytes);
    // The parser's own budget sits above ours, so ours reports first; it
    // still bounds what the parser holds before values are built.
    let options = serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_depth: max_depth + 2,
            flow_nesting_limit: max_depth + 2,
            max_total_scalar_bytes: max_bytes.saturating_mul(2),
            max_documents: 1,
        },
    };
    serde_saphyr::with_deserializer_from_str_with_options(text, options, |de| {
        Node {
            budget: &budget,
            depth: 0,
        }
        .deserialize(de)
    })
    .map_err(|e| {
        let message = e.to_string();
        // The parser's own depth limits, past ours in flow style.
        let parser_depth = message.contains("depth") || message.contains("recursion limit");
        if budget.breach.get().is_none() && parser_depth {
            DecodeError::TooDeep {
                limit: max_depth,
                path: String::new(),
            }
        } else {
            budget.error(message)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn nested(levels: usize) -> String {
        format!("{}1{}", "[".repeat(levels), "]".repeat(levels))
    }

    fn nested_objects(levels: usize) -> String {
        format!("{}1{}", "{\"a\":".repeat(levels), "}".repeat(levels))
    }

    #[test]
    fn depth_counts_containers() {
        assert_eq!(depth(&json!(1)), 0);
        assert_eq!(depth(&json!({})), 1);
        assert_eq!(depth(&json!({"a": [1]})), 2);
        assert_eq!(depth(&json!([[], {"b": {"c": []}}])), 4);
    }

    #[test]
    fn json_at_the_limit_decodes_and_one_more_is_too_deep() {
        let v = decode_json(nested(100).as_bytes(), 100, 1 << 20).unwrap();
        assert_eq!(depth(&v), 100);
        let e = decode_json(nested(101).as_bytes(), 100, 1 << 20).unwrap_err();
        let api = e.into_api("the request body", ApiError::bad_request);
        assert_eq!((api.code, api.reason), (422, "Invalid"));
        assert!(
            api.message.contains("more than 100 levels"),
            "{}",
            api.message
        );
        assert_eq!(api.causes[0].field, format!("{}...", "[0]".repeat(12)));
        // Far deeper than serde_json's own recursion limit: the same answer.
        assert!(matches!(
            decode_json(nested(100_000).as_bytes(), 100, 1 << 20),
            Err(DecodeError::TooDeep { limit: 100, .. })
        ));
        let e = decode_json(nested_objects(5000).as_bytes(), 100, 1 << 20).unwrap_err();
        let DecodeError::TooDeep { limit: 100, path } = e else {
            panic!("{e:?}");
        };
        assert!(path.starts_with("a.a.a."), "{path}");
        let e = decode_json(br#"{"spec": {"x": [1, [[[]]]]}}"#, 3, 1 << 20).unwrap_err();
        assert_eq!(e.to_string(), "spec.x[1]: nested more than 3 levels deep");
    }

    #[test]
    fn malformed_json_is_malformed() {
        for bad in [&b"{"[..], b"[1,]", b"{\"a\":1} x", b"", b"\xff"] {
            let e = decode_json(bad, 100, 1 << 20).unwrap_err();
            assert!(matches!(e, DecodeError::Malformed(_)), "{bad:?}: {e:?}");
            let api = e.into_api("the body", ApiError::bad_request);
            assert_eq!(api.code, 400);
        }
    }

    #[test]
    fn decodes_like_serde_json() {
        let text = r#"{"a": [1, -2, 3.5, "x", true, null, {"b": {}}], "c": 18446744073709551615}"#;
        let ours = decode_json(text.as_bytes(), 100, 1 << 20).unwrap();
        let theirs: Value = serde_json::from_str(text).unwrap();
        assert_eq!(ours, theirs);
        let yaml = decode_yaml(text, 100, 1 << 20).unwrap();
        assert_eq!(yaml, theirs);
    }

    #[test]
    fn large_json_is_too_large() {
        let text = format!("[\"{}\"]", "x".repeat(2000));
        assert!(decode_json(text.as_bytes(), 100, 4000).is_ok());
        assert_eq!(
            decode_json(text.as_bytes(), 100, 1000),
            Err(DecodeError::TooLarge { limit: 1000 })
        );
    }

    #[test]
    fn yaml_depth_is_bounded_in_block_and_flow_style() {
        let v = decode_yaml(&nested(100), 100, 1 << 20).unwrap();
        assert_eq!(depth(&v), 100);
        for text in [nested(101), nested(300), nested(100_000)] {
            assert!(
                matches!(
                    decode_yaml(&text, 100, 1 << 20),
                    Err(DecodeError::TooDeep { limit: 100, .. })
                ),
                "{} levels",
                text.len() / 2
            );
        }
        let mut block = String::new();
        for i in 0..150 {
            block.push_str(&" ".repeat(i));
            block.push_str("a:\n");
        }
        block.push_str(&" ".repeat(150));
        block.push_str("b: 1\n");
        assert!(matches!(
            decode_yaml(&block, 100, 1 << 20),
            Err(DecodeError::TooDeep { limit: 100, .. })
        ));
    }

    #[test]
    fn a_yaml_alias_bomb_is_refused() {
        // Nine levels of ten aliases each: a billion leaves if expanded.
        let mut text = String::from("a0: &a0 [\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"]\n");
        for i in 1..9 {
            let p = i - 1;
            text.push_str(&format!(
                "a{i}: &a{i} [*a{p},*a{p},*a{p},*a{p},*a{p},*a{p},*a{p},*a{p},*a{p},*a{p}]\n"
            ));
        }
        let e = decode_yaml(&text, 100, 1 << 20).unwrap_err();
        assert!(
            matches!(e, DecodeError::TooLarge { .. } | DecodeError::Malformed(_)),
            "{e:?}"
        );
    }

    #[test]
    fn json_size_stops_at_the_limit() {
        let v = json!({"a": "x".repeat(100)});
        assert_eq!(json_size(&v, 1000), Some(v.to_string().len()));
        assert_eq!(json_size(&v, 50), None);
    }

    #[test]
    fn store_readable_depth_is_what_serde_json_reads_inside_an_event() {
        // The event record is one object around the stored object.
        let wrap = |levels: usize| format!("{{\"object\":{}}}", nested(levels));
        assert!(serde_json::from_str::<Value>(&wrap(STORE_READABLE_DEPTH)).is_ok());
        assert!(serde_json::from_str::<Value>(&wrap(STORE_READABLE_DEPTH + 1)).is_err());
    }
}
