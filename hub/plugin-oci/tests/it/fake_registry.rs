//! Registries that misbehave, served by a few lines of HTTP on loopback:
//! an endless manifest, a token that is not a valid header.

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;
use trainhub_plugin_oci::{Digest, Error, Object};

use crate::{client, module_ref};

/// The path of the HTTP request `stream` starts with (its head read
/// whole); `None` when the client goes away first.
pub async fn request_path<S: tokio::io::AsyncRead + Unpin>(stream: &mut S) -> Option<String> {
    let mut request = Vec::new();
    let mut buf = [0u8; 4096];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => request.extend_from_slice(&buf[..n]),
        }
    }
    let head = String::from_utf8_lossy(&request);
    Some(head.split(' ').nth(1).unwrap_or("/").to_string())
}

/// Serves every connection with `answer(path)`, for the test's lifetime.
async fn serve(answer: fn(&str, u16) -> Vec<Vec<u8>>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Some(path) = request_path(&mut stream).await else {
                    return;
                };
                for part in answer(&path, port) {
                    if stream.write_all(&part).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    format!("127.0.0.1:{port}")
}

const CHUNKS: usize = 10_000;

/// `/v2/` answers 200; a manifest answers 10,000 chunks of 1 KiB, chunked
/// (no length announced).
fn endless_manifest(path: &str, _port: u16) -> Vec<Vec<u8>> {
    if path == "/v2/" {
        return vec![b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_vec()];
    }
    let mut parts = vec![
        b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.oci.image.manifest.v1+json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n".to_vec(),
    ];
    let chunk = [b' '; 1024];
    for _ in 0..CHUNKS {
        let mut part = format!("{:x}\r\n", chunk.len()).into_bytes();
        part.extend_from_slice(&chunk);
        part.extend_from_slice(b"\r\n");
        parts.push(part);
    }
    parts.push(b"0\r\n\r\n".to_vec());
    parts
}

#[tokio::test]
async fn an_endless_manifest_is_cut_at_the_limit() {
    let address = serve(endless_manifest).await;
    let reference = module_ref(&address, &format!("p/m@{}", Digest::of(b"m")));
    let e = client().pull(&reference).await.unwrap_err();
    match e {
        Error::TooLarge {
            object: Object::Manifest,
            limit,
            size,
            ..
        } => assert_eq!(size, limit + 1, "read one byte past the limit, no more"),
        other => panic!("expected TooLarge, got {other}"),
    }
}

/// A bearer challenge whose token service answers a token with a newline.
fn bad_token(path: &str, port: u16) -> Vec<Vec<u8>> {
    if path.starts_with("/token") {
        let body = br#"{"token": "abc\ndef"}"#;
        return vec![
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            )
            .into_bytes(),
            body.to_vec(),
        ];
    }
    vec![format!(
        "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer realm=\"http://127.0.0.1:{port}/token\",service=\"fake\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .into_bytes()]
}

#[tokio::test]
async fn a_token_that_is_not_a_header_is_an_error_not_a_crash() {
    let address = serve(bad_token).await;
    let reference = module_ref(&address, &format!("p/m@{}", Digest::of(b"m")));
    let e = client().pull(&reference).await.unwrap_err();
    assert!(matches!(e, Error::Unauthorized { .. }), "{e}");
    // So does a push (whose requests oci-client makes).
    let e = client()
        .push(
            &module_ref(&address, "p/m:1"),
            &crate::component(10, 1),
            crate::CREATED,
            &crate::no_annotations(),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Unauthorized { .. }), "{e}");
}
