//! Per-spoke authority and the hub's own endpoints: a log reader that never
//! reads stalls no one; a spoke writes only the pods, events and log
//! streams of its own runs; `/metrics` and `/debug/*` are for the policy's
//! admin groups.

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc::UnboundedSender;
use tokio_stream::wrappers::UnboundedReceiverStream;
use trainhub_apiserver::pki::Ca;
use trainhub_proto as pb;

use crate::common::{DevHub, free_port, next_of, tail, wait_for};

fn log_of(hub: &DevHub) -> impl Fn() -> String + '_ {
    move || format!("hub log:\n{}", tail(&hub.log(), 80))
}

/// A one-pod TrainJob running `script`, on a spoke `selector` picks (any
/// when empty).
fn trainjob(name: &str, selector: &str, script: &str) -> String {
    let script = serde_json::to_string(script).unwrap();
    let annotations = if selector.is_empty() {
        String::new()
    } else {
        format!("  annotations:\n    trainhub.kubeflow.org/spoke-selector: \"{selector}\"\n")
    };
    format!(
        "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata:\n  name: {name}\n{annotations}spec:\n  runtimeRef:\n    name: python-distributed\n  trainer:\n    numNodes: 1\n    command: [\"sh\", \"-c\", {script}]\n"
    )
}

/// The name of the pod of a one-pod TrainJob, once the hub shows it.
async fn pod_of(hub: &DevHub, job: &str) -> String {
    wait_for(
        &format!("the pod of {job}"),
        Duration::from_secs(120),
        log_of(hub),
        || {
            let out = hub.kubectl(&[
                "get",
                "pods",
                "-l",
                &format!("jobset.sigs.k8s.io/jobset-name={job}"),
                "-o",
                "jsonpath={.items[0].metadata.name}",
            ]);
            let name = String::from_utf8_lossy(&out.stdout).trim().to_string();
            (out.status.success() && !name.is_empty()).then_some(name)
        },
    )
    .await
}

/// `.status.conditions[*].type` of a TrainJob.
fn conditions(hub: &DevHub, name: &str) -> String {
    let out = hub.kubectl(&[
        "get",
        "trainjob",
        name,
        "-o",
        "jsonpath={.status.conditions[?(@.status==\"True\")].type}",
    ]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_follower_that_never_reads_stalls_no_other_job() {
    let hub = DevHub::start_args(&["--spokes", "1"], |_| {});
    // A job that writes 32 MiB of log at once and keeps running: far more
    // than the hub buffers for a reader, the pipe and the sockets hold.
    hub.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(&trainjob(
            "talker",
            "",
            "yes 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde | head -c 33554432; echo talked; sleep 300",
        )),
    );
    let pod = pod_of(&hub, "talker").await;
    let pod = pod.as_str();
    wait_for(
        "the talker's log written",
        Duration::from_secs(120),
        log_of(&hub),
        || {
            let out = hub.kubectl(&["logs", pod, "--tail", "1"]);
            String::from_utf8_lossy(&out.stdout)
                .contains("talked")
                .then_some(())
        },
    )
    .await;

    // `kubectl logs -f` whose stdout nobody reads: kubectl blocks on its
    // pipe, the hub's writes to kubectl block, its buffer fills.
    let mut stuck = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(hub.kubeconfig())
        .args(["logs", "-f", pod])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl logs -f");

    // The hub drops that reader, on its own stream...
    wait_for(
        "the stuck reader dropped",
        Duration::from_secs(60),
        log_of(&hub),
        || {
            hub.log()
                .contains("dropped a log stream whose reader fell behind")
                .then_some(())
        },
    )
    .await;

    // ...and another job on the same spoke keeps reporting and completes.
    hub.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(&trainjob("quiet", "", "echo quiet-done")),
    );
    wait_for(
        "the other job Complete within 30s",
        Duration::from_secs(30),
        log_of(&hub),
        || conditions(&hub, "quiet").contains("Complete").then_some(()),
    )
    .await;
    let quiet = pod_of(&hub, "quiet").await;
    let logs = hub.kubectl_ok(&["logs", &quiet]);
    assert_eq!(logs.trim(), "quiet-done");
    // The talker's logs can still be read by a reader that reads.
    let last = hub.kubectl_ok(&["logs", pod, "--tail", "1"]);
    assert_eq!(last.trim(), "talked");
    let _ = stuck.kill();
    let _ = stuck.wait();
    // Stopped before the hub goes, so no process outlives the test.
    hub.kubectl_ok(&["delete", "trainjob", "talker", "--wait=true"]);
}

