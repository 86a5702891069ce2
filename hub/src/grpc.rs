//! The spokes' side door: a gRPC server over mutual TLS where each spoke
//! holds one bidirectional `Session` stream.
//!
//! A spoke is who its client certificate says: the Subject CN is its name,
//! and the certificate must carry the Subject O [`SPOKE_GROUP`] (so a
//! user's client certificate from the same CA cannot act as a spoke).
//! Nothing a spoke sends can claim another name.
//!
//! # Bounds
//!
//! The listener is the spokes' own (tenants use the API port), with its own
//! caps, sized for a fleet ([`GrpcLimits`]): connections in the TLS
//! handshake and connections in all (past either, a new connection is
//! closed at once), connections per spoke identity, HTTP/2 streams per
//! connection, session starts per spoke per minute (a spoke flapping its
//! session cannot make the hub re-dispatch for everyone all the time),
//! message sizes both ways and the collections in a message
//! ([`trainhub_proto::limits`]). One live session per spoke: a newer one
//! replaces (and closes) the older.
//!
//! # Liveness
//!
//! A hello whose `fence_after_ms` is not strictly shorter than the hub's
//! worker-lost timeout is refused (FailedPrecondition). The hub answers
//! every heartbeat; a session from which nothing has arrived for
//! [`Dispatch::spoke_silence`] is ended and counts as a disconnect, so a
//! half-open connection (a partition that closes no socket) starts the
//! worker-lost timer.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_util::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Server;
use tonic::transport::server::{Connected, TcpConnectInfo};
use tonic::{Request, Response, Status, Streaming};
use trainhub_apiserver::auth::user_from_certificate;
use trainhub_apiserver::pki::CertInfo;
use trainhub_apiserver::reload::ReloadingCert;
use trainhub_proto as pb;
use trainhub_proto::limits::MAX_MESSAGE_BYTES;

use crate::dispatch::Dispatch;
use crate::leader::{Role, single};

/// The Subject O every spoke certificate carries.
pub const SPOKE_GROUP: &str = "trainhub:spokes";
/// How long a new stream may take to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// PEM material of the gRPC server.
#[derive(Debug, Clone)]
pub struct GrpcTls {
    pub cert_pem: String,
    pub key_pem: String,
    /// The CA that signs spoke certificates.
    pub client_ca_pem: String,
    /// The serving certificate from files, re-read when rotated; when
    /// given, `cert_pem` and `key_pem` are not used.
    pub reloading: Option<Arc<ReloadingCert>>,
}

/// The caps of the spokes' listener. The defaults hold a fleet of a few
/// thousand spokes (1,000 connect at once and stay connected well within
/// them; see `docs/benchmarks.md`).
#[derive(Debug, Clone, Copy)]
pub struct GrpcLimits {
    /// Connections open at once, handshaking or not.
    pub max_connections: usize,
    /// Connections in the TLS handshake at once.
    pub max_handshakes: usize,
    /// Connections in the TLS handshake at once from one IP address (one
    /// client cannot take every handshake slot).
    pub max_handshakes_per_ip: usize,
    /// A client that has not finished the handshake by then is dropped.
    pub handshake_timeout: Duration,
    /// Connections open at once per certificate name (a spoke needs one;
    /// one more while the hub has not yet noticed that the previous one
    /// died).
    pub max_connections_per_identity: usize,
    /// HTTP/2 streams per connection (a spoke opens one).
    pub max_streams_per_connection: u32,
    /// Sessions a spoke may start per minute (bursts up to this many).
    pub sessions_per_minute: u32,
}

