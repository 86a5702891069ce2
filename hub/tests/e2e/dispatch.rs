//! Dispatch faults against the real hub binary, with spokes in this test
//! process: real agents over real gRPC and mutual TLS, on the simulated
//! backend (runs that hold until stopped), so a spoke can be cut off,
//! brought back holding what it held, and inspected.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::task::JoinHandle;
use trainhub_apiserver::pki::Ca;
use trainhub_proto as pb;
use trainhub_spoke::agent::{self, AgentConfig};
use trainhub_spoke::backend::Backend;
use trainhub_spoke::backend::sim::SimBackend;

use crate::common::{DevHub, eventually, free_port, next_of};

/// A spoke in this process: its backend outlives its agent.
struct TestSpoke {
    name: String,
    backend: Arc<SimBackend>,
    config: AgentConfig,
    reports: Option<tokio::sync::mpsc::UnboundedReceiver<trainhub_spoke::backend::RunReport>>,
    agent: Option<JoinHandle<()>>,
}

impl TestSpoke {
    fn new(ca: &Ca, name: &str, grpc_port: u16) -> TestSpoke {
        let issued = ca
            .issue_client(name, &[trainhub::grpc::SPOKE_GROUP])
            .unwrap();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let capacity: BTreeMap<String, i64> = [
            ("cpu".to_string(), 1_000_000),
            ("memory".to_string(), 1 << 50),
        ]
        .into();
        let backend = SimBackend::new(capacity, Duration::from_secs(3600), tx, None);
        let mut config = AgentConfig::new(
            format!("https://127.0.0.1:{grpc_port}"),
            ca.cert_pem().to_string(),
            issued.cert_pem,
            issued.key_pem,
        );
        config.labels = [("name".to_string(), name.to_string())].into();
        config.heartbeat = Duration::from_millis(300);
        config.backoff_min = Duration::from_millis(100);
        config.backoff_max = Duration::from_millis(500);
        TestSpoke {
            name: name.to_string(),
            backend,
            config,
            reports: Some(rx),
            agent: None,
        }
    }

    /// Connects (again), holding whatever the backend holds.
    fn connect(&mut self) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        // Reports of the old agent's channel are forwarded to the new one.
        if let Some(mut old) = self.reports.take() {
            let tx2 = tx.clone();
            tokio::spawn(async move {
                while let Some(r) = old.recv().await {
                    let _ = tx2.send(r);
                }
            });
        }
        let backend: Arc<dyn Backend> = self.backend.clone();
        self.agent = Some(tokio::spawn(agent::run(
            self.config.clone(),
            backend,
            rx,
            std::future::pending(),
        )));
        drop(tx);
    }

    /// Cuts the spoke off the hub; its runs keep running.
    fn disconnect(&mut self) {
        if let Some(a) = self.agent.take() {
            a.abort();
        }
    }

    fn held(&self) -> Vec<String> {
        self.backend
            .runs()
            .into_iter()
            .map(|r| format!("{}.{}", r.key.run_id, r.key.generation))
            .collect()
    }
}

fn trainjob_yaml(name: &str, selector: Option<&str>) -> String {
    let annotations = selector
        .map(|s| format!("  annotations:\n    trainhub.kubeflow.org/spoke-selector: \"{s}\"\n"))
        .unwrap_or_default();
    format!(
        "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata:\n  name: {name}\n{annotations}spec:\n  runtimeRef:\n    name: python-distributed\n  trainer:\n    numNodes: 1\n    command: [\"true\"]\n---\n"
    )
}

