//! `trainctl plugin`: keys, signatures and registry pushes of plugin
//! modules (the `trainhub_plugin_oci` crate).

use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Subcommand;
use trainhub_plugin_oci::{
    CosignSignature, Credentials, DetachedSignature, Digest, ModuleRef, PlainHttp, RegistryClient,
    RegistryOptions, SigningKey, TrustPolicy, generate_key_pair,
};

/// The longest module file read (as the registry pull's default limit).
const MAX_MODULE_FILE: u64 = 64 * 1024 * 1024;
/// The longest key, policy or signature file read.
const MAX_SMALL_FILE: u64 = 1024 * 1024;

#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Generate an ECDSA P-256 key pair for signing plugins: a PKCS#8
    /// private key (mode 0600) and a PKIX public key, the form `cosign.pub`
    /// has (for trust policies and `cosign verify --key`).
    Keygen {
        /// The private key file.
        #[arg(long, default_value = "plugin.key")]
        key: PathBuf,
        /// The public key file.
        #[arg(long = "pub", default_value = "plugin.pub")]
        public: PathBuf,
        /// Overwrite existing files.
        #[arg(long)]
        force: bool,
    },
    /// Push a built component to a registry (CNCF wasm artifact layout) and
    /// print its reference pinned by digest; with --key, sign it there too.
    Push {
        /// The component (`.wasm`).
        module: PathBuf,
        /// Where to: `oci://registry/repository:tag`.
        reference: String,
        /// Sign the pushed manifest with this private key (cosign's format).
        #[arg(long)]
        key: Option<PathBuf>,
        /// Annotations on the signature (`-a key=value`, as cosign's).
        #[arg(short = 'a', long = "annotation", value_parser = parse_annotation)]
        annotations: Vec<(String, String)>,
        #[command(flatten)]
        registry: RegistryArgs,
    },
    /// Sign a module: `oci://...` in its registry (cosign's format, stored
    /// beside it), or a file (a detached signature, FILE.sig by default).
    Sign {
        /// `oci://registry/repository[:tag][@sha256:...]` or a file.
        target: String,
        /// The private key (PKCS#8 PEM, as `trainctl plugin keygen` writes).
        #[arg(long)]
        key: PathBuf,
        /// Annotations on a registry signature (`-a key=value`).
        #[arg(short = 'a', long = "annotation", value_parser = parse_annotation)]
        annotations: Vec<(String, String)>,
        /// The detached signature file to write (files only).
        #[arg(long)]
        output: Option<PathBuf>,
        #[command(flatten)]
        registry: RegistryArgs,
    },
    /// Verify a module's signatures against public keys or a trust policy:
    /// `oci://...` (pulled by digest, its cosign signatures read from the
    /// registry) or a file with its detached signature. Exits 1 when
    /// refused, naming the key that did not sign.
    Verify {
        /// `oci://registry/repository[:tag][@sha256:...]` or a file.
        target: String,
        /// A public key every signature requirement needs (repeatable: all
        /// must have signed).
        #[arg(long = "key", required_unless_present = "policy")]
        keys: Vec<PathBuf>,
        /// A trust policy file (YAML or JSON; Kubewarden's verification
        /// config shape) instead of --key.
        #[arg(long, conflicts_with = "keys")]
        policy: Option<PathBuf>,
        /// The detached signature of a file (default FILE.sig).
        #[arg(long)]
        signature: Option<PathBuf>,
        /// The file's expected sha256 (hex), checked before its signature.
        #[arg(long)]
        sha256: Option<String>,
        #[command(flatten)]
        registry: RegistryArgs,
    },
    /// Print the `TrainerPlugin` object that installs a module, its digest
    /// filled in: `oci://...` pinned to its manifest (a tag is resolved
    /// now), or a file pinned by its sha256 with its detached signature
    /// (FILE.sig) when there is one. Apply it with `| kubectl apply -f -`.
    Install {
        /// `oci://registry/repository[:tag][@sha256:...]` or a file.
        target: String,
        /// The object's name.
        #[arg(long)]
        name: String,
        /// The plugin's settings (a YAML or JSON file), for `spec.settings`.
        #[arg(long)]
        settings: Option<PathBuf>,
        /// `Fail` (default) or `Ignore`: what a failed plugin call does.
        #[arg(long, value_parser = ["Fail", "Ignore"])]
        failure_policy: Option<String>,
        #[command(flatten)]
        registry: RegistryArgs,
    },
}

