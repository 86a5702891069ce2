//! The bounded JSON and YAML decoders of request bodies: no panic, results
//! within the request limits, and JSON decoded as serde_json decodes it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use trainhub_apiserver::limits::{self, MAX_REQUEST_DEPTH};

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = limits::decode_json(data, MAX_REQUEST_DEPTH, 1 << 20) {
        assert!(limits::depth(&v) <= MAX_REQUEST_DEPTH);
        let theirs: Value = serde_json::from_slice(data).expect("serde_json reads what we read");
        assert_eq!(v, theirs);
    }
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(v) = limits::decode_yaml(text, MAX_REQUEST_DEPTH, 1 << 20)
    {
        assert!(limits::depth(&v) <= MAX_REQUEST_DEPTH);
        assert!(limits::json_size(&v, 4 << 20).is_some());
    }
});
