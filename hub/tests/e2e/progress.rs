//! `status.trainerStatus` from a TrainJob's own pods: a training script
//! posts its progress with what the hub gave it (upstream's
//! `KUBEFLOW_TRAINER_SERVER_*` env, the token and CA in its volume), the
//! Kubeflow SDK's `update_trainjob_status` posts with the same, `kubectl get
//! trainjobs` shows PROGRESS and ETA, and the token is good for nothing else.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::{DevHub, python_with, tail};
use crate::kubectl::eventually;

/// Posts progress 40, ETA 120 and a loss metric with Python's standard
/// library (upstream's "raw HTTP" way), then trains on for a while.
const SCRIPT: &str = r#"
import json, os, ssl, time, urllib.request
url = os.environ["KUBEFLOW_TRAINER_SERVER_URL"]
ctx = ssl.create_default_context(cafile=os.environ["KUBEFLOW_TRAINER_SERVER_CA_CERT"])
token = open(os.environ["KUBEFLOW_TRAINER_SERVER_TOKEN"]).read().strip()
status = {"progressPercentage": 40, "estimatedRemainingSeconds": 120,
          "metrics": [{"name": "loss", "value": "0.5"}],
          "lastUpdatedTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
request = urllib.request.Request(url, data=json.dumps({"trainerStatus": status}).encode(),
    method="POST", headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
with urllib.request.urlopen(request, context=ctx, timeout=10) as answer:
    print("posted", answer.status, json.load(answer)["trainerStatus"]["progressPercentage"], flush=True)
time.sleep(600)
"#;

/// A TrainJob on one node running `command` (JSON).
fn job(name: &str, command: &str) -> String {
    format!(
        "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata:\n  name: {name}\nspec:\n  runtimeRef:\n    name: python-distributed\n  trainer:\n    numNodes: 1\n    command: {command}\n"
    )
}

/// The file `name` of the token volume in the pod directory of `job`.
fn volume_file(root: &Path, job: &str, name: &str) -> Option<PathBuf> {
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.ends_with(format!("volumes/kubeflow-trainer-token/{name}"))
                && path.to_string_lossy().contains(&format!("/{job}-"))
            {
                return Some(path);
            }
        }
    }
    None
}

/// `status.trainerStatus` of the TrainJob `name` as kubectl reads it (null
/// when absent).
fn trainer_status(hub: &DevHub, name: &str) -> serde_json::Value {
    let text = hub.kubectl_ok(&[
        "get",
        "trainjob",
        name,
        "-o",
        "jsonpath={.status.trainerStatus}",
    ]);
    serde_json::from_str(&text).unwrap_or(serde_json::Value::Null)
}

