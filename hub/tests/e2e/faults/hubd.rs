//! Hub-side faults against the real hub binary, with raw gRPC spokes the
//! test drives message by message (real mutual TLS, real protocol): a hub
//! restarted while a spoke is down for good, Withdraw messages dropped, a
//! TrainJob deleted while its spoke is away; and what `kubectl` shows of
//! where a job runs.

use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::mpsc::UnboundedSender;
use tokio_stream::wrappers::UnboundedReceiverStream;
use trainhub_apiserver::pki::Ca;
use trainhub_proto as pb;

use crate::common::{DevHub, eventually, free_port, next_of};

const FINALIZER: &str = "trainhub.kubeflow.org/run-cleanup";

/// A spoke agent played by the test: it says hello and then sends and
/// reads exactly what the test tells it to.
struct RawSpoke {
    name: String,
    tx: UnboundedSender<pb::SpokeMessage>,
    inbound: tonic::Streaming<pb::HubMessage>,
}

fn message(m: pb::spoke_message::Message) -> pb::SpokeMessage {
    pb::SpokeMessage { message: Some(m) }
}

fn capacity(cpu_free: i64) -> Vec<pb::Capacity> {
    vec![
        pb::Capacity {
            resource: "cpu".into(),
            allocatable_milli: 1000,
            free_milli: cpu_free,
        },
        pb::Capacity {
            resource: "memory".into(),
            allocatable_milli: 1 << 50,
            free_milli: 1 << 50,
        },
    ]
}

impl RawSpoke {
    /// Connects as `name` with one CPU (`cpu_free` of it free), holding
    /// `runs`; `fence_after_ms` below the hub's worker-lost timeout.
    async fn connect(
        ca: &Ca,
        name: &str,
        port: u16,
        cpu_free: i64,
        runs: Vec<pb::RunRef>,
        fence_after_ms: i64,
    ) -> RawSpoke {
        use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
        let issued = ca
            .issue_client(name, &[trainhub::grpc::SPOKE_GROUP])
            .unwrap();
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca.cert_pem()))
            .identity(Identity::from_pem(&issued.cert_pem, &issued.key_pem));
        // As a real spoke does: a hub that has just started refuses sessions
        // (UNAVAILABLE) until its dispatch has loaded the store; try again.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let (tx, inbound) = loop {
            let channel = Endpoint::from_shared(format!("https://127.0.0.1:{port}"))
                .unwrap()
                .tls_config(tls.clone())
                .unwrap()
                .connect()
                .await
                .expect("the raw spoke connects");
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            tx.send(message(pb::spoke_message::Message::Hello(pb::Hello {
                labels: [("name".to_string(), name.to_string())].into(),
                backend: "test".into(),
                capacity: capacity(cpu_free),
                runs: runs.clone(),
                version: "test".into(),
                fence_after_ms,
            })))
            .unwrap();
            match pb::spoke_client::SpokeClient::new(channel)
                .session(UnboundedReceiverStream::new(rx))
                .await
            {
                Ok(session) => break (tx, session.into_inner()),
                Err(status)
                    if status.code() == tonic::Code::Unavailable
                        && std::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Err(status) => panic!("the hub takes the session: {status:?}"),
            }
        };
        RawSpoke {
            name: name.to_string(),
            tx,
            inbound,
        }
    }

    fn send(&self, m: pb::spoke_message::Message) {
        self.tx.send(message(m)).unwrap();
    }

    fn admit(&self, run_id: &str, generation: i64) {
        self.send(pb::spoke_message::Message::Admit(pb::AdmitAnswer {
            run_id: run_id.to_string(),
            generation,
            admitted: true,
            reason: String::new(),
        }));
    }

    fn heartbeat(&self, cpu_free: i64, reservations: &[(&str, i64)]) {
        self.send(pb::spoke_message::Message::Heartbeat(pb::Heartbeat {
            capacity: capacity(cpu_free),
            reservations: reservations
                .iter()
                .map(|(id, generation)| pb::RunRef {
                    run_id: id.to_string(),
                    generation: *generation,
                    ..Default::default()
                })
                .collect(),
        }));
    }

    fn report(&self, run_id: &str, generation: i64, seq: u64, status: &str, finished: bool) {
        self.send(pb::spoke_message::Message::Report(pb::RunReport {
            run_id: run_id.to_string(),
            generation,
            seq,
            jobset_status_json: status.to_string(),
            finished,
            ..Default::default()
        }));
    }

    /// The next message from the hub that `pick` takes; others are skipped.
    async fn next<T>(
        &mut self,
        what: &str,
        pick: impl FnMut(pb::hub_message::Message) -> Option<T>,
    ) -> T {
        next_of(
            &mut self.inbound,
            &format!("{what} for {}", self.name),
            pick,
        )
        .await
    }

    async fn offer(&mut self, job: &str) -> pb::Offer {
        self.next(&format!("an offer of {job}"), |m| match m {
            pb::hub_message::Message::Offer(o) if o.name == job => Some(o),
            _ => None,
        })
        .await
    }

    async fn start(&mut self, run_id: &str) -> pb::Start {
        self.next("a start", |m| match m {
            pb::hub_message::Message::Start(s) if s.run_id == run_id => Some(s),
            _ => None,
        })
        .await
    }

    async fn withdraw(&mut self, run_id: &str) -> pb::Withdraw {
        self.next("a withdraw", |m| match m {
            pb::hub_message::Message::Withdraw(w) if w.run_id == run_id => Some(w),
            _ => None,
        })
        .await
    }

    async fn stop(&mut self, run_id: &str) -> pb::Stop {
        self.next("a stop", |m| match m {
            pb::hub_message::Message::Stop(s) if s.run_id == run_id => Some(s),
            _ => None,
        })
        .await
    }

    /// Admits the offer of `job` and waits for its Start.
    async fn take(&mut self, job: &str) -> pb::Start {
        let offer = self.offer(job).await;
        self.admit(&offer.run_id, offer.generation);
        self.start(&offer.run_id).await
    }
}

