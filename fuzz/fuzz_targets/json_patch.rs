//! JSON patch (document NUL operations): no panic, and a patch that applies
//! leaves the document within the object limits.
#![no_main]

#[path = "common.rs"]
mod common;

use libfuzzer_sys::fuzz_target;
use trainhub_apiserver::patch;

fuzz_target!(|data: &[u8]| {
    if let Some((mut doc, ops)) = common::two_documents(data)
        && patch::json_patch(&mut doc, &ops).is_ok()
    {
        common::assert_within_limits(&doc);
    }
});