/// Runs `code` with the test's Python, `env` added; its stdout.
fn python(interpreter: &str, code: &str, env: &[(&str, String)]) -> String {
    let out = Command::new(interpreter)
        .args(["-c", code])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .expect("python");
    assert!(
        out.status.success(),
        "{code}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn training_pods_report_progress_that_kubectl_shows() {
    let interpreter = python_with("kubeflow.trainer", "kubeflow");
    let hub = DevHub::start_args(&["--spokes", "1"], |_| {});
    let script = serde_json::json!(["python3", "-c", SCRIPT]).to_string();
    for (name, command) in [
        ("progress", script.as_str()),
        ("other", r#"["sleep", "600"]"#),
    ] {
        let out = hub.kubectl_stdin(&["apply", "-f", "-"], Some(&job(name, command)));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // The script's post shows in the table's PROGRESS and ETA.
    let mut table = String::new();
    let shown = eventually(Duration::from_secs(90), || {
        table = hub.kubectl_ok(&["get", "trainjob", "progress"]);
        table.lines().nth(1).is_some_and(|row| {
            let cells: Vec<&str> = row.split_whitespace().collect();
            cells.contains(&"40") && cells.contains(&"120")
        })
    });
    assert!(
        shown,
        "{table}\nlogs: {}\nhub log:\n{}",
        String::from_utf8_lossy(
            &hub.kubectl(&["logs", "-l", "jobset.sigs.k8s.io/jobset-name=progress"])
                .stdout
        ),
        tail(&hub.log(), 40)
    );
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert!(
        header.ends_with(&["PROGRESS", "ETA"]) && header.contains(&"STATE"),
        "{table}"
    );
    let status = trainer_status(&hub, "progress");
    assert_eq!(
        status["metrics"],
        serde_json::json!([{"name": "loss", "value": "0.5"}])
    );
    assert!(
        status["lastUpdatedTime"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{status}"
    );
    let managers = hub.kubectl_ok(&[
        "get",
        "trainjob",
        "progress",
        "--show-managed-fields",
        "-o",
        "jsonpath={.metadata.managedFields[*].manager}",
    ]);
    assert!(managers.contains("trainer-status"), "{managers}");

    // The Kubeflow SDK's reporter, with the pod's env, token and CA.
    let data = hub.dir.path();
    let token = volume_file(data, "progress", "token").expect("the pod's token file");
    let ca = volume_file(data, "progress", "ca.crt").expect("the pod's CA file");
    let url = format!(
        "https://127.0.0.1:{}/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs/progress/status",
        hub.port
    );
    let env = [
        ("KUBEFLOW_TRAINER_SERVER_URL", url.clone()),
        ("KUBEFLOW_TRAINER_SERVER_CA_CERT", ca.display().to_string()),
        ("KUBEFLOW_TRAINER_SERVER_TOKEN", token.display().to_string()),
    ];
    // The hub takes one post per TrainJob per interval: the script's was
    // the last.
    std::thread::sleep(trainhub::trainer_status::POST_INTERVAL);
    let sent = python(
        &interpreter,
        "from kubeflow.trainer import update_trainjob_status\n\
         print(update_trainjob_status(progress_percent=100, estimated_remaining_seconds=0, metrics={'loss': 0.125}))",
        &env,
    );
    assert_eq!(sent.trim(), "True", "the SDK's post was refused");
    let status = trainer_status(&hub, "progress");
    assert_eq!(status["progressPercentage"], 100, "{status}");
    assert_eq!(status["estimatedRemainingSeconds"], 0, "{status}");
    assert_eq!(
        status["metrics"],
        serde_json::json!([{"name": "loss", "value": "0.125"}])
    );

    // The SDK still reads the TrainJob (its status model meets trainerStatus).
    let seen = python(
        &interpreter,
        &format!(
            "from kubeflow.common.types import KubernetesBackendConfig\n\
             from kubeflow.trainer import TrainerClient\n\
             c = TrainerClient(backend_config=KubernetesBackendConfig(config_file={:?}))\n\
             print(c.get_job('progress').name)",
            hub.kubeconfig().display().to_string()
        ),
        &[],
    );
    assert_eq!(seen.trim(), "progress");

    // The token is good for its own TrainJob's status and nothing else.
    let token_text = std::fs::read_to_string(&token).unwrap();
    let token_text = token_text.trim();
    let as_job = hub.kubectl(&["--token", token_text, "get", "trainjob", "progress"]);
    assert!(!as_job.status.success());
    assert!(
        String::from_utf8_lossy(&as_job.stderr).contains("Forbidden"),
        "{}",
        String::from_utf8_lossy(&as_job.stderr)
    );
    let post = |target: &str, body: &str, bearer: &str| -> String {
        python(
            &interpreter,
            &format!(
                "import ssl, urllib.request, urllib.error\n\
                 ctx = ssl.create_default_context(cafile={ca:?})\n\
                 r = urllib.request.Request({target:?}, data={body:?}.encode(), method='POST', headers={{'Authorization': 'Bearer ' + {bearer:?}, 'Content-Type': 'application/json'}})\n\
                 try:\n    print(urllib.request.urlopen(r, context=ctx, timeout=10).status)\n\
                 except urllib.error.HTTPError as e:\n    print(e.code, e.read().decode())",
                ca = ca.display().to_string()
            ),
            &[],
        )
    };
    let other = url.replace("/progress/status", "/other/status");
    let answer = post(
        &other,
        r#"{"trainerStatus": {"progressPercentage": 1}}"#,
        token_text,
    );
    assert!(answer.starts_with("403"), "another job's status: {answer}");
    std::thread::sleep(trainhub::trainer_status::POST_INTERVAL);
    let answer = post(
        &url,
        r#"{"trainerStatus": {"progressPercentage": 101, "lastUpdatedTime": "2026-01-01T00:00:00Z"}}"#,
        token_text,
    );
    assert!(
        answer.starts_with("422") && answer.contains("status.trainerStatus.progressPercentage"),
        "out of range: {answer}"
    );
    let answer = post(
        &url,
        r#"{"trainerStatus": {"progressPercentage": 5}}"#,
        "trainjob:default:progress:x:00",
    );
    assert!(answer.starts_with("401"), "a forged token: {answer}");
    assert_eq!(
        trainer_status(&hub, "other"),
        serde_json::Value::Null,
        "the other job was not touched"
    );
    hub.kubectl_ok(&["delete", "trainjob", "progress", "other", "--wait=false"]);
}
