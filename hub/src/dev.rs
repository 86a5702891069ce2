//! `trainhub dev`: the embedded default. One hub on 127.0.0.1 with its own
//! CA, an admin token, the built-in runtimes and plugins, and a kubeconfig
//! that kubectl and the Kubeflow SDK use as they are.
//!
//! Everything lives in the data directory and is reused on the next start:
//! `pki/` (CA and the hub's serving certificate), `tokens.csv` (the admin
//! token on its first line; more users may follow), `policy.yaml` (optional:
//! namespace grants, see `trainhub_apiserver::auth`), `store.redb`,
//! `plugin-cache/`. `kubeconfig` is written when the
//! hub is ready to serve, and removed at start, so its presence means ready.
//!
//! The data directory is made 0700 and its keys and tokens 0600. The local
//! spokes run TrainJobs in a sandbox (see
//! `trainhub_spoke::backend::process::sandbox`) that hides the whole data
//! directory from them but for the pod's own directory.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use anyhow::{Context, Result};
use trainhub_apiserver::kubeconfig::{Kubeconfig, KubeconfigParams};
use trainhub_apiserver::pki::{PemDir, write_file_atomically};

use crate::hub::{self, Config, Hub};

#[derive(Debug, Clone, clap::Args)]
pub struct DevArgs {
    /// Where the hub keeps its store, certificates, token and kubeconfig.
    #[arg(long, default_value = ".trainhub")]
    pub data_dir: PathBuf,
    /// Port of the Kubernetes API on 127.0.0.1 (0: any free port).
    #[arg(long, default_value_t = 6443)]
    pub api_port: u16,
    /// Local spokes (process backend) to start, connected over gRPC with
    /// mutual TLS on 127.0.0.1.
    #[arg(long, default_value_t = 2)]
    pub spokes: usize,
    /// Capacity each local spoke declares, `RESOURCE=QUANTITY,...`.
    #[arg(long, default_value = "cpu=4,memory=8Gi")]
    pub spoke_capacity: String,
    /// Port of the spokes' gRPC endpoint on 127.0.0.1 (0: any free port).
    #[arg(long, default_value_t = 0)]
    pub grpc_port: u16,
    /// TrainJobs (YAML) to submit once the hub is ready; their progress and,
    /// when they finish, their logs are printed.
    #[arg(long = "apply", value_name = "FILE")]
    pub apply: Vec<PathBuf>,
    #[command(flatten)]
    pub dispatch: crate::dispatch::DispatchArgs,
    /// The local spokes stop their runs (fence themselves) when they have
    /// heard nothing from the hub for this many seconds (default: two
    /// thirds of --worker-lost-timeout-seconds); must be strictly less than
    /// --worker-lost-timeout-seconds.
    #[arg(long, value_name = "SECONDS")]
    pub spoke_fence_after_seconds: Option<f64>,
    /// Events are removed this long after their last write (kube-apiserver's
    /// `--event-ttl`; Go duration syntax; 0 keeps them).
    #[arg(long, default_value = "1h0m0s", value_parser = crate::controller::events::parse_go_duration)]
    pub event_ttl: std::time::Duration,
    /// Custom plugins directory, hot-reloaded.
    #[arg(long)]
    pub plugins_dir: Option<PathBuf>,
    /// When the hub runs as root: the uids the local spokes' runs get, one
    /// per run, `FIRST-LAST` (or one `UID`); `none` keeps the hub's uid.
    #[arg(long, value_name = "UIDS", default_value_t = trainhub_spoke::backend::process::RunAsUser::default())]
    pub run_as_user: trainhub_spoke::backend::process::RunAsUser,
    #[command(flatten)]
    pub api_limits: crate::api_limits::ApiLimitsArgs,
    /// etcd client URLs, comma-separated: the hub keeps its objects in
    /// etcd (under `/trainhub`) instead of `store.redb`; try several
    /// replicas with --replicas.
    #[arg(long, value_delimiter = ',')]
    pub etcd_servers: Vec<String>,
    /// Hub replicas to start in this process (needs --etcd-servers), on
    /// consecutive ports from --api-port (and from --grpc-port, unless 0);
    /// one leads, the others follow. The kubeconfig points at the first;
    /// the local spokes get every replica's gRPC address and follow the
    /// leader.
    #[arg(long, default_value_t = 1)]
    pub replicas: usize,
    #[command(flatten)]
    pub election: crate::leader::ElectionArgs,
    #[command(flatten)]
    pub plugin_sources: crate::plugins::sources::SourceArgs,
    #[command(flatten)]
    pub dashboard: crate::dashboard::DashboardArgs,
}

const ADMIN_USER: &str = "admin";
const CONTEXT: &str = "trainhub-dev";