const RUNNING: &str = r#"{"replicatedJobsStatus":[{"name":"node","ready":1,"succeeded":0,"failed":0,"active":1,"suspended":0}]}"#;
const COMPLETED: &str = r#"{"conditions":[{"type":"Completed","status":"True","reason":"AllJobsCompleted","message":"done","lastTransitionTime":"2026-01-01T00:00:00Z"}],"replicatedJobsStatus":[{"name":"node","ready":0,"succeeded":1,"failed":0,"active":0,"suspended":0}]}"#;

/// A TrainJob of one node asking for one CPU, optionally only for spoke
/// `only`.
fn trainjob(name: &str, only: Option<&str>) -> String {
    let annotations = only
        .map(|s| {
            format!("  annotations:\n    trainhub.kubeflow.org/spoke-selector: \"name={s}\"\n")
        })
        .unwrap_or_default();
    format!(
        "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata:\n  name: {name}\n{annotations}spec:\n  runtimeRef:\n    name: python-distributed\n  trainer:\n    numNodes: 1\n    command: [\"true\"]\n    resourcesPerNode:\n      requests:\n        cpu: \"1\"\n"
    )
}

fn apply(hub: &DevHub, yaml: &str, namespace: Option<&str>) {
    let mut args = vec!["apply", "-f", "-"];
    if let Some(ns) = namespace {
        args.extend(["-n", ns]);
    }
    let out = hub.kubectl_stdin(&args, Some(yaml));
    assert!(
        out.status.success(),
        "kubectl apply: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn field(hub: &DevHub, job: &str, path: &str) -> String {
    hub.kubectl_ok(&[
        "get",
        "trainjob",
        job,
        "-o",
        &format!("jsonpath={{{path}}}"),
    ])
}

fn exists(hub: &DevHub, args: &[&str]) -> bool {
    let out = hub.kubectl(args);
    if out.status.success() {
        return true;
    }
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("NotFound") || err.contains("not found"),
        "{err}"
    );
    false
}

