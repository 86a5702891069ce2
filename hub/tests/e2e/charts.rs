//! The Helm charts, the install manifests and the Dockerfiles
//! (`tests/charts/test_charts.py`): rendered with Helm, linted, validated;
//! the Deployments' flags checked against the clap definitions; and, run as
//! local processes with the binaries this build produced, the hub must serve
//! and the spoke join it.

use std::path::Path;
use std::process::Command;

use crate::common::{plugin_cache, python_with};

#[test]
fn helm_charts_render_lint_validate_and_start_the_built_binaries() {
    let python = python_with(
        "helm_python, kubernetes_validate",
        "helm-python-sdk kubernetes-validate",
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("hub/ is inside the workspace");
    let trainhub = Path::new(env!("CARGO_BIN_EXE_trainhub"));
    let mut cmd = Command::new(&python);
    cmd.arg(root.join("tests/charts/test_charts.py"))
        .env("TRAINHUB_BIN", trainhub)
        .env("TRAINHUB_PLUGIN_CACHE_DIR", plugin_cache());
    // `cargo test --workspace` builds trainspoke beside trainhub; with
    // `-p trainhub` alone the test reads the spoke's clap definitions and
    // starts nothing.
    let trainspoke = trainhub.with_file_name("trainspoke");
    if trainspoke.exists() {
        cmd.env("TRAINSPOKE_BIN", &trainspoke);
    }
    let out = cmd.output().expect("running python");
    assert!(
        out.status.success(),
        "tests/charts/test_charts.py failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