/// How to reach the registry.
#[derive(Debug, clap::Args)]
pub struct RegistryArgs {
    /// Speak plain HTTP to a registry on a loopback address (127.0.0.1,
    /// ::1, localhost); others still get HTTPS.
    #[arg(long)]
    pub plain_http: bool,
    /// A registry (`host:port`) to speak plain HTTP to (repeatable).
    #[arg(long = "insecure-registry")]
    pub insecure_registries: Vec<String>,
    /// Registry user name (the password from $TRAINHUB_REGISTRY_PASSWORD or
    /// --password-stdin).
    #[arg(long, env = "TRAINHUB_REGISTRY_USERNAME")]
    pub username: Option<String>,
    /// Read the registry password from standard input.
    #[arg(long, requires = "username")]
    pub password_stdin: bool,
    /// A PEM CA certificate to trust for the registry (repeatable).
    #[arg(long = "registry-ca")]
    pub registry_cas: Vec<PathBuf>,
    /// Allow a tag without a digest for `sign` and `verify` (resolved to
    /// the digest it names now, and printed).
    #[arg(long)]
    pub allow_tag: bool,
}

pub fn run(command: PluginCommand) -> anyhow::Result<ExitCode> {
    match command {
        PluginCommand::Keygen { key, public, force } => keygen(&key, &public, force),
        PluginCommand::Push {
            module,
            reference,
            key,
            annotations,
            registry,
        } => block_on(push(
            &module,
            &reference,
            key.as_deref(),
            annotations,
            &registry,
        )),
        PluginCommand::Sign {
            target,
            key,
            annotations,
            output,
            registry,
        } => block_on(sign(&target, &key, annotations, output, &registry)),
        PluginCommand::Verify {
            target,
            keys,
            policy,
            signature,
            sha256,
            registry,
        } => block_on(verify(
            &target,
            &keys,
            policy.as_deref(),
            signature,
            sha256.as_deref(),
            &registry,
        )),
        PluginCommand::Install {
            target,
            name,
            settings,
            failure_policy,
            registry,
        } => block_on(install(
            &target,
            &name,
            settings.as_deref(),
            failure_policy,
            &registry,
        )),
    }
}

/// The `TrainerPlugin` of `target` (see [`PluginCommand::Install`]).
async fn install(
    target: &str,
    name: &str,
    settings: Option<&Path>,
    failure_policy: Option<String>,
    registry: &RegistryArgs,
) -> anyhow::Result<ExitCode> {
    let problems = trainhub_apiserver::names::dns1123_subdomain(name);
    if !problems.is_empty() {
        anyhow::bail!("--name {name:?}: {}", problems.join("; "));
    }
    let mut spec = serde_json::Map::new();
    if is_oci(target) {
        let client = client(registry)?;
        // A tag is resolved now: the object pins what it names today.
        let pinned = pin(&client, target, true).await?;
        let text = pinned.to_string();
        let module = if text.starts_with("oci://") {
            text
        } else {
            format!("oci://{text}")
        };
        spec.insert("module".into(), module.into());
    } else {
        let path = std::path::absolute(target).with_context(|| format!("resolving {target}"))?;
        let bytes = read_bounded(&path, MAX_MODULE_FILE)?;
        spec.insert("module".into(), format!("file://{}", path.display()).into());
        spec.insert(
            "sha256".into(),
            trainhub_plugin_oci::Digest::of(&bytes).hex().into(),
        );
        let sig = signature_path(&path);
        if sig.exists() {
            spec.insert("signature".into(), read_text(&sig)?.trim().into());
        }
    }
    if let Some(path) = settings {
        let text = read_text(path)?;
        let value: serde_json::Value = serde_saphyr::from_str(&text)
            .with_context(|| format!("{}: not YAML or JSON", path.display()))?;
        spec.insert("settings".into(), value);
    }
    if let Some(policy) = failure_policy {
        spec.insert("failurePolicy".into(), policy.into());
    }
    let object = serde_json::json!({
        "apiVersion": "trainhub.kubeflow.org/v1alpha1",
        "kind": "TrainerPlugin",
        "metadata": {"name": name},
        "spec": spec,
    });
    print!(
        "{}",
        serde_saphyr::to_string(&object).context("printing the object")?
    );
    Ok(ExitCode::SUCCESS)
}

