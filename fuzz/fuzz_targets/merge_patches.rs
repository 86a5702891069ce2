//! JSON merge patch and strategic merge patch (target NUL patch): no panic;
//! merge patch is idempotent.
#![no_main]

#[path = "common.rs"]
mod common;

use libfuzzer_sys::fuzz_target;
use trainhub_apiserver::patch::{self, BuiltinListKeys};

fuzz_target!(|data: &[u8]| {
    let Some((target, p)) = common::two_documents(data) else {
        return;
    };
    let mut once = target.clone();
    patch::merge_patch(&mut once, &p);
    let mut twice = once.clone();
    patch::merge_patch(&mut twice, &p);
    assert_eq!(once, twice, "merge patch is idempotent");
    let mut strategic = target;
    let _ = patch::strategic_merge_patch(&mut strategic, &p, &BuiltinListKeys);
});
