//! Where `TrainerPlugin` modules come from, and whether they may load: the
//! bytes of an `oci://`, `https://` or `file://` module, checked against
//! the digest the object pins, then against the hub's trust policy (cosign
//! signatures in the registry for OCI modules, the object's detached
//! signature for URLs and files).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use base64::Engine as _;
use sha2::Digest as _;
use trainhub_plugin_oci::{
    CompiledPolicy, Credentials, DetachedSignature, Digest, ModuleRef, PlainHttp, RegistryClient,
    RegistryOptions, TrustPolicy,
};

use super::objects::{
    LoadFailure, REASON_DIGEST_MISMATCH, REASON_INVALID, REASON_PULL_FAILED, Spec, read_file_module,
};

/// The `trainhub serve` / `dev` flags of plugin modules.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SourceArgs {
    /// YAML or JSON: which signatures a TrainerPlugin's module needs to load,
    /// shaped like Kubewarden's verification config (`allOf`, `anyOf` with
    /// `minimumMatches`, entries `kind: pubKey` with a PEM `key`). Without
    /// it, any module whose digest matches loads.
    #[arg(long, value_name = "FILE")]
    pub plugin_trust_policy: Option<PathBuf>,
    /// Registries (`host:port` as written in module references) reached
    /// over plain HTTP; all others over HTTPS.
    #[arg(long, value_name = "HOST:PORT", value_delimiter = ',')]
    pub plugin_insecure_registries: Vec<String>,
    /// A Docker `config.json` (`{"auths": {"REGISTRY": {"auth": base64(user:password)}}}`
    /// or `username`/`password`) with the credentials of private registries.
    #[arg(long, value_name = "FILE")]
    pub plugin_registry_auth: Option<PathBuf>,
    /// PEM CA certificates trusted, besides the system's roots, for
    /// registries and `https://` modules (a private registry's CA).
    #[arg(long, value_name = "FILE", value_delimiter = ',')]
    pub plugin_ca_file: Vec<PathBuf>,
}

/// What a module is, fetched and checked.
#[derive(Debug)]
pub struct Fetched {
    pub bytes: Vec<u8>,
    /// `sha256:...` of the bytes.
    pub module_digest: String,
}

/// The hub's module sources, one client per registry with credentials.
pub struct Sources {
    insecure: Vec<String>,
    auths: BTreeMap<String, Credentials>,
    clients: std::sync::Mutex<BTreeMap<String, RegistryClient>>,
    policy: Option<CompiledPolicy>,
    roots: Vec<Vec<u8>>,
}

impl Sources {
    /// # Errors
    ///
    /// The trust policy or the credentials file cannot be read or is
    /// invalid (the hub does not start without what it was told to use).
    pub fn new(args: &SourceArgs) -> Result<Sources> {
        let policy = match &args.plugin_trust_policy {
            Some(path) => Some(read_policy(path)?),
            None => None,
        };
        let auths = match &args.plugin_registry_auth {
            Some(path) => read_auths(path)?,
            None => BTreeMap::new(),
        };
        let roots = args
            .plugin_ca_file
            .iter()
            .map(|path| {
                let pem = std::fs::read(path)
                    .with_context(|| format!("--plugin-ca-file {}", path.display()))?;
                if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
                    anyhow::bail!("--plugin-ca-file {}: no PEM certificate", path.display());
                }
                Ok(pem)
            })
            .collect::<Result<_>>()?;
        Ok(Sources {
            insecure: args.plugin_insecure_registries.clone(),
            auths,
            clients: std::sync::Mutex::default(),
            policy,
            roots,
        })
    }

    fn client(&self, registry: &str) -> RegistryClient {
        let mut clients = self
            .clients
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        clients
            .entry(registry.to_string())
            .or_insert_with(|| {
                RegistryClient::new(RegistryOptions {
                    credentials: self.auths.get(registry).cloned().unwrap_or_default(),
                    plain_http: PlainHttp::Registries(self.insecure.clone()),
                    extra_root_certificates_pem: self.roots.clone(),
                    ..RegistryOptions::default()
                })
            })
            .clone()
    }

    /// The module of `spec`, its digest checked, its signatures checked
    /// against the trust policy.
    ///
    /// # Errors
    ///
    /// Why it may not load, as a condition reason and message.
    pub async fn fetch(&self, spec: &Spec) -> Result<Fetched, LoadFailure> {
        if spec.module.starts_with("oci://") {
            return self.fetch_oci(spec).await;
        }
        let expected = spec.digest()?;
        let bytes = if spec.module.starts_with("https://") {
            let digest = Digest::parse(&expected, true)
                .map_err(|e| LoadFailure::new(REASON_INVALID, format!("spec.sha256: {e}")))?;
            let url = spec.module.split("@sha256:").next().unwrap_or_default();
            let options = RegistryOptions {
                extra_root_certificates_pem: self.roots.clone(),
                ..RegistryOptions::default()
            };
            trainhub_plugin_oci::url::fetch_https(url, &digest, &options)
                .await
                .map_err(failure)?
        } else if spec.module.starts_with("file://") {
            let path = spec.module.split("@sha256:").next().unwrap_or_default();
            read_file_module(path).await?
        } else {
            return Err(LoadFailure::new(
                REASON_INVALID,
                format!(
                    "spec.module {}: an oci://, https:// or file:// reference is required",
                    spec.module
                ),
            ));
        };
        let actual = hex::encode(sha2::Sha256::digest(&bytes));
        if actual != expected {
            return Err(LoadFailure::new(
                REASON_DIGEST_MISMATCH,
                format!("the module's sha256 is {actual}, the object pins {expected}"),
            ));
        }
        if let Some(policy) = &self.policy {
            let signatures = match &spec.signature {
                Some(text) => vec![DetachedSignature::parse(text.as_bytes()).map_err(|e| {
                    LoadFailure::new("SignatureInvalid", format!("spec.signature: {e}"))
                })?],
                None => Vec::new(),
            };
            policy
                .evaluate_detached(&bytes, &signatures)
                .map_err(|refusal| {
                    LoadFailure::new(refusal.reason.as_str(), refusal.to_string())
                })?;
        }
        Ok(Fetched {
            bytes,
            module_digest: format!("sha256:{actual}"),
        })
    }

    async fn fetch_oci(&self, spec: &Spec) -> Result<Fetched, LoadFailure> {
        let reference = ModuleRef::parse(&spec.module)
            .map_err(|e| LoadFailure::new(REASON_INVALID, format!("spec.module: {e}")))?;
        let client = self.client(&reference.registry);
        // A tag alone is resolved once per load; spec.sha256 then pins the
        // module's bytes.
        let pinned = match &reference.digest {
            Some(_) => reference.clone(),
            None if spec.sha256.is_some() => client.resolve(&reference).await.map_err(failure)?,
            None => {
                return Err(LoadFailure::new(
                    REASON_INVALID,
                    "spec.sha256 is required unless spec.module carries a digest",
                ));
            }
        };
        let pulled = client.pull(&pinned).await.map_err(failure)?;
        let actual = pulled.module_digest.hex();
        if let Some(expected) = &spec.sha256
            && *expected != actual
        {
            return Err(LoadFailure::new(
                REASON_DIGEST_MISMATCH,
                format!("the module's sha256 is {actual}, spec.sha256 pins {expected}"),
            ));
        }
        if let Some(policy) = &self.policy {
            let signatures = client.signatures(&pinned).await.map_err(failure)?;
            policy
                .evaluate_cosign(&pulled.manifest_digest, &signatures)
                .map_err(|refusal| {
                    LoadFailure::new(refusal.reason.as_str(), refusal.to_string())
                })?;
        }
        Ok(Fetched {
            bytes: pulled.bytes,
            module_digest: format!("sha256:{actual}"),
        })
    }
}

