//! `trainctl` commands.

mod plugin;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};

use crate::plugins::{Host, HostConfig, Registry};
use crate::render::{self, Inputs, RenderError};

#[derive(Debug, Parser)]
#[command(name = "trainctl", version, about = "trainhub's command line")]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the plugin pipeline offline and print the objects it builds.
    Render(RenderArgs),
    /// Create the CA and issue hub and spoke certificates for the spokes'
    /// mutual TLS.
    #[command(subcommand)]
    Certs(CertsCommand),
    /// Cordon, uncordon and drain spokes (admins; through the hub's API,
    /// with the kubeconfig kubectl uses).
    #[command(subcommand)]
    Spoke(SpokeCommand),
    /// Sign, push and verify plugin modules (OCI registries, cosign
    /// signatures, detached signature files).
    #[command(subcommand)]
    Plugin(plugin::PluginCommand),
}

#[derive(Debug, Subcommand)]
pub enum SpokeCommand {
    /// Mark the spoke unschedulable: no new TrainJobs go to it; those
    /// running on it go on.
    Cordon(SpokeTarget),
    /// Mark the spoke schedulable again.
    Uncordon(SpokeTarget),
    /// Cordon the spoke, then wait until no TrainJob runs on it, as
    /// `kubectl drain` does: running TrainJobs finish where they are (none
    /// is moved; suspend and resume one to requeue it now).
    Drain {
        #[command(flatten)]
        target: SpokeTarget,
        /// Give up after this long (e.g. `90s`, `10m`; `0s`: wait for ever),
        /// failing with the TrainJobs still running there.
        #[arg(long, default_value = "0s", value_parser = crate::controller::events::parse_go_duration)]
        timeout: std::time::Duration,
    },
}

#[derive(Debug, clap::Args)]
pub struct SpokeTarget {
    /// The Spoke (the spoke's name).
    pub name: String,
    /// The kubeconfig to use (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum CertsCommand {
    /// Create a CA in DIR (`ca.crt`, `ca.key`), unless one is there.
    Init {
        #[arg(long, default_value = "pki")]
        dir: PathBuf,
    },
    /// Issue the hub's serving certificate (`hub.crt`, `hub.key`) for the
    /// names and addresses spokes dial.
    Hub {
        #[arg(long, default_value = "pki")]
        dir: PathBuf,
        /// DNS names (repeatable).
        #[arg(long = "dns")]
        dns_names: Vec<String>,
        /// IP addresses (repeatable).
        #[arg(long = "ip")]
        ips: Vec<std::net::IpAddr>,
        /// Days the certificate is valid.
        #[arg(long, default_value_t = trainhub_apiserver::pki::LEAF_VALIDITY_DAYS)]
        days: i64,
    },
    /// Issue a spoke's client certificate (`NAME.crt`, `NAME.key`); NAME,
    /// its Subject CN, is the spoke's name at the hub.
    Spoke {
        name: String,
        #[arg(long, default_value = "pki")]
        dir: PathBuf,
        /// Days the certificate is valid.
        #[arg(long, default_value_t = crate::spokes::DEFAULT_CERT_DAYS)]
        days: i64,
    },
    /// Issue again, from the CA, the certificates `NAME.crt` of DIR (`hub`,
    /// spoke names) with a new key, same subject and names, into the same
    /// files. A running hub and its spokes pick the new files up without
    /// a restart.
    Renew {
        /// `hub` or spoke names (repeatable).
        #[arg(required = true)]
        names: Vec<String>,
        #[arg(long, default_value = "pki")]
        dir: PathBuf,
        /// Days the new certificates are valid (default: 365 for the hub's,
        /// 30 for a spoke's).
        #[arg(long)]
        days: Option<i64>,
    },
}

#[derive(Debug, clap::Args)]
pub struct RenderArgs {
    /// YAML or JSON files with TrainJobs and runtimes (several documents per
    /// file allowed; `-` reads stdin). Without a runtime, the built-in
    /// runtimes are used.
    #[arg(short = 'f', long = "filename", required = true)]
    pub files: Vec<PathBuf>,
    /// Directory of custom plugins (`NAME.wasm` with an optional `NAME.yaml`).
    #[arg(long, env = "TRAINHUB_PLUGINS_DIR")]
    pub plugins_dir: Option<PathBuf>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Yaml)]
    pub output: Output,
    /// Name of the spoke the objects are built for.
    #[arg(long, default_value = "local")]
    pub target: String,
    /// Where compiled plugins are cached between runs.
    #[arg(long, env = "TRAINHUB_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Yaml,
    Json,
}

