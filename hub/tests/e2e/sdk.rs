//! The unmodified Kubeflow Python SDK (`pip install kubeflow`) against
//! `trainhub dev` with two process spokes: list_runtimes, train on two
//! nodes, wait_for_job_status, get_job_logs (also following) from each node,
//! list_jobs, delete_job.

use std::path::Path;
use std::process::Command;

use crate::common::{DevHub, python_with, tail};

#[test]
fn kubeflow_sdk_lists_runtimes_and_creates_reads_and_deletes_a_trainjob() {
    sdk_suite(&[]);
}

/// The SDK script (`sdk.py`) against `trainhub dev --spokes 2` with `args`
/// added (e.g. another store).
pub fn sdk_suite(args: &[&str]) {
    let python = python_with("kubeflow.trainer", "kubeflow");
    // The SDK's CustomTrainer runs its function with `python`: the spokes
    // run it with the interpreter the SDK is installed for.
    let interpreter = Command::new(&python)
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python");
    let bin = Path::new(String::from_utf8_lossy(&interpreter.stdout).trim())
        .parent()
        .expect("interpreter directory")
        .to_path_buf();
    let venv_python = bin.join("python");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    assert!(
        venv_python.exists()
            || Command::new("python")
                .arg("-V")
                .status()
                .is_ok_and(|s| s.success()),
        "no `python` next to {} or on PATH for the SDK's command",
        bin.display()
    );
    let dev_args: Vec<&str> = ["--spokes", "2"].iter().chain(args).copied().collect();
    let hub = DevHub::start_env(&dev_args, &[("PATH", path)], |_| {});
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/sdk.py");
    let out = Command::new(&python)
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
