//! `trainctl` commands.

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
    },
    /// Issue a spoke's client certificate (`NAME.crt`, `NAME.key`); NAME,
    /// its Subject CN, is the spoke's name at the hub.
    Spoke {
        name: String,
        #[arg(long, default_value = "pki")]
        dir: PathBuf,
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
        } => {
            let pki = PemDir::new(&dir);
            let ca = pki
                .read_ca()
                .context("no CA: run `trainctl certs init` first")?;
            let names: Vec<&str> = dns_names.iter().map(String::as_str).collect();
            let issued = ca.issue_server("trainhub", &names, &ips)?;
            pki.write("hub", &issued)?;
            println!("hub certificate in {}", pki.cert_path("hub").display());
        }
        CertsCommand::Spoke { name, dir } => {
            if !crate::grpc::is_dns_label(&name) {
                anyhow::bail!(
                    "spoke name {name:?}: must be a DNS-1123 label (lowercase letters, digits and '-', at most 63)"
                );
            }
            let pki = PemDir::new(&dir);
            let ca = pki
                .read_ca()
                .context("no CA: run `trainctl certs init` first")?;
            let issued = ca.issue_client(&name, &[crate::grpc::SPOKE_GROUP])?;
            pki.write(&name, &issued)?;
            println!("spoke certificate in {}", pki.cert_path(&name).display());
        }
    }
    Ok(ExitCode::SUCCESS)
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