async fn connect(
    ca: &Ca,
    name: &str,
    port: u16,
) -> pb::spoke_client::SpokeClient<tonic::transport::Channel> {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
    let issued = ca
        .issue_client(name, &[trainhub::grpc::SPOKE_GROUP])
        .unwrap();
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca.cert_pem()))
        .identity(Identity::from_pem(&issued.cert_pem, &issued.key_pem));
    let channel = Endpoint::from_shared(format!("https://127.0.0.1:{port}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .expect("a spoke connects");
    pb::spoke_client::SpokeClient::new(channel)
}

fn message(m: pb::spoke_message::Message) -> pb::SpokeMessage {
    pb::SpokeMessage { message: Some(m) }
}

/// A raw spoke session: says hello with label `name=NAME`.
struct RawSpoke {
    tx: UnboundedSender<pb::SpokeMessage>,
    inbound: tonic::Streaming<pb::HubMessage>,
}

impl RawSpoke {
    async fn open(ca: &Ca, name: &str, port: u16) -> RawSpoke {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let capacity: Vec<pb::Capacity> = ["cpu", "memory"]
            .iter()
            .map(|r| pb::Capacity {
                resource: r.to_string(),
                allocatable_milli: 1 << 40,
                free_milli: 1 << 40,
            })
            .collect();
        tx.send(message(pb::spoke_message::Message::Hello(pb::Hello {
            labels: [("name".to_string(), name.to_string())].into(),
            backend: "test".into(),
            capacity,
            runs: Vec::new(),
            version: "test".into(),
            fence_after_ms: 60_000,
        })))
        .unwrap();
        let mut client = connect(ca, name, port).await;
        let inbound = client
            .session(UnboundedReceiverStream::new(rx))
            .await
            .expect("a session")
            .into_inner();
        RawSpoke { tx, inbound }
    }

    async fn next<T>(
        &mut self,
        what: &str,
        pick: impl FnMut(pb::hub_message::Message) -> Option<T>,
    ) -> T {
        next_of(&mut self.inbound, what, pick).await
    }

    /// Admits the next offer and waits for its start: the run id.
    async fn take_run(&mut self) -> String {
        let offer = self
            .next("an offer", |m| match m {
                pb::hub_message::Message::Offer(o) => Some(o),
                _ => None,
            })
            .await;
        self.tx
            .send(message(pb::spoke_message::Message::Admit(
                pb::AdmitAnswer {
                    run_id: offer.run_id.clone(),
                    generation: offer.generation,
                    admitted: true,
                    reason: String::new(),
                },
            )))
            .unwrap();
        let run = offer.run_id.clone();
        self.next("a start", |m| match m {
            pb::hub_message::Message::Start(s) if s.run_id == run => Some(()),
            _ => None,
        })
        .await;
        offer.run_id
    }

    fn report(&self, run_id: &str, seq: u64, pods: &[Value], events: &[Value]) {
        let running = r#"{"replicatedJobsStatus":[{"name":"node","ready":1,"succeeded":0,"failed":0,"active":1,"suspended":0}]}"#;
        self.tx
            .send(message(pb::spoke_message::Message::Report(pb::RunReport {
                run_id: run_id.to_string(),
                generation: 1,
                seq,
                jobset_status_json: running.into(),
                pods_json: pods.iter().map(Value::to_string).collect(),
                finished: false,
                events_json: events.iter().map(Value::to_string).collect(),
            })))
            .unwrap();
    }

    fn log(&self, request_id: &str, data: &str, eof: bool) {
        self.tx
            .send(message(pb::spoke_message::Message::Log(pb::LogChunk {
                request_id: request_id.to_string(),
                data: data.as_bytes().to_vec(),
                eof,
                error: String::new(),
            })))
            .unwrap();
    }
}

fn pod(name: &str, job: &str, phase: &str) -> Value {
    serde_json::json!({
        "metadata": {"name": name, "labels": {"jobset.sigs.k8s.io/jobset-name": job}},
        "spec": {"containers": [{"name": "node", "image": "x"}]},
        "status": {"phase": phase},
    })
}

fn event(name: &str, involved: &str, message: &str) -> Value {
    serde_json::json!({
        "metadata": {"name": name},
        "involvedObject": {"kind": "Pod", "name": involved},
        "type": "Normal", "reason": "Started", "message": message,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spoke_cannot_write_another_spokes_pods_events_or_logs() {
    let grpc = free_port();
    let port = grpc.to_string();
    let hub = DevHub::start_args(&["--spokes", "0", "--grpc-port", &port], |_| {});
    let ca = hub.ca();
    let mut honest = RawSpoke::open(&ca, "spoke-b", grpc).await;
    let mut rogue = RawSpoke::open(&ca, "spoke-a", grpc).await;

    hub.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(&trainjob("victim", "name=spoke-b", "true")),
    );
    let victim_run = honest.take_run().await;
    honest.report(
        &victim_run,
        1,
        &[pod("victim-node-0-0", "victim", "Running")],
        &[event("victim-node-0-0.a1", "victim-node-0-0", "honest")],
    );
    hub.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(&trainjob("evil", "name=spoke-a", "true")),
    );
    let evil_run = rogue.take_run().await;
    let victim_pod = || -> Value {
        serde_json::from_str(&hub.kubectl_ok(&["get", "pod", "victim-node-0-0", "-o", "json"]))
            .unwrap()
    };
    wait_for(
        "the victim's pod shown",
        Duration::from_secs(30),
        log_of(&hub),
        || {
            let out = hub.kubectl(&["get", "pod", "victim-node-0-0", "-o", "json"]);
            out.status.success().then_some(())
        },
    )
    .await;
    let before = victim_pod();

    // The rogue spoke reports, on its own run, the victim's pod and
    // events under the victim's names, and a pod that claims the
    // victim's JobSet by label; and a report on the victim's run.
    rogue.report(
        &evil_run,
        1,
        &[
            pod("victim-node-0-0", "victim", "Failed"),
            pod("evil-node-0-0", "victim", "Running"),
            pod("evil-node-0-1", "evil", "Running"),
        ],
        &[
            event("victim-node-0-0.a1", "victim-node-0-0", "forged"),
            event("evil-node-0-1.b2", "victim-node-0-0", "forged"),
            event("evil-node-0-1.c3", "evil-node-0-1", "own"),
        ],
    );
    rogue.report(
        &victim_run,
        2,
        &[pod("victim-node-0-0", "victim", "Failed")],
        &[],
    );
    // Its own pod and event are written: the report was processed.
    wait_for(
        "the rogue's own pod and event written",
        Duration::from_secs(30),
        log_of(&hub),
        || {
            let pod = hub.kubectl(&["get", "pod", "evil-node-0-1"]);
            let event = hub.kubectl(&["get", "event", "evil-node-0-1.c3"]);
            (pod.status.success() && event.status.success()).then_some(())
        },
    )
    .await;
    wait_for(
        "the refusals logged with the spoke's name",
        Duration::from_secs(30),
        log_of(&hub),
        || {
            let log = hub.log();
            let refused = log
                .lines()
                .filter(|l| l.contains("refused a") && l.contains("spoke-a"))
                .count();
            (refused >= 4 && log.contains("refused a report on a run not placed on this spoke"))
                .then_some(())
        },
    )
    .await;
    let after = victim_pod();
    assert_eq!(after, before, "the victim's pod changed");
    assert_eq!(
        after["metadata"]["annotations"]["trainhub.kubeflow.org/spoke"],
        "spoke-b"
    );
    assert!(
        !hub.kubectl(&["get", "pod", "evil-node-0-0"])
            .status
            .success(),
        "a pod claiming another TrainJob's JobSet by label was written"
    );
    let honest_event = hub.kubectl_ok(&[
        "get",
        "event",
        "victim-node-0-0.a1",
        "-o",
        "jsonpath={.message}",
    ]);
    assert_eq!(honest_event, "honest");
    assert!(
        !hub.kubectl(&["get", "event", "evil-node-0-1.b2"])
            .status
            .success(),
        "an event on another TrainJob's pod was written"
    );
    let selected = hub.kubectl_ok(&[
        "get",
        "pods",
        "-l",
        "jobset.sigs.k8s.io/jobset-name=victim",
        "-o",
        "jsonpath={.items[*].metadata.name}",
    ]);
    assert_eq!(selected, "victim-node-0-0");

    // Logs: the hub asks the victim's spoke under an unguessable id; the
    // rogue spoke writing to it (even knowing the id) and to guessed ids
    // is refused; the reader gets the victim spoke's lines only.
    let kubeconfig = hub.kubeconfig();
    let reader = tokio::task::spawn_blocking(move || {
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["logs", "victim-node-0-0"])
            .output()
            .expect("kubectl logs")
    });
    let request = honest
        .next("a log request", |m| match m {
            pb::hub_message::Message::LogRequest(r) if !r.cancel => Some(r),
            _ => None,
        })
        .await;
    assert_eq!(request.request_id.len(), 32, "{request:?}");
    assert!(
        request.request_id.bytes().all(|b| b.is_ascii_hexdigit()),
        "{request:?}"
    );
    for guess in ["log-1", "log-2", "log-3", "0", "1"] {
        rogue.log(guess, "injected\n", false);
    }
    rogue.log(&request.request_id, "injected\n", false);
    wait_for(
        "the rogue's chunk refused",
        Duration::from_secs(30),
        log_of(&hub),
        || {
            hub.log()
                .contains("refused a log chunk for a stream this session was not asked to serve")
                .then_some(())
        },
    )
    .await;
    honest.log(&request.request_id, "honest line\n", true);
    let out = tokio::time::timeout(Duration::from_secs(30), reader)
        .await
        .expect("kubectl logs within 30s")
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "honest line\n");
}