/// Pods of a TrainJob the hub shows, with the spoke annotation of each.
fn pods_of(hub: &DevHub, job: &str) -> Vec<(String, String)> {
    let out = hub.kubectl_ok(&[
        "get",
        "pods",
        "-l",
        &format!("jobset.sigs.k8s.io/jobset-name={job}"),
        "-o",
        "json",
    ]);
    let list: Value = serde_json::from_str(&out).unwrap();
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["metadata"]["name"].as_str().unwrap().to_string(),
                p["metadata"]["annotations"]["trainhub.kubeflow.org/spoke"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect()
}

fn uid_of(hub: &DevHub, job: &str) -> String {
    hub.kubectl_ok(&["get", "trainjob", job, "-o", "jsonpath={.metadata.uid}"])
}

/// `trainhub dev` with no spokes of its own and a worker-lost timeout of
/// 3 s, and two spokes for it (not connected), spoke-a and spoke-b, that
/// fence themselves after 2 s (below the timeout, as the hub requires).
fn hub_losing_spokes_after_3s() -> (DevHub, TestSpoke, TestSpoke) {
    let grpc = free_port();
    let port = grpc.to_string();
    let hub = DevHub::start_args(
        &[
            "--spokes",
            "0",
            "--grpc-port",
            &port,
            "--worker-lost-timeout-seconds",
            "3",
        ],
        |_| {},
    );
    let ca = hub.ca();
    let mut a = TestSpoke::new(&ca, "spoke-a", grpc);
    let mut b = TestSpoke::new(&ca, "spoke-b", grpc);
    a.config.fence_after = Duration::from_secs(2);
    b.config.fence_after = Duration::from_secs(2);
    (hub, a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_spoke_is_replaced_and_its_stale_run_stopped_when_it_returns() {
    let (hub, mut a, mut b) = hub_losing_spokes_after_3s();
    a.connect();
    hub.kubectl_stdin(&["apply", "-f", "-"], Some(&trainjob_yaml("lost", None)));
    let first = eventually("the run on spoke-a", &hub, Duration::from_secs(30), || {
        pods_of(&hub, "lost")
            .into_iter()
            .find(|(_, s)| s == "spoke-a")
    })
    .await;
    let uid = uid_of(&hub, "lost");
    assert_eq!(a.held(), vec![format!("{uid}.1")]);
    b.connect();

    // spoke-a goes dark; after the lost timeout the job runs on spoke-b.
    a.disconnect();
    let cut = Instant::now();
    eventually(
        "the requeued run on spoke-b",
        &hub,
        Duration::from_secs(30),
        || b.held().contains(&format!("{uid}.2")).then_some(()),
    )
    .await;
    assert!(
        cut.elapsed() >= Duration::from_secs(2),
        "requeued before the worker-lost timeout: {:?}",
        cut.elapsed()
    );
    eventually(
        "spoke-b's pods at the hub",
        &hub,
        Duration::from_secs(30),
        || {
            let pods = pods_of(&hub, "lost");
            (!pods.is_empty() && pods.iter().all(|(_, s)| s == "spoke-b")).then_some(())
        },
    )
    .await;
    assert!(
        !pods_of(&hub, "lost")
            .iter()
            .any(|(n, _)| *n == first.0 && first.1 == "spoke-a"),
        "spoke-a's pod is still shown"
    );

    // spoke-a returns still running generation 1: stopped, never shown.
    a.connect();
    eventually(
        "spoke-a's stale run stopped",
        &hub,
        Duration::from_secs(30),
        || a.held().is_empty().then_some(()),
    )
    .await;
    let pods = pods_of(&hub, "lost");
    assert!(pods.iter().all(|(_, s)| s == "spoke-b"), "{pods:?}");
    assert_eq!(b.held(), vec![format!("{uid}.2")]);
    assert!(
        hub.log().contains("spoke connected"),
        "the hub logs spoke connections"
    );
}

/// The counts of a ClusterQueue's status: pending, reserving, admitted.
fn queue_counts(hub: &DevHub) -> Option<(i64, i64, i64)> {
    let out = hub.kubectl(&["get", "cq", "cluster-queue", "-o", "json"]);
    let cq: Value = serde_json::from_slice(&out.stdout).ok()?;
    let n = |f: &str| cq["status"][f].as_i64();
    Some((
        n("pendingWorkloads")?,
        n("reservingWorkloads")?,
        n("admittedWorkloads")?,
    ))
}

/// A spoke lost while its runs hold the whole quota: after the worker-lost
/// timeout they are requeued and placed again within the quota (their
/// reservation released, never counted twice, the TrainJob that waited
/// still waiting), and the stale runs are stopped when the spoke returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_spokes_quota_trainjobs_are_placed_again_within_the_quota() {
    let (hub, mut a, mut b) = hub_losing_spokes_after_3s();
    a.connect();
    // Two CPUs of quota; each TrainJob asks for one.
    let queues = crate::quotas::queues("2", "");
    crate::quotas::apply(&hub, &queues);
    for name in ["q1", "q2"] {
        crate::quotas::apply(&hub, &crate::quotas::trainjob(name, 3600, None));
    }
    eventually(
        "both runs on spoke-a",
        &hub,
        Duration::from_secs(30),
        || (a.held().len() == 2).then_some(()),
    )
    .await;
    b.connect();
    crate::quotas::apply(&hub, &crate::quotas::trainjob("q3", 3600, None));
    eventually(
        "q3 waiting for quota",
        &hub,
        Duration::from_secs(30),
        || (queue_counts(&hub) == Some((1, 2, 2))).then_some(()),
    )
    .await;
    assert!(b.held().is_empty(), "q3 ran over the quota: {:?}", b.held());

    // spoke-a goes dark with both runs: after the lost timeout two of the
    // three run on spoke-b, never three.
    a.disconnect();
    let cut = Instant::now();
    loop {
        let on_b = b.held();
        assert!(
            on_b.len() <= 2,
            "{} runs on a quota of 2: {on_b:?}",
            on_b.len()
        );
        if on_b.len() == 2 && queue_counts(&hub) == Some((1, 2, 2)) {
            break;
        }
        assert!(
            cut.elapsed() < Duration::from_secs(60),
            "not placed again: on spoke-b {on_b:?}, queue {:?}\n{}",
            queue_counts(&hub),
            hub.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        cut.elapsed() >= Duration::from_secs(2),
        "requeued before the worker-lost timeout: {:?}",
        cut.elapsed()
    );
    // Each run on spoke-b is a new generation or the TrainJob that waited.
    let q3 = uid_of(&hub, "q3");
    for run in b.held() {
        assert!(
            run == format!("{q3}.1") || run.ends_with(".2"),
            "{run} on spoke-b"
        );
    }

    // spoke-a returns still running both: stopped, the quota unchanged.
    a.connect();
    eventually(
        "spoke-a's stale runs stopped",
        &hub,
        Duration::from_secs(30),
        || a.held().is_empty().then_some(()),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(b.held().len(), 2, "{:?}", b.held());
    assert_eq!(queue_counts(&hub), Some((1, 2, 2)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_reports_and_certificates_from_another_ca_are_refused() {
    let grpc = free_port();
    let port = grpc.to_string();
    let hub = DevHub::start_args(&["--spokes", "0", "--grpc-port", &port], |_| {});
    let ca = hub.ca();
    let mut a = TestSpoke::new(&ca, "spoke-a", grpc);
    a.connect();
    hub.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(&trainjob_yaml("mine", Some("name=spoke-a"))),
    );
    eventually("the run on spoke-a", &hub, Duration::from_secs(30), || {
        (!pods_of(&hub, "mine").is_empty()).then_some(())
    })
    .await;
    let uid = uid_of(&hub, "mine");

    // spoke-b, with a valid certificate, reports on spoke-a's run.
    let issued = ca
        .issue_client("spoke-b", &[trainhub::grpc::SPOKE_GROUP])
        .unwrap();
    let mut client = connect_raw(&ca, &issued.cert_pem, &issued.key_pem, grpc)
        .await
        .expect("spoke-b connects");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tx.send(message(pb::spoke_message::Message::Hello(pb::Hello {
        backend: "test".into(),
        fence_after_ms: 60_000,
        ..Default::default()
    })))
    .unwrap();
    let fake_pod = serde_json::json!({
        "metadata": {"name": "intruder", "labels": {"jobset.sigs.k8s.io/jobset-name": "mine"}},
        "status": {"phase": "Running"}
    });
    tx.send(message(pb::spoke_message::Message::Report(pb::RunReport {
        run_id: uid.clone(),
        generation: 1,
        seq: 1,
        jobset_status_json: r#"{"conditions":[{"type":"Failed","status":"True","reason":"FailedJobs","message":"forged"}]}"#.into(),
        pods_json: vec![fake_pod.to_string()],
        finished: true,
        events_json: vec![serde_json::json!({
            "metadata": {"name": "intruder.forged"},
            "involvedObject": {"kind": "Pod", "name": "intruder"},
            "reason": "Forged", "message": "forged", "type": "Normal",
        })
        .to_string()],
    })))
    .unwrap();
    let mut inbound = client
        .session(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let stop = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match inbound.message().await {
                Ok(Some(pb::HubMessage {
                    message: Some(pb::hub_message::Message::Stop(stop)),
                })) => return stop,
                Ok(Some(_)) => {}
                other => panic!("stream ended without a stop: {other:?}"),
            }
        }
    })
    .await
    .expect("the hub stops the run it refused");
    assert_eq!(stop.run_id, uid);
    assert!(
        pods_of(&hub, "mine")
            .iter()
            .all(|(n, s)| n != "intruder" && s == "spoke-a"),
        "a forged pod was shown"
    );
    let status = hub.kubectl_ok(&[
        "get",
        "trainjob",
        "mine",
        "-o",
        "jsonpath={.status.conditions}",
    ]);
    assert!(
        !status.contains("forged"),
        "a forged status was taken: {status}"
    );
    let events = hub.kubectl_ok(&["get", "events", "-o", "name"]);
    assert!(
        !events.contains("intruder.forged"),
        "a forged event was written: {events}"
    );
    drop(tx);
    assert!(
        hub.log()
            .contains("refused a report on a run not placed on this spoke"),
        "the refusal is logged"
    );

    // A certificate from another CA: the TLS handshake fails.
    let other = Ca::generate("someone-else").unwrap();
    let stranger = other
        .issue_client("spoke-c", &[trainhub::grpc::SPOKE_GROUP])
        .unwrap();
    let refused = match connect_raw(&ca, &stranger.cert_pem, &stranger.key_pem, grpc).await {
        Err(_) => true,
        Ok(mut client) => {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            tx.send(message(pb::spoke_message::Message::Hello(
                Default::default(),
            )))
            .unwrap();
            client
                .session(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
                .await
                .is_err()
        }
    };
    assert!(refused, "a spoke certificate from another CA was accepted");
    // A user certificate of the right CA is no spoke either.
    let user = ca.issue_client("alice", &["developers"]).unwrap();
    let mut client = connect_raw(&ca, &user.cert_pem, &user.key_pem, grpc)
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tx.send(message(pb::spoke_message::Message::Hello(
        Default::default(),
    )))
    .unwrap();
    let status = client
        .session(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
        .await
        .expect_err("a user certificate is no spoke");
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_a_burst_of_dispatches_places_every_trainjob_exactly_once() {
    let grpc = free_port();
    let port = grpc.to_string();
    let mut hub = DevHub::start_args(&["--spokes", "0", "--grpc-port", &port], |_| {});
    let ca = hub.ca();
    let mut spokes: Vec<TestSpoke> = ["spoke-a", "spoke-b", "spoke-c"]
        .iter()
        .map(|n| TestSpoke::new(&ca, n, grpc))
        .collect();
    for s in &mut spokes {
        s.connect();
    }
    let burst: String = (0..60)
        .map(|i| trainjob_yaml(&format!("burst-{i}"), None))
        .collect();
    let kubeconfig = hub.kubeconfig();
    let apply = std::thread::spawn(move || {
        let mut child = std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["create", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        use std::io::Write;
        let _ = child.stdin.take().unwrap().write_all(burst.as_bytes());
        let _ = child.wait();
    });
    // Kill the hub once dispatching is under way.
    eventually(
        "the first placements",
        &hub,
        Duration::from_secs(60),
        || {
            // Distinct runs: with every spoke admitting every offer, one
            // TrainJob is held (reserved) by all three at first.
            let runs: std::collections::BTreeSet<String> =
                spokes.iter().flat_map(|s| s.held()).collect();
            (runs.len() >= 5).then_some(())
        },
    )
    .await;
    hub.kill();
    let _ = apply.join();
    hub.start_again();
    let out = hub.kubectl_ok(&["get", "trainjobs", "-o", "json"]);
    let list: Value = serde_json::from_str(&out).unwrap();
    let uids: Vec<String> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["metadata"]["uid"].as_str().unwrap().to_string())
        .collect();
    assert!(uids.len() >= 5, "{} TrainJobs survived", uids.len());
    let placed = eventually(
        "every TrainJob held by exactly one spoke",
        &hub,
        Duration::from_secs(90),
        || {
            let mut holders: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for s in &spokes {
                for run in s.held() {
                    let uid = run.split('.').next().unwrap().to_string();
                    holders
                        .entry(uid)
                        .or_default()
                        .push(format!("{}:{run}", s.name));
                }
            }
            let all_once = uids
                .iter()
                .all(|u| holders.get(u).is_some_and(|h| h.len() == 1));
            let no_strays = holders.keys().all(|u| uids.contains(u));
            (all_once && no_strays).then_some(holders)
        },
    )
    .await;
    assert_eq!(placed.len(), uids.len());
}

fn message(m: pb::spoke_message::Message) -> pb::SpokeMessage {
    pb::SpokeMessage { message: Some(m) }
}

async fn connect_raw(
    ca: &Ca,
    cert_pem: &str,
    key_pem: &str,
    port: u16,
) -> Result<pb::spoke_client::SpokeClient<tonic::transport::Channel>, tonic::transport::Error> {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca.cert_pem()))
        .identity(Identity::from_pem(cert_pem, key_pem));
    let channel = Endpoint::from_shared(format!("https://127.0.0.1:{port}"))
        .unwrap()
        .tls_config(tls)?
        .connect()
        .await?;
    Ok(pb::spoke_client::SpokeClient::new(channel))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_left_on_a_replaced_session_does_not_set_the_status_back() {
    use tokio_stream::wrappers::UnboundedReceiverStream;
    let grpc = free_port();
    let port = grpc.to_string();
    let hub = DevHub::start_args(&["--spokes", "0", "--grpc-port", &port], |_| {});
    let ca = hub.ca();
    let issued = ca
        .issue_client("spoke-r", &[trainhub::grpc::SPOKE_GROUP])
        .unwrap();
    let capacity: Vec<pb::Capacity> = ["cpu", "memory"]
        .iter()
        .map(|r| pb::Capacity {
            resource: r.to_string(),
            allocatable_milli: 1 << 40,
            free_milli: 1 << 40,
        })
        .collect();
    let hello = |runs: Vec<pb::RunRef>| {
        message(pb::spoke_message::Message::Hello(pb::Hello {
            labels: [("name".to_string(), "spoke-r".to_string())].into(),
            backend: "test".into(),
            capacity: capacity.clone(),
            runs,
            version: "test".into(),
            fence_after_ms: 60_000,
        }))
    };
    let report = |run_id: &str, seq: u64, status: &str| {
        message(pb::spoke_message::Message::Report(pb::RunReport {
            run_id: run_id.to_string(),
            generation: 1,
            seq,
            jobset_status_json: status.to_string(),
            ..Default::default()
        }))
    };

    // Session 1 is offered the TrainJob, admits it and is told to start it.
    let (tx1, rx1) = tokio::sync::mpsc::unbounded_channel();
    tx1.send(hello(Vec::new())).unwrap();
    let mut client1 = connect_raw(&ca, &issued.cert_pem, &issued.key_pem, grpc)
        .await
        .expect("session 1 connects");
    let mut in1 = client1
        .session(UnboundedReceiverStream::new(rx1))
        .await
        .unwrap()
        .into_inner();
    hub.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(&trainjob_yaml("reordered", Some("name=spoke-r"))),
    );
    let offer = next_of(&mut in1, "an offer", |m| match m {
        pb::hub_message::Message::Offer(o) => Some(o),
        _ => None,
    })
    .await;
    tx1.send(message(pb::spoke_message::Message::Admit(
        pb::AdmitAnswer {
            run_id: offer.run_id.clone(),
            generation: offer.generation,
            admitted: true,
            reason: String::new(),
        },
    )))
    .unwrap();
    next_of(&mut in1, "a start", |m| match m {
        pb::hub_message::Message::Start(s) if s.run_id == offer.run_id => Some(()),
        _ => None,
    })
    .await;
    let run = offer.run_id.clone();

    // Session 2 replaces it (as after a network blip) and reports the run
    // running.
    let running = r#"{"replicatedJobsStatus":[{"name":"node","ready":1,"succeeded":0,"failed":0,"active":1,"suspended":0}]}"#;
    let (tx2, rx2) = tokio::sync::mpsc::unbounded_channel();
    tx2.send(hello(vec![pb::RunRef {
        run_id: run.clone(),
        generation: 1,
        finished: false,
        ..Default::default()
    }]))
    .unwrap();
    tx2.send(report(&run, 1, running)).unwrap();
    let mut client2 = connect_raw(&ca, &issued.cert_pem, &issued.key_pem, grpc)
        .await
        .expect("session 2 connects");
    let _in2 = client2
        .session(UnboundedReceiverStream::new(rx2))
        .await
        .unwrap()
        .into_inner();
    // A field of the TrainJob, by JSONPath.
    let field = |path: &str| {
        hub.kubectl_ok(&[
            "get",
            "trainjob",
            "reordered",
            "-o",
            &format!("jsonpath={{{path}}}"),
        ])
    };
    eventually(
        "the run shown active",
        &hub,
        Duration::from_secs(30),
        || (field(".status.jobsStatus[0].active") == "1").then_some(()),
    )
    .await;

    // One live session per spoke: the hub closed session 1 when session 2
    // said hello, naming why.
    let ended = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match in1.message().await {
                Ok(Some(_)) => {}
                other => return other,
            }
        }
    })
    .await
    .expect("session 1 closed within 30s");
    let status = ended.expect_err("session 1 ends with a status");
    assert_eq!(status.code(), tonic::Code::Aborted, "{status:?}");
    assert!(
        status.message().contains("replaced by a newer session"),
        "{status:?}"
    );
    // A report the old session still carries now goes nowhere: it is older
    // than session 2's and must not be taken.
    let failed = r#"{"conditions":[{"type":"Failed","status":"True","reason":"FailedJobs","message":"stale","lastTransitionTime":"2026-01-01T00:00:00Z"}]}"#;
    let _ = tx1.send(report(&run, 2, failed));
    // Session 2 still speaks for the spoke.
    let finished = r#"{"conditions":[{"type":"Completed","status":"True","reason":"AllJobsCompleted","message":"done","lastTransitionTime":"2026-01-01T00:00:00Z"}],"replicatedJobsStatus":[{"name":"node","ready":0,"succeeded":1,"failed":0,"active":0,"suspended":0}]}"#;
    tx2.send(report(&run, 2, finished)).unwrap();
    eventually(
        "the TrainJob Complete from session 2",
        &hub,
        Duration::from_secs(30),
        || {
            field(".status.conditions[*].type")
                .contains("Complete")
                .then_some(())
        },
    )
    .await;
    let conditions = field(".status.conditions");
    assert!(
        !conditions.contains("stale") && !conditions.contains("\"Failed\""),
        "the replaced session's report was taken: {conditions}"
    );
}
