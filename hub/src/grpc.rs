//! The spokes' side door: a gRPC server over mutual TLS where each spoke
//! holds one bidirectional `Session` stream.
//!
//! A spoke is who its client certificate says: the Subject CN is its name,
//! and the certificate must carry the Subject O [`SPOKE_GROUP`] (so a
//! user's client certificate from the same CA cannot act as a spoke).
//! Nothing a spoke sends can claim another name.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::{TcpListenerStream, UnboundedReceiverStream};
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};
use trainhub_apiserver::auth::user_from_certificate;
use trainhub_proto as pb;

use crate::dispatch::Dispatch;

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
}

struct SpokeService {
    dispatch: Arc<Dispatch>,
    /// Set when the server shuts down: the open sessions end, so that the
    /// graceful shutdown does not wait for streams that never finish.
    stopping: tokio::sync::watch::Receiver<bool>,
}

type HubStream = Pin<Box<dyn Stream<Item = Result<pb::HubMessage, Status>> + Send>>;

#[tonic::async_trait]
impl pb::spoke_server::Spoke for SpokeService {
    type SessionStream = HubStream;

    async fn session(
        &self,
        request: Request<Streaming<pb::SpokeMessage>>,
    ) -> Result<Response<HubStream>, Status> {
        let name = spoke_name(&request)?;
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
        let (tx, rx) = mpsc::unbounded_channel();
        let id = self.dispatch.connect(&name, hello, tx);
        let dispatch = self.dispatch.clone();
        tokio::spawn(async move {
            loop {
                match inbound.message().await {
                    Ok(Some(pb::SpokeMessage {
                        message: Some(message),
                    })) => dispatch.on_message(&name, id, message).await,
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(status) => {
                        tracing::debug!(spoke = %name, %status, "session ended");
                        break;
                    }
                }
            }
            dispatch.disconnect(&name, id);
        });
        let mut stopping = self.stopping.clone();
        let stopped = async move {
            let _ = stopping.wait_for(|s| *s).await;
        };
        Ok(Response::new(Box::pin(
            UnboundedReceiverStream::new(rx).map(Ok).take_until(stopped),
        )))
    }
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

/// Serves the spokes' gRPC endpoint on `listener` until `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    tls: &GrpcTls,
    dispatch: Arc<Dispatch>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let addr: Option<SocketAddr> = listener.local_addr().ok();
    let tls_config = ServerTlsConfig::new()
        .identity(Identity::from_pem(&tls.cert_pem, &tls.key_pem))
        .client_ca_root(Certificate::from_pem(&tls.client_ca_pem));
    tracing::info!(addr = ?addr, "serving spokes (gRPC, mutual TLS)");
    let (stop_tx, stopping) = tokio::sync::watch::channel(false);
    let shutdown = async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    };
    Server::builder()
        .tls_config(tls_config)?
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .add_service(
            pb::spoke_server::SpokeServer::new(SpokeService { dispatch, stopping })
                .max_decoding_message_size(64 << 20),
        )
        .serve_with_incoming_shutdown(incoming(listener), shutdown)
        .await?;
    Ok(())
}

/// The listener's connections, with Nagle's algorithm off: the protocol is
/// small messages each side waits on (an offer, its answer, a start), and
/// Nagle would hold one back until the peer's delayed ACK, 40 ms later.
fn incoming(
    listener: tokio::net::TcpListener,
) -> impl Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    TcpListenerStream::new(listener).map(|accepted| {
        accepted.inspect(|tcp| {
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(error = %e, "TCP_NODELAY not set");
            }
        })
    })
}
