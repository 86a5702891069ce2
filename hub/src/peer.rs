//! The hop between hub replicas: pod logs asked of a follower are streamed
//! from the leader, where the spokes' sessions are.
//!
//! At the start of each term the leader publishes, in the store (a key no
//! API resource serves, written with the term's fenced store), its API
//! address, its serving certificate and a fresh random token. A follower
//! that is asked for a pod's log (after authorizing the caller itself, as
//! for any request) calls the leader's [`PEER_LOGS_PATH`] with that token
//! as a bearer token, over TLS that accepts exactly the published
//! certificate, and streams the answer through. Whoever can read the store
//! can already do anything the hub does; nobody else learns the token.

use std::sync::{Arc, RwLock};

use axum::Router;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use bytes::Bytes;
use futures_util::StreamExt as _;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::watch;
use trainhub_apiserver::server::{ByteStream, LogSource};
use trainhub_apiserver::status::ApiError;
use trainhub_apiserver::store::{Key, Op, Store};

use crate::dispatch::Dispatch;

/// The store key of the leader's record (no API resource serves it).
pub fn leader_key() -> Key {
    Key::new("trainhub.kubeflow.org/internal-leader", None, "leader")
}

/// Where a leader serves pod logs to the other replicas.
pub const PEER_LOGS_PATH: &str = "/internal/trainhub/v1/podlogs";

/// The token of the term this replica leads, if it leads.
#[derive(Default)]
pub struct PeerToken(RwLock<Option<String>>);

impl PeerToken {
    fn get(&self) -> Option<String> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set(&self, token: Option<String>) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = token;
    }

    /// The term ended: the token is no longer accepted.
    pub fn revoke(&self) {
        self.set(None);
    }

    /// Publishes this leader's record with a fresh token (through the
    /// term's fenced store: a deposed leader cannot publish).
    ///
    /// # Errors
    ///
    /// The store refused the write, or no randomness was to be had.
    pub async fn publish(
        &self,
        store: &dyn Store,
        api: &str,
        cert_pem: &str,
    ) -> Result<(), String> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|e| format!("generating the peer token: {e}"))?;
        let token = hex::encode(bytes);
        self.set(Some(token.clone()));
        let value = json!({
            "api": api,
            "certificate": cert_pem,
            "token": token,
        });
        store
            .commit(vec![Op::Put {
                key: leader_key(),
                value,
            }])
            .await
            .map(|_| ())
            .map_err(|e| format!("publishing the leader's address: {e}"))
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LogQuery {
    namespace: String,
    pod: String,
    container: Option<String>,
    #[serde(default)]
    follow: bool,
    tail_lines: Option<i64>,
}

type PeerState = (
    watch::Receiver<Option<Arc<Dispatch>>>,
    Arc<PeerToken>,
    Arc<dyn Store>,
);