/// A registry or URL failure as the object's condition: DigestMismatch,
/// SignatureInvalid or PullFailed (transient when the source was
/// unreachable, so the last good version keeps serving).
fn failure(e: trainhub_plugin_oci::Error) -> LoadFailure {
    let reason = match e.reason() {
        "DigestMismatch" => REASON_DIGEST_MISMATCH,
        "SignatureInvalid" => "SignatureInvalid",
        _ => REASON_PULL_FAILED,
    };
    LoadFailure {
        reason,
        message: e.to_string(),
        transient: e.is_transient(),
    }
}

fn read_policy(path: &Path) -> Result<CompiledPolicy> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let policy: TrustPolicy = serde_saphyr::from_str(&text)
        .with_context(|| format!("{}: not a trust policy", path.display()))?;
    policy
        .compile()
        .with_context(|| format!("{}: the trust policy", path.display()))
}

/// A Docker `config.json`'s `auths`: per registry, `auth` (base64 of
/// `user:password`) or `username` and `password`.
fn read_auths(path: &Path) -> Result<BTreeMap<String, Credentials>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let config: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a Docker config.json", path.display()))?;
    let mut out = BTreeMap::new();
    for (registry, entry) in config["auths"].as_object().into_iter().flatten() {
        let (username, password) = match entry["auth"].as_str() {
            Some(auth) => {
                let decoded = base64::engine::general_purpose::STANDARD
                    .decode(auth)
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok())
                    .with_context(|| {
                        format!(
                            "{}: auths.{registry}.auth is not base64 text",
                            path.display()
                        )
                    })?;
                let (u, p) = decoded.split_once(':').with_context(|| {
                    format!(
                        "{}: auths.{registry}.auth is not user:password",
                        path.display()
                    )
                })?;
                (u.to_string(), p.to_string())
            }
            None => (
                entry["username"].as_str().unwrap_or_default().to_string(),
                entry["password"].as_str().unwrap_or_default().to_string(),
            ),
        };
        if username.is_empty() {
            anyhow::bail!("{}: auths.{registry} has no user", path.display());
        }
        out.insert(registry.clone(), Credentials::Basic { username, password });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_credentials_come_from_a_docker_config() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        std::fs::write(
            &path,
            r#"{"auths": {"r.example": {"auth": "YWxpY2U6czNjcjN0"}, "q.example:5000": {"username": "bob", "password": "pw"}}}"#,
        )
        .unwrap();
        let auths = read_auths(&path).unwrap();
        assert_eq!(
            auths["r.example"],
            Credentials::Basic {
                username: "alice".into(),
                password: "s3cr3t".into()
            }
        );
        assert_eq!(
            auths["q.example:5000"],
            Credentials::Basic {
                username: "bob".into(),
                password: "pw".into()
            }
        );
        std::fs::write(
            &path,
            r#"{"auths": {"r.example": {"auth": "bm9jb2xvbg=="}}}"#,
        )
        .unwrap();
        let e = read_auths(&path).unwrap_err();
        assert!(format!("{e:#}").contains("not user:password"), "{e:#}");
    }

    #[test]
    fn an_invalid_trust_policy_stops_the_hub() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy.yaml");
        std::fs::write(&path, "allOf:\n- kind: pubKey\n  key: not a key\n").unwrap();
        let e = Sources::new(&SourceArgs {
            plugin_trust_policy: Some(path),
            ..SourceArgs::default()
        })
        .err()
        .unwrap();
        assert!(format!("{e:#}").contains("allOf[0].key"), "{e:#}");
    }
}
