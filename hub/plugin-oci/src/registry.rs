//! Talking to a registry: pull a module by digest, push one, read and write
//! cosign signatures. Every byte received is bounded by [`Limits`] and
//! checked against the digest that names it before it is returned.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures_util::{FutureExt as _, StreamExt as _};
use oci_client::RegistryOperation;
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::secrets::RegistryAuth;

use crate::artifact::{
    DOCKER_LIST_MEDIA_TYPE, DOCKER_MANIFEST_MEDIA_TYPE, Descriptor, Manifest, OCI_INDEX_MEDIA_TYPE,
    OCI_MANIFEST_MEDIA_TYPE, WASM_CONFIG_MEDIA_TYPE, WASM_LAYER_MEDIA_TYPE, WasmConfig,
};
use crate::cosign::{
    CosignSignature, SIGNATURE_ANNOTATION, SIGNATURE_CONFIG_MEDIA_TYPE, SIMPLE_SIGNING_MEDIA_TYPE,
    signature_tag,
};
use crate::digest::{Digest, Hasher};
use crate::error::{Error, Object};
use crate::reference::ModuleRef;

/// Caps on what a registry may send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// A manifest (module or signatures). Default 256 KiB.
    pub max_manifest_bytes: u64,
    /// The wasm layer. Default 64 MiB.
    pub max_module_bytes: u64,
    /// Signatures read from one signature manifest. Default 64.
    pub max_signatures: usize,
    /// One signature payload. Default 64 KiB.
    pub max_signature_payload_bytes: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_manifest_bytes: 256 * 1024,
            max_module_bytes: 64 * 1024 * 1024,
            max_signatures: 64,
            max_signature_payload_bytes: 64 * 1024,
        }
    }
}

/// Registry credentials, given by the caller (a Secret, the hub's config,
/// a flag).
#[derive(Clone, Default, PartialEq, Eq)]
pub enum Credentials {
    #[default]
    Anonymous,
    /// HTTP basic, or exchanged for a bearer token when the registry asks.
    Basic { username: String, password: String },
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credentials::Anonymous => f.write_str("Anonymous"),
            Credentials::Basic { username, .. } => write!(f, "Basic({username:?}, <redacted>)"),
        }
    }
}

/// When plain HTTP (no TLS) may be used.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum PlainHttp {
    /// Always HTTPS.
    #[default]
    Never,
    /// Plain HTTP to registries on a loopback host (`localhost`,
    /// `127.0.0.0/8`, `::1`); HTTPS to the others.
    Loopback,
    /// Plain HTTP to exactly these registries (`host:port` as written in
    /// references); HTTPS to the others.
    Registries(Vec<String>),
}

impl PlainHttp {
    fn allows(&self, reference: &ModuleRef) -> bool {
        match self {
            PlainHttp::Never => false,
            PlainHttp::Loopback => {
                let host = reference.host();
                host.eq_ignore_ascii_case("localhost")
                    || host
                        .parse::<std::net::IpAddr>()
                        .is_ok_and(|ip| ip.is_loopback())
            }
            PlainHttp::Registries(list) => list.contains(&reference.registry),
        }
    }
}

/// How to reach registries.
#[derive(Clone, Debug)]
pub struct RegistryOptions {
    pub credentials: Credentials,
    pub plain_http: PlainHttp,
    /// PEM certificates trusted besides the system's roots (a private
    /// registry's CA).
    pub extra_root_certificates_pem: Vec<Vec<u8>>,
    pub limits: Limits,
    /// Default 10 s.
    pub connect_timeout: Duration,
    /// The longest wait for bytes on an open connection. Default 30 s.
    pub read_timeout: Duration,
}

impl Default for RegistryOptions {
    fn default() -> RegistryOptions {
        RegistryOptions {
            credentials: Credentials::Anonymous,
            plain_http: PlainHttp::Never,
            extra_root_certificates_pem: Vec::new(),
            limits: Limits::default(),
            connect_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(30),
        }
    }
}

/// A module pulled and verified: `bytes` hash to `module_digest`, which the
/// manifest `manifest_digest` names.
#[derive(Clone)]
pub struct PulledModule {
    pub reference: ModuleRef,
    pub manifest_digest: Digest,
    /// The sha256 of the component's bytes: what a plugin's `spec.sha256`
    /// and the compile cache use.
    pub module_digest: Digest,
    pub media_type: String,
    pub bytes: Vec<u8>,
}

