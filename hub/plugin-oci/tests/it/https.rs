//! Modules at `https://` URLs: served on loopback over TLS by a CA the
//! test makes, fetched only when trusted, capped, and checked against
//! their sha256.

use std::sync::Arc;

use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpListener;
use trainhub_plugin_oci::url::fetch_https;
use trainhub_plugin_oci::{Digest, Error, Limits, RegistryOptions};

struct Server {
    /// `https://localhost:PORT`
    base: String,
    ca_pem: Vec<u8>,
}

/// An HTTPS server for `localhost` whose certificate a fresh CA signed:
/// `/m.wasm` is `module`, `/busy` answers 503, anything else 404.
async fn serve(module: Vec<u8>) -> Server {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let module = Arc::new(module);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, module) = (acceptor.clone(), module.clone());
            tokio::spawn(async move {
                let Ok(mut stream) = acceptor.accept(tcp).await else {
                    return;
                };
                let Some(path) = crate::fake_registry::request_path(&mut stream).await else {
                    return;
                };
                let (status, body): (&str, &[u8]) = match path.as_str() {
                    "/m.wasm" => ("200 OK", &module),
                    "/busy" => ("503 Service Unavailable", b""),
                    _ => ("404 Not Found", b""),
                };
                let head = format!(
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(head.as_bytes()).await;
                let _ = stream.write_all(body).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    Server {
        base: format!("https://localhost:{port}"),
        ca_pem: cert_pem(&ca),
    }
}

fn cert_pem(cert: &rcgen::Certificate) -> Vec<u8> {
    cert.pem().into_bytes()
}

fn trusting(server: &Server) -> RegistryOptions {
    RegistryOptions {
        extra_root_certificates_pem: vec![server.ca_pem.clone()],
        ..RegistryOptions::default()
    }
}

#[tokio::test]
async fn a_module_at_an_https_url_is_fetched_when_its_sha256_matches() {
    let module = crate::component(300_000, 7);
    let digest = Digest::of(&module);
    let server = serve(module.clone()).await;
    let url = format!("{}/m.wasm", server.base);
    let bytes = fetch_https(&url, &digest, &trusting(&server))
        .await
        .unwrap();
    assert_eq!(bytes, module);

    // Another digest pinned: refused, both digests named.
    let other = Digest::of(b"another module");
    let e = fetch_https(&url, &other, &trusting(&server))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::DigestMismatch { .. }), "{e}");
    assert_eq!(e.reason(), "DigestMismatch");
    let text = e.to_string();
    assert!(
        text.contains(&other.to_string()) && text.contains(&digest.to_string()),
        "{text}"
    );

    // Larger than the limit: refused before it is read whole.
    let small = RegistryOptions {
        limits: Limits {
            max_module_bytes: 1024,
            ..Limits::default()
        },
        ..trusting(&server)
    };
    let e = fetch_https(&url, &digest, &small).await.unwrap_err();
    assert!(matches!(e, Error::TooLarge { limit: 1024, .. }), "{e}");
}

#[tokio::test]
async fn an_untrusted_server_plain_http_and_errors_are_refused_with_their_reason() {
    let module = crate::component(10, 1);
    let digest = Digest::of(&module);
    let server = serve(module).await;
    let url = format!("{}/m.wasm", server.base);

    // The server's CA not trusted: no bytes.
    let e = fetch_https(&url, &digest, &RegistryOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Unavailable { .. }), "{e}");
    assert!(e.to_string().to_lowercase().contains("certificate"), "{e}");

    // Plain HTTP and credentials in the URL: refused before any request.
    for bad in [
        url.replace("https://", "http://"),
        url.replace("https://", "https://user:pw@"),
    ] {
        let e = fetch_https(&bad, &digest, &trusting(&server))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::InvalidReference { .. }), "{bad}: {e}");
    }

    // Not there: NotFound (permanent); a server error: Unavailable
    // (transient, the last good version keeps serving).
    let e = fetch_https(
        &format!("{}/gone.wasm", server.base),
        &digest,
        &trusting(&server),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(e, Error::NotFound { .. }) && !e.is_transient(),
        "{e}"
    );
    let e = fetch_https(
        &format!("{}/busy", server.base),
        &digest,
        &trusting(&server),
    )
    .await
    .unwrap_err();
    assert!(e.is_transient(), "{e}");
}
