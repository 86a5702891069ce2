//! Server-side apply (live NUL applied configuration): no panic, and
//! applying the same configuration again changes nothing.
#![no_main]

#[path = "common.rs"]
mod common;

use libfuzzer_sys::fuzz_target;
use trainhub_apiserver::patch::{self, BuiltinListKeys};

fuzz_target!(|data: &[u8]| {
    let Some((live, applied)) = common::two_documents(data) else {
        return;
    };
    // As the API: a configuration names its apiVersion and kind (the
    // server answers 400 before applying one that does not).
    let named = |field: &str| applied.get(field).and_then(|v| v.as_str()).is_some_and(|s| !s.is_empty());
    if !named("apiVersion") || !named("kind") {
        return;
    }
    let now = "2026-01-01T00:00:00Z";
    let live = live.is_object().then_some(live);
    if let Ok(once) = patch::apply(live.as_ref(), &applied, "fuzz", false, &BuiltinListKeys, now)
    {
        let twice = patch::apply(Some(&once), &applied, "fuzz", false, &BuiltinListKeys, now)
            .expect("applying the same configuration again succeeds");
        assert_eq!(once, twice, "apply is idempotent");
    }
});
