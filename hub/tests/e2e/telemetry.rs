//! One trace per TrainJob across the hub, its spokes and the training
//! process, exported over OTLP to a receiver in this test; and the hub's
//! and the spokes' `/metrics`.
//!
//! The hub is the real `trainhub dev` binary; the spokes are the real
//! `trainspoke` binary (built next to it by `cargo test --workspace`).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value;
use serde_json::Value;

use crate::common::{DevHub, free_port, tail, trainspoke_binary, wait_for};

/// One span as received, with its service's resource.
#[derive(Debug, Clone)]
struct Received {
    service: String,
    resource: HashMap<String, String>,
    name: String,
    trace_id: String,
    span_id: String,
    parent: String,
    attributes: HashMap<String, String>,
    /// How many export requests had arrived before this span's.
    request: usize,
}

#[derive(Default, Clone)]
struct Receiver {
    spans: Arc<Mutex<Vec<Received>>>,
    requests: Arc<Mutex<usize>>,
}

fn strings(
    attributes: &[opentelemetry_proto::tonic::common::v1::KeyValue],
) -> HashMap<String, String> {
    attributes
        .iter()
        .filter_map(|kv| {
            let value = match kv.value.as_ref()?.value.as_ref()? {
                any_value::Value::StringValue(s) => s.clone(),
                any_value::Value::IntValue(i) => i.to_string(),
                any_value::Value::BoolValue(b) => b.to_string(),
                any_value::Value::DoubleValue(d) => d.to_string(),
                _ => return None,
            };
            Some((kv.key.clone(), value))
        })
        .collect()
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let request_no = {
            let mut n = self.requests.lock().unwrap();
            *n += 1;
            *n
        };
        let mut received = Vec::new();
        for rs in request.into_inner().resource_spans {
            let resource = rs
                .resource
                .map(|r| strings(&r.attributes))
                .unwrap_or_default();
            let service = resource.get("service.name").cloned().unwrap_or_default();
            for ss in rs.scope_spans {
                for span in ss.spans {
                    received.push(Received {
                        service: service.clone(),
                        resource: resource.clone(),
                        name: span.name.clone(),
                        trace_id: hex::encode(&span.trace_id),
                        span_id: hex::encode(&span.span_id),
                        parent: hex::encode(&span.parent_span_id),
                        attributes: strings(&span.attributes),
                        request: request_no,
                    });
                }
            }
        }
        self.spans.lock().unwrap().extend(received);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl Receiver {
    /// Serves OTLP/gRPC (plain HTTP/2) on a free port; returns its endpoint.
    async fn start(&self) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let service = TraceServiceServer::new(self.clone());
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .unwrap();
        });
        format!("http://{addr}")
    }

    fn spans(&self) -> Vec<Received> {
        self.spans.lock().unwrap().clone()
    }

    fn requests(&self) -> usize {
        *self.requests.lock().unwrap()
    }
}

/// A `trainspoke` process.
struct Spoke {
    child: Child,
    log: PathBuf,
    http: u16,
}

impl Drop for Spoke {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_spoke(
    hub: &DevHub,
    dir: &Path,
    name: &str,
    cluster: &str,
    grpc: u16,
    otel: &[(&str, String)],
) -> Spoke {
    let issued = hub
        .ca()
        .issue_client(name, &[trainhub::grpc::SPOKE_GROUP])
        .unwrap();
    let ca = dir.join("ca.crt");
    std::fs::write(&ca, hub.ca().cert_pem()).unwrap();
    let cert = dir.join(format!("{name}.crt"));
    let key = dir.join(format!("{name}.key"));
    std::fs::write(&cert, &issued.cert_pem).unwrap();
    std::fs::write(&key, &issued.key_pem).unwrap();
    let http = free_port();
    let log = dir.join(format!("{name}.log"));
    let child = Command::new(trainspoke_binary())
        .args(["--hub", &format!("https://127.0.0.1:{grpc}")])
        .arg("--ca")
        .arg(&ca)
        .arg("--cert")
        .arg(&cert)
        .arg("--key")
        .arg(&key)
        .arg("--work-dir")
        .arg(dir.join(name))
        .args(["--label", &format!("cluster={cluster}")])
        .args(["--capacity", "cpu=4,memory=8Gi"])
        .args(["--heartbeat-seconds", "1"])
        .args(["--http-address", &format!("127.0.0.1:{http}")])
        .args(["--log-format", "json"])
        .envs(otel.iter().map(|(k, v)| (*k, v)))
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("starting trainspoke");
    Spoke { child, log, http }
}

/// `GET path` over plain HTTP/1.1: (status, body).
fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n")?.1.to_string();
    Some((status, body))
}

/// Samples of a Prometheus text exposition, parsed by a real parser.
fn parse_metrics(text: &str) -> prometheus_parse::Scrape {
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .expect("the metrics parse")
}

/// The value of the sample `name` whose labels include `labels`.
fn sample(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape.samples.iter().find_map(|s| {
        let matches = s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v));
        match (&s.value, matches) {
            (
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v),
                true,
            ) => Some(*v),
            _ => None,
        }
    })
}

const JOB: &str = "traced";

