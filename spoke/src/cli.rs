//! The `trainspoke` command line.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::agent::{self, AgentConfig};
use crate::backend::process::{ProcessBackend, ProcessConfig, parse_quantity_milli};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// Every pod of a run is a local process (no Kubernetes needed).
    Process,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Joins this machine or cluster to a trainhub hub and runs the TrainJobs
/// it places here.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "trainspoke", version)]
pub struct Args {
    /// The hub's gRPC endpoint, `https://HOST:PORT`.
    #[arg(long, env = "TRAINSPOKE_HUB")]
    pub hub: String,
    /// PEM file of the CA that signed the hub's certificate.
    #[arg(long)]
    pub ca: PathBuf,
    /// PEM files of this spoke's client certificate (its CN is the spoke's
    /// name) and key, as `trainctl certs spoke` writes them.
    #[arg(long)]
    pub cert: PathBuf,
    #[arg(long)]
    pub key: PathBuf,
    /// Name to check the hub's certificate against (default: the host in --hub).
    #[arg(long)]
    pub tls_server_name: Option<String>,
    /// A label placement can select on, `KEY=VALUE`; repeatable.
    #[arg(long = "label", value_name = "KEY=VALUE")]
    pub labels: Vec<String>,
    #[arg(long, value_enum, default_value_t = BackendKind::Process)]
    pub backend: BackendKind,
    /// Process backend: where runs keep their working directories and logs.
    #[arg(long, default_value = ".trainspoke")]
    pub work_dir: PathBuf,
    /// Process backend: declared capacity, `RESOURCE=QUANTITY` comma
    /// separated (e.g. `cpu=8,memory=32Gi,nvidia.com/gpu=0`).
    #[arg(long, default_value = "cpu=4,memory=8Gi")]
    pub capacity: String,
    /// Seconds between heartbeats.
    #[arg(long, default_value_t = 5)]
    pub heartbeat_seconds: u64,
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Serve `/metrics` (Prometheus), `/livez` and `/readyz` over plain
    /// HTTP on `HOST:PORT` (e.g. `0.0.0.0:8080`); off when not given.
    #[arg(long, value_name = "HOST:PORT")]
    pub http_address: Option<std::net::SocketAddr>,
}

pub fn main(args: Args) -> ExitCode {
    let mut telemetry = init_telemetry(&args);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(run(args));
    if let Some(t) = telemetry.as_mut() {
        t.shutdown();
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Logs, and traces when `OTEL_EXPORTER_OTLP_ENDPOINT` is set, with the
/// resource `service.name=trainspoke`, `service.instance.id` the spoke's
/// name (its certificate's CN) and `k8s.cluster.name` its `cluster` label.
fn init_telemetry(args: &Args) -> Option<trainhub_telemetry::Telemetry> {
    let mut resource = Vec::new();
    if let Some(name) = std::fs::read(&args.cert)
        .ok()
        .and_then(|pem| common_name(&pem))
    {
        resource.push(("service.instance.id".to_string(), name));
    }
    if let Ok(labels) = parse_pairs("--label", &args.labels)
        && let Some(cluster) = labels.get("cluster")
    {
        resource.push(("k8s.cluster.name".to_string(), cluster.clone()));
    }
    trainhub_telemetry::Telemetry::init(trainhub_telemetry::Options {
        service_name: "trainspoke",
        log_format: match args.log_format {
            LogFormat::Text => trainhub_telemetry::LogFormat::Text,
            LogFormat::Json => trainhub_telemetry::LogFormat::Json,
        },
        resource,
    })
    .ok()
}

/// The Subject CN of the first certificate in `pem`.
fn common_name(pem: &[u8]) -> Option<String> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem).ok()?;
    let cert = pem.parse_x509().ok()?;
    let cn = cert.subject().iter_common_name().next()?;
    cn.as_str().ok().map(String::from)
}

/// `KEY=VALUE,...` into a map, naming the flag in errors.
pub fn parse_pairs(flag: &str, items: &[String]) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for item in items
        .iter()
        .flat_map(|i| i.split(','))
        .filter(|i| !i.trim().is_empty())
    {
        let Some((k, v)) = item.split_once('=') else {
            bail!("{flag}: {item:?} is not KEY=VALUE");
        };
        out.insert(k.trim().to_string(), v.trim().to_string());
    }
    Ok(out)
}

/// `--capacity` into milli-units per resource.
pub fn parse_capacity(text: &str) -> Result<BTreeMap<String, i64>> {
    parse_pairs("--capacity", &[text.to_string()])?
        .into_iter()
        .map(|(k, v)| {
            let milli =
                parse_quantity_milli(&v).map_err(|e| anyhow::anyhow!("--capacity {k}: {e}"))?;
            Ok((k, milli))
        })
        .collect()
}

pub async fn run(args: Args) -> Result<()> {
    let Args {
        hub,
        ca,
        cert,
        key,
        tls_server_name,
        labels,
        backend,
        work_dir,
        capacity,
        heartbeat_seconds,
        log_format: _,
        http_address,
    } = args;
    let read = |p: &PathBuf| {
        std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
    };
    let mut config = AgentConfig::new(hub, read(&ca)?, read(&cert)?, read(&key)?);
    config.tls_server_name = tls_server_name;
    config.labels = parse_pairs("--label", &labels)?;
    config.heartbeat = Duration::from_secs(heartbeat_seconds.max(1));
    let (reports_tx, reports_rx) = tokio::sync::mpsc::unbounded_channel();
    let backend: Arc<dyn crate::backend::Backend> = match backend {
        BackendKind::Process => ProcessBackend::new(
            ProcessConfig {
                work_dir,
                capacity: parse_capacity(&capacity)?,
                path_env: None,
            },
            reports_tx,
        )
        .context("starting the process backend")?,
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let http = match http_address {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("--http-address {addr}: listening"))?;
            let backend = backend.clone();
            let mut stop = stop_rx.clone();
            Some(tokio::spawn(async move {
                let stopped = async move {
                    let _ = stop.wait_for(|s| *s).await;
                };
                if let Err(e) = crate::metrics::serve(listener, backend, stopped).await {
                    tracing::error!(error = %e, "the HTTP endpoint failed");
                }
            }))
        }
        None => None,
    };
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    agent::run(config, backend, reports_rx, shutdown).await;
    let _ = stop_tx.send(true);
    if let Some(http) = http {
        let _ = http.await;
    }
    Ok(())
}
