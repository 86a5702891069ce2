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
pub(crate) fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
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

    kueue_suite(hub);

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

/// Kueue's examples applied unchanged, and its kinds listed by their short
/// names with Kueue's columns.
fn kueue_suite(hub: &DevHub) {
    let examples = upstream_dir().join("../kueue/examples");
    let mut files: Vec<_> = std::fs::read_dir(&examples)
        .expect("Kueue's examples")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 4, "{files:?}");
    for file in files {
        let path = file.to_string_lossy().into_owned();
        let out = hub.kubectl_ok(&["apply", "-f", &path]);
        assert!(
            out.contains("created") || out.contains("configured"),
            "{path}: {out}"
        );
    }
    let priority = "apiVersion: kueue.x-k8s.io/v1beta2\nkind: WorkloadPriorityClass\nmetadata:\n  name: high-priority\nvalue: 10000\ndescription: production training\n";
    let out = hub.kubectl_stdin(&["apply", "-f", "-"], Some(priority));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let listed = hub.kubectl_ok(&["get", "cq,lq,rf,wpc"]);
    for expected in [
        "clusterqueue.kueue.x-k8s.io/cluster-queue",
        "localqueue.kueue.x-k8s.io/user-queue",
        "resourceflavor.kueue.x-k8s.io/default-flavor",
        "resourceflavor.kueue.x-k8s.io/spot",
        "workloadpriorityclass.kueue.x-k8s.io/high-priority",
    ] {
        assert!(
            listed.contains(expected),
            "{expected} missing from:\n{listed}"
        );
    }
    let headers: Vec<Vec<&str>> = listed
        .lines()
        .filter(|l| l.starts_with("NAME"))
        .map(|l| {
            l.split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .collect()
        })
        .collect();
    assert!(
        headers.contains(&vec!["NAME", "COHORT", "PENDING WORKLOADS"]),
        "{listed}"
    );
    assert!(
        headers.contains(&vec![
            "NAME",
            "CLUSTERQUEUE",
            "PENDING WORKLOADS",
            "ADMITTED WORKLOADS"
        ]),
        "{listed}"
    );
    assert!(headers.contains(&vec!["NAME", "VALUE"]), "{listed}");
    let wpc = listed
        .lines()
        .find(|l| l.contains("workloadpriorityclass.kueue.x-k8s.io/high-priority"))
        .unwrap_or_default();
    assert!(wpc.contains("10000"), "{listed}");

    let wide = hub.kubectl_ok(&["get", "cq", "cluster-queue", "-o", "wide"]);
    assert!(
        wide.contains("STRATEGY") && wide.contains("BestEffortFIFO"),
        "{wide}"
    );

    // The deprecated version, asked for by name, says so.
    let out = hub.kubectl(&["get", "clusterqueues.v1beta1.kueue.x-k8s.io", "-o", "name"]);
    assert!(out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("Warning: This version is deprecated. Use v1beta2 instead."),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // An invalid ClusterQueue: 422 naming the field.
    let bad = "apiVersion: kueue.x-k8s.io/v1beta2\nkind: ClusterQueue\nmetadata:\n  name: bad-queue\nspec:\n  resourceGroups:\n  - coveredResources: [cpu]\n    flavors:\n    - name: default-flavor\n      resources:\n      - name: cpu\n        nominalQuota: 4\n        lendingLimit: 2\n";
    let out = hub.kubectl_stdin(&["apply", "-f", "-"], Some(bad));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "an invalid ClusterQueue was accepted"
    );
    assert!(
        stderr.contains("spec.resourceGroups[0].flavors[0].resources[0].lendingLimit")
            && stderr.contains("must be nil when cohort is empty"),
        "{stderr}"
    );
}
