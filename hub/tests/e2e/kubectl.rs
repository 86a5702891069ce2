//! kubectl, unmodified, against `trainhub dev`.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{DevHub, upstream_dir};

fn yaml_files() -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(upstream_dir())
        .expect("upstream manifests")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    // Runtimes first, then the TrainJobs that use them.
    files.sort_by_key(|p| {
        (
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('0')),
            p.clone(),
        )
    });
    files
}

/// Polls `f` until it returns true or `timeout` passes.
fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

#[test]
fn kubectl_applies_upstream_manifests_and_manages_trainjobs() {
    kubectl_suite(&DevHub::start());
}

/// Upstream manifests applied unchanged, then TrainJobs listed, described,
/// patched, watched and deleted with kubectl, against `hub` (any store).
pub fn kubectl_suite(hub: &DevHub) {
    // Every upstream file, unchanged, with kubectl's default (strict,
    // server-side) validation.
    for file in yaml_files() {
        let path = file.to_string_lossy().into_owned();
        let out = hub.kubectl_ok(&["apply", "-f", &path]);
        assert!(
            out.contains("created") || out.contains("configured") || out.contains("unchanged"),
            "{path}: {out}"
        );
    }

    let table = hub.kubectl_ok(&["get", "trainjobs"]);
    let header = table.lines().next().unwrap_or_default();
    assert!(
        header.starts_with("NAME") && header.contains("STATE") && header.contains("AGE"),
        "{table}"
    );
    for name in ["multi-node-example", "runtime-patches-example"] {
        assert!(table.contains(name), "{name} missing from:\n{table}");
    }
    let runtimes = hub.kubectl_ok(&["get", "clustertrainingruntimes"]);
    for name in [
        "torch-distributed",
        "deepspeed-distributed",
        "python-distributed",
    ] {
        assert!(runtimes.contains(name), "{name} missing from:\n{runtimes}");
    }

    let yaml = hub.kubectl_ok(&["get", "trainjob", "multi-node-example", "-o", "yaml"]);
    assert!(
        yaml.contains("kind: TrainJob") && yaml.contains("name: torch-distributed"),
        "{yaml}"
    );
    assert!(
        yaml.contains("resourceVersion:") && yaml.contains("uid:"),
        "{yaml}"
    );
    // Admission defaulted the runtime reference.
    assert!(
        yaml.contains("kind: ClusterTrainingRuntime")
            && yaml.contains("apiGroup: trainer.kubeflow.org"),
        "{yaml}"
    );

    let described = hub.kubectl_ok(&["describe", "trainjob", "multi-node-example"]);
    assert!(
        described.contains("Name:")
            && described.contains("multi-node-example")
            && described.contains("Runtime Ref"),
        "{described}"
    );

    // get -w sees a change made meanwhile.
    let mut watch = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(hub.kubeconfig())
        .args([
            "get",
            "trainjob",
            "multi-node-example",
            "-w",
            "-o",
            "custom-columns=NAME:.metadata.name,TEAM:.metadata.labels.team",
            "--no-headers",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl get -w");
    let stdout = watch.stdout.take().expect("stdout");
    let (lines_tx, lines_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let first = lines_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the watch lists the job first");
    assert!(first.contains("multi-node-example"), "{first}");

    let out = hub.kubectl_ok(&["label", "trainjob", "multi-node-example", "team=vision"]);
    assert!(out.contains("labeled"), "{out}");
    let seen = lines_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the watch sees the label");
    assert!(seen.contains("vision"), "{seen}");
    let _ = watch.kill();
    let _ = watch.wait();

    let selected = hub.kubectl_ok(&["get", "trainjobs", "-l", "team in (vision)", "-o", "name"]);
    assert_eq!(
        selected.trim(),
        "trainjob.trainer.kubeflow.org/multi-node-example"
    );
    let by_field = hub.kubectl_ok(&[
        "get",
        "trainjobs",
        "--field-selector",
        "metadata.name=multi-node-example",
        "-o",
        "name",
    ]);
    assert_eq!(
        by_field.trim(),
        "trainjob.trainer.kubeflow.org/multi-node-example"
    );

    // Suspend with a merge patch; the lifecycle controller reports it.
    let out = hub.kubectl_ok(&[
        "patch",
        "trainjob",
        "multi-node-example",
        "--type=merge",
        "-p",
        r#"{"spec":{"suspend":true}}"#,
    ]);
    assert!(out.contains("patched"), "{out}");
    assert!(
        eventually(Duration::from_secs(10), || hub.kubectl_ok(&[
            "get",
            "trainjob",
            "multi-node-example",
            "-o",
            "jsonpath={.status.conditions[0].reason}"
        ]) == "Suspended"),
        "the Suspended condition did not appear"
    );

    // An invalid TrainJob: 422 naming the field.
    let bad = "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata:\n  name: bad\nspec:\n  runtimeRef:\n    name: torch-distributed\n  trainer:\n    numNodes: -1\n";
    let out = hub.kubectl_stdin(&["apply", "-f", "-"], Some(bad));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "an invalid TrainJob was accepted");
    assert!(
        stderr.contains("spec.trainer.numNodes") && stderr.contains("Invalid value"),
        "{stderr}"
    );

    let out = hub.kubectl_ok(&["delete", "trainjob", "multi-node-example"]);
    assert!(out.contains("deleted"), "{out}");
    let out = hub.kubectl(&["get", "trainjob", "multi-node-example"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("NotFound"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
