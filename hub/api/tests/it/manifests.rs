//! The checked-in CRD manifests are what the code generates.

use std::path::Path;

#[test]
fn checked_in_crds_are_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../manifests/crds");
    let mut stale = Vec::new();
    for (name, yaml) in trainhub_api::crd::manifests().unwrap() {
        let on_disk = std::fs::read_to_string(dir.join(&name)).unwrap_or_default();
        if on_disk != yaml {
            stale.push(format!("manifests/crds/{name}"));
        }
    }
    assert!(
        stale.is_empty(),
        "stale or missing: {}; regenerate with `cargo run -p trainhub-api --example crdgen`",
        stale.join(", ")
    );
}
