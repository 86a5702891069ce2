//! The agent: one gRPC stream to the hub over mutual TLS, kept open.
//!
//! On every (re)connect it says hello (labels, backend, capacity and every
//! run it holds) and resends the last report of each run, so a hub that
//! restarted or missed messages catches up; then it sends heartbeats with
//! capacity, answers offers, starts and stops runs, forwards run reports
//! and serves log requests. Reconnects back off exponentially with jitter.
//! Everything the hub sends is idempotent by `(run_id, generation)`, so a
//! message repeated after a reconnect changes nothing.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use rand::Rng;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
use tracing::Instrument;
use trainhub_proto as pb;
use trainhub_proto::limits::{MAX_EVENTS_PER_REPORT, MAX_LOG_CHUNK_BYTES, MAX_MESSAGE_BYTES};

use trainhub_telemetry::metrics::labels;
use trainhub_telemetry::propagation::{Parent, TRACEPARENT};

use crate::backend::{Backend, BackendError, PodSetRequest, RunKey, RunReport, RunSpec};
use crate::metrics;

/// How the agent reaches the hub.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// `https://host:port` of the hub's gRPC endpoint.
    pub hub_url: String,
    /// The name the hub's certificate is checked against (default: the
    /// URL's host).
    pub tls_server_name: Option<String>,
    /// PEM: the CA that signed the hub's certificate, and this spoke's
    /// client certificate and key (its CN is the spoke's name).
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
    /// Labels placement selects on.
    pub labels: BTreeMap<String, String>,
    pub heartbeat: Duration,
    /// Reconnect backoff: starts at `backoff_min`, doubles up to `backoff_max`.
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// When set, the CA, certificate and key are read from these files on
    /// every connect (the PEM fields above are not used), and a change of
    /// the files ends the session so that the next uses them.
    pub cert_files: Option<crate::certs::CertFiles>,
}

impl AgentConfig {
    pub fn new(hub_url: String, ca_pem: String, cert_pem: String, key_pem: String) -> Self {
        AgentConfig {
            hub_url,
            tls_server_name: None,
            ca_pem,
            cert_pem,
            key_pem,
            labels: BTreeMap::new(),
            heartbeat: Duration::from_secs(5),
            backoff_min: Duration::from_millis(200),
            backoff_max: Duration::from_secs(30),
            cert_files: None,
        }
    }
}

/// Why a session ended.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("hub address {0:?}: {1}")]
    Address(String, String),
    #[error("connecting to the hub: {}", chain(.0))]
    Connect(#[from] tonic::transport::Error),
    #[error("the hub ended the session: {0}")]
    Status(#[from] tonic::Status),
    #[error("certificate files: {0}")]
    CertFiles(String),
    #[error("the certificate files changed: reconnecting with them")]
    Rotated,
}

/// An error with its sources: tonic's transport errors say only
/// "transport error" at the top.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

type Outbound = mpsc::UnboundedSender<pb::SpokeMessage>;

/// Aborts a spawned task when dropped, so that dropping the agent's future
/// (or a session's) ends everything it started.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct Shared {
    backend: Arc<dyn Backend>,
    /// The open session's sender; None while disconnected.
    current: Mutex<Option<Outbound>>,
    /// Report sequence numbers per run.
    seq: Mutex<HashMap<String, u64>>,
    /// Log requests being served, by request id.
    log_tasks: Mutex<HashMap<String, JoinHandle<()>>>,
    /// The `run` span of each run started here, open until it finishes.
    run_spans: Mutex<HashMap<String, tracing::Span>>,
}

