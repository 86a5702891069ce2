//! The `trainspoke` command line.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::agent::{self, AgentConfig};
use crate::backend::kube::capacity::GPU_PRODUCT_LABEL;
use crate::backend::kube::{KubeBackend, KubeConfig};
use crate::backend::process::{
    ProcessBackend, ProcessConfig, RunAsUser, SandboxConfig, devices, format_milli,
    parse_quantity_milli,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// Every pod of a run is a local process (no Kubernetes needed).
    Process,
    /// Runs are JobSets in a Kubernetes cluster (--kubeconfig, or the
    /// default kubeconfig, or the in-cluster service account).
    Kube,
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
    /// The hub's gRPC endpoint, `https://HOST:PORT`; for a hub of several
    /// replicas, each replica's, comma-separated (or one Service name in
    /// front of them). A replica that does not lead refuses the session
    /// and names the leader, which the spoke dials next; its runs keep
    /// running meanwhile.
    #[arg(long, env = "TRAINSPOKE_HUB")]
    pub hub: String,
    /// PEM file of the CA that signed the hub's certificate.
    #[arg(long)]
    pub ca: PathBuf,
    /// PEM files of this spoke's client certificate (its CN is the spoke's
    /// name) and key, as `trainctl certs spoke` writes them. Read again on
    /// every connect; when they (or --ca) change on disk, e.g. after
    /// `trainctl certs renew`, the spoke reconnects with them.
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
    /// separated (e.g. `cpu=8,memory=32Gi,nvidia.com/gpu=0`). Default: the
    /// machine's CPUs, its memory less max(1Gi, 10%), the NVIDIA GPUs
    /// `nvidia-smi` lists and the AMD GPUs of the KFD topology in sysfs
    /// (see docs/gpus.md).
    #[arg(long)]
    pub capacity: Option<String>,
    /// Process backend, spoke running as root: the uids runs get, one per
    /// run, `FIRST-LAST` (or one `UID`); `none` keeps the spoke's uid. The
    /// range must hold no real user's uid.
    #[arg(long, value_name = "UIDS", default_value_t = RunAsUser::default())]
    pub run_as_user: RunAsUser,
    /// Process backend: a file or directory runs must not see, besides the
    /// work directory and --key (hidden always); repeatable.
    #[arg(long = "sandbox-hide", value_name = "PATH")]
    pub sandbox_hide: Vec<PathBuf>,
    /// Kube backend: the kubeconfig file to use (default: $KUBECONFIG or
    /// ~/.kube/config, else the in-cluster service account).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Kube backend: create a run's namespace when the cluster lacks it.
    #[arg(long)]
    pub create_namespaces: bool,
    /// Kube backend: leave admission to Kueue: JobSets are created suspended
    /// in this LocalQueue (label kueue.x-k8s.io/queue-name).
    #[arg(long)]
    pub kueue_queue: Option<String>,
    /// Kube backend: the server-side apply field manager.
    #[arg(long, default_value = "trainspoke")]
    pub field_manager: String,
    /// Seconds between heartbeats.
    #[arg(long, default_value_t = 5)]
    pub heartbeat_seconds: u64,
    /// Self-fencing: when nothing has been heard from the hub for this
    /// many seconds, every run not finished is stopped and reported lost
    /// (`Fenced`) on the next connect. Must be strictly less than the hub's
    /// --worker-lost-timeout-seconds (the hub refuses the session
    /// otherwise), with a margin for the time a message takes.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    pub fence_after_seconds: u64,
    /// An admitted offer neither started nor withdrawn by the hub is
    /// released after this many seconds.
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..))]
    pub reservation_ttl_seconds: u64,
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