impl fmt::Debug for PulledModule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PulledModule")
            .field("reference", &self.reference)
            .field("manifest_digest", &self.manifest_digest)
            .field("module_digest", &self.module_digest)
            .field("media_type", &self.media_type)
            .field("len", &self.bytes.len())
            .finish()
    }
}

/// A module pushed: its reference pinned to the new manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PushedModule {
    pub reference: ModuleRef,
    pub manifest_digest: Digest,
    pub module_digest: Digest,
}

/// A registry client. Cheap to create; holds no connection between calls.
#[derive(Clone, Debug)]
pub struct RegistryClient {
    options: RegistryOptions,
}

impl RegistryClient {
    /// A client with `options`.
    ///
    /// oci-client's HTTP stack takes rustls' process-wide default crypto
    /// provider; this installs ring's as that default when none is set
    /// (the workspace uses ring only).
    pub fn new(options: RegistryOptions) -> RegistryClient {
        // Err means a provider is installed already, which is what we need.
        let _ = rustls::crypto::ring::default_provider().install_default();
        RegistryClient { options }
    }

    pub fn options(&self) -> &RegistryOptions {
        &self.options
    }

    fn oci(&self, reference: &ModuleRef) -> Result<oci_client::Client, Error> {
        use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
        let protocol = if self.options.plain_http.allows(reference) {
            ClientProtocol::HttpsExcept(vec![reference.registry.clone()])
        } else {
            ClientProtocol::Https
        };
        let config = ClientConfig {
            protocol,
            // A module is one artifact: an index is refused, never resolved
            // by platform.
            platform_resolver: None,
            extra_root_certificates: self
                .options
                .extra_root_certificates_pem
                .iter()
                .map(|pem| Certificate {
                    encoding: CertificateEncoding::Pem,
                    data: pem.clone(),
                })
                .collect(),
            connect_timeout: Some(self.options.connect_timeout),
            read_timeout: Some(self.options.read_timeout),
            max_concurrent_upload: 1,
            max_concurrent_download: 1,
            ..ClientConfig::default()
        };
        oci_client::Client::try_from(config).map_err(|e| Error::Client(chain(&e)))
    }