fn block_on(
    work: impl std::future::Future<Output = anyhow::Result<ExitCode>>,
) -> anyhow::Result<ExitCode> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?
        .block_on(work)
}

fn keygen(key: &Path, public: &Path, force: bool) -> anyhow::Result<ExitCode> {
    for path in [key, public] {
        if !force && path.exists() {
            anyhow::bail!("{} exists (--force to overwrite)", path.display());
        }
    }
    let keys = generate_key_pair()?;
    write_private(key, keys.private_pem.as_bytes())?;
    std::fs::write(public, &keys.public_pem)
        .with_context(|| format!("writing {}", public.display()))?;
    let fingerprint = trainhub_plugin_oci::PublicKey::from_pem(&keys.public_pem)?.fingerprint();
    println!(
        "private key in {} (keep it secret), public key in {} ({fingerprint})",
        key.display(),
        public.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// Writes a secret readable by its owner only.
fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    file.write_all(bytes)
        .with_context(|| format!("writing {}", path.display()))
}

async fn push(
    module: &Path,
    reference: &str,
    key: Option<&Path>,
    annotations: Vec<(String, String)>,
    registry: &RegistryArgs,
) -> anyhow::Result<ExitCode> {
    let target = ModuleRef::parse(reference)?;
    let signer = key.map(read_signing_key).transpose()?;
    let bytes = read_bounded(module, MAX_MODULE_FILE)?;
    let client = client(registry)?;
    let pushed = client
        .push(&target, &bytes, &created_now()?, &BTreeMap::new())
        .await
        .with_context(|| format!("pushing {}", module.display()))?;
    println!("{}", pushed.reference);
    eprintln!("module sha256 {}", pushed.module_digest.hex());
    if let Some(signer) = signer {
        sign_in_registry(&client, &pushed.reference, &signer, annotations).await?;
    }
    Ok(ExitCode::SUCCESS)
}

async fn sign(
    target: &str,
    key: &Path,
    annotations: Vec<(String, String)>,
    output: Option<PathBuf>,
    registry: &RegistryArgs,
) -> anyhow::Result<ExitCode> {
    let signer = read_signing_key(key)?;
    if is_oci(target) {
        if output.is_some() {
            anyhow::bail!("--output is for detached signatures of files, not oci:// references");
        }
        let client = client(registry)?;
        let pinned = pin(&client, target, registry.allow_tag).await?;
        // Sign only what is there and is a module (as cosign signs only an
        // image it can read).
        client.pull(&pinned).await?;
        sign_in_registry(&client, &pinned, &signer, annotations).await?;
        return Ok(ExitCode::SUCCESS);
    }
    if !annotations.is_empty() {
        anyhow::bail!("a detached signature carries no annotations (sign an oci:// reference)");
    }
    let module = PathBuf::from(target);
    let bytes = read_bounded(&module, MAX_MODULE_FILE)?;
    let signature = DetachedSignature::sign(&signer, &bytes)?;
    let output = output.unwrap_or_else(|| signature_path(&module));
    std::fs::write(&output, signature.to_file_text())
        .with_context(|| format!("writing {}", output.display()))?;
    println!(
        "{}: signed sha256 {} into {}",
        module.display(),
        Digest::of(&bytes).hex(),
        output.display()
    );
    Ok(ExitCode::SUCCESS)
}

async fn sign_in_registry(
    client: &RegistryClient,
    pinned: &ModuleRef,
    signer: &SigningKey,
    annotations: Vec<(String, String)>,
) -> anyhow::Result<()> {
    let digest = pinned
        .digest
        .context("internal: signing needs a pinned reference")?;
    let annotations: BTreeMap<String, String> = annotations.into_iter().collect();
    let signature =
        CosignSignature::sign(signer, &pinned.repository_name(), &digest, &annotations)?;
    client
        .push_signature(pinned, &signature)
        .await
        .with_context(|| format!("storing the signature of {pinned}"))?;
    eprintln!(
        "signed {pinned} with key {} (stored at tag {})",
        signer.public_key().fingerprint(),
        trainhub_plugin_oci::cosign::signature_tag(&digest)
    );
    Ok(())
}

async fn verify(
    target: &str,
    keys: &[PathBuf],
    policy: Option<&Path>,
    signature: Option<PathBuf>,
    sha256: Option<&str>,
    registry: &RegistryArgs,
) -> anyhow::Result<ExitCode> {
    let policy = match policy {
        Some(path) => {
            let text = read_text(path)?;
            serde_saphyr::from_str::<TrustPolicy>(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
        }
        None => TrustPolicy::all_of_keys(
            &keys
                .iter()
                .map(|path| read_text(path))
                .collect::<anyhow::Result<Vec<_>>>()?,
        ),
    }
    .compile()?;

    let (name, verdict) = if is_oci(target) {
        let client = client(registry)?;
        let pinned = pin(&client, target, registry.allow_tag).await?;
        let pulled = client.pull(&pinned).await?;
        let signatures = client.signatures(&pinned).await?;
        let verdict = policy.evaluate_cosign(&pulled.manifest_digest, &signatures);
        (
            format!("{pinned} (module sha256 {})", pulled.module_digest.hex()),
            verdict,
        )
    } else {
        let module = PathBuf::from(target);
        let bytes = read_bounded(&module, MAX_MODULE_FILE)?;
        let actual = Digest::of(&bytes);
        if let Some(expected) = sha256 {
            let expected =
                Digest::parse(expected, true).map_err(|e| anyhow::anyhow!("--sha256: {e}"))?;
            if expected != actual {
                anyhow::bail!(
                    "{}: DigestMismatch: expected sha256 {}, the file has {}",
                    module.display(),
                    expected.hex(),
                    actual.hex()
                );
            }
        }
        let signature_file = signature.unwrap_or_else(|| signature_path(&module));
        let detached = DetachedSignature::parse(&read_bounded(&signature_file, MAX_SMALL_FILE)?)
            .with_context(|| signature_file.display().to_string())?;
        let verdict = policy.evaluate_detached(&bytes, &[detached]);
        (
            format!("{} (sha256 {})", module.display(), actual.hex()),
            verdict,
        )
    };
    match verdict {
        Ok(verdict) => {
            let by: Vec<String> = verdict
                .matched
                .iter()
                .map(|k| match &k.owner {
                    Some(owner) => format!("{} ({owner}, {})", k.path, k.fingerprint),
                    None => format!("{} ({})", k.path, k.fingerprint),
                })
                .collect();
            println!("{name}: verified, signed by {}", by.join(", "));
            Ok(ExitCode::SUCCESS)
        }
        Err(refusal) => {
            eprintln!("{name}: {refusal}");
            Ok(ExitCode::FAILURE)
        }
    }
}

/// A client from the flags; the password from --password-stdin or
/// $TRAINHUB_REGISTRY_PASSWORD.
fn client(args: &RegistryArgs) -> anyhow::Result<RegistryClient> {
    let RegistryArgs {
        plain_http,
        insecure_registries,
        username,
        password_stdin,
        registry_cas,
        allow_tag: _,
    } = args;
    let credentials = match username {
        None => Credentials::Anonymous,
        Some(username) => {
            let password = if *password_stdin {
                let mut text = String::new();
                std::io::stdin()
                    .take(64 * 1024)
                    .read_to_string(&mut text)
                    .context("reading the password from stdin")?;
                text.trim_end_matches(['\r', '\n']).to_string()
            } else {
                std::env::var("TRAINHUB_REGISTRY_PASSWORD").context(
                    "--username needs a password: --password-stdin or $TRAINHUB_REGISTRY_PASSWORD",
                )?
            };
            Credentials::Basic {
                username: username.clone(),
                password,
            }
        }
    };
    let plain_http = match (*plain_http, insecure_registries.is_empty()) {
        (false, true) => PlainHttp::Never,
        (true, true) => PlainHttp::Loopback,
        (false, false) => PlainHttp::Registries(insecure_registries.clone()),
        (true, false) => anyhow::bail!("give --plain-http or --insecure-registry, not both"),
    };
    let extra_root_certificates_pem = registry_cas
        .iter()
        .map(|path| read_bounded(path, MAX_SMALL_FILE))
        .collect::<anyhow::Result<_>>()?;
    Ok(RegistryClient::new(RegistryOptions {
        credentials,
        plain_http,
        extra_root_certificates_pem,
        ..RegistryOptions::default()
    }))
}

/// The reference pinned to a digest; a tag alone only with --allow-tag.
async fn pin(client: &RegistryClient, text: &str, allow_tag: bool) -> anyhow::Result<ModuleRef> {
    let reference = ModuleRef::parse(text)?;
    if reference.digest.is_some() {
        return Ok(reference);
    }
    if !allow_tag {
        anyhow::bail!(
            "{reference} names a tag, which may move: give @sha256:<digest> (as `trainctl plugin push` prints it), or --allow-tag"
        );
    }
    let pinned = client.resolve(&reference).await?;
    eprintln!("{reference} is {pinned}");
    Ok(pinned)
}

fn is_oci(target: &str) -> bool {
    target.starts_with("oci://") || target.starts_with("registry://")
}

fn signature_path(module: &Path) -> PathBuf {
    let mut name = module.as_os_str().to_owned();
    name.push(".sig");
    PathBuf::from(name)
}

fn read_signing_key(path: &Path) -> anyhow::Result<SigningKey> {
    SigningKey::from_pem(&read_text(path)?).with_context(|| path.display().to_string())
}

fn read_text(path: &Path) -> anyhow::Result<String> {
    String::from_utf8(read_bounded(path, MAX_SMALL_FILE)?)
        .with_context(|| format!("{} is not UTF-8 text", path.display()))
}

fn read_bounded(path: &Path, limit: u64) -> anyhow::Result<Vec<u8>> {
    let file = std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("reading {}", path.display()))?;
    if bytes.len() as u64 > limit {
        anyhow::bail!("{} is larger than {limit} bytes", path.display());
    }
    Ok(bytes)
}

/// `$SOURCE_DATE_EPOCH` (reproducible builds) or now, in RFC 3339.
fn created_now() -> anyhow::Result<String> {
    let timestamp = match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(epoch) => {
            let seconds: i64 = epoch
                .trim()
                .parse()
                .with_context(|| format!("SOURCE_DATE_EPOCH {epoch:?}"))?;
            jiff::Timestamp::from_second(seconds)
                .with_context(|| format!("SOURCE_DATE_EPOCH {epoch:?}"))?
        }
        Err(_) => jiff::Timestamp::now(),
    };
    Ok(timestamp.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
}

fn parse_annotation(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("{text:?}: expected key=value")),
    }
}
