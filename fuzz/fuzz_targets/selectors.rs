//! Label and field selector parsers: no panic on any text, and a parsed
//! selector evaluates on any labels.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::json;
use trainhub_apiserver::selector::{FieldSelector, LabelSelector};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(s) = LabelSelector::parse(text) {
        let _ = s.matches(Some(&json!({"a": "b", "app": "x", "tier": "1"})));
        let _ = s.matches(None);
    }
    let supported = ["metadata.name", "metadata.namespace", "status.phase"];
    if let Ok(s) = FieldSelector::parse(text, &supported) {
        let _ = s.matches(&json!({"metadata": {"name": "a"}, "status": {"phase": "Running"}}));
    }
});
