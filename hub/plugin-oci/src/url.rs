//! Modules served at an `https://` URL and pinned by their sha256 (Envoy's
//! remote wasm source): fetched with the registry client's TLS roots and
//! timeouts, the body capped, the bytes checked against the digest before
//! anyone compiles them.

use crate::digest::Digest;
use crate::error::{Error, Object};
use crate::registry::{RegistryOptions, chain};

/// The bytes at `url`, which must hash to `expected`.
///
/// Only `https://` is fetched, and a redirect may not leave HTTPS. A body
/// longer than `options.limits.max_module_bytes` is refused without being
/// read whole.
///
/// # Errors
///
/// [`Error::InvalidReference`] for a URL that is not `https://`,
/// [`Error::Unavailable`] when the server cannot be reached or answers with
/// a server error (transient: keep the last good version),
/// [`Error::NotFound`] for 404, [`Error::Unauthorized`] for 401/403,
/// [`Error::TooLarge`], [`Error::DigestMismatch`].
pub async fn fetch_https(
    url: &str,
    expected: &Digest,
    options: &RegistryOptions,
) -> Result<Vec<u8>, Error> {
    let invalid = |reason: &str| Error::InvalidReference {
        reference: url.to_string(),
        reason: reason.to_string(),
    };
    let parsed = reqwest::Url::parse(url).map_err(|e| invalid(&e.to_string()))?;
    if parsed.scheme() != "https" {
        return Err(invalid("only https:// URLs are fetched"));
    }
    let host = parsed.host_str().unwrap_or_default().to_string();
    if host.is_empty() {
        return Err(invalid("no host"));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(invalid(
            "credentials in the URL would be stored in the object; use the hub's registry credentials",
        ));
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut builder = reqwest::Client::builder()
        .https_only(true)
        .connect_timeout(options.connect_timeout)
        .read_timeout(options.read_timeout)
        .user_agent(concat!("trainhub/", env!("CARGO_PKG_VERSION")));
    for pem in &options.extra_root_certificates_pem {
        let certificates = reqwest::Certificate::from_pem_bundle(pem)
            .map_err(|e| Error::Client(format!("a CA certificate: {}", chain(&e))))?;
        for certificate in certificates {
            builder = builder.add_root_certificate(certificate);
        }
    }
    let client = builder.build().map_err(|e| Error::Client(chain(&e)))?;
    let unavailable = |detail: String| Error::Unavailable {
        registry: host.clone(),
        detail,
    };
    let response = client
        .get(parsed.clone())
        .send()
        .await
        .map_err(|e| unavailable(chain(&e)))?;
    let status = response.status().as_u16();
    match status {
        200 => {}
        404 => {
            return Err(Error::NotFound {
                reference: url.to_string(),
            });
        }
        401 | 403 => {
            return Err(Error::Unauthorized {
                registry: host,
                detail: format!("HTTP {status}"),
            });
        }
        500.. => return Err(unavailable(format!("HTTP {status}"))),
        _ => {
            return Err(Error::Registry {
                reference: url.to_string(),
                detail: format!("HTTP {status}"),
            });
        }
    }
    let limit = options.limits.max_module_bytes;
    let too_large = |size: u64| Error::TooLarge {
        reference: url.to_string(),
        object: Object::Module,
        limit,
        size,
    };
    if let Some(length) = response.content_length()
        && length > limit
    {
        return Err(too_large(length));
    }
    let mut response = response;
    let mut bytes = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| unavailable(chain(&e)))? {
        if (bytes.len() + chunk.len()) as u64 > limit {
            return Err(too_large((bytes.len() + chunk.len()) as u64));
        }
        bytes.extend_from_slice(&chunk);
    }
    let actual = Digest::of(&bytes);
    if actual != *expected {
        return Err(Error::DigestMismatch {
            reference: url.to_string(),
            object: Object::Module,
            expected: *expected,
            actual,
        });
    }
    Ok(bytes)
}
