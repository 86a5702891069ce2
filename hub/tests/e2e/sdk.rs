//! The unmodified Kubeflow Python SDK (`pip install kubeflow`) against
//! `trainhub dev`: list_runtimes, train, get_job, list_jobs, delete_job.

use std::path::Path;
use std::process::Command;

use crate::common::{DevHub, tail};

/// The interpreter with the SDK installed: `TRAINHUB_PYTHON` (CI sets it to
/// its virtualenv) or `python3`.
fn python() -> String {
    std::env::var("TRAINHUB_PYTHON").unwrap_or_else(|_| "python3".into())
}

#[test]
fn kubeflow_sdk_lists_runtimes_and_creates_reads_and_deletes_a_trainjob() {
    let has_sdk = Command::new(python())
        .args(["-c", "import kubeflow.trainer"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        has_sdk,
        "the Kubeflow SDK is not installed for {}: `pip install kubeflow` (or set TRAINHUB_PYTHON)",
        python()
    );
    let hub = DevHub::start();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/sdk.py");
    let out = Command::new(python())
        .arg(script)
        .arg(hub.kubeconfig())
        .output()
        .expect("running python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the SDK script failed:\nstdout: {stdout}\nstderr: {}\nhub log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        tail(&hub.log(), 40)
    );
    assert!(stdout.contains("sdk ok:"), "{stdout}");
}