pub async fn run(
    args: DevArgs,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    // Absolute from here on: the plugin cache, the spokes' run directories
    // and the kubeconfig's paths must not depend on a later working directory.
    let dir = &std::path::absolute(&args.data_dir)
        .with_context(|| format!("resolving {}", args.data_dir.display()))?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    {
        // The store, the CA's key and the tokens are inside: for no one else.
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("making {} private (0700)", dir.display()))?;
    }
    let kubeconfig = dir.join("kubeconfig");
    match std::fs::remove_file(&kubeconfig) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("removing the old {}", kubeconfig.display()));
        }
        _ => {}
    }
    let pki = PemDir::new(dir.join("pki"));
    let ca = pki.load_or_create_ca("trainhub-dev-ca")?;
    if !pki.contains("hub") {
        let issued = ca.issue_server(
            "trainhub",
            &["localhost"],
            &[IpAddr::V4(Ipv4Addr::LOCALHOST)],
        )?;
        pki.write("hub", &issued)?;
    }
    let token = admin_token(dir)?;
    let mut spokes = Vec::new();
    for i in 1..=args.spokes {
        let name = format!("spoke-{i}");
        // Issued for DEFAULT_CERT_DAYS, and again when it expires within
        // the warning window (or cannot be read).
        let expiring = pki
            .read(&name)
            .ok()
            .and_then(|i| trainhub_apiserver::pki::CertInfo::from_pem(&i.cert_pem).ok())
            .is_none_or(|c| {
                c.not_after - jiff::Timestamp::now().as_second()
                    < crate::spokes::EXPIRY_WARNING.as_secs() as i64
            });
        if expiring {
            pki.write(
                &name,
                &ca.issue_client_for(
                    &name,
                    &[crate::grpc::SPOKE_GROUP],
                    crate::spokes::DEFAULT_CERT_DAYS,
                )?,
            )?;
        }
        spokes.push((
            name.clone(),
            pki.read(&name)?,
            trainhub_spoke::certs::CertFiles {
                cert: pki.cert_path(&name),
                key: pki.key_path(&name),
                ca: pki.cert_path("ca"),
            },
        ));
    }
    let capacity = trainhub_spoke::cli::parse_capacity(&args.spoke_capacity)?;
    let worker_lost_ms = args
        .dispatch
        .worker_lost_timeout_seconds
        .saturating_mul(1000);
    let fence_after = match args.spoke_fence_after_seconds {
        Some(s) if s.is_finite() && s > 0.0 => std::time::Duration::from_secs_f64(s),
        Some(s) => anyhow::bail!("--spoke-fence-after-seconds {s}: must be more than 0"),
        None => std::time::Duration::from_millis(worker_lost_ms / 3 * 2),
    };
    crate::dispatch::check_fence_after(
        i64::try_from(fence_after.as_millis()).unwrap_or(i64::MAX),
        worker_lost_ms,
    )
    .map_err(|rule| anyhow::anyhow!("the local spokes' --spoke-fence-after-seconds: {rule}"))?;
    // The hub answers heartbeats: a local spoke hears from it at least
    // this often while connected.
    let heartbeat = std::time::Duration::from_secs(1).min(fence_after / 3);
    let mut to_apply = Vec::new();
    for file in &args.apply {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        to_apply.extend(crate::render::parse_documents(
            &file.display().to_string(),
            &text,
        )?);
    }
    if args.replicas == 0 {
        anyhow::bail!("--replicas must be at least 1");
    }
    if args.replicas > 1 && args.etcd_servers.is_empty() {
        anyhow::bail!(
            "--replicas {} needs --etcd-servers: replicas share an etcd store (redb is one process's)",
            args.replicas
        );
    }
    let port = |base: u16, i: usize| -> Result<u16> {
        if base == 0 {
            return Ok(0);
        }
        u16::try_from(usize::from(base) + i)
            .map_err(|_| anyhow::anyhow!("port {base} + {i} is past 65535"))
    };
    let mut hubs = Vec::new();
    for i in 0..args.replicas {
        let config = Config {
            // One replica keeps the data directory's layout as it always was.
            data_dir: if args.replicas == 1 {
                dir.clone()
            } else {
                dir.join(format!("replica-{i}"))
            },
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port(args.api_port, i)?),
            tls_cert: pki.cert_path("hub"),
            tls_key: pki.key_path("hub"),
            client_ca: Some(pki.cert_path("ca")),
            token_file: Some(dir.join("tokens.csv")),
            policy_file: Some(dir.join("policy.yaml")).filter(|p| p.exists()),
            plugins_dir: args.plugins_dir.clone(),
            grpc_listen: Some(SocketAddr::new(
                IpAddr::V4(Ipv4Addr::LOCALHOST),
                port(args.grpc_port, i)?,
            )),
            spoke_ca: Some(pki.cert_path("ca")),
            dispatch: args.dispatch.config(),
            event_ttl: args.event_ttl,
            api_limits: args.api_limits.clone(),
            // The local spokes' pods reach the API where it listens.
            plugin_sources: args.plugin_sources.clone(),
            dashboard: args.dashboard.clone(),
            trainer_status: Some(hub::TrainerStatusConfig {
                url: None,
                ca_file: pki.cert_path("ca"),
            }),
        };
        let replication = hub::Replication {
            storage: if args.etcd_servers.is_empty() {
                hub::Storage::Redb
            } else {
                hub::Storage::Etcd(trainhub_apiserver::store::EtcdConfig {
                    endpoints: args.etcd_servers.clone(),
                    prefix: "/trainhub".into(),
                    ..Default::default()
                })
            },
            election: args.election.timings(),
            identity: Some(format!("dev-replica-{i}")),
            advertise_api: None,
            advertise_grpc: None,
        };
        hubs.push(Hub::open_replicated(config, replication).await?);
    }
    let mut hubs = hubs.into_iter();
    let Some(hub) = hubs.next() else {
        anyhow::bail!("no hub replica");
    };
    hub.install(hub::default_objects()?).await?;
    // The other replicas serve first: the spokes get every address.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut grpc_addrs = Vec::new();
    let mut others = Vec::new();
    for (i, replica) in hubs.enumerate() {
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let mut stop = stop_rx.clone();
        others.push(tokio::spawn(async move {
            let served = replica
                .serve(
                    |addrs| {
                        let _ = ready_tx.send(addrs);
                    },
                    async move {
                        let _ = stop.wait_for(|s| *s).await;
                    },
                )
                .await;
            if let Err(e) = served {
                tracing::error!(replica = i + 2, error = %e, "a hub replica failed");
            }
        }));
        match ready_rx.await {
            Ok(addrs) => {
                tracing::info!(replica = i + 2, api = %addrs.api, "hub replica serving");
                grpc_addrs.extend(addrs.grpc);
            }
            Err(_) => anyhow::bail!("hub replica {} did not start", i + 2),
        }
    }
    let shutdown = async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    };
    let ca_pem = ca.cert_pem().to_string();
    let mut written = Ok(());
    let server = hub.server.clone();
    let store = hub.store.clone();
    // The API's log source: on a follower replica, streamed from the leader.
    let logs = hub.logs.clone();
    let spokes_dir = dir.join("spokes");
    let sandbox = trainhub_spoke::backend::process::SandboxConfig {
        run_as_user: args.run_as_user.0,
        hide: vec![dir.clone()],
        disabled: false,
    };
    hub.serve(
        |addrs| {
            let addr = addrs.api;
            if let Some(grpc) = addrs.grpc {
                let hub_urls = std::iter::once(grpc)
                    .chain(grpc_addrs)
                    .map(|a| format!("https://{a}"))
                    .collect::<Vec<_>>()
                    .join(",");
                for (name, issued, files) in spokes {
                    let work_dir = spokes_dir.join(&name);
                    let config = trainhub_spoke::agent::AgentConfig {
                        heartbeat,
                        fence_after,
                        labels: [("trainhub.kubeflow.org/spoke".to_string(), name.clone())].into(),
                        cert_files: Some(files),
                        ..trainhub_spoke::agent::AgentConfig::new(
                            hub_urls.clone(),
                            ca_pem.clone(),
                            issued.cert_pem,
                            issued.key_pem,
                        )
                    };
                    let capacity = capacity.clone();
                    let sandbox = sandbox.clone();
                    tokio::spawn(async move {
                        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                        // Starting kills what a previous run left and waits
                        // (up to seconds) for it to be gone: not on a worker
                        // that owes other tasks.
                        let start = || {
                            trainhub_spoke::backend::process::ProcessBackend::new(
                                trainhub_spoke::backend::process::ProcessConfig {
                                    work_dir,
                                    capacity,
                                    path_env: None,
                                    sandbox,
                                    gpus: Vec::new(),
                                },
                                tx,
                            )
                        };
                        let started = match tokio::runtime::Handle::current().runtime_flavor() {
                            tokio::runtime::RuntimeFlavor::CurrentThread => start(),
                            _ => tokio::task::block_in_place(start),
                        };
                        let backend = match started {
                            Ok(b) => b,
                            Err(e) => {
                                tracing::error!(spoke = %name, error = %e, "starting a local spoke");
                                return;
                            }
                        };
                        trainhub_spoke::agent::run(config, backend, rx, std::future::pending()).await;
                    });
                }
            }
            if !to_apply.is_empty() {
                tokio::spawn(apply_and_follow(server, store, logs, to_apply));
            }
            written = Kubeconfig::write(
                &kubeconfig,
                &KubeconfigParams {
                    cluster_name: CONTEXT.into(),
                    server_url: format!("https://{addr}"),
                    ca_pem,
                    user_name: ADMIN_USER.into(),
                    token: Some(token),
                    client_cert_pem: None,
                    client_key_pem: None,
                    namespace: Some("default".into()),
                },
            )
            .map_err(anyhow::Error::from);
            if written.is_ok() {
                println!(
                    "trainhub dev is ready: export KUBECONFIG={}",
                    kubeconfig.display()
                );
                println!(
                    "dashboard: https://{addr}/dashboard/ (log in with the admin token, the first field of {})",
                    dir.join("tokens.csv").display()
                );
            }
        },
        shutdown,
    )
    .await?;
    for other in others {
        let _ = other.await;
    }
    written
}