impl Default for GrpcLimits {
    fn default() -> Self {
        GrpcLimits {
            max_connections: 10_000,
            max_handshakes: 512,
            max_handshakes_per_ip: 64,
            handshake_timeout: Duration::from_secs(10),
            max_connections_per_identity: 4,
            max_streams_per_connection: 4,
            sessions_per_minute: 20,
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Session starts of one spoke: a token bucket refilled over a minute.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Token buckets of session starts, per spoke name.
struct SessionRate {
    per_minute: f64,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl SessionRate {
    fn new(per_minute: u32) -> Self {
        SessionRate {
            per_minute: f64::from(per_minute.max(1)),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes a session start for `name`, or says when the next one may be.
    fn take(&self, name: &str, now: Instant) -> Result<(), Duration> {
        let mut buckets = lock(&self.buckets);
        let full = Bucket {
            tokens: self.per_minute,
            at: now,
        };
        let b = buckets.entry(name.to_string()).or_insert(full);
        let refill = now.saturating_duration_since(b.at).as_secs_f64() * self.per_minute / 60.0;
        b.tokens = (b.tokens + refill).min(self.per_minute);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            return Ok(());
        }
        Err(Duration::from_secs_f64(
            (1.0 - b.tokens) * 60.0 / self.per_minute,
        ))
    }
}

struct SpokeService {
    /// The dispatch of the term this replica leads; None while it follows.
    current: watch::Receiver<Option<Arc<Dispatch>>>,
    /// This replica's role: a follower names the leader to the spokes.
    role: watch::Receiver<Role>,
    /// Set when the server shuts down: the open sessions end, so that the
    /// graceful shutdown does not wait for streams that never finish.
    stopping: watch::Receiver<bool>,
    rate: SessionRate,
}

type HubStream = Pin<Box<dyn Stream<Item = Result<pb::HubMessage, Status>> + Send>>;

/// What ends a session's streams: the server stopping, or a newer session
/// of the same spoke (with the reason).
async fn closed(
    mut close: watch::Receiver<Option<String>>,
    mut stopping: watch::Receiver<bool>,
) -> Option<String> {
    tokio::select! {
        r = close.wait_for(Option::is_some) => r.ok().and_then(|r| r.clone()),
        _ = stopping.wait_for(|s| *s) => None,
    }
}

#[tonic::async_trait]
impl pb::spoke_server::Spoke for SpokeService {
    type SessionStream = HubStream;

    async fn session(
        &self,
        request: Request<Streaming<pb::SpokeMessage>>,
    ) -> Result<Response<HubStream>, Status> {
        let name = spoke_name(&request)?;
        let cert = peer_cert(&request)?;
        let current = self.current.borrow().clone();
        let Some(dispatch) = current else {
            return Err(not_leader(&self.role.borrow()));
        };
        let registry = dispatch.spokes().clone();
        if let Some(refusal) = registry.refusal(&name, &cert) {
            tracing::warn!(spoke = %name, serial = %cert.serial, "refused a session: the spoke's certificate is revoked");
            return Err(Status::permission_denied(refusal));
        }
        if let Err(wait) = self.rate.take(&name, Instant::now()) {
            tracing::warn!(spoke = %name, "refused a session: the spoke starts sessions too often");
            return Err(Status::resource_exhausted(format!(
                "spoke {name:?} started more than {} sessions in a minute; retry in {}s",
                self.rate.per_minute,
                wait.as_secs() + 1
            )));
        }
        let mut inbound = request.into_inner();
        let hello = match tokio::time::timeout(HELLO_TIMEOUT, inbound.message()).await {
            Ok(Ok(Some(pb::SpokeMessage {
                message: Some(pb::spoke_message::Message::Hello(hello)),
            }))) => hello,
            Ok(Ok(_)) => {
                return Err(Status::invalid_argument(
                    "the first message of a session must be a hello",
                ));
            }
            Ok(Err(status)) => return Err(status),
            Err(_) => return Err(Status::deadline_exceeded("no hello within 10s")),
        };
        let hello_message = pb::SpokeMessage {
            message: Some(pb::spoke_message::Message::Hello(hello)),
        };
        if let Err(e) = pb::limits::check(&hello_message) {
            tracing::warn!(spoke = %name, refused = %e, "refused a hello past the protocol's limits");
            return Err(Status::invalid_argument(format!("hello refused: {e}")));
        }
        let Some(pb::spoke_message::Message::Hello(hello)) = hello_message.message else {
            return Err(Status::internal("the hello went missing"));
        };
        if let Err(rule) = dispatch.check_hello(&hello) {
            tracing::warn!(spoke = %name, refused = %rule, "refused a session");
            return Err(Status::failed_precondition(rule));
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let (close_tx, close_rx) = watch::channel(None);
        let backend = hello.backend.clone();
        let (silent_tx, silent_rx) = watch::channel(None);
        let id = dispatch.connect(&name, hello, tx, close_tx);
        registry.started(&name, id, cert.clone(), &backend);
        // Revoked while this session was being set up: ended at once.
        if let Some(refusal) = registry.refusal(&name, &cert) {
            dispatch.close_session(&name, &refusal);
        }
        // The term ended while this session was being set up: the sessions
        // it closed did not include this one.
        let still_leading = self
            .current
            .borrow()
            .as_ref()
            .is_some_and(|d| Arc::ptr_eq(d, &dispatch));
        if !still_leading {
            dispatch.close_session(&name, NOT_LEADING);
        }
        let silence = dispatch.spoke_silence();
        let ended = closed(close_rx.clone(), self.stopping.clone());
        tokio::spawn(async move {
            tokio::pin!(ended);
            loop {
                let message = tokio::select! {
                    m = tokio::time::timeout(silence, inbound.message()) => match m {
                        Ok(m) => m,
                        Err(_) => {
                            let reason = format!(
                                "nothing arrived from spoke {name:?} for {}s (--spoke-silence-seconds): session ended",
                                silence.as_secs_f64()
                            );
                            tracing::warn!(spoke = %name, "{reason}");
                            let _ = silent_tx.send(Some(reason));
                            break;
                        }
                    },
                    _ = &mut ended => break,
                };
                match message {
                    Ok(Some(message)) => {
                        if let Err(e) = pb::limits::check(&message) {
                            tracing::warn!(spoke = %name, refused = %e, "refused a message past the protocol's limits");
                            continue;
                        }
                        if let Some(message) = message.message {
                            registry.heard(&name, id);
                            dispatch.on_message(&name, id, message);
                        }
                    }
                    Ok(None) => break,
                    Err(status) => {
                        tracing::debug!(spoke = %name, %status, "session ended");
                        break;
                    }
                }
            }
            dispatch.disconnect(&name, id);
            registry.ended(&name, id);
        });
        // The hub's messages until the session is closed; a replaced
        // session ends with the reason.
        let ended = closed(close_rx, self.stopping.clone());
        let ended = async move {
            let mut silent_rx = silent_rx;
            let silent = async move {
                let reason = silent_rx.wait_for(Option::is_some).await.map(|r| r.clone());
                match reason {
                    Ok(reason) => reason,
                    // The session ended otherwise.
                    Err(_) => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                reason = ended => reason,
                reason = silent => reason,
            }
        };
        let outbound =
            futures_util::stream::unfold(Some((rx, Box::pin(ended))), |state| async move {
                let (mut rx, mut ended) = state?;
                // A replaced session's sender is dropped as it is closed:
                // the reason comes first.
                tokio::select! {
                    biased;
                    reason = &mut ended => reason.map(|r| (Err(Status::aborted(r)), None)),
                    m = rx.recv() => match m {
                        Some(m) => Some((Ok(m), Some((rx, ended)))),
                        None => ended.await.map(|r| (Err(Status::aborted(r)), None)),
                    },
                }
            });
        Ok(Response::new(Box::pin(outbound)))
    }
}

/// Why the sessions of a replica that stopped leading end.
pub const NOT_LEADING: &str = "this hub replica is no longer the leader: reconnect to the leader";

/// The gRPC metadata key in which a follower names the leader's spoke
/// endpoint (`host:port`) when it refuses a session.
pub const LEADER_METADATA: &str = "trainhub-leader";

/// UNAVAILABLE, with the leader's spoke endpoint in [`LEADER_METADATA`]
/// when this follower knows it.
fn not_leader(role: &Role) -> Status {
    let leader = role.leader_grpc();
    let mut status = Status::unavailable(match leader {
        Some(addr) => format!(
            "this hub replica is not the leader; the leader's spoke endpoint is {addr} (gRPC metadata {LEADER_METADATA})"
        ),
        None => "this hub replica is not the leader and no leader is known yet: retry".into(),
    });
    if let Some(value) = leader.and_then(|a| a.parse().ok()) {
        status.metadata_mut().insert(LEADER_METADATA, value);
    }
    status
}

/// The serial and validity of the spoke's verified client certificate.
fn peer_cert<T>(request: &Request<T>) -> Result<CertInfo, Status> {
    let certs = request
        .peer_certs()
        .ok_or_else(|| Status::unauthenticated("a spoke must present a client certificate"))?;
    let der = certs
        .first()
        .ok_or_else(|| Status::unauthenticated("a spoke must present a client certificate"))?;
    CertInfo::from_der(der.as_ref()).map_err(Status::unauthenticated)
}

/// The spoke's name from its verified client certificate.
fn spoke_name<T>(request: &Request<T>) -> Result<String, Status> {
    let certs = request
        .peer_certs()
        .ok_or_else(|| Status::unauthenticated("a spoke must present a client certificate"))?;
    let der = certs
        .first()
        .ok_or_else(|| Status::unauthenticated("a spoke must present a client certificate"))?;
    let user = user_from_certificate(der.as_ref()).map_err(Status::unauthenticated)?;
    let name = user.name;
    if !user.groups.iter().any(|g| g == SPOKE_GROUP) {
        return Err(Status::permission_denied(format!(
            "certificate {name:?} is not a spoke certificate (Subject O {SPOKE_GROUP} missing)"
        )));
    }
    if !is_dns_label(&name) {
        return Err(Status::permission_denied(format!(
            "spoke name {name:?} (certificate CN) must be a DNS-1123 label"
        )));
    }
    Ok(name)
}

/// Lowercase alphanumerics and '-', 1-63 characters, alphanumeric at both ends.
pub fn is_dns_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// Serves the spokes' gRPC endpoint on `listener` until `shutdown`, with
/// the default [`GrpcLimits`].
pub async fn serve(
    listener: tokio::net::TcpListener,
    tls: &GrpcTls,
    dispatch: Arc<Dispatch>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    serve_with(listener, tls, GrpcLimits::default(), dispatch, shutdown).await
}

/// Serves the spokes' gRPC endpoint on `listener` until `shutdown`, for a
/// hub that always leads (one process writes its store).
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    tls: &GrpcTls,
    limits: GrpcLimits,
    dispatch: Arc<Dispatch>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let (_current, current) = watch::channel(Some(dispatch));
    serve_replica(listener, tls, limits, current, single(), shutdown).await
}

/// Serves the spokes' gRPC endpoint of one hub replica on `listener` until
/// `shutdown`. Sessions are served while `current` holds the dispatch of
/// the term this replica leads; a follower refuses them with UNAVAILABLE
/// and the leader's endpoint from `role` (see [`LEADER_METADATA`]). A term
/// ends its sessions itself ([`Dispatch::close_all_sessions`]).
pub async fn serve_replica(
    listener: tokio::net::TcpListener,
    tls: &GrpcTls,
    limits: GrpcLimits,
    current: watch::Receiver<Option<Arc<Dispatch>>>,
    role: watch::Receiver<Role>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let addr: Option<SocketAddr> = listener.local_addr().ok();
    let acceptor = TlsAcceptor::from(server_config(tls)?);
    tracing::info!(addr = ?addr, "serving spokes (gRPC, mutual TLS)");
    let (stop_tx, stopping) = watch::channel(false);
    let shutdown = async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    };
    let incoming = accept(listener, acceptor, limits, stopping.clone());
    Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .tcp_keepalive(Some(Duration::from_secs(60)))
        .max_concurrent_streams(limits.max_streams_per_connection)
        .http2_max_pending_accept_reset_streams(Some(16))
        .http2_max_header_list_size(16u32 << 10)
        .add_service(
            pb::spoke_server::SpokeServer::new(SpokeService {
                current,
                role,
                stopping,
                rate: SessionRate::new(limits.sessions_per_minute),
            })
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES),
        )
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await?;
    Ok(())
}

/// TLS with a required client certificate from the spokes' CA; ALPN h2.
fn server_config(tls: &GrpcTls) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    use trainhub_apiserver::tls::{crypto_provider, parse_certificates, parse_private_key};
    let provider = crypto_provider();
    let mut roots = rustls::RootCertStore::empty();
    for cert in parse_certificates("spoke CA", &tls.client_ca_pem)? {
        roots.add(cert)?;
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()?;
    let builder = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier);
    let mut config = match &tls.reloading {
        Some(reloading) => builder.with_cert_resolver(reloading.clone()),
        None => {
            let chain = parse_certificates("gRPC server certificate", &tls.cert_pem)?;
            let key = parse_private_key("gRPC server key", &tls.key_pem)?;
            builder.with_single_cert(chain, key)?
        }
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// Connections open per certificate name.
type PerIdentity = Arc<Mutex<HashMap<String, usize>>>;

/// A counted place in a per-key count (handshakes per IP), given back
/// when dropped.
struct Counted<K: std::hash::Hash + Eq + Clone> {
    key: K,
    counts: Arc<Mutex<HashMap<K, usize>>>,
}

impl<K: std::hash::Hash + Eq + Clone> Counted<K> {
    /// A place for `key` if it has fewer than `max`.
    fn take(counts: &Arc<Mutex<HashMap<K, usize>>>, key: K, max: usize) -> Option<Self> {
        let mut map = lock(counts);
        let n = map.entry(key.clone()).or_default();
        if *n >= max {
            if *n == 0 {
                map.remove(&key);
            }
            return None;
        }
        *n += 1;
        Some(Counted {
            key,
            counts: counts.clone(),
        })
    }
}

impl<K: std::hash::Hash + Eq + Clone> Drop for Counted<K> {
    fn drop(&mut self) {
        let mut map = lock(&self.counts);
        if let Some(n) = map.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                map.remove(&self.key);
            }
        }
    }
}

/// A connection past the handshake, holding its places under the caps
/// until it closes.
pub struct Conn {
    tcp: TcpStream,
    _permit: OwnedSemaphorePermit,
    identity: Option<Counted<String>>,
}

impl Connected for Conn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.tcp.connect_info()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }
}

/// The listener's connections after the TLS handshake, under the caps.
/// Nagle's algorithm is off: the protocol is small messages each side
/// waits on (an offer, its answer, a start), and Nagle would hold one back
/// until the peer's delayed ACK, 40 ms later.
fn accept(
    listener: tokio::net::TcpListener,
    acceptor: TlsAcceptor,
    limits: GrpcLimits,
    mut stopping: watch::Receiver<bool>,
) -> ReceiverStream<std::io::Result<TlsStream<Conn>>> {
    let (tx, rx) = mpsc::channel(64);
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    let handshakes = Arc::new(Semaphore::new(limits.max_handshakes));
    let identities: PerIdentity = Arc::default();
    let per_ip: Arc<Mutex<HashMap<std::net::IpAddr, usize>>> = Arc::default();
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = stopping.wait_for(|s| *s) => return,
            };
            let (tcp, peer) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors and the like: let it pass.
                    tracing::debug!(error = %e, "gRPC accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(connection) = connections.clone().try_acquire_owned() else {
                tracing::debug!(%peer, "gRPC connection refused: {} connections open, the cap", limits.max_connections);
                continue;
            };
            let Ok(handshake) = handshakes.clone().try_acquire_owned() else {
                tracing::debug!(%peer, "gRPC connection refused: {} TLS handshakes under way, the cap", limits.max_handshakes);
                continue;
            };
            let Some(handshake_of_ip) =
                Counted::take(&per_ip, peer.ip(), limits.max_handshakes_per_ip)
            else {
                tracing::debug!(%peer, "gRPC connection refused: {} TLS handshakes under way from this address, the cap", limits.max_handshakes_per_ip);
                continue;
            };
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(error = %e, "TCP_NODELAY not set");
            }
            let (acceptor, tx, identities) = (acceptor.clone(), tx.clone(), identities.clone());
            tokio::spawn(async move {
                let conn = Conn {
                    tcp,
                    _permit: connection,
                    identity: None,
                };
                let tls =
                    match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(conn))
                        .await
                    {
                        Ok(Ok(tls)) => tls,
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "gRPC TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "gRPC TLS handshake timed out");
                            return;
                        }
                    };
                drop((handshake, handshake_of_ip));
                let mut tls = tls;
                let name = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .and_then(|der| user_from_certificate(der.as_ref()).ok())
                    .map(|u| u.name)
                    .unwrap_or_default();
                let Some(identity) = Counted::take(
                    &identities,
                    name.clone(),
                    limits.max_connections_per_identity,
                ) else {
                    tracing::warn!(%peer, identity = %name, "gRPC connection refused: {} connections of this identity are open, the cap", limits.max_connections_per_identity);
                    return;
                };
                tls.get_mut().0.identity = Some(identity);
                let _ = tx.send(Ok(tls)).await;
            });
        }
    });
    ReceiverStream::new(rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_starts_are_rate_limited_per_spoke() {
        let rate = SessionRate::new(3);
        let t0 = Instant::now();
        for _ in 0..3 {
            assert!(rate.take("a", t0).is_ok());
        }
        let wait = rate.take("a", t0).unwrap_err();
        assert!(wait <= Duration::from_secs(20), "{wait:?}");
        // Another spoke is not held back by this one.
        assert!(rate.take("b", t0).is_ok());
        // A third of a minute later, one more.
        assert!(rate.take("a", t0 + Duration::from_secs(21)).is_ok());
        assert!(rate.take("a", t0 + Duration::from_secs(21)).is_err());
    }
}