/// The tails of the hub's and the spokes' logs, for failure messages.
fn logs(hub: &DevHub, spokes: &[Spoke]) -> String {
    let mut text = format!("hub log:\n{}", tail(&hub.log(), 40));
    for s in spokes {
        let log = std::fs::read_to_string(&s.log).unwrap_or_default();
        text.push_str(&format!("\n{}:\n{}", s.log.display(), tail(&log, 20)));
    }
    text
}

fn trainjob_yaml(gate: &Path) -> String {
    // The training process prints the trace context it was given, then
    // holds until the test opens the gate (after restarting the hub).
    let script = format!(
        "echo TRACEPARENT=$TRACEPARENT; while [ ! -e {} ]; do sleep 0.1; done",
        gate.display()
    );
    format!(
        "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata:\n  name: {JOB}\nspec:\n  runtimeRef:\n    name: python-distributed\n  trainer:\n    numNodes: 1\n    command: [\"sh\", \"-c\", {script:?}]\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_spans_hub_spokes_and_the_training_process_across_a_hub_restart() {
    let receiver = Receiver::default();
    let endpoint = receiver.start().await;
    let otel = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.clone()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100".to_string()),
    ];
    let grpc = free_port();
    let mut hub = DevHub::start_env(
        &["--spokes", "0", "--grpc-port", &grpc.to_string()],
        &otel,
        |_| {},
    );
    // Not under /tmp and open to others: the training process (sandboxed,
    // with a private /tmp and its own uid) waits for the gate in here.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let spokes = [
        start_spoke(&hub, dir.path(), "spoke-east", "east", grpc, &otel),
        start_spoke(&hub, dir.path(), "spoke-west", "west", grpc, &otel),
    ];
    for spoke in &spokes {
        wait_for(
            "the spoke to be ready",
            Duration::from_secs(60),
            || logs(&hub, &spokes),
            || (http_get(spoke.http, "/readyz")?.0 == 200).then_some(()),
        )
        .await;
    }

    let gate = dir.path().join("gate");
    let out = hub.kubectl_stdin(&["create", "-f", "-"], Some(&trainjob_yaml(&gate)));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let job: Value =
        serde_json::from_str(&hub.kubectl_ok(&["get", "trainjob", JOB, "-o", "json"])).unwrap();
    let annotations = &job["metadata"]["annotations"];
    let traceparent = annotations["trainhub.kubeflow.org/traceparent"]
        .as_str()
        .expect("the traceparent annotation")
        .to_string();
    let trace_id = annotations["trainhub.kubeflow.org/trace-id"]
        .as_str()
        .expect("the trace-id annotation")
        .to_string();
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    assert_eq!(parts[1], trace_id);
    let admission_id = parts[2].to_string();

    // The process runs and prints the TRACEPARENT it was given.
    let printed = wait_for(
        "the process's TRACEPARENT",
        Duration::from_secs(60),
        || logs(&hub, &spokes),
        || {
            let out = hub.kubectl(&[
                "logs",
                "-l",
                &format!("jobset.sigs.k8s.io/jobset-name={JOB}"),
            ]);
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.lines()
                .find_map(|l| l.strip_prefix("TRACEPARENT="))
                .filter(|v| !v.is_empty())
                .map(String::from)
        },
    )
    .await;

    // The hub's metrics count the dispatch of this TrainJob.
    let metrics = hub.kubectl_ok(&["get", "--raw", "/metrics"]);
    let scrape = parse_metrics(&metrics);
    assert_eq!(
        sample(
            &scrape,
            "trainhub_dispatch_submit_to_admitted_seconds_count",
            &[]
        ),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        sample(&scrape, "trainhub_connected_spokes", &[]),
        Some(2.0),
        "{metrics}"
    );
    assert_eq!(
        sample(&scrape, "trainhub_trainjobs", &[("state", "Running")]),
        Some(1.0),
        "{metrics}"
    );
    assert!(
        scrape
            .samples
            .iter()
            .any(|s| s.metric == "trainhub_plugin_call_duration_seconds"
                && s.labels.get("phase") == Some("validate")
                && s.labels.get("outcome") == Some("ok")),
        "{metrics}"
    );
    for spoke in &spokes {
        let (status, text) = http_get(spoke.http, "/metrics").expect("spoke metrics");
        assert_eq!(status, 200);
        let scrape = parse_metrics(&text);
        assert_eq!(
            sample(&scrape, "trainhub_spoke_connected", &[]),
            Some(1.0),
            "{text}"
        );
        assert_eq!(
            sample(
                &scrape,
                "trainhub_spoke_allocatable",
                &[("resource", "cpu")]
            ),
            Some(4.0),
            "{text}"
        );
    }

    // An admin changes the hub's log level at run time, as on kube-apiserver.
    assert_eq!(
        hub.kubectl_ok(&["get", "--raw", "/debug/flags/v"]).trim(),
        "info"
    );
    let v = dir.path().join("v");
    std::fs::write(&v, "4").unwrap();
    let set = hub.kubectl_ok(&[
        "replace",
        "--raw",
        "/debug/flags/v",
        "-f",
        &v.display().to_string(),
    ]);
    assert!(set.contains("debug"), "{set}");
    assert_eq!(
        hub.kubectl_ok(&["get", "--raw", "/debug/flags/v"]).trim(),
        "debug"
    );
    std::fs::write(&v, "trainhub=loud").unwrap();
    let refused = hub.kubectl(&[
        "replace",
        "--raw",
        "/debug/flags/v",
        "-f",
        &v.display().to_string(),
    ]);
    assert!(
        !refused.status.success(),
        "a level that is neither a verbosity nor a filter is refused"
    );

    // The admission span is exported; the hub restarts mid-run.
    wait_for(
        "the admission span",
        Duration::from_secs(30),
        || logs(&hub, &spokes),
        || {
            receiver
                .spans()
                .iter()
                .any(|s| s.name == "admission" && s.span_id == admission_id)
                .then_some(())
        },
    )
    .await;
    hub.restart();
    let restarted_at = receiver.requests();
    std::fs::write(&gate, "").unwrap();
    wait_for(
        "the TrainJob to complete",
        Duration::from_secs(60),
        || logs(&hub, &spokes),
        || {
            let status = hub.kubectl_ok(&[
                "get",
                "trainjob",
                JOB,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Complete\")].status}",
            ]);
            (status == "True").then_some(())
        },
    )
    .await;

    // Every span of the TrainJob arrives, in one trace.
    let expected_hub = [
        "admission",
        "queue",
        "offer",
        "placed",
        "build",
        "running",
        "status",
        "outcome",
    ];
    let spans = wait_for(
        "the TrainJob's spans",
        Duration::from_secs(30),
        || logs(&hub, &spokes),
        || {
            let spans: Vec<Received> = receiver
                .spans()
                .into_iter()
                .filter(|s| s.trace_id == trace_id)
                .collect();
            let has = |service: &str, name: &str| {
                spans.iter().any(|s| s.service == service && s.name == name)
            };
            (expected_hub.iter().all(|n| has("trainhub", n))
                && ["admit", "apply", "run"]
                    .iter()
                    .all(|n| has("trainspoke", n)))
            .then_some(spans)
        },
    )
    .await;
    // The trace, shown when an assertion below fails.
    for s in &spans {
        eprintln!(
            "{} {} {} <- {} {:?}",
            s.service, s.name, s.span_id, s.parent, s.attributes
        );
    }
    let one = |service: &str, name: &str| -> Vec<&Received> {
        spans
            .iter()
            .filter(|s| s.service == service && s.name == name)
            .collect()
    };
    let admission = one("trainhub", "admission");
    assert_eq!(admission.len(), 1);
    assert_eq!(admission[0].span_id, admission_id);
    assert_eq!(admission[0].parent, "", "admission is the root");
    assert_eq!(
        admission[0].attributes.get("outcome").map(String::as_str),
        Some("admitted")
    );
    // After admission, every span of the hub is a child of the stored
    // context, whichever process of the hub made it.
    for name in &expected_hub[1..] {
        for s in one("trainhub", name) {
            assert_eq!(
                s.parent, admission_id,
                "{name} is a child of admission: {s:?}"
            );
        }
    }
    let outcome = one("trainhub", "outcome");
    assert_eq!(
        outcome[0].attributes.get("outcome").map(String::as_str),
        Some("Complete")
    );
    assert!(
        outcome[0].request > restarted_at,
        "the outcome came from the restarted hub"
    );
    // The PreExecution plugins are children of admission; the Build
    // plugins of the build span.
    let build = one("trainhub", "build");
    assert_eq!(build.len(), 1);
    let plugins = one("trainhub", "plugin");
    let phase_under = |phase: &str, parent: &str| {
        plugins.iter().any(|p| {
            p.attributes.get("plugin.phase").map(String::as_str) == Some(phase)
                && p.parent == parent
        })
    };
    assert!(phase_under("validate", &admission_id), "{plugins:#?}");
    assert!(phase_under("build", &build[0].span_id), "{plugins:#?}");
    // The spokes answer offers under the offer that reached them; the winner
    // applies and runs under the build span.
    let offers: Vec<&str> = one("trainhub", "offer")
        .iter()
        .map(|s| s.span_id.as_str())
        .collect();
    for admit in one("trainspoke", "admit") {
        assert!(
            offers.contains(&admit.parent.as_str()),
            "{admit:?} under {offers:?}"
        );
    }
    let run = one("trainspoke", "run");
    assert_eq!(run.len(), 1);
    for s in [one("trainspoke", "apply")[0], run[0]] {
        assert_eq!(s.parent, build[0].span_id, "{s:?}");
    }
    let spoke_resource = &run[0].resource;
    assert!(
        matches!(
            spoke_resource.get("k8s.cluster.name").map(String::as_str),
            Some("east" | "west")
        ),
        "{spoke_resource:?}"
    );
    assert!(
        spoke_resource
            .get("service.instance.id")
            .is_some_and(|n| n.starts_with("spoke-"))
    );
    // The process's TRACEPARENT is the run span's context.
    assert_eq!(printed, format!("00-{trace_id}-{}-01", run[0].span_id));
}