impl Shared {
    fn report_message(&self, report: &RunReport) -> pb::SpokeMessage {
        if report.events.len() > MAX_EVENTS_PER_REPORT {
            tracing::warn!(
                run = %report.key.run_id,
                events = report.events.len(),
                "a report carries at most {MAX_EVENTS_PER_REPORT} events; the rest are not sent"
            );
        }
        let seq = {
            let mut seq = lock(&self.seq);
            let n = seq.entry(report.key.run_id.clone()).or_default();
            *n += 1;
            *n
        };
        pb::SpokeMessage {
            message: Some(pb::spoke_message::Message::Report(pb::RunReport {
                run_id: report.key.run_id.clone(),
                generation: report.key.generation,
                seq,
                jobset_status_json: report.jobset_status.to_string(),
                pods_json: report.pods.iter().map(|p| p.to_string()).collect(),
                finished: report.finished,
                events_json: report
                    .events
                    .iter()
                    .take(MAX_EVENTS_PER_REPORT)
                    .map(|e| e.to_string())
                    .collect(),
            })),
        }
    }

    fn send(&self, message: pb::SpokeMessage) {
        if let Some(tx) = lock(&self.current).as_ref() {
            let _ = tx.send(message);
        }
    }
}

/// Runs the agent until `shutdown` resolves: connects, serves the session,
/// reconnects. `reports` is the receiving end of the backend's report
/// channel.
pub async fn run(
    config: AgentConfig,
    backend: Arc<dyn Backend>,
    mut reports: mpsc::UnboundedReceiver<RunReport>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let shared = Arc::new(Shared {
        backend,
        current: Mutex::new(None),
        seq: Mutex::new(HashMap::new()),
        log_tasks: Mutex::new(HashMap::new()),
        run_spans: Mutex::new(HashMap::new()),
    });
    /// Ends the log streams being served when the agent goes away.
    struct EndLogs(Arc<Shared>);
    impl Drop for EndLogs {
        fn drop(&mut self) {
            for (_, task) in lock(&self.0.log_tasks).drain() {
                task.abort();
            }
        }
    }
    let _end_logs = EndLogs(shared.clone());
    let _forwarder = {
        let shared = shared.clone();
        AbortOnDrop(tokio::spawn(async move {
            while let Some(report) = reports.recv().await {
                if report.finished {
                    end_run_span(&shared, &report);
                }
                let message = shared.report_message(&report);
                shared.send(message);
            }
        }))
    };
    let connect_loop = async {
        let mut failures: u32 = 0;
        let mut sessions: u64 = 0;
        loop {
            let started = Instant::now();
            if sessions > 0 {
                metrics::spoke().reconnects.inc();
            }
            sessions += 1;
            let result = session(&config, &shared).await;
            metrics::spoke().connected.set(0);
            match &result {
                Ok(()) => tracing::warn!("the hub closed the session"),
                Err(AgentError::Rotated) => {
                    tracing::info!("reconnecting with the rotated certificate")
                }
                Err(e) => tracing::warn!(error = %e, "session with the hub failed"),
            }
            *lock(&shared.current) = None;
            for (_, task) in lock(&shared.log_tasks).drain() {
                task.abort();
            }
            if started.elapsed() > config.backoff_max {
                failures = 0;
            }
            let wait = if matches!(result, Err(AgentError::Rotated)) {
                failures = 0;
                config.backoff_min
            } else {
                backoff(&config, failures)
            };
            failures = failures.saturating_add(1);
            tracing::info!(wait_ms = wait.as_millis() as u64, "reconnecting");
            tokio::time::sleep(wait).await;
        }
    };
    tokio::select! {
        _ = shutdown => {}
        () = connect_loop => {}
    }
    *lock(&shared.current) = None;
}

/// Exponential backoff with full jitter in [d/2, d].
fn backoff(config: &AgentConfig, failures: u32) -> Duration {
    let base = config
        .backoff_min
        .saturating_mul(1u32.checked_shl(failures.min(16)).unwrap_or(u32::MAX))
        .min(config.backoff_max);
    let half = base / 2;
    half + half.mul_f64(rand::rng().random::<f64>())
}