/// An HTTP GET of the hub's API port with a bearer token (or none): the
/// status and body.
async fn get(hub: &DevHub, path: &str, token: Option<&str>) -> (u16, String) {
    let raw = kube::config::Kubeconfig::read_from(hub.kubeconfig()).expect("kubeconfig");
    let mut config = kube::Config::from_custom_kubeconfig(raw, &Default::default())
        .await
        .expect("config");
    config.auth_info.token = token.map(|t| t.to_string().into());
    let client = kube::Client::try_from(config).expect("client");
    let request = axum::http::Request::get(path).body(Vec::new()).unwrap();
    match client.request_text(request).await {
        Ok(text) => (200, text),
        Err(kube::Error::Api(status)) => (status.code, status.message),
        Err(e) => panic!("GET {path}: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_debug_are_for_the_policys_admin_groups() {
    let hub = DevHub::start_with(|dir| {
        // The policy's admins are `ops`: `system:masters` is not one here.
        std::fs::write(
            dir.join("tokens.csv"),
            "ops-token-0123456789,ops,ops,\"ops\"\nalice-token-0123456789,alice,alice,\"team-a\"\nroot-token-0123456789,root,root,\"system:masters\"\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("policy.yaml"),
            "adminGroups: [ops]\nnamespaces:\n  - namespace: team-a\n    groups: [team-a]\n",
        )
        .unwrap();
    });
    hub.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(&trainjob("project-nightingale", "", "true")),
    );

    let (code, body) = get(&hub, "/metrics", None).await;
    assert_eq!(code, 401, "{body}");
    for path in ["/metrics", "/debug/flags/v"] {
        for token in ["alice-token-0123456789", "root-token-0123456789"] {
            let (code, body) = get(&hub, path, Some(token)).await;
            assert_eq!(code, 403, "{path} {token}: {body}");
            assert!(
                body.contains(&format!("cannot get path \"{path}\"")),
                "{body}"
            );
        }
    }
    let (code, metrics) = get(&hub, "/metrics", Some("ops-token-0123456789")).await;
    assert_eq!(code, 200, "{metrics}");
    assert!(metrics.contains("trainhub_trainjobs"), "{metrics}");
    // No series names a TrainJob.
    assert!(!metrics.contains("project-nightingale"), "{metrics}");
    let (code, level) = get(&hub, "/debug/flags/v", Some("ops-token-0123456789")).await;
    assert_eq!(code, 200, "{level}");
}