/// Says the capacity the process backend declares, and warns when it
/// declares GPUs other than those found.
fn say_capacity(capacity: &BTreeMap<String, i64>, machine: &devices::Discovered) {
    let shown: Vec<String> = capacity
        .iter()
        .map(|(k, v)| format!("{k}={}", format_milli(*v)))
        .collect();
    let gpus: Vec<&str> = machine.gpus.iter().map(|g| g.id.as_str()).collect();
    tracing::info!(capacity = %shown.join(","), ?gpus, "process backend capacity");
    for vendor in devices::Vendor::ALL {
        let resource = vendor.resource();
        let declared = capacity.get(resource).copied().unwrap_or(0);
        let found = machine.capacity.get(resource).copied().unwrap_or(0);
        if declared != found && found > 0 {
            tracing::warn!(
                declared = %format_milli(declared),
                found = %format_milli(found),
                "--capacity declares another number of {resource} than were found: pods get only GPUs found, and wait for them"
            );
        }
    }
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
        run_as_user,
        sandbox_hide,
        kubeconfig,
        create_namespaces,
        kueue_queue,
        field_manager,
        heartbeat_seconds,
        fence_after_seconds,
        reservation_ttl_seconds,
        log_format: _,
        http_address,
    } = args;
    let read = |p: &PathBuf| {
        std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
    };
    let mut config = AgentConfig::new(hub, read(&ca)?, read(&cert)?, read(&key)?);
    // Rotated files are picked up without a restart.
    config.cert_files = Some(crate::certs::CertFiles {
        cert: cert.clone(),
        key: key.clone(),
        ca: ca.clone(),
    });
    config.tls_server_name = tls_server_name;
    config.labels = parse_pairs("--label", &labels)?;
    config.heartbeat = Duration::from_secs(heartbeat_seconds.max(1));
    config.fence_after = Duration::from_secs(fence_after_seconds);
    config.reservation_ttl = Duration::from_secs(reservation_ttl_seconds);
    if config.heartbeat >= config.fence_after {
        bail!(
            "--heartbeat-seconds {heartbeat_seconds} must be less than --fence-after-seconds {fence_after_seconds}: the hub answers heartbeats, and a spoke that hears nothing for fence-after stops its runs"
        );
    }
    let (reports_tx, reports_rx) = tokio::sync::mpsc::unbounded_channel();
    let backend: Arc<dyn crate::backend::Backend> = match backend {
        BackendKind::Process => {
            // nvidia-smi and rocm-smi may take seconds: not on a worker thread.
            let machine = tokio::task::spawn_blocking(|| {
                devices::discover(None, std::path::Path::new(devices::SYSFS))
            })
            .await
            .context("discovering the machine's capacity")?;
            let capacity = match capacity {
                Some(text) => parse_capacity(&text)?,
                None => machine.capacity.clone(),
            };
            say_capacity(&capacity, &machine);
            for (label, product) in &machine.labels {
                config
                    .labels
                    .entry(label.clone())
                    .or_insert_with(|| product.clone());
            }
            ProcessBackend::new(
                ProcessConfig {
                    work_dir,
                    capacity,
                    path_env: None,
                    sandbox: SandboxConfig {
                        run_as_user: run_as_user.0,
                        hide: std::iter::once(key.clone()).chain(sandbox_hide).collect(),
                        disabled: false,
                    },
                    gpus: machine.gpus,
                },
                reports_tx,
            )
            .context("starting the process backend")?
        }
        BackendKind::Kube => {
            let client = kube_client(kubeconfig.as_deref()).await?;
            let backend = KubeBackend::connect(
                client,
                KubeConfig {
                    create_namespaces,
                    kueue_queue,
                    field_manager,
                    ..KubeConfig::default()
                },
                reports_tx,
            )
            .await
            .map_err(|e| anyhow::anyhow!("starting the kube backend: {e}"))?;
            let (product, seen) = backend.gpu_product();
            if let Some(product) = product {
                if seen.len() > 1 {
                    tracing::info!(?seen, chosen = %product, "nodes have several GPU products; the label names the one with the most GPUs");
                }
                config
                    .labels
                    .entry(GPU_PRODUCT_LABEL.to_string())
                    .or_insert(product);
            }
            backend
        }
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

/// A client of the cluster: from `kubeconfig`, else inferred (`$KUBECONFIG`
/// or `~/.kube/config`, else the in-cluster service account).
async fn kube_client(kubeconfig: Option<&std::path::Path>) -> Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading the kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("the kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer().await.context(
            "finding the cluster (no --kubeconfig, no default kubeconfig, not in a pod)",
        )?,
    };
    kube::Client::try_from(config).context("making the Kubernetes client")
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    const BASE: [&str; 9] = [
        "trainspoke",
        "--hub",
        "https://hub:6444",
        "--ca",
        "ca.crt",
        "--cert",
        "s.crt",
        "--key",
        "s.key",
    ];

    #[test]
    fn kube_backend_flags_parse_under_their_documented_names() {
        let args = Args::try_parse_from(BASE.iter().copied().chain([
            "--backend",
            "kube",
            "--kubeconfig",
            "/etc/kube/config",
            "--create-namespaces",
            "--kueue-queue",
            "team-a",
            "--field-manager",
            "spoke-eu",
        ]))
        .unwrap();
        assert_eq!(args.backend, BackendKind::Kube);
        assert_eq!(args.kubeconfig, Some(PathBuf::from("/etc/kube/config")));
        assert!(args.create_namespaces);
        assert_eq!(args.kueue_queue.as_deref(), Some("team-a"));
        assert_eq!(args.field_manager, "spoke-eu");
    }

    #[test]
    fn kube_backend_flags_default_to_no_namespaces_no_kueue_and_trainspoke() {
        let args = Args::try_parse_from(BASE.iter().copied().chain(["--backend", "kube"])).unwrap();
        assert_eq!(args.kubeconfig, None);
        assert!(!args.create_namespaces);
        assert_eq!(args.kueue_queue, None);
        assert_eq!(args.field_manager, "trainspoke");
        let default = Args::try_parse_from(BASE).unwrap();
        assert_eq!(default.backend, BackendKind::Process);
    }

    #[test]
    fn fencing_and_reservation_flags_default_to_the_documented_values() {
        let default = Args::try_parse_from(BASE).unwrap();
        assert_eq!(default.fence_after_seconds, 300);
        assert_eq!(default.reservation_ttl_seconds, 120);
        let args = Args::try_parse_from(BASE.iter().copied().chain([
            "--fence-after-seconds",
            "3",
            "--reservation-ttl-seconds",
            "10",
        ]))
        .unwrap();
        assert_eq!(
            (args.fence_after_seconds, args.reservation_ttl_seconds),
            (3, 10)
        );
        let zero = Args::try_parse_from(BASE.iter().copied().chain(["--fence-after-seconds", "0"]));
        assert!(zero.is_err(), "fencing cannot be turned off");
    }

    #[test]
    fn capacity_is_discovered_unless_given() {
        assert_eq!(Args::try_parse_from(BASE).unwrap().capacity, None);
        let args =
            Args::try_parse_from(BASE.iter().copied().chain(["--capacity", "cpu=2"])).unwrap();
        let capacity = parse_capacity(args.capacity.as_deref().unwrap()).unwrap();
        assert_eq!(capacity, BTreeMap::from([("cpu".to_owned(), 2000)]));
    }

    #[test]
    fn sandbox_flags_default_to_the_documented_uid_range() {
        use crate::backend::process::{DEFAULT_RUN_UIDS, UidRange};
        let default = Args::try_parse_from(BASE).unwrap();
        assert_eq!(default.run_as_user, RunAsUser(Some(DEFAULT_RUN_UIDS)));
        assert!(default.sandbox_hide.is_empty());
        let args = Args::try_parse_from(BASE.iter().copied().chain([
            "--run-as-user",
            "5000-5999",
            "--sandbox-hide",
            "/etc/trainspoke",
            "--sandbox-hide",
            "/home/spoke",
        ]))
        .unwrap();
        assert_eq!(
            args.run_as_user,
            RunAsUser(Some(UidRange {
                first: 5000,
                last: 5999
            }))
        );
        assert_eq!(args.sandbox_hide.len(), 2);
        let none = Args::try_parse_from(BASE.iter().copied().chain(["--run-as-user", "none"]));
        assert_eq!(none.unwrap().run_as_user, RunAsUser(None));
        let root = Args::try_parse_from(BASE.iter().copied().chain(["--run-as-user", "0"]))
            .unwrap_err()
            .to_string();
        assert!(root.contains("above 0"), "{root}");
    }
}