    /// The HTTP client for manifest reads (oci-client reads a manifest
    /// answer whole; this one stops at the limit). Same TLS roots and
    /// timeouts as oci-client's; no redirect to plain HTTP unless
    /// `reference`'s registry may be spoken to in plain HTTP.
    fn http(&self, reference: &ModuleRef) -> Result<reqwest::Client, Error> {
        let mut builder = reqwest::Client::builder()
            .https_only(!self.options.plain_http.allows(reference))
            .connect_timeout(self.options.connect_timeout)
            .read_timeout(self.options.read_timeout)
            .user_agent(concat!("trainhub/", env!("CARGO_PKG_VERSION")));
        for pem in &self.options.extra_root_certificates_pem {
            let certificates = reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| Error::Client(format!("a registry CA certificate: {}", chain(&e))))?;
            for certificate in certificates {
                builder = builder.add_root_certificate(certificate);
            }
        }
        builder.build().map_err(|e| Error::Client(chain(&e)))
    }

    fn scheme(&self, reference: &ModuleRef) -> &'static str {
        if self.options.plain_http.allows(reference) {
            "http"
        } else {
            "https"
        }
    }

    fn auth(&self) -> RegistryAuth {
        match &self.options.credentials {
            Credentials::Anonymous => RegistryAuth::Anonymous,
            Credentials::Basic { username, password } => {
                RegistryAuth::Basic(username.clone(), password.clone())
            }
        }
    }

    /// Pins a tag: the digest of the manifest the tag names now. Whether a
    /// tag may be used at all is the caller's decision.
    ///
    /// # Errors
    /// [`Error::NotFound`], [`Error::Unavailable`], [`Error::TooLarge`], …
    pub async fn resolve(&self, reference: &ModuleRef) -> Result<ModuleRef, Error> {
        if reference.digest.is_some() {
            return Ok(reference.clone());
        }
        let oci = self.oci(reference)?;
        let bytes = self.manifest(&oci, reference).await?;
        Ok(reference.pinned(Digest::of(&bytes)))
    }

    /// Pulls the module `reference` pins: its manifest (checked against the
    /// digest), then the one wasm layer (checked against the manifest's
    /// descriptor: size, then sha256).
    ///
    /// # Errors
    /// [`Error::NotPinned`] without a digest; [`Error::DigestMismatch`] or
    /// [`Error::SizeMismatch`] for altered content; [`Error::NotAModule`],
    /// [`Error::TooLarge`], [`Error::NotFound`], [`Error::Unavailable`], …
    pub async fn pull(&self, reference: &ModuleRef) -> Result<PulledModule, Error> {
        let manifest_digest = reference.digest.ok_or_else(|| Error::NotPinned {
            reference: reference.to_string(),
        })?;
        let oci = self.oci(reference)?;
        let bytes = self.manifest(&oci, reference).await?;
        let name = reference.to_string();
        let manifest = Manifest::parse(&name, &bytes)?;
        let (layer, module_digest) = manifest.wasm_layer(&name)?;
        if layer.size > self.options.limits.max_module_bytes {
            return Err(Error::TooLarge {
                reference: name,
                object: Object::Layer,
                limit: self.options.limits.max_module_bytes,
                size: layer.size,
            });
        }
        let bytes = self
            .blob(&oci, reference, &module_digest, layer.size, Object::Layer)
            .await?;
        Ok(PulledModule {
            reference: reference.clone(),
            manifest_digest,
            module_digest,
            media_type: layer.media_type.clone(),
            bytes,
        })
    }

    /// Pushes `module` (a component or core module) to `target`'s tag in the
    /// CNCF wasm artifact layout: an OCI manifest with the config
    /// [`WASM_CONFIG_MEDIA_TYPE`] and one [`WASM_LAYER_MEDIA_TYPE`] layer.
    /// `created` (RFC 3339) goes into the config; the same module, time and
    /// annotations give the same manifest digest.
    ///
    /// # Guarantees
    /// Idempotent: pushing again uploads nothing new and moves the tag to
    /// the same digest.
    ///
    /// # Errors
    /// [`Error::InvalidReference`] without a tag, [`Error::NotAModule`] for
    /// bytes that are not wasm, registry errors.
    pub async fn push(
        &self,
        target: &ModuleRef,
        module: &[u8],
        created: &str,
        annotations: &BTreeMap<String, String>,
    ) -> Result<PushedModule, Error> {
        let Some(tag) = &target.tag else {
            return Err(Error::InvalidReference {
                reference: target.to_string(),
                reason: "a push needs a tag to push to".into(),
            });
        };
        let target = target.at_tag(tag);
        let config = WasmConfig::for_module(module, created)?.to_bytes();
        let layer = Descriptor::of(WASM_LAYER_MEDIA_TYPE, module);
        let mut manifest =
            Manifest::image(Descriptor::of(WASM_CONFIG_MEDIA_TYPE, &config), vec![layer]);
        if !annotations.is_empty() {
            manifest.annotations = Some(annotations.clone());
        }
        let oci = self.oci(&target)?;
        self.authorize(&oci, &target, RegistryOperation::Push)
            .await?;
        self.upload(&oci, &target, module).await?;
        self.upload(&oci, &target, &config).await?;
        let manifest_digest = self.put_manifest(&oci, &target, &manifest).await?;
        Ok(PushedModule {
            reference: target.pinned(manifest_digest),
            manifest_digest,
            module_digest: Digest::of(module),
        })
    }

    /// The cosign signatures stored for the manifest `reference` pins, at
    /// the tag `sha256-<hex>.sig` of its repository; none when that tag does
    /// not exist. Layers of other media types are skipped; signatures are
    /// returned unverified (see [`crate::CompiledPolicy::evaluate_cosign`]).
    ///
    /// # Errors
    /// [`Error::NotPinned`]; [`Error::InvalidSignature`] for a layer without
    /// its signature annotation; size and digest errors; registry errors.
    pub async fn signatures(&self, reference: &ModuleRef) -> Result<Vec<CosignSignature>, Error> {
        let digest = reference.digest.ok_or_else(|| Error::NotPinned {
            reference: reference.to_string(),
        })?;
        let sig_ref = reference.at_tag(&signature_tag(&digest));
        let oci = self.oci(&sig_ref)?;
        let Some(manifest) = self.signature_manifest(&oci, &sig_ref).await? else {
            return Ok(Vec::new());
        };
        let limits = &self.options.limits;
        let mut out = Vec::new();
        for layer in manifest
            .layers
            .iter()
            .filter(|l| l.media_type == SIMPLE_SIGNING_MEDIA_TYPE)
        {
            if out.len() == limits.max_signatures {
                return Err(Error::TooLarge {
                    reference: sig_ref.to_string(),
                    object: Object::Signature,
                    limit: limits.max_signatures as u64,
                    size: manifest.layers.len() as u64,
                });
            }
            let Some(b64) = layer
                .annotations
                .as_ref()
                .and_then(|a| a.get(SIGNATURE_ANNOTATION))
            else {
                return Err(Error::InvalidSignature(format!(
                    "{sig_ref}: layer {} has no {SIGNATURE_ANNOTATION} annotation",
                    layer.digest
                )));
            };
            if layer.size > limits.max_signature_payload_bytes {
                return Err(Error::TooLarge {
                    reference: sig_ref.to_string(),
                    object: Object::Signature,
                    limit: limits.max_signature_payload_bytes,
                    size: layer.size,
                });
            }
            let payload_digest = Digest::parse(&layer.digest, false)
                .map_err(|e| Error::InvalidSignature(format!("{sig_ref}: {e}")))?;
            let payload = self
                .blob(
                    &oci,
                    &sig_ref,
                    &payload_digest,
                    layer.size,
                    Object::Signature,
                )
                .await?;
            out.push(CosignSignature::from_layer(payload, b64)?);
        }
        Ok(out)
    }

    /// Stores `signature` as cosign does: appended as one layer to the
    /// signature manifest at `sha256-<hex>.sig`, keeping the signatures
    /// already there. Returns the signature manifest's new digest.
    ///
    /// # Guarantees
    /// Idempotent: a signature already stored (same payload and signature)
    /// is not added twice.
    ///
    /// # Errors
    /// [`Error::NotPinned`]; registry errors.
    pub async fn push_signature(
        &self,
        reference: &ModuleRef,
        signature: &CosignSignature,
    ) -> Result<Digest, Error> {
        let digest = reference.digest.ok_or_else(|| Error::NotPinned {
            reference: reference.to_string(),
        })?;
        let sig_ref = reference.at_tag(&signature_tag(&digest));
        let oci = self.oci(&sig_ref)?;
        self.authorize(&oci, &sig_ref, RegistryOperation::Push)
            .await?;
        let mut layers = match self.signature_manifest(&oci, &sig_ref).await? {
            Some(existing) => existing.layers,
            None => Vec::new(),
        };
        let mut layer = Descriptor::of(SIMPLE_SIGNING_MEDIA_TYPE, &signature.payload);
        layer.annotations = Some(BTreeMap::from([(
            SIGNATURE_ANNOTATION.to_string(),
            signature.signature_b64(),
        )]));
        if !layers.contains(&layer) {
            self.upload(&oci, &sig_ref, &signature.payload).await?;
            layers.push(layer);
        }
        // The config go-containerregistry gives cosign's signature images:
        // the payloads as the rootfs' diff ids.
        let config = serde_json::json!({
            "architecture": "",
            "created": "0001-01-01T00:00:00Z",
            "history": [{"created": "0001-01-01T00:00:00Z"}],
            "os": "",
            "rootfs": {
                "type": "layers",
                "diff_ids": layers.iter().map(|l| l.digest.clone()).collect::<Vec<_>>(),
            },
            "config": {},
        });
        let config = serde_json::to_vec(&config).unwrap_or_default();
        self.upload(&oci, &sig_ref, &config).await?;
        let manifest =
            Manifest::image(Descriptor::of(SIGNATURE_CONFIG_MEDIA_TYPE, &config), layers);
        self.put_manifest(&oci, &sig_ref, &manifest).await
    }

    /// The signature manifest at `sig_ref`, or `None` when the tag does not
    /// exist.
    async fn signature_manifest(
        &self,
        oci: &oci_client::Client,
        sig_ref: &ModuleRef,
    ) -> Result<Option<Manifest>, Error> {
        match self.manifest(oci, sig_ref).await {
            Ok(bytes) => Manifest::parse(&sig_ref.to_string(), &bytes)
                .map(Some)
                .map_err(|e| Error::InvalidSignature(e.to_string())),
            Err(Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The `Authorization` header of a bearer token, when the registry asks
    /// for one (oci-client caches the token for the requests that follow).
    /// A token that is not a valid header value is refused here: oci-client
    /// assumes it is one and panics on it otherwise.
    async fn authorize(
        &self,
        oci: &oci_client::Client,
        reference: &ModuleRef,
        operation: RegistryOperation,
    ) -> Result<Option<http::HeaderValue>, Error> {
        let image = reference.to_oci();
        let token = guarded(
            reference,
            Object::Manifest,
            oci.auth(&image, &self.auth(), operation),
        )
        .await?;
        token
            .map(|token| {
                http::HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                    Error::Unauthorized {
                        registry: reference.registry.clone(),
                        detail:
                            "the token service answered a token that is not a valid header value"
                                .into(),
                    }
                })
            })
            .transpose()
    }

    /// The manifest bytes `reference` names, read up to
    /// `max_manifest_bytes` and no further, checked against its digest when
    /// pinned.
    async fn manifest(
        &self,
        oci: &oci_client::Client,
        reference: &ModuleRef,
    ) -> Result<Vec<u8>, Error> {
        let image = reference.to_oci();
        let token = self
            .authorize(oci, reference, RegistryOperation::Pull)
            .await?;
        let target = match (&reference.digest, &reference.tag) {
            (Some(digest), _) => digest.to_string(),
            (None, Some(tag)) => tag.clone(),
            (None, None) => "latest".into(),
        };
        let url = format!(
            "{}://{}/v2/{}/manifests/{target}",
            self.scheme(reference),
            image.resolve_registry(),
            image.repository(),
        );
        let mut request = self.http(reference)?.get(&url).header(
            http::header::ACCEPT,
            [
                OCI_MANIFEST_MEDIA_TYPE,
                DOCKER_MANIFEST_MEDIA_TYPE,
                OCI_INDEX_MEDIA_TYPE,
                DOCKER_LIST_MEDIA_TYPE,
            ]
            .join(", "),
        );
        if let Some(value) = token {
            request = request.header(http::header::AUTHORIZATION, value);
        } else if let Credentials::Basic { username, password } = &self.options.credentials {
            request = request.basic_auth(username, Some(password));
        }
        let response = request
            .send()
            .await
            .map_err(|e| request_error(&e, reference))?;
        let status = response.status();
        let limit = self.options.limits.max_manifest_bytes;
        if !status.is_success() {
            let body = read_capped(response, 4096, reference)
                .await
                .unwrap_or_default();
            let detail = format!(
                "GET {url}: HTTP {status}: {}",
                String::from_utf8_lossy(&body).trim()
            );
            return Err(match status.as_u16() {
                404 => Error::NotFound {
                    reference: reference.to_string(),
                },
                401 | 403 => Error::Unauthorized {
                    registry: reference.registry.clone(),
                    detail,
                },
                500.. => Error::Unavailable {
                    registry: reference.registry.clone(),
                    detail,
                },
                _ => Error::Registry {
                    reference: reference.to_string(),
                    detail,
                },
            });
        }
        let too_large = |size: u64| Error::TooLarge {
            reference: reference.to_string(),
            object: Object::Manifest,
            limit,
            size,
        };
        if let Some(length) = response.content_length().filter(|l| *l > limit) {
            return Err(too_large(length));
        }
        let bytes = read_capped(response, limit, reference).await?;
        if bytes.len() as u64 > limit {
            return Err(too_large(bytes.len() as u64));
        }
        if let Some(expected) = reference.digest {
            let actual = Digest::of(&bytes);
            if actual != expected {
                return Err(Error::DigestMismatch {
                    reference: reference.to_string(),
                    object: Object::Manifest,
                    expected,
                    actual,
                });
            }
        }
        Ok(bytes)
    }

    /// A blob of `size` bytes named `digest`, read in chunks: more bytes
    /// than `size` stop the read; the sha256 of what arrived must be
    /// `digest`.
    async fn blob(
        &self,
        oci: &oci_client::Client,
        reference: &ModuleRef,
        digest: &Digest,
        size: u64,
        object: Object,
    ) -> Result<Vec<u8>, Error> {
        let name = digest.to_string();
        // A digest alone: the descriptor's `urls` (foreign locations) are
        // never followed.
        let image = reference.to_oci();
        let mut stream = guarded(
            reference,
            object,
            oci.pull_blob_stream(&image, name.as_str()),
        )
        .await?;
        let capacity = usize::try_from(size.min(1 << 20)).unwrap_or(1 << 20);
        let mut bytes = Vec::with_capacity(capacity);
        let mut hasher = Hasher::new();
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(chunk) => {
                    let total = bytes.len() as u64 + chunk.len() as u64;
                    if total > size {
                        return Err(Error::SizeMismatch {
                            reference: reference.to_string(),
                            object,
                            expected: size,
                            actual: total,
                        });
                    }
                    hasher.update(&chunk);
                    bytes.extend_from_slice(&chunk);
                }
                // oci-client's own check at the end of the stream; ours
                // below reports it with both digests.
                Err(e) if is_digest_error(&e) => break,
                Err(e) => {
                    return Err(Error::Unavailable {
                        registry: reference.registry.clone(),
                        detail: format!("reading the {object} of {reference}: {}", chain(&e)),
                    });
                }
            }
        }
        let actual = hasher.finish();
        if actual != *digest {
            return Err(Error::DigestMismatch {
                reference: reference.to_string(),
                object,
                expected: *digest,
                actual,
            });
        }
        if bytes.len() as u64 != size {
            return Err(Error::SizeMismatch {
                reference: reference.to_string(),
                object,
                expected: size,
                actual: bytes.len() as u64,
            });
        }
        Ok(bytes)
    }

    /// Uploads `bytes` as a blob of `reference`'s repository unless it is
    /// there already.
    async fn upload(
        &self,
        oci: &oci_client::Client,
        reference: &ModuleRef,
        bytes: &[u8],
    ) -> Result<(), Error> {
        let digest = Digest::of(bytes).to_string();
        let image = reference.to_oci();
        oci.store_auth_if_needed(image.resolve_registry(), &self.auth())
            .await;
        let exists = guarded(reference, Object::Layer, oci.blob_exists(&image, &digest)).await?;
        if !exists {
            guarded(
                reference,
                Object::Layer,
                oci.push_blob(&image, bytes.to_vec(), &digest),
            )
            .await?;
        }
        Ok(())
    }

    async fn put_manifest(
        &self,
        oci: &oci_client::Client,
        reference: &ModuleRef,
        manifest: &Manifest,
    ) -> Result<Digest, Error> {
        let bytes = manifest.to_bytes();
        let image = reference.to_oci();
        oci.store_auth_if_needed(image.resolve_registry(), &self.auth())
            .await;
        guarded(
            reference,
            Object::Manifest,
            oci.push_manifest_raw(
                &image,
                bytes.clone(),
                http::HeaderValue::from_static(OCI_MANIFEST_MEDIA_TYPE),
            ),
        )
        .await?;
        Ok(Digest::of(&bytes))
    }
}

