//! The agent: one gRPC stream to the hub over mutual TLS, kept open.
//!
//! On every (re)connect it says hello (labels, backend, capacity and every
//! run it holds) and resends the last report of each run, so a hub that
//! restarted or missed messages catches up; then it sends heartbeats with
//! capacity, answers offers, starts and stops runs, forwards run reports
//! and serves log requests. Reconnects back off exponentially with jitter.
//! Everything the hub sends is idempotent by `(run_id, generation)`, so a
//! message repeated after a reconnect changes nothing.
//!
//! # Fencing
//!
//! The agent keeps the time it last heard anything from the hub (the hub
//! answers every heartbeat). When that is older than
//! [`AgentConfig::fence_after`], it stops every run that has not finished
//! ([`Backend::fence`]) and keeps them as lost (`Fenced`): its next hello
//! says so, and a Start for them is not carried out again. The hub
//! refuses a session whose fence-after is not strictly shorter than its
//! worker-lost timeout, so a spoke cut off from the hub has stopped its
//! runs before the hub places them elsewhere.
//!
//! # Reservations
//!
//! Every heartbeat lists the reservations the backend holds (admitted
//! offers neither started nor withdrawn). A reservation older than
//! [`AgentConfig::reservation_ttl`] is released by the agent itself, so a
//! lost Withdraw cannot hold capacity forever.

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

use crate::backend::{
    Backend, BackendError, LOST_FENCED, PodSetRequest, RunKey, RunReport, RunSpec,
};
use crate::metrics;

/// How the agent reaches the hub.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// `https://host:port` of the hub's gRPC endpoint; several replicas'
    /// comma-separated (or one Service name in front of them). A replica
    /// that does not lead refuses the session and names the leader
    /// ([`LEADER_METADATA`]), which the agent dials next; on any other
    /// failure it tries the next address.
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
    /// Runs are stopped (fenced) when nothing has been heard from the hub
    /// for this long; it must be strictly shorter than the hub's
    /// worker-lost timeout (the hub refuses the session otherwise).
    pub fence_after: Duration,
    /// An admitted offer neither started nor withdrawn is released after
    /// this long.
    pub reservation_ttl: Duration,
}

/// `trainspoke --fence-after-seconds`'s default.
pub const DEFAULT_FENCE_AFTER: Duration = Duration::from_secs(300);
/// `trainspoke --reservation-ttl-seconds`'s default.
pub const DEFAULT_RESERVATION_TTL: Duration = Duration::from_secs(120);
/// The gRPC metadata key in which a hub replica that does not lead names
/// the leader's spoke endpoint (`host:port`) when it refuses a session
/// with UNAVAILABLE (the hub's `grpc::LEADER_METADATA`).
pub const LEADER_METADATA: &str = "trainhub-leader";

/// How long connecting (TCP, TLS, the stream's response) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

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
            fence_after: DEFAULT_FENCE_AFTER,
            reservation_ttl: DEFAULT_RESERVATION_TTL,
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
    #[error("connecting to the hub took longer than {0:?}")]
    ConnectTimeout(Duration),
    #[error("nothing heard from the hub for {0:?}: runs fenced, reconnecting")]
    Fenced(Duration),
}

impl AgentError {
    /// The leader's spoke endpoint, as a URL, when a hub replica refused
    /// the session because it does not lead and named the leader.
    pub fn leader_hint(&self) -> Option<String> {
        let AgentError::Status(status) = self else {
            return None;
        };
        if status.code() != tonic::Code::Unavailable {
            return None;
        }
        let addr = status
            .metadata()
            .get(LEADER_METADATA)?
            .to_str()
            .ok()?
            .trim();
        if addr.is_empty() {
            return None;
        }
        Some(if addr.contains("://") {
            addr.to_string()
        } else {
            format!("https://{addr}")
        })
    }
}

