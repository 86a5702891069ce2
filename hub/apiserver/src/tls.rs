//! Serving an axum [`Router`] over TLS, HTTP/1.1 and HTTP/2 on one port.
//!
//! kubectl speaks h2, the Kubernetes Python client HTTP/1.1; both are offered
//! by ALPN and served by hyper-util's auto connection builder. Client
//! certificates are requested and, when one is presented, verified against
//! the client CA; a client without one may still come in (with a bearer
//! token). Each request carries the verified leaf certificate in its
//! extensions as a [`PeerCertificate`], for [`crate::auth::Authenticator`].

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use rustls::RootCertStore;
use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

/// The client's leaf certificate (DER) when it presented one; the TLS layer
/// has verified it against the client CA. Present in every request's
/// extensions when served by [`serve`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerCertificate(pub Option<Arc<Vec<u8>>>);

impl PeerCertificate {
    pub fn der(&self) -> Option<&[u8]> {
        self.0.as_deref().map(Vec::as_slice)
    }
}

/// Why a TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{what}: {message}")]
    Pem { what: &'static str, message: String },
    #[error("{what}: no PEM CERTIFICATE block found")]
    NoCertificate { what: &'static str },
    #[error("client CA: {0}")]
    ClientVerifier(#[from] rustls::server::VerifierBuilderError),
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The ring provider, which is the only one this workspace builds.
pub fn crypto_provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Parses every `CERTIFICATE` block of `pem`.
pub fn parse_certificates(
    what: &'static str,
    pem: &str,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            what,
            message: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate { what });
    }
    Ok(certs)
}

/// Parses the first private key of `pem` (PKCS#8, SEC1 or PKCS#1).
pub fn parse_private_key(
    what: &'static str,
    pem: &str,
) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|e| TlsError::Pem {
        what,
        message: e.to_string(),
    })
}

/// A server configuration with ALPN `h2` and `http/1.1`. With
/// `client_ca_pem`, client certificates are requested and verified against
/// it, but not required.
pub fn server_config(
    cert_chain_pem: &str,
    key_pem: &str,
    client_ca_pem: Option<&str>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let chain = parse_certificates("server certificate", cert_chain_pem)?;
    let key = parse_private_key("server key", key_pem)?;
    let config = server_builder(client_ca_pem)?.with_single_cert(chain, key)?;
    Ok(with_alpn(config))
}

/// As [`server_config`], with the serving certificate from `resolver`
/// (a [`crate::reload::ReloadingCert`] follows rotated files).
pub fn server_config_with_resolver(
    resolver: Arc<dyn rustls::server::ResolvesServerCert>,
    client_ca_pem: Option<&str>,
) -> Result<Arc<ServerConfig>, TlsError> {
    Ok(with_alpn(
        server_builder(client_ca_pem)?.with_cert_resolver(resolver),
    ))
}