/// Runs an oci-client call, mapping its error; a panic inside oci-client on
/// a registry's answer becomes an error too.
async fn guarded<T>(
    reference: &ModuleRef,
    object: Object,
    call: impl Future<Output = oci_client::errors::Result<T>>,
) -> Result<T, Error> {
    match AssertUnwindSafe(call).catch_unwind().await {
        Ok(result) => result.map_err(|e| map_error(e, reference, object)),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(Error::Registry {
                reference: reference.to_string(),
                detail: format!("the registry client failed on the registry's answer: {what}"),
            })
        }
    }
}

/// A response's body, at most `limit + 1` bytes (one more than allowed, so
/// that the caller sees it was too long).
async fn read_capped(
    mut response: reqwest::Response,
    limit: u64,
    reference: &ModuleRef,
) -> Result<Vec<u8>, Error> {
    let mut bytes = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| request_error(&e, reference))?
    {
        let room = usize::try_from(limit + 1)
            .unwrap_or(usize::MAX)
            .saturating_sub(bytes.len());
        bytes.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if bytes.len() as u64 > limit {
            break;
        }
    }
    Ok(bytes)
}

/// A transport error: credentials refused (an error status of oci-client's
/// HEAD requests), the registry unavailable (refused, timed out, broke off,
/// a server error), or an answer that is not HTTP.
fn request_error(e: &reqwest::Error, reference: &ModuleRef) -> Error {
    match e.status().map(|s| s.as_u16()) {
        Some(401 | 403) => {
            return Error::Unauthorized {
                registry: reference.registry.clone(),
                detail: chain(e),
            };
        }
        Some(500..) => {
            return Error::Unavailable {
                registry: reference.registry.clone(),
                detail: chain(e),
            };
        }
        _ => {}
    }
    if e.is_connect() || e.is_timeout() || e.is_request() || e.is_body() {
        Error::Unavailable {
            registry: reference.registry.clone(),
            detail: chain(e),
        }
    } else {
        Error::Registry {
            reference: reference.to_string(),
            detail: chain(e),
        }
    }
}