/// The hub addresses of `--hub`: comma-separated, blanks dropped.
pub fn hub_urls(hub: &str) -> Vec<String> {
    hub.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// Which hub address the agent dials next: the leader a replica named,
/// once, else the addresses in turn.
#[derive(Debug, Clone, Default)]
pub struct Targets {
    urls: Vec<String>,
    next: usize,
    hinted: Option<String>,
}

impl Targets {
    pub fn new(hub: &str) -> Self {
        Targets {
            urls: hub_urls(hub),
            next: 0,
            hinted: None,
        }
    }

    /// The address to dial now.
    pub fn pick(&mut self) -> String {
        if let Some(hinted) = self.hinted.take() {
            return hinted;
        }
        let Some(url) = self.urls.get(self.next % self.urls.len().max(1)) else {
            return String::new();
        };
        self.next = (self.next + 1) % self.urls.len().max(1);
        url.clone()
    }

    /// The session with `url` ended; `hint` is the leader a replica named.
    /// Returns whether the next dial follows a hint.
    pub fn ended(&mut self, url: &str, hint: Option<String>) -> bool {
        self.hinted = hint.filter(|h| h != url);
        self.hinted.is_some()
    }
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
    /// When anything was last heard from the hub (or the agent started).
    heard: Mutex<Instant>,
    /// Fencings so far; a session ends when it changes.
    fencings: tokio::sync::watch::Sender<u64>,
    /// Runs fenced that the backend no longer lists (it forgot them when
    /// it stopped them), with the reason; dropped when the hub stops them.
    lost: Mutex<BTreeMap<RunKey, &'static str>>,
    /// When each reservation was first seen.
    reserved_at: Mutex<HashMap<RunKey, Instant>>,
}

impl Shared {
    fn new(backend: Arc<dyn Backend>) -> Arc<Self> {
        Arc::new(Shared {
            backend,
            current: Mutex::new(None),
            seq: Mutex::new(HashMap::new()),
            log_tasks: Mutex::new(HashMap::new()),
            run_spans: Mutex::new(HashMap::new()),
            heard: Mutex::new(Instant::now()),
            fencings: tokio::sync::watch::channel(0).0,
            lost: Mutex::new(BTreeMap::new()),
            reserved_at: Mutex::new(HashMap::new()),
        })
    }

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

    fn heard(&self) {
        *lock(&self.heard) = Instant::now();
    }

    /// Every run held, as the hello lists them: the backend's, and the
    /// runs the agent fenced that the backend forgot.
    fn held(&self) -> Vec<pb::RunRef> {
        let mut refs: Vec<pb::RunRef> = self
            .backend
            .runs()
            .into_iter()
            .map(|r| pb::RunRef {
                run_id: r.key.run_id,
                generation: r.key.generation,
                finished: r.finished,
                lost: r.lost.is_some(),
                reason: r.lost.unwrap_or_default().to_string(),
            })
            .collect();
        for (key, reason) in lock(&self.lost).iter() {
            if !refs
                .iter()
                .any(|r| r.run_id == key.run_id && r.generation == key.generation)
            {
                refs.push(pb::RunRef {
                    run_id: key.run_id.clone(),
                    generation: key.generation,
                    finished: false,
                    lost: true,
                    reason: (*reason).to_string(),
                });
            }
        }
        refs
    }

    /// Fences once per silence: stops every run not finished, keeps them
    /// as lost, and ends the open session.
    async fn fence_if_silent(&self, fence_after: Duration, fenced_for: &mut Option<Instant>) {
        let heard = *lock(&self.heard);
        if heard.elapsed() < fence_after || *fenced_for == Some(heard) {
            return;
        }
        *fenced_for = Some(heard);
        let stopped = self.backend.fence().await;
        {
            let mut lost = lock(&self.lost);
            for key in &stopped {
                lost.insert(key.clone(), LOST_FENCED);
            }
        }
        for key in &stopped {
            tracing::error!(
                run = %key.run_id,
                generation = key.generation,
                silent_ms = heard.elapsed().as_millis() as u64,
                fence_after_ms = fence_after.as_millis() as u64,
                "FENCED: nothing heard from the hub for longer than --fence-after-seconds; the run is stopped and reported lost, and the hub places it again"
            );
        }
        if stopped.is_empty() {
            tracing::warn!(
                "nothing heard from the hub for {fence_after:?}; no run to fence; still reconnecting"
            );
        } else {
            tracing::error!(
                runs = stopped.len(),
                "fenced: nothing heard from the hub for {fence_after:?}; still reconnecting"
            );
        }
        self.fencings.send_modify(|n| *n += 1);
    }

    /// Releases reservations older than `ttl`.
    fn expire_reservations(&self, ttl: Duration) {
        let held = self.backend.reservations();
        let now = Instant::now();
        let expired: Vec<RunKey> = {
            let mut at = lock(&self.reserved_at);
            at.retain(|k, _| held.contains(k));
            held.iter()
                .filter(|k| now.duration_since(*at.entry((*k).clone()).or_insert(now)) >= ttl)
                .cloned()
                .collect()
        };
        for key in expired {
            tracing::warn!(run = %key.run_id, generation = key.generation, ttl_s = ttl.as_secs(), "a reservation neither started nor withdrawn expired; its capacity is released");
            self.backend.withdraw(&key);
            lock(&self.reserved_at).remove(&key);
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
    let shared = Shared::new(backend);
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
    let _watchdog = {
        let shared = shared.clone();
        let (fence_after, ttl) = (config.fence_after, config.reservation_ttl);
        let every = (fence_after / 10).clamp(Duration::from_millis(50), Duration::from_secs(1));
        AbortOnDrop(tokio::spawn(async move {
            let mut fenced_for = None;
            let mut interval = tokio::time::interval(every);
            loop {
                interval.tick().await;
                shared.fence_if_silent(fence_after, &mut fenced_for).await;
                shared.expire_reservations(ttl);
            }
        }))
    };
    let connect_loop = async {
        let mut failures: u32 = 0;
        let mut sessions: u64 = 0;
        let mut targets = Targets::new(&config.hub_url);
        let mut redirects: u32 = 0;
        loop {
            let started = Instant::now();
            if sessions > 0 {
                metrics::spoke().reconnects.inc();
            }
            sessions += 1;
            let url = targets.pick();
            let result = session(&config, &url, &shared).await;
            let hint = result.as_ref().err().and_then(AgentError::leader_hint);
            let redirected = targets.ended(&url, hint.clone());
            metrics::spoke().connected.set(0);
            match &result {
                Ok(()) => tracing::warn!("the hub closed the session"),
                Err(AgentError::Rotated) => {
                    tracing::info!("reconnecting with the rotated certificate")
                }
                Err(_) if redirected => {
                    tracing::info!(hub = %url, leader = ?hint, "the hub replica does not lead: following it to the leader")
                }
                Err(e) => tracing::warn!(hub = %url, error = %e, "session with the hub failed"),
            }
            *lock(&shared.current) = None;
            for (_, task) in lock(&shared.log_tasks).drain() {
                task.abort();
            }
            if started.elapsed() > config.backoff_max {
                failures = 0;
            }
            redirects = if redirected { redirects + 1 } else { 0 };
            let wait = if matches!(result, Err(AgentError::Rotated)) {
                failures = 0;
                config.backoff_min
            } else if redirected && redirects <= 2 {
                // A redirect is not a failure; a third in a row (replicas
                // that disagree on the leader while it changes) backs off.
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

async fn session(config: &AgentConfig, url: &str, shared: &Arc<Shared>) -> Result<(), AgentError> {
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
    let endpoint = Endpoint::from_shared(url.to_string())
        .map_err(|e| AgentError::Address(url.to_string(), e.to_string()))?
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(20));
    let channel = tokio::time::timeout(CONNECT_TIMEOUT, endpoint.connect())
        .await
        .map_err(|_| AgentError::ConnectTimeout(CONNECT_TIMEOUT))??;
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
        let held = shared.held();
        let _ = tx.send(pb::SpokeMessage {
            message: Some(pb::spoke_message::Message::Hello(pb::Hello {
                labels: config.labels.clone().into_iter().collect(),
                backend: backend.kind().to_string(),
                capacity: capacity(backend.as_ref()),
                runs: held.clone(),
                version: env!("CARGO_PKG_VERSION").to_string(),
                fence_after_ms: i64::try_from(config.fence_after.as_millis()).unwrap_or(i64::MAX),
            })),
        });
        for run in held.iter().filter(|r| !r.lost) {
            let key = RunKey {
                run_id: run.run_id.clone(),
                generation: run.generation,
            };
            if let Some(report) = backend.report(&key) {
                let _ = tx.send(shared.report_message(&report));
            }
        }
        *current = Some(tx.clone());
        held
    };
    let response = tokio::time::timeout(
        CONNECT_TIMEOUT,
        client.session(UnboundedReceiverStream::new(rx)),
    )
    .await
    .map_err(|_| AgentError::ConnectTimeout(CONNECT_TIMEOUT))??;
    shared.heard();
    let mut fencings = shared.fencings.subscribe();
    fencings.mark_unchanged();
    metrics::spoke().connected.set(1);
    tracing::info!(hub = %url, runs = held.len(), "connected to the hub");
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
                        reservations: backend
                            .reservations()
                            .into_iter()
                            .map(|k| pb::RunRef {
                                run_id: k.run_id,
                                generation: k.generation,
                                ..Default::default()
                            })
                            .collect(),
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
            _ = fencings.changed() => break Err(AgentError::Fenced(config.fence_after)),
        };
        match next {
            Some(Ok(pb::HubMessage {
                message: Some(message),
            })) => {
                shared.heard();
                handle(shared, &tx, message)
            }
            Some(Ok(_)) => shared.heard(),
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
            match &answer {
                Err(e) => tracing::debug!(run = %key.run_id, error = %e, "offer refused"),
                Ok(()) => {
                    lock(&shared.reserved_at)
                        .entry(key.clone())
                        .or_insert_with(Instant::now);
                }
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
        Message::Withdraw(w) => {
            let key = RunKey {
                run_id: w.run_id,
                generation: w.generation,
            };
            backend.withdraw(&key);
            lock(&shared.reserved_at).remove(&key);
        }
        Message::Start(start)
            if lock(&shared.lost).contains_key(&RunKey {
                run_id: start.run_id.clone(),
                generation: start.generation,
            }) =>
        {
            // Stopped here without being asked: never started again.
            tracing::info!(run = %start.run_id, generation = start.generation, "a start of a lost run ignored");
        }
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
            let shared = shared.clone();
            tokio::spawn(async move {
                tracing::info!(run = %stop.run_id, generation = stop.generation, reason = %stop.reason, "stopping");
                backend.stop(&stop.run_id, stop.generation).await;
                lock(&shared.lost)
                    .retain(|k, _| !(k.run_id == stop.run_id && k.generation <= stop.generation));
                lock(&shared.reserved_at)
                    .retain(|k, _| !(k.run_id == stop.run_id && k.generation <= stop.generation));
                shared.send(pb::SpokeMessage {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::SimBackend;

    fn refused_by_follower(leader: Option<&str>) -> AgentError {
        let mut status = tonic::Status::unavailable("this hub replica is not the leader");
        if let Some(l) = leader {
            status
                .metadata_mut()
                .insert(LEADER_METADATA, l.parse().unwrap());
        }
        AgentError::Status(status)
    }

    #[test]
    fn a_followers_refusal_sends_the_spoke_to_the_leader_then_the_list_resumes() {
        let mut t = Targets::new("https://a:1, https://b:2,,https://c:3");
        assert_eq!(t.pick(), "https://a:1");
        let hint = refused_by_follower(Some("10.0.0.2:6444")).leader_hint();
        assert_eq!(hint.as_deref(), Some("https://10.0.0.2:6444"));
        assert!(t.ended("https://a:1", hint));
        assert_eq!(t.pick(), "https://10.0.0.2:6444");
        // The leader went away: the addresses in turn.
        assert!(!t.ended("https://10.0.0.2:6444", None));
        assert_eq!(t.pick(), "https://b:2");
        assert_eq!(t.pick(), "https://c:3");
        assert_eq!(t.pick(), "https://a:1");
    }

    #[test]
    fn only_an_unavailable_refusal_naming_a_leader_is_a_hint() {
        assert_eq!(refused_by_follower(None).leader_hint(), None);
        let mut other = tonic::Status::permission_denied("revoked");
        other
            .metadata_mut()
            .insert(LEADER_METADATA, "x:1".parse().unwrap());
        assert_eq!(AgentError::Status(other).leader_hint(), None);
        // A hint naming the address just refused is not followed again.
        let mut t = Targets::new("https://a:1");
        assert!(!t.ended("https://a:1", Some("https://a:1".into())));
        assert_eq!(t.pick(), "https://a:1");
    }

    fn sim() -> Arc<SimBackend> {
        let (tx, _rx) = mpsc::unbounded_channel();
        SimBackend::new(
            [("cpu".to_string(), 4000)].into(),
            Duration::from_secs(3600),
            tx,
            None,
        )
    }

    fn key(run: &str) -> RunKey {
        RunKey {
            run_id: run.into(),
            generation: 1,
        }
    }

    #[tokio::test]
    async fn a_silent_hub_fences_the_runs_once_and_the_hello_says_they_are_lost() {
        let backend = sim();
        let shared = Shared::new(backend.clone());
        let jobset = serde_json::json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "j"}, "spec": {"replicatedJobs": []}});
        backend
            .start(RunSpec {
                key: key("r"),
                namespace: "ns".into(),
                name: "j".into(),
                trainjob_uid: "r".into(),
                objects: vec![jobset],
                extra_env: Vec::new(),
            })
            .await
            .unwrap();
        let mut fencings = shared.fencings.subscribe();
        let mut fenced_for = None;
        // Heard recently: nothing happens.
        shared
            .fence_if_silent(Duration::from_secs(60), &mut fenced_for)
            .await;
        assert_eq!(backend.runs().len(), 1);
        assert!(!fencings.has_changed().unwrap());
        // Silent for longer than fence-after: stopped, lost, session ended.
        let long_ago = Instant::now().checked_sub(Duration::from_secs(5)).unwrap();
        *lock(&shared.heard) = long_ago;
        shared
            .fence_if_silent(Duration::from_secs(1), &mut fenced_for)
            .await;
        assert!(backend.runs().is_empty(), "the backend stopped the run");
        assert!(fencings.has_changed().unwrap());
        fencings.mark_unchanged();
        let held = shared.held();
        assert_eq!(held.len(), 1);
        assert_eq!(
            (
                held[0].run_id.as_str(),
                held[0].lost,
                held[0].reason.as_str()
            ),
            ("r", true, LOST_FENCED)
        );
        // Once per silence.
        shared
            .fence_if_silent(Duration::from_secs(1), &mut fenced_for)
            .await;
        assert!(!fencings.has_changed().unwrap());
    }

    #[tokio::test]
    async fn a_reservation_expires_on_the_spoke_after_its_ttl() {
        let backend = sim();
        let shared = Shared::new(backend.clone());
        let gang = [PodSetRequest {
            name: "node".into(),
            count: 1,
            requests_milli: [("cpu".to_string(), 1000)].into(),
        }];
        backend.admit(&key("r"), &gang).unwrap();
        shared.expire_reservations(Duration::from_secs(3600));
        assert_eq!(backend.reservations(), vec![key("r")]);
        shared.expire_reservations(Duration::ZERO);
        assert!(backend.reservations().is_empty());
        assert_eq!(
            backend.capacity()[0].free_milli,
            4000,
            "its capacity is back"
        );
    }
}