/// A server configuration up to its certificate: the protocol versions
/// and, with `client_ca_pem`, client certificates requested and verified
/// against it (not required).
fn server_builder(
    client_ca_pem: Option<&str>,
) -> Result<rustls::ConfigBuilder<ServerConfig, rustls::server::WantsServerCert>, TlsError> {
    let provider = crypto_provider();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    Ok(match client_ca_pem {
        Some(ca_pem) => {
            let mut roots = RootCertStore::empty();
            for cert in parse_certificates("client CA", ca_pem)? {
                roots.add(cert)?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    })
}

/// ALPN `h2` and `http/1.1`.
fn with_alpn(mut config: ServerConfig) -> Arc<ServerConfig> {
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Arc::new(config)
}

/// Timeouts and caps of [`serve_with`]. The defaults suit kubectl, the
/// Kubernetes clients and many watchers; every one is a bound on what a
/// client (or many from one address) can hold of the server.
#[derive(Debug, Clone, Copy)]
pub struct ServeOptions {
    /// A client that has not finished the TLS handshake by then is dropped.
    pub handshake_timeout: Duration,
    /// After shutdown is signalled, how long in-flight requests (and open
    /// watches) may run before the connections are dropped.
    pub shutdown_grace: Duration,
    /// An HTTP/1.1 client must send a request's whole header within this
    /// (slowloris), counted from when the server is ready for the request;
    /// an idle keep-alive connection is closed after it too.
    pub header_read_timeout: Duration,
    /// A connection with no request in flight (no open watch either) for
    /// this long is closed: HTTP/2 with GOAWAY, HTTP/1.1 at once.
    pub idle_timeout: Duration,
    /// A client that accepts none of a response's bytes for this long (its
    /// receive window and the socket buffer full) is disconnected, so a
    /// client that stops reading holds nothing for long.
    pub write_timeout: Duration,
    /// Connections served at once on the listener; more are closed as soon
    /// as they are accepted.
    pub max_connections: usize,
    /// Connections served at once from one client IP address.
    pub max_connections_per_client: usize,
    /// HTTP/2 streams (requests) in flight on one connection
    /// (`SETTINGS_MAX_CONCURRENT_STREAMS`).
    pub http2_max_concurrent_streams: u32,
    /// Largest request header block (HTTP/1.1 buffer, HTTP/2 header list).
    pub max_header_bytes: usize,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            handshake_timeout: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(5),
            header_read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(90),
            write_timeout: Duration::from_secs(60),
            max_connections: 8192,
            max_connections_per_client: 512,
            // Go's HTTP/2 default, which kube-apiserver keeps unless told.
            http2_max_concurrent_streams: 250,
            // kube-apiserver's MaxHeaderBytes.
            max_header_bytes: 1 << 20,
        }
    }
}

/// [`serve_with`] with the default [`ServeOptions`].
pub async fn serve(
    listener: TcpListener,
    config: Arc<ServerConfig>,
    app: Router,
    shutdown: impl Future<Output = ()>,
) {
    serve_with(listener, config, app, shutdown, ServeOptions::default()).await
}

/// Connections held per client address, for
/// [`ServeOptions::max_connections_per_client`].
#[derive(Default)]
struct PerClient(std::sync::Mutex<std::collections::HashMap<IpAddr, usize>>);

/// One connection counted against its address; uncounted when dropped.
struct ClientSlot {
    clients: Arc<PerClient>,
    ip: IpAddr,
}

impl PerClient {
    fn take(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<ClientSlot> {
        let mut held = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = held.entry(ip).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(ClientSlot {
            clients: self.clone(),
            ip,
        })
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut held = self.clients.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = held.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(&self.ip);
            }
        }
    }
}

