//! The process backend with real processes.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};

use super::*;

fn backend(dir: &Path) -> (Arc<ProcessBackend>, mpsc::UnboundedReceiver<RunReport>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let b = ProcessBackend::new(
        ProcessConfig {
            work_dir: dir.to_path_buf(),
            capacity: [("cpu".to_string(), 4000)].into(),
            path_env: None,
        },
        tx,
    )
    .unwrap();
    (b, rx)
}

fn jobset(name: &str, rjobs: Value, max_restarts: i64) -> Value {
    json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name},
        "spec": {"failurePolicy": {"maxRestarts": max_restarts}, "replicatedJobs": rjobs}
    })
}

fn rjob(name: &str, pods: i64, script: &str, extra: Value) -> Value {
    let mut r = json!({
        "name": name,
        "replicas": 1,
        "template": {"spec": {"parallelism": pods, "completions": pods, "template": {"spec": {
            "containers": [{
                "name": name,
                "command": ["sh", "-c", script],
                "ports": [{"containerPort": 29500}],
                "resources": {"requests": {"cpu": "1"}},
                "env": [
                    {"name": "MASTER_ADDR", "value": format!("lr-{name}-0-0.lr")},
                    {"name": "MASTER_PORT", "value": "29500"},
                ]
            }]
        }}}}
    });
    if let (Some(r), Some(extra)) = (r.as_object_mut(), extra.as_object()) {
        r.extend(extra.clone());
    }
    r
}

fn spec(name: &str, generation: i64, js: Value) -> RunSpec {
    RunSpec {
        key: RunKey {
            run_id: format!("uid-{name}"),
            generation,
        },
        namespace: "default".into(),
        name: name.into(),
        trainjob_uid: format!("uid-{name}"),
        objects: vec![js],
        extra_env: vec![],
    }
}

/// The first finished report, within a deadline.
async fn finished(rx: &mut mpsc::UnboundedReceiver<RunReport>) -> RunReport {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let report = tokio::time::timeout(left, rx.recv())
            .await
            .expect("a finished report in time")
            .expect("reports open");
        if report.finished {
            return report;
        }
    }
}