/// Submits `objects` as the admin would, prints each TrainJob's progress,
/// and, once it finished, the log of each of its pods.
async fn apply_and_follow(
    server: std::sync::Arc<trainhub_apiserver::server::Server>,
    store: std::sync::Arc<dyn trainhub_apiserver::store::Store>,
    logs: std::sync::Arc<dyn trainhub_apiserver::server::LogSource>,
    objects: Vec<serde_json::Value>,
) {
    use futures_util::StreamExt;
    use trainhub_apiserver::store::Key;
    let mut jobs = Vec::new();
    for mut object in objects {
        if object["metadata"]["namespace"].is_null() {
            object["metadata"]["namespace"] = "default".into();
        }
        let kind = object["kind"].as_str().unwrap_or_default().to_string();
        let name = object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let namespace = object["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        match server.create_object(object).await {
            Ok(_) => println!("{kind}/{name} created"),
            Err(e) if e.code == 409 => println!("{kind}/{name} exists"),
            Err(e) => {
                println!("{kind}/{name}: {}", e.message);
                continue;
            }
        }
        if kind == "TrainJob" {
            jobs.push((namespace, name));
        }
    }
    for (namespace, name) in jobs {
        let key = Key::new(crate::api::TRAINJOBS, Some(&namespace), &name);
        let mut last = String::new();
        let finished = loop {
            let Some(object) = store.get(&key) else {
                break None;
            };
            let status = &object.value["status"];
            let state = ["Complete", "Failed"]
                .into_iter()
                .find(|t| crate::controller::lifecycle::is_true(status, t));
            let (pods, _) = store.list(crate::api::PODS, Some(&namespace));
            let mine: Vec<_> = pods
                .iter()
                .filter(|p| {
                    p.value["metadata"]["labels"][trainhub_api::constants::LABEL_JOBSET_NAME]
                        == name.as_str()
                })
                .collect();
            let phases: Vec<String> = mine
                .iter()
                .map(|p| {
                    format!(
                        "{}={}",
                        p.key.name,
                        p.value["status"]["phase"].as_str().unwrap_or("?")
                    )
                })
                .collect();
            let line = format!(
                "trainjob/{name}: {} {}",
                state.unwrap_or(if mine.is_empty() { "Queued" } else { "Running" }),
                phases.join(" ")
            );
            if line != last {
                println!("{line}");
                last = line;
            }
            if state.is_some() {
                break Some(
                    mine.into_iter()
                        .map(|p| p.value.clone())
                        .collect::<Vec<_>>(),
                );
            }
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        };
        for pod in finished.unwrap_or_default() {
            let pod_name = pod["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            println!("--- logs of pod {pod_name} ---");
            match logs.logs(&pod, None, false, None).await {
                Ok(mut stream) => {
                    while let Some(Ok(chunk)) = stream.next().await {
                        print!("{}", String::from_utf8_lossy(&chunk));
                    }
                }
                Err(e) => println!("(no logs: {})", e.message),
            }
        }
    }
}

/// The admin token of the dev hub, created on first start (`tokens.csv`).
fn admin_token(dir: &std::path::Path) -> Result<String> {
    let path = dir.join("tokens.csv");
    let existing = std::fs::read_to_string(&path).ok().and_then(|text| {
        text.lines()
            .find_map(|l| l.split(',').next())
            .filter(|t| !t.is_empty())
            .map(str::to_string)
    });
    if let Some(token) = existing {
        return Ok(token);
    }
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("generating a token: {e}"))?;
    let token = hex::encode(bytes);
    let line = format!("{token},{ADMIN_USER},{ADMIN_USER},\"system:masters\"\n");
    write_file_atomically(&path, line.as_bytes(), 0o600)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(token)
}