/// Accepts connections on `listener` until `shutdown` completes, serving
/// `app` over TLS with HTTP/1.1 or HTTP/2 on each. Every request gets the
/// [`PeerCertificate`] and axum's `ConnectInfo<SocketAddr>` in its
/// extensions.
///
/// A failed or slow handshake, or a failed accept, is logged and never ends
/// the loop. Connections past [`ServeOptions::max_connections`] (or past
/// [`ServeOptions::max_connections_per_client`] from one address) are closed
/// at once. On shutdown the listener is closed, connections are asked to
/// finish (HTTP/2 GOAWAY, HTTP/1.1 close after the current response), and
/// this returns when they have, or after `shutdown_grace`.
pub async fn serve_with(
    listener: TcpListener,
    config: Arc<ServerConfig>,
    app: Router,
    shutdown: impl Future<Output = ()>,
    options: ServeOptions,
) {
    let acceptor = TlsAcceptor::from(config);
    let max_connections = options.max_connections.clamp(1, Semaphore::MAX_PERMITS);
    let connections = Arc::new(Semaphore::new(max_connections));
    let clients = Arc::new(PerClient::default());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(options.header_read_timeout)
        .max_buf_size(options.max_header_bytes.max(8192));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(options.http2_max_concurrent_streams)
        .max_header_list_size(u32::try_from(options.max_header_bytes).unwrap_or(u32::MAX))
        // Dead peers are found by pings when nothing else moves.
        .keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(20));
    let builder = Arc::new(builder);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        let (tcp, remote) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                // Typically out of file descriptors: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            tracing::debug!(%remote, max = max_connections, "connection refused: the server holds its maximum of connections");
            continue;
        };
        let Some(slot) = clients.take(remote.ip(), options.max_connections_per_client) else {
            tracing::debug!(%remote, max = options.max_connections_per_client, "connection refused: this address holds its maximum of connections");
            continue;
        };
        // Responses and watch events are small writes: without this, Nagle's
        // algorithm holds one back until the client's delayed ACK (40 ms).
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(%remote, error = %e, "TCP_NODELAY not set");
        }
        let acceptor = acceptor.clone();
        let app = app.clone();
        let builder = builder.clone();
        let stop = stop_rx.clone();
        tokio::spawn(async move {
            let _held = (permit, slot);
            serve_connection(tcp, remote, acceptor, app, &builder, stop, options).await;
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    // Every connection holds a permit until it is done.
    let all = u32::try_from(max_connections).unwrap_or(u32::MAX);
    if tokio::time::timeout(options.shutdown_grace, connections.acquire_many(all))
        .await
        .is_err()
    {
        tracing::info!(grace = ?options.shutdown_grace, "connections still open after the shutdown grace; dropping them");
    }
}

async fn serve_connection(
    tcp: TcpStream,
    remote: SocketAddr,
    acceptor: TlsAcceptor,
    app: Router,
    builder: &auto::Builder<TokioExecutor>,
    mut stop: tokio::sync::watch::Receiver<bool>,
    options: ServeOptions,
) {
    let tls = match tokio::time::timeout(options.handshake_timeout, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            tracing::info!(%remote, error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::info!(%remote, timeout = ?options.handshake_timeout, "TLS handshake timed out");
            return;
        }
    };
    let peer = PeerCertificate(
        tls.get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .map(|leaf| Arc::new(leaf.as_ref().to_vec())),
    );
    // Requests in flight on this connection, each until its response body
    // is done: a connection with none is idle.
    let (in_flight, mut busy) = tokio::sync::watch::channel(0usize);
    let in_flight = Arc::new(in_flight);
    let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
        request.extensions_mut().insert(peer.clone());
        request
            .extensions_mut()
            .insert(ConnectInfo::<SocketAddr>(remote));
        let guard = InFlight::new(in_flight.clone());
        let response = app.clone().oneshot(request);
        async move {
            let response = response.await?;
            Ok::<_, std::convert::Infallible>(response.map(|body| {
                axum::body::Body::new(Guarded {
                    inner: body,
                    _guard: guard,
                })
            }))
        }
    });
    let io = TokioIo::new(WriteTimeout::new(tls, options.write_timeout));
    let connection = builder.serve_connection_with_upgrades(io, service);
    let mut connection = std::pin::pin!(connection);
    let mut closing = false;
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(%remote, error = %e, "connection ended with an error");
                }
                return;
            }
            _ = stop.wait_for(|stopped| *stopped), if !closing => {
                connection.as_mut().graceful_shutdown();
                closing = true;
            }
            () = idle(&mut busy, options.idle_timeout), if !closing => {
                tracing::debug!(%remote, timeout = ?options.idle_timeout, "closing an idle connection");
                connection.as_mut().graceful_shutdown();
                closing = true;
            }
        }
    }
}

/// Resolves once no request has been in flight for `timeout`.
async fn idle(busy: &mut tokio::sync::watch::Receiver<usize>, timeout: Duration) {
    loop {
        if busy.wait_for(|n| *n == 0).await.is_err() {
            return;
        }
        if tokio::time::timeout(timeout, busy.wait_for(|n| *n > 0))
            .await
            .is_err()
        {
            return;
        }
    }
}