/// The SPOKE cell of `kubectl get trainjobs` for `job` (read at the
/// header's offset: an empty STATE cell leaves no word).
fn spoke_cell(hub: &DevHub, job: &str) -> String {
    let out = hub.kubectl_ok(&["get", "trainjobs"]);
    let mut lines = out.lines();
    let header = lines.next().unwrap_or_default();
    let words: Vec<&str> = header.split_whitespace().collect();
    assert_eq!(
        words,
        ["NAME", "STATE", "AGE", "SPOKE", "PROGRESS", "ETA"],
        "{out}"
    );
    let at = header.find("SPOKE").unwrap();
    let end = header.find("PROGRESS").unwrap();
    lines
        .find(|l| l.split_whitespace().next() == Some(job))
        .map(|l| {
            let end = end.min(l.len());
            l.get(at..end).unwrap_or_default().trim().to_string()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_hub_restart_a_placement_on_a_spoke_gone_for_good_is_requeued() {
    let grpc = free_port();
    let port = grpc.to_string();
    let mut hub = DevHub::start_args(
        &[
            "--spokes",
            "0",
            "--grpc-port",
            &port,
            "--worker-lost-timeout-seconds",
            "4",
        ],
        |_| {},
    );
    let ca = hub.ca();
    let mut a = RawSpoke::connect(&ca, "spoke-a", grpc, 1000, Vec::new(), 3000).await;
    apply(&hub, &trainjob("stranded", None), None);
    let started = a.take("stranded").await;
    assert_eq!(started.generation, 1);
    a.report(&started.run_id, 1, 1, RUNNING, false);
    eventually("SPOKE spoke-a", &hub, Duration::from_secs(30), || {
        (spoke_cell(&hub, "stranded") == "spoke-a").then_some(())
    })
    .await;

    // The hub and the spoke go down; only the hub comes back.
    hub.kill();
    drop(a);
    hub.start_again();
    let restarted = Instant::now();
    let mut b = RawSpoke::connect(&ca, "spoke-b", grpc, 1000, Vec::new(), 3000).await;
    let offer = b.offer("stranded").await;
    // The timer runs from the hub's start (a little before it is ready).
    assert!(
        restarted.elapsed() >= Duration::from_secs(3),
        "requeued before the worker-lost timeout: {:?}",
        restarted.elapsed()
    );
    assert_eq!(offer.run_id, started.run_id);
    assert_eq!(offer.generation, 2, "requeued under a new generation");
    b.admit(&offer.run_id, offer.generation);
    b.start(&offer.run_id).await;
    b.report(&offer.run_id, 2, 1, COMPLETED, true);
    eventually(
        "the TrainJob Complete",
        &hub,
        Duration::from_secs(30),
        || {
            field(&hub, "stranded", ".status.conditions[*].type")
                .contains("Complete")
                .then_some(())
        },
    )
    .await;
    assert_eq!(spoke_cell(&hub, "stranded"), "spoke-b");
    let described = hub.kubectl_ok(&["describe", "trainjob", "stranded"]);
    for expected in [
        "Placed on spoke spoke-a (placement 1)",
        "SpokeLost",
        "Requeued: spoke spoke-a stayed disconnected",
        "Placed on spoke spoke-b (placement 2)",
    ] {
        assert!(
            described.contains(expected),
            "describe lacks {expected:?}:\n{described}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_withdraws_are_sent_again_from_heartbeats_and_the_capacity_comes_back() {
    let grpc = free_port();
    let port = grpc.to_string();
    let hub = DevHub::start_args(
        &[
            "--spokes",
            "0",
            "--grpc-port",
            &port,
            "--offer-timeout-seconds",
            "3",
        ],
        |_| {},
    );
    let ca = hub.ca();
    // r has room for one job; t for many (its free CPU never runs out).
    let mut r = RawSpoke::connect(&ca, "spoke-r", grpc, 1000, Vec::new(), 60_000).await;
    let mut t = RawSpoke::connect(&ca, "spoke-t", grpc, 1000, Vec::new(), 60_000).await;
    apply(&hub, &trainjob("first", None), None);
    let to_r = r.offer("first").await;
    let to_t = t.offer("first").await;
    t.admit(&to_t.run_id, to_t.generation);
    t.start(&to_t.run_id).await;
    // The hub withdraws r's offer, and withdraws it again when r's
    // admission comes too late; r never gets either message (the test
    // drops them), so r still holds the reservation.
    r.admit(&to_r.run_id, to_r.generation);
    for _ in 0..2 {
        let dropped = r.withdraw(&to_r.run_id).await;
        assert_eq!(dropped.generation, 1);
    }
    r.heartbeat(0, &[(&to_r.run_id, to_r.generation)]);
    // The hub sees the leaked reservation and withdraws it again.
    let again = r.withdraw(&to_r.run_id).await;
    assert_eq!(again.generation, 1);
    // This time it arrives: r's capacity is free again (r's view), and
    // the hub places a job that only fits there once it sees that (the
    // hub's view).
    apply(&hub, &trainjob("second", Some("spoke-r")), None);
    r.heartbeat(1000, &[]);
    let second = r.take("second").await;
    assert_eq!(second.name, "second");
    eventually("SPOKE spoke-r", &hub, Duration::from_secs(30), || {
        (spoke_cell(&hub, "second") == "spoke-r").then_some(())
    })
    .await;
    assert_eq!(spoke_cell(&hub, "first"), "spoke-t");

    // Suspended: its run is stopped and it shows no spoke.
    let suspend = |on: bool| {
        hub.kubectl_ok(&[
            "patch",
            "trainjob",
            "second",
            "--type=merge",
            "-p",
            &format!(r#"{{"spec":{{"suspend":{on}}}}}"#),
        ])
    };
    suspend(true);
    let stop = r.stop(&second.run_id).await;
    assert_eq!((stop.generation, stop.reason.as_str()), (1, "suspended"));
    eventually(
        "no SPOKE while suspended",
        &hub,
        Duration::from_secs(30),
        || spoke_cell(&hub, "second").is_empty().then_some(()),
    )
    .await;
    // Resumed: offered again under a new generation; r leaves the offer
    // unanswered, and it expires.
    suspend(false);
    let again = r.offer("second").await;
    assert_eq!(again.generation, 2);
    let offered = Instant::now();
    let expired = r.withdraw(&again.run_id).await;
    assert_eq!(expired.generation, 2);
    assert!(
        offered.elapsed() >= Duration::from_secs(2),
        "withdrawn before the offer timeout: {:?}",
        offered.elapsed()
    );
    let described = hub.kubectl_ok(&["describe", "trainjob", "second"]);
    for reason in ["Placed", "Suspended", "Resumed", "OfferExpired"] {
        assert!(
            described.contains(reason),
            "describe lacks {reason}:\n{described}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trainjob_deleted_while_its_spoke_is_away_goes_once_its_run_is_stopped() {
    let grpc = free_port();
    let port = grpc.to_string();
    let hub = DevHub::start_args(
        &[
            "--spokes",
            "0",
            "--grpc-port",
            &port,
            "--worker-lost-timeout-seconds",
            "60",
            "--deletion-timeout-seconds",
            "6",
        ],
        |_| {},
    );
    let ca = hub.ca();

    // Placed on spoke-d, which then goes away.
    let mut d = RawSpoke::connect(&ca, "spoke-d", grpc, 1000, Vec::new(), 30_000).await;
    apply(&hub, &trainjob("doomed", None), None);
    let run = d.take("doomed").await;
    d.report(&run.run_id, 1, 1, RUNNING, false);
    assert_eq!(
        field(&hub, "doomed", ".metadata.finalizers"),
        format!("[\"{FINALIZER}\"]")
    );
    drop(d);
    hub.kubectl_ok(&["delete", "trainjob", "doomed", "--wait=false"]);
    // Still there, being deleted.
    assert!(!field(&hub, "doomed", ".metadata.deletionTimestamp").is_empty());
    assert!(exists(&hub, &["get", "trainjob", "doomed"]));

    // spoke-d returns still running it: told to stop; once it confirms,
    // the TrainJob is gone.
    let held = pb::RunRef {
        run_id: run.run_id.clone(),
        generation: 1,
        ..Default::default()
    };
    let mut d = RawSpoke::connect(&ca, "spoke-d", grpc, 0, vec![held], 30_000).await;
    let stop = d.stop(&run.run_id).await;
    assert!(stop.generation >= 1);
    assert!(
        exists(&hub, &["get", "trainjob", "doomed"]),
        "gone before the spoke confirmed the stop"
    );
    d.send(pb::spoke_message::Message::Stopped(pb::Stopped {
        run_id: run.run_id.clone(),
        generation: stop.generation,
    }));
    eventually("the TrainJob gone", &hub, Duration::from_secs(30), || {
        (!exists(&hub, &["get", "trainjob", "doomed"])).then_some(())
    })
    .await;

    // Deleted while its spoke is away for good: gone after the bound.
    d.heartbeat(1000, &[]);
    apply(&hub, &trainjob("abandoned", None), None);
    let run = d.take("abandoned").await;
    d.report(&run.run_id, 1, 1, RUNNING, false);
    drop(d);
    hub.kubectl_ok(&["delete", "trainjob", "abandoned", "--wait=false"]);
    let deleted = Instant::now();
    assert!(exists(&hub, &["get", "trainjob", "abandoned"]));
    eventually(
        "the TrainJob gone after the bound",
        &hub,
        Duration::from_secs(30),
        || (!exists(&hub, &["get", "trainjob", "abandoned"])).then_some(()),
    )
    .await;
    assert!(
        deleted.elapsed() >= Duration::from_secs(4),
        "gone before the deletion bound: {:?}",
        deleted.elapsed()
    );

    // A namespace with a placed TrainJob in it: deleting the namespace
    // deletes the TrainJob through its finalizer, then the namespace.
    let mut d = RawSpoke::connect(&ca, "spoke-d", grpc, 1000, Vec::new(), 30_000).await;
    hub.kubectl_ok(&["create", "namespace", "team"]);
    apply(&hub, &trainjob("inside", None), Some("team"));
    let run = d.take("inside").await;
    d.report(&run.run_id, 1, 1, RUNNING, false);
    eventually("the finalizer", &hub, Duration::from_secs(30), || {
        hub.kubectl_ok(&[
            "get",
            "trainjob",
            "inside",
            "-n",
            "team",
            "-o",
            "jsonpath={.metadata.finalizers}",
        ])
        .contains(FINALIZER)
        .then_some(())
    })
    .await;
    hub.kubectl_ok(&["delete", "namespace", "team", "--wait=false"]);
    let stop = d.stop(&run.run_id).await;
    d.send(pb::spoke_message::Message::Stopped(pb::Stopped {
        run_id: run.run_id.clone(),
        generation: stop.generation,
    }));
    eventually("the namespace gone", &hub, Duration::from_secs(30), || {
        (!exists(&hub, &["get", "namespace", "team"])).then_some(())
    })
    .await;
    let list: Value =
        serde_json::from_str(&hub.kubectl_ok(&["get", "trainjobs", "-A", "-o", "json"])).unwrap();
    assert_eq!(list["items"].as_array().map(Vec::len), Some(0), "{list}");
}