pub fn run(args: Args) -> ExitCode {
    let Args { command } = args;
    let result = match command {
        Command::Render(args) => render_command(args),
        Command::Certs(command) => certs_command(command),
        Command::Spoke(command) => spoke_command(command),
        Command::Plugin(command) => plugin::run(command),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn certs_command(command: CertsCommand) -> anyhow::Result<ExitCode> {
    use trainhub_apiserver::pki::PemDir;
    match command {
        CertsCommand::Init { dir } => {
            let pki = PemDir::new(&dir);
            pki.load_or_create_ca("trainhub-ca")?;
            println!("CA in {}", pki.cert_path("ca").display());
        }
        CertsCommand::Hub {
            dir,
            dns_names,
            ips,
            days,
        } => {
            let pki = PemDir::new(&dir);
            let ca = pki
                .read_ca()
                .context("no CA: run `trainctl certs init` first")?;
            let names: Vec<&str> = dns_names.iter().map(String::as_str).collect();
            let issued = ca.issue_server_for("trainhub", &names, &ips, days)?;
            pki.write("hub", &issued)?;
            println!("hub certificate in {}", pki.cert_path("hub").display());
        }
        CertsCommand::Renew { names, dir, days } => {
            let pki = PemDir::new(&dir);
            let ca = pki
                .read_ca()
                .context("no CA: run `trainctl certs init` first")?;
            for name in names {
                let old = pki.read(&name).with_context(|| {
                    format!("{name}: no certificate to renew in {}", dir.display())
                })?;
                let info = trainhub_apiserver::pki::CertInfo::from_pem(&old.cert_pem)
                    .map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
                let days = days.unwrap_or(if info.server {
                    trainhub_apiserver::pki::LEAF_VALIDITY_DAYS
                } else {
                    crate::spokes::DEFAULT_CERT_DAYS
                });
                let issued = ca.renew(&old.cert_pem, days)?;
                let new = trainhub_apiserver::pki::CertInfo::from_pem(&issued.cert_pem)
                    .map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
                pki.write(&name, &issued)?;
                println!(
                    "{name}: renewed in {} (serial {}, valid until {})",
                    pki.cert_path(&name).display(),
                    new.serial,
                    jiff::Timestamp::from_second(new.not_after)
                        .map(|t| t.to_string())
                        .unwrap_or_default()
                );
            }
        }
        CertsCommand::Spoke { name, dir, days } => {
            if !crate::grpc::is_dns_label(&name) {
                anyhow::bail!(
                    "spoke name {name:?}: must be a DNS-1123 label (lowercase letters, digits and '-', at most 63)"
                );
            }
            let pki = PemDir::new(&dir);
            let ca = pki
                .read_ca()
                .context("no CA: run `trainctl certs init` first")?;
            let issued = ca.issue_client_for(&name, &[crate::grpc::SPOKE_GROUP], days)?;
            pki.write(&name, &issued)?;
            println!("spoke certificate in {}", pki.cert_path(&name).display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn spoke_command(command: SpokeCommand) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(async move {
        match command {
            SpokeCommand::Cordon(target) => {
                let api = spokes_api(target.kubeconfig.as_deref()).await?;
                set_unschedulable(&api, &target.name, true).await?;
                println!("spoke/{} cordoned", target.name);
            }
            SpokeCommand::Uncordon(target) => {
                let api = spokes_api(target.kubeconfig.as_deref()).await?;
                set_unschedulable(&api, &target.name, false).await?;
                println!("spoke/{} uncordoned", target.name);
            }
            SpokeCommand::Drain { target, timeout } => {
                let api = spokes_api(target.kubeconfig.as_deref()).await?;
                set_unschedulable(&api, &target.name, true).await?;
                println!("spoke/{} cordoned", target.name);
                let started = std::time::Instant::now();
                let mut last = None;
                loop {
                    let spoke = api.get(&target.name).await.with_context(|| {
                        format!("reading spoke/{}", target.name)
                    })?;
                    let running = spoke.data["status"]["running"].as_i64().unwrap_or(0);
                    if running == 0 {
                        println!("spoke/{} drained", target.name);
                        break;
                    }
                    if last != Some(running) {
                        println!(
                            "waiting for {running} TrainJob(s) running on spoke/{} to finish",
                            target.name
                        );
                        last = Some(running);
                    }
                    if !timeout.is_zero() && started.elapsed() >= timeout {
                        anyhow::bail!(
                            "spoke/{}: {running} TrainJob(s) still running after {timeout:?}; it stays cordoned",
                            target.name
                        );
                    }
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// The hub's Spokes, through the kubeconfig (`path`, else kubectl's).
async fn spokes_api(
    path: Option<&std::path::Path>,
) -> anyhow::Result<kube::Api<kube::core::DynamicObject>> {
    let config = match path {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading the kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("the kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("finding the hub (no --kubeconfig, no $KUBECONFIG, no ~/.kube/config)")?,
    };
    let client = kube::Client::try_from(config).context("making the API client")?;
    let resource = kube::core::ApiResource {
        group: crate::spokes::GROUP.into(),
        version: "v1alpha1".into(),
        api_version: crate::spokes::API_VERSION.into(),
        kind: crate::spokes::KIND.into(),
        plural: "spokes".into(),
    };
    Ok(kube::Api::all_with(client, &resource))
}

async fn set_unschedulable(
    api: &kube::Api<kube::core::DynamicObject>,
    name: &str,
    unschedulable: bool,
) -> anyhow::Result<()> {
    let patch = serde_json::json!({"spec": {"unschedulable": unschedulable}});
    api.patch(
        name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .with_context(|| format!("patching spoke/{name}"))?;
    Ok(())
}

fn render_command(args: RenderArgs) -> anyhow::Result<ExitCode> {
    let RenderArgs {
        files,
        plugins_dir,
        output,
        target,
        cache_dir,
    } = args;
    let mut inputs = Inputs::default();
    for file in &files {
        let name = file.display().to_string();
        let text = if name == "-" {
            std::io::read_to_string(std::io::stdin()).context("reading stdin")?
        } else {
            std::fs::read_to_string(file).with_context(|| format!("reading {name}"))?
        };
        inputs.add(&name, render::parse_documents(&name, &text)?)?;
    }
    if inputs.runtimes.is_empty() {
        inputs.add_builtin_runtimes()?;
    }

    let cache_dir = cache_dir.or_else(default_cache_dir);
    let host = Arc::new(Host::new(&HostConfig {
        cache_dir,
        ..HostConfig::default()
    })?);
    let builtins = crate::builtin::load(&host)?;
    let registry = Registry::new(host, builtins, plugins_dir);
    let snapshot = registry.snapshot();
    for (file, problem) in snapshot.problems() {
        eprintln!("warning: plugin {} not loaded: {problem}", file.display());
    }
    let target = trainhub_plugin_sdk::Target {
        name: target,
        labels: Vec::new(),
        resources: Vec::new(),
    };

    match render::render(&inputs, &snapshot, &target) {
        Ok((objects, warnings)) => {
            for w in warnings {
                eprintln!("Warning: {w}");
            }
            let mut out = std::io::stdout().lock();
            match output {
                Output::Json => {
                    let list =
                        serde_json::json!({"apiVersion": "v1", "kind": "List", "items": objects});
                    serde_json::to_writer_pretty(&mut out, &list)?;
                    writeln!(out)?;
                }
                Output::Yaml => {
                    for object in &objects {
                        writeln!(out, "---")?;
                        out.write_all(serde_saphyr::to_string(object)?.as_bytes())?;
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(RenderError::Invalid { job, errors }) => {
            eprintln!("The TrainJob {job:?} is invalid:");
            for e in &errors {
                let field = if e.field.is_empty() {
                    "<root>"
                } else {
                    &e.field
                };
                match &e.value {
                    Some(v) => eprintln!("* {field}: {}: {v:?}: {}", kind_text(e.kind), e.detail),
                    None => eprintln!("* {field}: {}: {}", kind_text(e.kind), e.detail),
                }
            }
            Ok(ExitCode::FAILURE)
        }
        Err(other) => Err(other.into()),
    }
}

/// Kubernetes' wording of a field error type.
pub fn kind_text(kind: trainhub_plugin_sdk::ErrorKind) -> &'static str {
    use trainhub_plugin_sdk::ErrorKind::*;
    match kind {
        Required => "Required value",
        Invalid => "Invalid value",
        Forbidden => "Forbidden",
        NotSupported => "Unsupported value",
        Duplicate => "Duplicate value",
        TooMany => "Too many",
    }
}

fn default_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("trainhub").join("wasm"))
}