/// The error and its sources, `: `-separated.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let next = s.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = s.source();
    }
    text
}

fn is_digest_error(e: &std::io::Error) -> bool {
    e.get_ref()
        .is_some_and(|inner| inner.is::<oci_client::errors::DigestError>())
}

fn map_error(e: OciDistributionError, reference: &ModuleRef, object: Object) -> Error {
    let registry = reference.registry.clone();
    match e {
        OciDistributionError::RequestError(ref inner) => request_error(inner, reference),
        OciDistributionError::ServerError { code, .. } if code >= 500 => Error::Unavailable {
            registry,
            detail: chain(&e),
        },
        OciDistributionError::ServerError { code: 404, .. } => Error::NotFound {
            reference: reference.to_string(),
        },
        OciDistributionError::UnauthorizedError { .. }
        | OciDistributionError::AuthenticationFailure(_) => Error::Unauthorized {
            registry,
            detail: chain(&e),
        },
        OciDistributionError::RegistryError { ref envelope, .. } => {
            let codes: Vec<&OciErrorCode> = envelope.errors.iter().map(|e| &e.code).collect();
            if codes.iter().any(|c| {
                matches!(
                    c,
                    OciErrorCode::ManifestUnknown
                        | OciErrorCode::NameUnknown
                        | OciErrorCode::BlobUnknown
                        | OciErrorCode::NotFound
                )
            }) {
                Error::NotFound {
                    reference: reference.to_string(),
                }
            } else if codes
                .iter()
                .any(|c| matches!(c, OciErrorCode::Unauthorized | OciErrorCode::Denied))
            {
                Error::Unauthorized {
                    registry,
                    detail: chain(&e),
                }
            } else {
                Error::Registry {
                    reference: reference.to_string(),
                    detail: chain(&e),
                }
            }
        }
        OciDistributionError::DigestError(oci_client::errors::DigestError::VerificationError {
            ref expected,
            ref actual,
        }) => match (Digest::parse(expected, false), Digest::parse(actual, false)) {
            (Ok(expected), Ok(actual)) => Error::DigestMismatch {
                reference: reference.to_string(),
                object,
                expected,
                actual,
            },
            _ => Error::Registry {
                reference: reference.to_string(),
                detail: chain(&e),
            },
        },
        other => Error::Registry {
            reference: reference.to_string(),
            detail: chain(&other),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_only_where_allowed() {
        let local = ModuleRef::parse("127.0.0.1:5000/p:1").unwrap();
        // Docker references have no IPv6 literals; a caller may build one.
        let v6 = ModuleRef {
            registry: "[::1]:5000".into(),
            ..local.clone()
        };
        let named = ModuleRef::parse("localhost:5000/p:1").unwrap();
        let remote = ModuleRef::parse("registry.example.com/p:1").unwrap();
        assert!(!PlainHttp::Never.allows(&local));
        for r in [&local, &v6, &named] {
            assert!(PlainHttp::Loopback.allows(r), "{r}");
        }
        assert!(!PlainHttp::Loopback.allows(&remote));
        let listed = PlainHttp::Registries(vec!["registry.example.com".into()]);
        assert!(listed.allows(&remote));
        assert!(!listed.allows(&local));
    }

    #[test]
    fn credentials_do_not_print_the_password() {
        let c = Credentials::Basic {
            username: "u".into(),
            password: "hunter2".into(),
        };
        assert!(!format!("{c:?}").contains("hunter2"));
    }
}