/// The leader's side: [`PEER_LOGS_PATH`] for the holders of the current
/// term's token (a public route: the token is the authentication).
pub fn routes(
    current: watch::Receiver<Option<Arc<Dispatch>>>,
    token: Arc<PeerToken>,
    store: Arc<dyn Store>,
) -> Router {
    Router::new().route(
        PEER_LOGS_PATH,
        get(
            |State((current, token, store)): State<PeerState>,
             headers: HeaderMap,
             Query(q): Query<LogQuery>| async move {
                let presented = headers
                    .get(header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("Bearer "));
                let expected = token.get();
                let admitted = match (presented, expected.as_deref()) {
                    (Some(p), Some(e)) => constant_time_eq(p.as_bytes(), e.as_bytes()),
                    _ => false,
                };
                if !admitted {
                    return ApiError::new(401, "Unauthorized", "Unauthorized").into_response();
                }
                let dispatch = current.borrow().clone();
                let Some(dispatch) = dispatch else {
                    return ApiError::unavailable("this replica no longer leads").into_response();
                };
                let key = Key::new(crate::api::PODS, Some(&q.namespace), &q.pod);
                let Some(pod) = store.get(&key) else {
                    return ApiError::new(404, "NotFound", format!("pods {:?} not found", q.pod))
                        .into_response();
                };
                match dispatch.open_logs(&pod.value, q.container.as_deref(), q.follow, q.tail_lines)
                {
                    Ok(stream) => (
                        [(header::CONTENT_TYPE, "text/plain")],
                        Body::from_stream(stream),
                    )
                        .into_response(),
                    Err(e) => e.into_response(),
                }
            },
        )
        .with_state((current, token, store)),
    )
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The pod log source of a replica: its own spoke sessions while it
/// leads, the leader's (through [`PEER_LOGS_PATH`]) while it follows.
pub struct ReplicaLogs {
    pub current: watch::Receiver<Option<Arc<Dispatch>>>,
    pub store: Arc<dyn Store>,
}

impl LogSource for ReplicaLogs {
    fn logs(
        &self,
        pod: &Value,
        container: Option<&str>,
        follow: bool,
        tail_lines: Option<i64>,
    ) -> trainhub_apiserver::server::LogsFuture {
        let leading = self.current.borrow().clone();
        if let Some(dispatch) = leading {
            let result = dispatch.open_logs(pod, container, follow, tail_lines);
            return Box::pin(async move { result });
        }
        let record = self.store.get(&leader_key()).map(|o| o.value.clone());
        let meta = &pod["metadata"];
        let mut path = format!(
            "{PEER_LOGS_PATH}?namespace={}&pod={}&follow={follow}",
            query_part(meta["namespace"].as_str().unwrap_or_default()),
            query_part(meta["name"].as_str().unwrap_or_default()),
        );
        if let Some(c) = container {
            path.push_str(&format!("&container={}", query_part(c)));
        }
        if let Some(n) = tail_lines {
            path.push_str(&format!("&tailLines={n}"));
        }
        Box::pin(async move {
            let record = record.ok_or_else(|| {
                ApiError::unavailable(
                    "pod logs are streamed by the leading hub replica, and none is known yet: retry",
                )
            })?;
            from_leader(&record, &path).await.map_err(|e| {
                tracing::warn!(error = %e, "streaming pod logs from the leader");
                ApiError::unavailable(format!(
                    "pod logs are streamed by the leading hub replica, which could not be reached: {e}"
                ))
            })
        })
    }
}

/// Names and namespaces are DNS labels; anything else is escaped.
fn query_part(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_' {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// GETs `path` from the leader of `record`, pinned to its certificate.
async fn from_leader(record: &Value, path: &str) -> Result<ByteStream, String> {
    use http_body_util::BodyExt as _;
    let api = record["api"].as_str().ok_or("no leader address")?;
    let token = record["token"].as_str().ok_or("no peer token")?;
    let cert_pem = record["certificate"]
        .as_str()
        .ok_or("no leader certificate")?;
    let pinned = trainhub_apiserver::tls::parse_certificates("the leader's certificate", cert_pem)
        .map_err(|e| e.to_string())?
        .into_iter()
        .next()
        .ok_or("no leader certificate")?;
    let provider = trainhub_apiserver::tls::crypto_provider();
    let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Pinned {
            der: pinned.as_ref().to_vec(),
            provider,
        }))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        tokio::net::TcpStream::connect(api),
    )
    .await
    .map_err(|_| format!("connecting to {api}: timed out"))?
    .map_err(|e| format!("connecting to {api}: {e}"))?;
    let name =
        rustls::pki_types::ServerName::try_from("trainhub-leader").map_err(|e| e.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS with {api}: {e}"))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| format!("HTTP with {api}: {e}"))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let request = hyper::Request::get(path)
        .header(header::HOST, api)
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .body(http_body_util::Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("asking {api}: {e}"))?;
    let status = response.status();
    if status != StatusCode::OK {
        let body = response
            .into_body()
            .collect()
            .await
            .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
            .unwrap_or_default();
        let message = serde_json::from_str::<Value>(&body)
            .ok()
            .and_then(|v| v["message"].as_str().map(String::from))
            .unwrap_or(body);
        return Err(format!("the leader answered {status}: {message}"));
    }
    let stream = http_body_util::BodyStream::new(response.into_body()).filter_map(|frame| async {
        match frame {
            Ok(frame) => frame.into_data().ok().map(Ok),
            Err(e) => Some(Err(std::io::Error::other(e))),
        }
    });
    Ok(Box::pin(stream))
}

/// Accepts exactly one certificate (the leader's, as it published it).
#[derive(Debug)]
struct Pinned {
    der: Vec<u8>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl rustls::client::danger::ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        if end_entity.as_ref() == self.der.as_slice() {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(
                "not the certificate the leader published".into(),
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_whole() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }

    #[test]
    fn query_values_are_escaped() {
        assert_eq!(query_part("job-node-0-0"), "job-node-0-0");
        assert_eq!(query_part("a b&c"), "a%20b%26c");
    }
}