async fn session(config: &AgentConfig, shared: &Arc<Shared>) -> Result<(), AgentError> {
    let stamp = config.cert_files.as_ref().map(|f| f.stamp());
    let (ca_pem, cert_pem, key_pem) = match &config.cert_files {
        Some(files) => {
            let pems = files.read().map_err(AgentError::CertFiles)?;
            (pems.ca, pems.cert, pems.key)
        }
        None => (
            config.ca_pem.clone(),
            config.cert_pem.clone(),
            config.key_pem.clone(),
        ),
    };
    let rotated = async {
        match (&config.cert_files, stamp) {
            (Some(files), Some(stamp)) => files.changed(stamp, crate::certs::CHECK_EVERY).await,
            _ => std::future::pending().await,
        }
    };
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&ca_pem))
        .identity(Identity::from_pem(&cert_pem, &key_pem));
    if let Some(name) = &config.tls_server_name {
        tls = tls.domain_name(name.clone());
    }
    let endpoint = Endpoint::from_shared(config.hub_url.clone())
        .map_err(|e| AgentError::Address(config.hub_url.clone(), e.to_string()))?
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(20));
    let channel = endpoint.connect().await?;
    let mut client = pb::spoke_client::SpokeClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);

    let (tx, rx) = mpsc::unbounded_channel();
    let backend = &shared.backend;
    // The snapshot of the held runs and the switch to this session happen
    // under one lock: a report the backend makes meanwhile waits for the
    // forwarder, then follows the snapshot on this session (not dropped as
    // if still disconnected, which would lose a run that finished just now).
    let held = {
        let mut current = lock(&shared.current);
        let held = backend.runs();
        let _ = tx.send(pb::SpokeMessage {
            message: Some(pb::spoke_message::Message::Hello(pb::Hello {
                labels: config.labels.clone().into_iter().collect(),
                backend: backend.kind().to_string(),
                capacity: capacity(backend.as_ref()),
                runs: held
                    .iter()
                    .map(|r| pb::RunRef {
                        run_id: r.key.run_id.clone(),
                        generation: r.key.generation,
                        finished: r.finished,
                        ..Default::default()
                    })
                    .collect(),
                version: env!("CARGO_PKG_VERSION").to_string(),
                ..Default::default()
            })),
        });
        for run in &held {
            if let Some(report) = backend.report(&run.key) {
                let _ = tx.send(shared.report_message(&report));
            }
        }
        *current = Some(tx.clone());
        held
    };
    let response = client.session(UnboundedReceiverStream::new(rx)).await?;
    metrics::spoke().connected.set(1);
    tracing::info!(hub = %config.hub_url, runs = held.len(), "connected to the hub");
    let _heartbeat = {
        let tx = tx.clone();
        let backend = backend.clone();
        let every = config.heartbeat;
        AbortOnDrop(tokio::spawn(async move {
            let mut interval = tokio::time::interval(every);
            interval.tick().await;
            loop {
                interval.tick().await;
                let message = pb::SpokeMessage {
                    message: Some(pb::spoke_message::Message::Heartbeat(pb::Heartbeat {
                        capacity: capacity(backend.as_ref()),
                        ..Default::default()
                    })),
                };
                if tx.send(message).is_err() {
                    return;
                }
            }
        }))
    };
    let mut inbound = response.into_inner();
    tokio::pin!(rotated);
    loop {
        let next = tokio::select! {
            next = inbound.next() => next,
            () = &mut rotated => break Err(AgentError::Rotated),
        };
        match next {
            Some(Ok(pb::HubMessage {
                message: Some(message),
            })) => handle(shared, &tx, message),
            Some(Ok(_)) => {}
            Some(Err(status)) => break Err(AgentError::Status(status)),
            None => break Ok(()),
        }
    }
}

fn capacity(backend: &dyn Backend) -> Vec<pb::Capacity> {
    backend
        .capacity()
        .into_iter()
        .map(|c| pb::Capacity {
            resource: c.resource,
            allocatable_milli: c.allocatable_milli,
            free_milli: c.free_milli,
        })
        .collect()
}

