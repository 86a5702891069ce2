//! What every target shares: inputs decoded as the API decodes bodies, and
//! the check that a result is within the limits.
#![allow(dead_code)]

use serde_json::Value;
use trainhub_apiserver::limits::{self, MAX_OBJECT_BYTES, MAX_OBJECT_DEPTH, MAX_REQUEST_DEPTH};

/// Two documents from one input: JSON (or YAML) before and after the first
/// NUL byte, each decoded within the request limits.
pub fn two_documents(data: &[u8]) -> Option<(Value, Value)> {
    let split = data.iter().position(|&b| b == 0)?;
    let (a, b) = (&data[..split], &data[split + 1..]);
    Some((document(a)?, document(b)?))
}

pub fn document(bytes: &[u8]) -> Option<Value> {
    match bytes.first() {
        // A leading `#` selects YAML (a comment to YAML).
        Some(b'#') => {
            let text = std::str::from_utf8(bytes).ok()?;
            limits::decode_yaml(text, MAX_REQUEST_DEPTH, 1 << 20).ok()
        }
        _ => limits::decode_json(bytes, MAX_REQUEST_DEPTH, 1 << 20).ok(),
    }
}

/// Panics when `value` is larger or deeper than a write may store.
pub fn assert_within_limits(value: &Value) {
    assert!(
        limits::json_size(value, MAX_OBJECT_BYTES).is_some(),
        "result larger than the object limit"
    );
    assert!(
        limits::depth(value) <= MAX_OBJECT_DEPTH,
        "result deeper than the object limit"
    );
}
