//! The spokes' listener under its caps, served for real on 127.0.0.1 with
//! mutual TLS: connections past a cap are closed while spokes within it
//! keep connecting; one live session per spoke; a spoke that starts
//! sessions too often is refused with a clear status.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio_stream::wrappers::UnboundedReceiverStream;
use trainhub::admission::TrainerAdmission;
use trainhub::dispatch::{Dispatch, DispatchConfig};
use trainhub::grpc::{GrpcLimits, GrpcTls, SPOKE_GROUP};
use trainhub::plugins::registry::Registry;
use trainhub_apiserver::pki::Ca;
use trainhub_apiserver::store::{RedbStore, Store};
use trainhub_proto as pb;

use crate::common;

struct Listener {
    _dir: tempfile::TempDir,
    ca: Ca,
    port: u16,
    dispatch: Arc<Dispatch>,
}

async fn serve(limits: GrpcLimits) -> Listener {
    let dir = tempfile::tempdir().expect("temp dir");
    let store: Arc<dyn Store> =
        Arc::new(RedbStore::open(&dir.path().join("store.redb"), 1000).expect("store"));
    let host = common::host();
    let builtins = trainhub::builtin::load(&host).expect("built-in plugins");
    let plugins = Arc::new(Registry::new(host, builtins, None));
    let admission =
        Arc::new(TrainerAdmission::new(store.clone(), plugins.clone()).expect("schemas"));
    let dispatch = Dispatch::new(store, admission, plugins, DispatchConfig::default());
    tokio::spawn(dispatch.clone().run(std::future::pending()));
    let ca = Ca::generate("caps-ca").expect("ca");
    let server = ca
        .issue_server("hub", &["localhost"], &[IpAddr::V4(Ipv4Addr::LOCALHOST)])
        .expect("server cert");
    let tls = GrpcTls {
        cert_pem: server.cert_pem,
        key_pem: server.key_pem,
        client_ca_pem: ca.cert_pem().to_string(),
        reloading: None,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let d = dispatch.clone();
    tokio::spawn(async move {
        trainhub::grpc::serve_with(listener, &tls, limits, d, std::future::pending())
            .await
            .expect("serving");
    });
    Listener {
        _dir: dir,
        ca,
        port,
        dispatch,
    }
}

/// A session of spoke `name` (hello sent), or why not.
async fn session(
    l: &Listener,
    name: &str,
) -> Result<
    (
        tokio::sync::mpsc::UnboundedSender<pb::SpokeMessage>,
        tonic::Streaming<pb::HubMessage>,
    ),
    String,
> {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
    let issued = l.ca.issue_client(name, &[SPOKE_GROUP]).expect("cert");
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(l.ca.cert_pem()))
        .identity(Identity::from_pem(&issued.cert_pem, &issued.key_pem));
    let channel = Endpoint::from_shared(format!("https://127.0.0.1:{}", l.port))
        .expect("url")
        .tls_config(tls)
        .expect("tls")
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tx.send(pb::SpokeMessage {
        message: Some(pb::spoke_message::Message::Hello(pb::Hello {
            backend: "test".into(),
            fence_after_ms: 60_000,
            ..Default::default()
        })),
    })
    .expect("queued");
    let mut client = pb::spoke_client::SpokeClient::new(channel);
    let inbound = tokio::time::timeout(
        Duration::from_secs(10),
        client.session(UnboundedReceiverStream::new(rx)),
    )
    .await
    .map_err(|_| "no answer within 10s".to_string())?
    .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?
    .into_inner();
    Ok((tx, inbound))
}

/// Waits until the dispatcher counts `n` connected spokes.
async fn connected(l: &Listener, n: usize) {
    tokio::time::timeout(Duration::from_secs(10), async {
        while l.dispatch.stats().0 != n {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{} spokes connected, not {n}", l.dispatch.stats().0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_per_identity_cap_are_closed_and_others_still_connect() {
    let l = serve(GrpcLimits {
        max_connections_per_identity: 1,
        ..GrpcLimits::default()
    })
    .await;
    let _first = session(&l, "s1").await.expect("s1's first connection");
    connected(&l, 1).await;
    let refused = session(&l, "s1")
        .await
        .expect_err("a second connection of s1");
    assert!(!refused.is_empty());
    let _other = session(&l, "s2").await.expect("s2 connects");
    connected(&l, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_handshakes_hold_slots_only_until_their_timeout() {
    let l = serve(GrpcLimits {
        max_handshakes: 4,
        max_handshakes_per_ip: 4,
        handshake_timeout: Duration::from_secs(2),
        ..GrpcLimits::default()
    })
    .await;
    // Four clients that connect and never say ClientHello.
    let mut stalled = Vec::new();
    for _ in 0..4 {
        stalled.push(
            TcpStream::connect(("127.0.0.1", l.port))
                .await
                .expect("tcp"),
        );
    }
    // Connections are accepted in order: this one finds the four slots
    // taken.
    let refused = session(&l, "s1").await;
    assert!(refused.is_err(), "a handshake past the cap was taken");
    // Their slots free at the timeout; the spoke then connects.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match session(&l, "s1").await {
            Ok(_) => break,
            Err(e) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "never connected: {e}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    drop(stalled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_live_session_per_spoke_and_flapping_is_refused() {
    let l = serve(GrpcLimits {
        sessions_per_minute: 3,
        ..GrpcLimits::default()
    })
    .await;
    let (_tx1, mut in1) = session(&l, "s1").await.expect("session 1");
    let (_tx2, _in2) = session(&l, "s1").await.expect("session 2");
    let status = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match in1.message().await {
                Ok(Some(_)) => {}
                Ok(None) => panic!("session 1 ended without a status"),
                Err(status) => return status,
            }
        }
    })
    .await
    .expect("session 1 closed within 10s");
    assert_eq!(status.code(), tonic::Code::Aborted, "{status:?}");
    assert!(
        status.message().contains("replaced by a newer session"),
        "{status:?}"
    );
    connected(&l, 1).await;
    let _third = session(&l, "s1").await.expect("session 3");
    let refused = session(&l, "s1")
        .await
        .expect_err("a fourth start in a minute");
    assert!(
        refused.contains("ResourceExhausted") && refused.contains("sessions in a minute"),
        "{refused}"
    );
    // Another spoke is not held back.
    let _other = session(&l, "s2").await.expect("s2 connects");
}