/// One message from the hub.
fn handle(shared: &Arc<Shared>, tx: &Outbound, message: pb::hub_message::Message) {
    use pb::hub_message::Message;
    let backend = shared.backend.clone();
    match message {
        Message::HeartbeatAck(_) => {}
        Message::Offer(offer) => {
            let key = RunKey {
                run_id: offer.run_id.clone(),
                generation: offer.generation,
            };
            let pod_sets: Vec<PodSetRequest> = offer
                .pod_sets
                .into_iter()
                .map(|p| PodSetRequest {
                    name: p.name,
                    count: p.count,
                    requests_milli: p.requests_milli.into_iter().collect(),
                })
                .collect();
            let span = trainhub_telemetry::span!(
                "admit",
                run = %key.run_id,
                generation = key.generation,
                admitted = tracing::field::Empty,
            );
            if let Some(parent) = Parent::extract(&offer.trace_context) {
                parent.adopt(&span);
            }
            let answer = span.in_scope(|| backend.admit(&key, &pod_sets));
            span.record("admitted", answer.is_ok());
            metrics::spoke()
                .offers
                .get_or_create(&labels([(
                    "admitted",
                    if answer.is_ok() { "true" } else { "false" },
                )]))
                .inc();
            if let Err(e) = &answer {
                tracing::debug!(run = %key.run_id, error = %e, "offer refused");
            }
            let _ = tx.send(pb::SpokeMessage {
                message: Some(pb::spoke_message::Message::Admit(pb::AdmitAnswer {
                    run_id: offer.run_id,
                    generation: offer.generation,
                    admitted: answer.is_ok(),
                    reason: answer.err().map(|e| e.to_string()).unwrap_or_default(),
                })),
            });
        }
        Message::Withdraw(w) => backend.withdraw(&RunKey {
            run_id: w.run_id,
            generation: w.generation,
        }),
        Message::Start(start) => {
            let shared = shared.clone();
            let (apply, extra_env) = run_spans(&shared, &start);
            let task = async move {
                let key = RunKey {
                    run_id: start.run_id.clone(),
                    generation: start.generation,
                };
                let result = match parse_objects(&start.objects_json) {
                    Ok(objects) => {
                        let spec = RunSpec {
                            key: key.clone(),
                            namespace: start.namespace.clone(),
                            name: start.name.clone(),
                            trainjob_uid: start.trainjob_uid.clone(),
                            objects,
                            extra_env,
                        };
                        shared.backend.start(spec).await
                    }
                    Err(e) => Err(e),
                };
                if let Err(e) = result {
                    tracing::warn!(run = %key.run_id, error = %e, "start failed");
                    let report = failed_report(key, &e);
                    end_run_span(&shared, &report);
                    let message = shared.report_message(&report);
                    shared.send(message);
                }
            };
            tokio::spawn(task.instrument(apply));
        }
        Message::Stop(stop) => {
            let tx = tx.clone();
            tokio::spawn(async move {
                tracing::info!(run = %stop.run_id, generation = stop.generation, reason = %stop.reason, "stopping");
                backend.stop(&stop.run_id, stop.generation).await;
                let _ = tx.send(pb::SpokeMessage {
                    message: Some(pb::spoke_message::Message::Stopped(pb::Stopped {
                        run_id: stop.run_id,
                        generation: stop.generation,
                    })),
                });
            });
        }
        Message::LogRequest(request) => {
            if request.cancel {
                if let Some(task) = lock(&shared.log_tasks).remove(&request.request_id) {
                    task.abort();
                }
                return;
            }
            let tx = tx.clone();
            let id = request.request_id.clone();
            let shared2 = shared.clone();
            let task = tokio::spawn(async move {
                let chunk = |data: Vec<u8>, eof: bool, error: String| pb::SpokeMessage {
                    message: Some(pb::spoke_message::Message::Log(pb::LogChunk {
                        request_id: request.request_id.clone(),
                        data,
                        eof,
                        error,
                    })),
                };
                let container = Some(request.container.as_str()).filter(|c| !c.is_empty());
                let tail = (request.tail_lines >= 0).then_some(request.tail_lines);
                match backend
                    .logs(
                        &request.run_id,
                        &request.pod,
                        container,
                        request.follow,
                        tail,
                    )
                    .await
                {
                    Ok(mut stream) => {
                        while let Some(item) = stream.next().await {
                            match item {
                                Ok(bytes) => {
                                    // The hub takes chunks of at most
                                    // MAX_LOG_CHUNK_BYTES.
                                    for piece in bytes.chunks(MAX_LOG_CHUNK_BYTES) {
                                        if tx
                                            .send(chunk(piece.to_vec(), false, String::new()))
                                            .is_err()
                                        {
                                            return;
                                        }
                                    }
                                }
                                Err(e) => {
                                    let _ = tx.send(chunk(Vec::new(), true, e));
                                    return;
                                }
                            }
                        }
                        let _ = tx.send(chunk(Vec::new(), true, String::new()));
                    }
                    Err(e) => {
                        let _ = tx.send(chunk(Vec::new(), true, e.to_string()));
                    }
                }
                lock(&shared2.log_tasks).remove(&request.request_id);
            });
            lock(&shared.log_tasks).insert(id, task);
        }
    }
}