#[tokio::test]
async fn two_ranks_meet_over_tcp_on_the_rewritten_endpoint_and_complete() {
    let dir = tempfile::tempdir().unwrap();
    let (b, mut rx) = backend(dir.path());
    let script = r#"python3 - <<'EOF'
import os, socket, time
rank = int(os.environ["JOB_COMPLETION_INDEX"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
if rank == 0:
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port)); s.listen(1)
    c, _ = s.accept(); print("rank 0 got", c.recv(100).decode())
else:
    for _ in range(200):
        try:
            c = socket.create_connection((addr, port)); break
        except OSError:
            time.sleep(0.05)
    c.sendall(b"hello from rank 1"); print("rank 1 sent to", addr, port)
EOF"#;
    let js = jobset("lr", json!([rjob("node", 2, script, json!({}))]), 0);
    b.start(spec("lr", 1, js)).await.unwrap();
    let report = finished(&mut rx).await;
    assert_eq!(
        report.jobset_status["terminalState"], "Completed",
        "{report:?}"
    );
    assert_eq!(
        report.jobset_status["replicatedJobsStatus"][0]["succeeded"],
        1
    );
    assert_eq!(report.pods.len(), 2);
    assert!(
        report
            .pods
            .iter()
            .all(|p| p["status"]["phase"] == "Succeeded")
    );
    let pod0 = report.pods[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(pod0.starts_with("lr-node-0-0-"), "{pod0}");
    assert_eq!(
        report.pods[0]["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"],
        "0"
    );
    let logs = b.logs("uid-lr", &pod0, None, false, None).await.unwrap();
    let text: Vec<_> = logs.collect().await;
    let text =
        String::from_utf8(text.into_iter().flat_map(|c| c.unwrap().to_vec()).collect()).unwrap();
    assert!(text.contains("rank 0 got hello from rank 1"), "{text}");
    // Capacity is released when the run ends.
    assert!(
        b.capacity()
            .iter()
            .all(|c| c.free_milli == c.allocatable_milli)
    );
}

#[tokio::test]
async fn a_failing_pod_restarts_the_jobset_until_max_restarts_then_fails() {
    let dir = tempfile::tempdir().unwrap();
    let (b, mut rx) = backend(dir.path());
    let js = jobset(
        "fail",
        json!([rjob("node", 1, "echo try; exit 3", json!({}))]),
        1,
    );
    b.start(spec("fail", 1, js)).await.unwrap();
    let report = finished(&mut rx).await;
    assert_eq!(report.jobset_status["terminalState"], "Failed");
    assert_eq!(report.jobset_status["restarts"], 1);
    assert_eq!(
        report.jobset_status["conditions"][0]["reason"],
        "FailedJobs"
    );
    let pod = &report.pods[0];
    assert_eq!(pod["status"]["phase"], "Failed");
    assert_eq!(
        pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"],
        3
    );
}

#[tokio::test]
async fn depends_on_runs_the_initializer_first() {
    let dir = tempfile::tempdir().unwrap();
    let (b, mut rx) = backend(dir.path());
    let init = rjob("init", 1, "sleep 0.3; echo ready > ../ready", json!({}));
    let node = rjob(
        "node",
        1,
        "test -f ../ready",
        json!({"dependsOn": [{"name": "init", "status": "Complete"}]}),
    );
    // Pods share the run directory as their parent.
    b.start(spec("dep", 1, jobset("dep", json!([init, node]), 0)))
        .await
        .unwrap();
    let report = finished(&mut rx).await;
    assert_eq!(
        report.jobset_status["terminalState"], "Completed",
        "{report:?}"
    );
}

#[tokio::test]
async fn gang_admission_is_all_or_nothing_and_names_the_resource() {
    let dir = tempfile::tempdir().unwrap();
    let (b, _rx) = backend(dir.path());
    let key = |n: &str| RunKey {
        run_id: n.into(),
        generation: 1,
    };
    let set = |count, cpu| PodSetRequest {
        name: "node".into(),
        count,
        requests_milli: [("cpu".to_string(), cpu)].into(),
    };
    b.admit(&key("a"), &[set(3, 1000)]).unwrap();
    let err = b.admit(&key("b"), &[set(2, 1000)]).unwrap_err();
    assert!(err.to_string().contains("cpu"), "{err}");
    assert_eq!(b.capacity()[0].free_milli, 1000);
    let gpu = PodSetRequest {
        name: "node".into(),
        count: 1,
        requests_milli: [("nvidia.com/gpu".to_string(), 1000)].into(),
    };
    let err = b.admit(&key("c"), &[gpu]).unwrap_err();
    assert!(err.to_string().contains("nvidia.com/gpu"), "{err}");
    b.withdraw(&key("a"));
    b.admit(&key("b"), &[set(2, 1000)]).unwrap();
    assert_eq!(b.capacity()[0].free_milli, 2000);
}

#[tokio::test]
async fn stop_kills_the_process_tree_and_follow_streams_until_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let (b, mut rx) = backend(dir.path());
    let js = jobset(
        "long",
        json!([rjob(
            "node",
            1,
            "echo one; echo two; echo three; sleep 1000 & wait",
            json!({})
        )]),
        0,
    );
    b.start(spec("long", 1, js)).await.unwrap();
    let pod = loop {
        let r = rx.recv().await.unwrap();
        if let Some(p) = r.pods.iter().find(|p| p["status"]["phase"] == "Running") {
            break p["metadata"]["name"].as_str().unwrap().to_string();
        }
    };
    // Until the output is there.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s: Vec<_> = b
            .logs("uid-long", &pod, None, false, Some(2))
            .await
            .unwrap()
            .collect()
            .await;
        let text =
            String::from_utf8(s.into_iter().flat_map(|c| c.unwrap().to_vec()).collect()).unwrap();
        if text == "two\nthree\n" {
            break;
        }
        assert!(Instant::now() < deadline, "tail: {text:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut follow = b
        .logs("uid-long", &pod, Some("node"), true, None)
        .await
        .unwrap();
    assert!(follow.next().await.unwrap().unwrap().starts_with(b"one"));
    assert!(
        b.logs("uid-long", &pod, Some("nope"), false, None)
            .await
            .is_err()
    );
    let sleeper = || {
        std::process::Command::new("pgrep")
            .args(["-f", "sleep 1000"])
            .output()
            .map(|o| !o.stdout.is_empty())
            .unwrap_or(false)
    };
    assert!(sleeper(), "the pod's process runs");
    b.stop("uid-long", 1).await;
    assert!(b.runs().is_empty());
    let deadline = Instant::now() + Duration::from_secs(10);
    while sleeper() {
        assert!(Instant::now() < deadline, "sleep 1000 survived the stop");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The follow ends once the pod is gone.
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(Ok(_)) = follow.next().await {}
    })
    .await;
    assert!(ended.is_ok(), "the follow did not end after the stop");
}