/// One request in flight, until dropped with its response body.
struct InFlight(Arc<tokio::sync::watch::Sender<usize>>);

impl InFlight {
    fn new(count: Arc<tokio::sync::watch::Sender<usize>>) -> Self {
        count.send_modify(|n| *n += 1);
        InFlight(count)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// A response body that holds `_guard` until it is done or dropped.
pub(crate) struct Guarded<G> {
    pub(crate) inner: axum::body::Body,
    pub(crate) _guard: G,
}

impl<G: Send + Unpin + 'static> axum::body::HttpBody for Guarded<G> {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, axum::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// A stream whose writes fail with `TimedOut` once they have made no
/// progress for `timeout`: the peer stopped reading.
struct WriteTimeout<T> {
    inner: T,
    timeout: Duration,
    stalled: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl<T> WriteTimeout<T> {
    fn new(inner: T, timeout: Duration) -> Self {
        WriteTimeout {
            inner,
            timeout,
            stalled: None,
        }
    }

    /// After the inner write returned `Pending`: pending still, or the
    /// timeout's error.
    fn stall<R>(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<R>> {
        let timeout = self.timeout;
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match sleep.as_mut().poll(cx) {
            std::task::Poll::Ready(()) => std::task::Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the client read nothing for {timeout:?}"),
            ))),
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }

    fn progress<R>(
        &mut self,
        cx: &mut std::task::Context<'_>,
        polled: std::task::Poll<std::io::Result<R>>,
    ) -> std::task::Poll<std::io::Result<R>> {
        match polled {
            std::task::Poll::Ready(r) => {
                self.stalled = None;
                std::task::Poll::Ready(r)
            }
            std::task::Poll::Pending => self.stall(cx),
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WriteTimeout<T> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteTimeout<T> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        self.progress(cx, polled)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_flush(cx);
        self.progress(cx, polled)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_shutdown(cx);
        self.progress(cx, polled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::{Ca, Issued};
    use axum::extract::Extension;
    use axum::routing::get;
    use bytes_body::collect;
    use rustls::ClientConfig;
    use rustls_pki_types::ServerName;
    use std::net::{IpAddr, Ipv4Addr};
    use tokio::net::TcpStream;
    use tokio::sync::oneshot;
    use tokio_rustls::TlsConnector;

    mod bytes_body {
        use http_body_util::BodyExt;

        pub async fn collect(body: hyper::body::Incoming) -> String {
            let bytes = body.collect().await.unwrap().to_bytes();
            String::from_utf8(bytes.to_vec()).unwrap()
        }
    }

    struct Pki {
        ca: Ca,
        server: Issued,
    }

    fn pki() -> Pki {
        let ca = Ca::generate("test CA").unwrap();
        let server = ca
            .issue_server("hub", &["localhost"], &[IpAddr::V4(Ipv4Addr::LOCALHOST)])
            .unwrap();
        Pki { ca, server }
    }

    async fn whoami(Extension(peer): Extension<PeerCertificate>) -> String {
        match peer.der() {
            None => "anonymous".to_string(),
            Some(der) => {
                use x509_parser::prelude::{FromDer, X509Certificate};
                let (_, cert) = X509Certificate::from_der(der).unwrap();
                let cn = cert.subject().iter_common_name().next().unwrap();
                format!("cn={}", cn.as_str().unwrap())
            }
        }
    }

    struct Server {
        addr: SocketAddr,
        stop: Option<oneshot::Sender<()>>,
        done: tokio::task::JoinHandle<()>,
    }

    async fn start(config: Arc<ServerConfig>, app: Router) -> Server {
        start_with(
            config,
            app,
            ServeOptions {
                handshake_timeout: Duration::from_secs(2),
                shutdown_grace: Duration::from_secs(2),
                ..ServeOptions::default()
            },
        )
        .await
    }

    async fn start_with(config: Arc<ServerConfig>, app: Router, options: ServeOptions) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let done = tokio::spawn(serve_with(
            listener,
            config,
            app,
            async move {
                let _ = stopped.await;
            },
            options,
        ));
        Server {
            addr,
            stop: Some(stop),
            done,
        }
    }

    fn client_config(ca: &Ca, identity: Option<&Issued>, alpn: &[u8]) -> Arc<ClientConfig> {
        let mut roots = RootCertStore::empty();
        roots
            .add(CertificateDer::from(ca.cert_der().to_vec()))
            .unwrap();
        let builder = ClientConfig::builder_with_provider(crypto_provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let mut config = match identity {
            Some(id) => builder
                .with_client_auth_cert(
                    parse_certificates("client", &id.cert_pem).unwrap(),
                    parse_private_key("client key", &id.key_pem).unwrap(),
                )
                .unwrap(),
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![alpn.to_vec()];
        Arc::new(config)
    }

    async fn connect(
        addr: SocketAddr,
        config: Arc<ClientConfig>,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(addr).await?;
        let name = ServerName::IpAddress(Ipv4Addr::LOCALHOST.into());
        TlsConnector::from(config).connect(name, tcp).await
    }

    async fn get_http1(addr: SocketAddr, config: Arc<ClientConfig>, path: &str) -> (u16, String) {
        let tls = connect(addr, config).await.unwrap();
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .unwrap();
        tokio::spawn(conn);
        let request = hyper::Request::get(path)
            .header("host", "localhost")
            .body(http_body_util::Empty::<hyper::body::Bytes>::new())
            .unwrap();
        let response = sender.send_request(request).await.unwrap();
        let status = response.status().as_u16();
        (status, collect(response.into_body()).await)
    }

    fn app() -> Router {
        Router::new().route("/whoami", get(whoami))
    }

    #[tokio::test]
    async fn http1_with_and_without_client_certificate() {
        let p = pki();
        let config =
            server_config(&p.server.cert_pem, &p.server.key_pem, Some(p.ca.cert_pem())).unwrap();
        let mut server = start(config, app()).await;

        let anonymous = client_config(&p.ca, None, b"http/1.1");
        assert_eq!(
            get_http1(server.addr, anonymous, "/whoami").await,
            (200, "anonymous".to_string())
        );

        let alice = p.ca.issue_client("alice", &["team-a"]).unwrap();
        let with_cert = client_config(&p.ca, Some(&alice), b"http/1.1");
        assert_eq!(
            get_http1(server.addr, with_cert, "/whoami").await,
            (200, "cn=alice".to_string())
        );

        server.stop.take().unwrap().send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), server.done)
            .await
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn h2_request_sees_the_certificate() {
        let p = pki();
        let config =
            server_config(&p.server.cert_pem, &p.server.key_pem, Some(p.ca.cert_pem())).unwrap();
        let server = start(config, app()).await;
        let bob = p.ca.issue_client("bob", &[]).unwrap();
        let tls = connect(server.addr, client_config(&p.ca, Some(&bob), b"h2"))
            .await
            .unwrap();
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                .await
                .unwrap();
        tokio::spawn(conn);
        let request = hyper::Request::get("https://localhost/whoami")
            .body(http_body_util::Empty::<hyper::body::Bytes>::new())
            .unwrap();
        let response = sender.send_request(request).await.unwrap();
        assert_eq!(response.version(), hyper::Version::HTTP_2);
        assert_eq!(collect(response.into_body()).await, "cn=bob");
    }

    #[tokio::test]
    async fn certificate_from_another_ca_is_refused_and_the_loop_survives() {
        let p = pki();
        let config =
            server_config(&p.server.cert_pem, &p.server.key_pem, Some(p.ca.cert_pem())).unwrap();
        let server = start(config, app()).await;

        let rogue_ca = Ca::generate("rogue").unwrap();
        let mallory = rogue_ca.issue_client("admin", &["system:masters"]).unwrap();
        let rogue = client_config(&p.ca, Some(&mallory), b"http/1.1");
        // TLS 1.3: the client learns of the refusal on its first read.
        let refused = async {
            let tls = connect(server.addr, rogue).await?;
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
                .await
                .map_err(std::io::Error::other)?;
            tokio::spawn(conn);
            let request = hyper::Request::get("/whoami")
                .body(http_body_util::Empty::<hyper::body::Bytes>::new())
                .map_err(std::io::Error::other)?;
            sender
                .send_request(request)
                .await
                .map_err(std::io::Error::other)
        };
        assert!(refused.await.is_err());

        // Garbage instead of a ClientHello.
        let mut raw = TcpStream::connect(server.addr).await.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut raw, b"GET / HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        drop(raw);

        let anonymous = client_config(&p.ca, None, b"http/1.1");
        assert_eq!(
            get_http1(server.addr, anonymous, "/whoami").await,
            (200, "anonymous".to_string())
        );
    }

    #[tokio::test]
    async fn without_client_ca_no_certificate_is_requested() {
        let p = pki();
        let config = server_config(&p.server.cert_pem, &p.server.key_pem, None).unwrap();
        let server = start(config, app()).await;
        let alice = p.ca.issue_client("alice", &[]).unwrap();
        let with_cert = client_config(&p.ca, Some(&alice), b"http/1.1");
        assert_eq!(
            get_http1(server.addr, with_cert, "/whoami").await,
            (200, "anonymous".to_string())
        );
    }

    #[tokio::test]
    async fn shutdown_lets_in_flight_requests_finish() {
        let p = pki();
        let config = server_config(&p.server.cert_pem, &p.server.key_pem, None).unwrap();
        let started = Arc::new(tokio::sync::Notify::new());
        let release = Arc::new(tokio::sync::Notify::new());
        let (s, r) = (started.clone(), release.clone());
        let app = Router::new().route(
            "/slow",
            get(move || {
                let (s, r) = (s.clone(), r.clone());
                async move {
                    s.notify_one();
                    r.notified().await;
                    "done"
                }
            }),
        );
        let mut server = start(config, app).await;
        let client = client_config(&p.ca, None, b"http/1.1");
        let addr = server.addr;
        let in_flight = tokio::spawn(async move { get_http1(addr, client, "/slow").await });
        tokio::time::timeout(Duration::from_secs(5), started.notified())
            .await
            .unwrap();
        server.stop.take().unwrap().send(()).unwrap();
        release.notify_one();
        assert_eq!(in_flight.await.unwrap(), (200, "done".to_string()));
        tokio::time::timeout(Duration::from_secs(5), server.done)
            .await
            .unwrap()
            .unwrap();
        // The listener is closed.
        assert!(TcpStream::connect(addr).await.is_err());
    }

    /// Whether the server closed `io` within `wait` (EOF or an error).
    async fn closed_within<T: AsyncRead + Unpin>(io: &mut T, wait: Duration) -> bool {
        let mut buf = [0u8; 1024];
        loop {
            match tokio::time::timeout(wait, tokio::io::AsyncReadExt::read(io, &mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => continue,
                Err(_) => return false,
            }
        }
    }

    #[tokio::test]
    async fn connections_past_the_per_client_cap_are_closed() {
        let p = pki();
        let config = server_config(&p.server.cert_pem, &p.server.key_pem, None).unwrap();
        let options = ServeOptions {
            max_connections_per_client: 3,
            ..ServeOptions::default()
        };
        let server = start_with(config, app(), options).await;
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(TcpStream::connect(server.addr).await.unwrap());
        }
        let mut extra = TcpStream::connect(server.addr).await.unwrap();
        assert!(closed_within(&mut extra, Duration::from_secs(5)).await);
        assert!(!closed_within(&mut held[0], Duration::from_millis(200)).await);
        // One gone, one more may come.
        drop(held.pop());
        let client = client_config(&p.ca, None, b"http/1.1");
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let attempt = tokio::time::timeout(Duration::from_secs(2), async {
                let tls = connect(server.addr, client.clone()).await?;
                let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
                    .await
                    .map_err(std::io::Error::other)?;
                tokio::spawn(conn);
                let request = hyper::Request::get("/whoami")
                    .header("host", "localhost")
                    .body(http_body_util::Empty::<hyper::body::Bytes>::new())
                    .map_err(std::io::Error::other)?;
                sender
                    .send_request(request)
                    .await
                    .map_err(std::io::Error::other)
            })
            .await;
            if let Ok(Ok(response)) = attempt {
                assert_eq!(response.status(), 200);
                break;
            }
            assert!(std::time::Instant::now() < deadline, "no slot came free");
        }
    }

    #[tokio::test]
    async fn slow_headers_and_idle_connections_are_cut_off() {
        let p = pki();
        let config = server_config(&p.server.cert_pem, &p.server.key_pem, None).unwrap();
        let options = ServeOptions {
            header_read_timeout: Duration::from_millis(500),
            idle_timeout: Duration::from_millis(500),
            ..ServeOptions::default()
        };
        let server = start_with(config, app(), options).await;
        // Half a request line, then nothing.
        let mut slow = connect(server.addr, client_config(&p.ca, None, b"http/1.1"))
            .await
            .unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut slow, b"GET /whoami HTTP/1.1\r\nHost: x")
            .await
            .unwrap();
        assert!(closed_within(&mut slow, Duration::from_secs(5)).await);
        // An HTTP/2 connection that sends nothing after the handshake.
        let mut idle = connect(server.addr, client_config(&p.ca, None, b"h2"))
            .await
            .unwrap();
        assert!(closed_within(&mut idle, Duration::from_secs(5)).await);
    }

    #[tokio::test]
    async fn a_client_that_reads_nothing_is_disconnected() {
        let p = pki();
        let config = server_config(&p.server.cert_pem, &p.server.key_pem, None).unwrap();
        let options = ServeOptions {
            write_timeout: Duration::from_millis(500),
            ..ServeOptions::default()
        };
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, std::io::Error>>(1);
        let rx = Arc::new(tokio::sync::Mutex::new(Some(rx)));
        let app = Router::new().route(
            "/endless",
            get(move || {
                let rx = rx.clone();
                async move {
                    let rx = rx.lock().await.take().unwrap();
                    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
                        rx.recv().await.map(|item| (item, rx))
                    });
                    axum::body::Body::from_stream(stream)
                }
            }),
        );
        let server = start_with(config, app, options).await;
        let mut tls = connect(server.addr, client_config(&p.ca, None, b"http/1.1"))
            .await
            .unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut tls, b"GET /endless HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        // The server writes until the socket is full, then stalls; the
        // client never reads. The feeder ends once the server stops taking.
        let chunk = bytes::Bytes::from(vec![b'x'; 64 * 1024]);
        let feeder = tokio::spawn(async move { while tx.send(Ok(chunk.clone())).await.is_ok() {} });
        tokio::time::timeout(Duration::from_secs(20), feeder)
            .await
            .expect("the stalled response was dropped")
            .unwrap();
        drop(tls);
    }

    #[test]
    fn config_errors_name_the_input() {
        let p = pki();
        let e = server_config("nothing", &p.server.key_pem, None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "server certificate: no PEM CERTIFICATE block found"
        );
        let e = server_config(&p.server.cert_pem, "nothing", None).unwrap_err();
        assert!(e.to_string().starts_with("server key: "), "{e}");
        let e = server_config(&p.server.cert_pem, &p.server.key_pem, Some("x")).unwrap_err();
        assert_eq!(e.to_string(), "client CA: no PEM CERTIFICATE block found");
        // A key that does not match the certificate.
        let other = p.ca.issue_client("x", &[]).unwrap();
        assert!(server_config(&p.server.cert_pem, &other.key_pem, None).is_err());
    }
}