/// The spans of a start: `apply` (the backend starting the run) and
/// `run` (until the run finishes), children of the hub's context; and the
/// environment that lets the run's processes join the trace: `TRACEPARENT`
/// of the `run` span (or, with tracing off here, the hub's) and the
/// exporter's `OTEL_*` settings.
fn run_spans(shared: &Shared, start: &pb::Start) -> (tracing::Span, Vec<(String, String)>) {
    let parent = Parent::extract(&start.trace_context);
    let span = |span: tracing::Span| {
        if let Some(p) = &parent {
            p.adopt(&span);
        }
        span
    };
    let apply = span(trainhub_telemetry::span!(
        "apply",
        run = %start.run_id,
        generation = start.generation,
        trainjob = %start.name,
    ));
    let run = span(trainhub_telemetry::span!(
        "run",
        run = %start.run_id,
        generation = start.generation,
        trainjob = %start.name,
        outcome = tracing::field::Empty,
    ));
    let traceparent = trainhub_telemetry::propagation::traceparent(&run)
        .or_else(|| start.trace_context.get(TRACEPARENT).cloned());
    let mut env = trainhub_telemetry::child_env();
    if let Some(traceparent) = traceparent {
        env.push(("TRACEPARENT".to_string(), traceparent));
    }
    if !run.is_disabled() {
        lock(&shared.run_spans).insert(start.run_id.clone(), run);
    }
    (apply, env)
}

/// Ends the `run` span of a finished run with its outcome.
fn end_run_span(shared: &Shared, report: &RunReport) {
    if let Some(span) = lock(&shared.run_spans).remove(&report.key.run_id) {
        let outcome = report.jobset_status["terminalState"]
            .as_str()
            .unwrap_or("Finished");
        span.record("outcome", outcome);
    }
}

fn parse_objects(objects: &[String]) -> Result<Vec<serde_json::Value>, BackendError> {
    objects
        .iter()
        .enumerate()
        .map(|(i, o)| {
            serde_json::from_str(o)
                .map_err(|e| BackendError::Invalid(format!("objects[{i}] is not JSON: {e}")))
        })
        .collect()
}

/// The report of a run that could not start: a Failed JobSet, which the
/// hub's PostExecution plugin turns into a Failed TrainJob.
fn failed_report(key: RunKey, error: &BackendError) -> RunReport {
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    RunReport {
        key,
        jobset_status: serde_json::json!({
            "conditions": [{
                "type": "Failed",
                "status": "True",
                "reason": "StartFailed",
                "message": format!("the spoke could not start the run: {error}"),
                "lastTransitionTime": now,
            }],
            "terminalState": "Failed",
        }),
        pods: Vec::new(),
        finished: true,
        events: Vec::new(),
    }
}
