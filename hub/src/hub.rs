//! The hub process: store, plugins, admission, API server and controllers,
//! assembled from a [`Config`] and served until shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::{Value, json};
use tokio::sync::watch;
use trainhub_apiserver::auth::{Authenticator, Policy, PolicyAuthorizer, TokenFile};
use trainhub_apiserver::reload::ReloadingCert;
use trainhub_apiserver::server::Server;
use trainhub_apiserver::store::{EtcdConfig, EtcdStore, RedbStore, Store};

use crate::admission::TrainerAdmission;
use crate::dispatch::{Dispatch, DispatchConfig};
use crate::grpc::{self, GrpcTls};
use crate::leader::{ElectionTimings, Replica, Role};
use crate::plugins::registry::Registry;
use crate::plugins::{Host, HostConfig};
use crate::{api, builtin, controller, render, spokes};

/// Where the hub publishes its own objects (the SDK's version ConfigMap);
/// created at start, cannot be deleted.
pub const SYSTEM_NAMESPACE: &str = "kubeflow-system";

/// Watch events kept for resuming watches after a disconnect or restart.
const WATCH_HISTORY: usize = 100_000;
/// How often the plugins directory is rescanned.
const PLUGIN_RESCAN: Duration = Duration::from_secs(2);

/// Where the hub keeps its state and how it serves.
#[derive(Debug, Clone)]
pub struct Config {
    /// The store (`store.redb`) and the plugin compilation cache live here.
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    /// PEM files of the serving certificate and key.
    pub tls_cert: PathBuf,
    pub tls_key: PathBuf,
    /// CA whose client certificates are accepted (user = CN, groups = O).
    pub client_ca: Option<PathBuf>,
    /// kube-apiserver's token file format: `token,user,uid,"group1,group2"`.
    pub token_file: Option<PathBuf>,
    /// Admin groups and namespace grants; see `trainhub_apiserver::auth`.
    pub policy_file: Option<PathBuf>,
    /// Custom plugins (`NAME.wasm` + optional `NAME.yaml`), hot-reloaded.
    pub plugins_dir: Option<PathBuf>,
    /// The spokes' gRPC endpoint (mutual TLS, served with the same
    /// certificate as the API); None: no spokes.
    pub grpc_listen: Option<SocketAddr>,
    /// CA whose certificates identify spokes (`trainctl certs spoke`).
    pub spoke_ca: Option<PathBuf>,
    pub dispatch: DispatchConfig,
    /// Events are removed this long after their last write; zero keeps
    /// them (until their TrainJob goes).
    pub event_ttl: std::time::Duration,
    /// Caps and timeouts of the API listener and per-user requests.
    pub api_limits: crate::api_limits::ApiLimitsArgs,
    /// Where the trainer's pods post their progress; None: they are not
    /// told (posts to `/status` are still taken from those allowed).
    pub trainer_status: Option<TrainerStatusConfig>,
    /// Registries and the trust policy of TrainerPlugin modules.
    pub plugin_sources: crate::plugins::sources::SourceArgs,
    /// The web dashboard's settings (it is served under `/dashboard/`).
    pub dashboard: crate::dashboard::DashboardArgs,
}

impl Config {
    /// A hub on 127.0.0.1 (a free port) with its state in `data_dir`,
    /// serving with `tls_cert` and `tls_key`, every other setting at its
    /// default: no spokes' endpoint, tokens, policy or plugins directory.
    pub fn local(data_dir: PathBuf, tls_cert: PathBuf, tls_key: PathBuf) -> Config {
        Config {
            data_dir,
            listen: SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), 0),
            tls_cert,
            tls_key,
            client_ca: None,
            token_file: None,
            policy_file: None,
            plugins_dir: None,
            grpc_listen: None,
            spoke_ca: None,
            dispatch: DispatchConfig::default(),
            event_ttl: crate::controller::events::DEFAULT_TTL,
            api_limits: Default::default(),
            trainer_status: None,
            plugin_sources: Default::default(),
            dashboard: Default::default(),
        }
    }
}

/// How the trainer's pods reach this hub's API to post `trainerStatus`.
#[derive(Debug, Clone)]
pub struct TrainerStatusConfig {
    /// The API as the pods reach it: `https://host:port`; None: the
    /// address the API listens on (`trainhub dev`: 127.0.0.1).
    pub url: Option<String>,
    /// PEM file of the CA that the pods verify the serving certificate with.
    pub ca_file: PathBuf,
}

/// The `trainhub serve` flags of the trainer status endpoint.
#[derive(Debug, Clone, clap::Args)]
pub struct TrainerStatusArgs {
    /// The hub's API as the training pods reach it (`https://host:port`):
    /// given, the trainer's containers get `KUBEFLOW_TRAINER_SERVER_URL`,
    /// `..._CA_CERT` and `..._TOKEN` to post their TrainJob's progress
    /// (`status.trainerStatus`) with, as Kubeflow Trainer's TrainJobStatus
    /// plugin gives them.
    #[arg(long)]
    pub trainer_status_url: Option<String>,
    /// PEM: the CA the pods verify the hub's serving certificate with
    /// (default: --client-ca-file, which `trainctl certs` makes the same CA).
    #[arg(long)]
    pub trainer_status_ca_file: Option<PathBuf>,
}

impl TrainerStatusArgs {
    /// # Errors
    ///
    /// A URL without a CA, or not `https://`.
    pub fn config(&self, client_ca: Option<&PathBuf>) -> Result<Option<TrainerStatusConfig>> {
        let Some(url) = &self.trainer_status_url else {
            return Ok(None);
        };
        if !url.starts_with("https://") {
            anyhow::bail!("--trainer-status-url must be an https:// URL, not {url:?}");
        }
        let ca_file = self
            .trainer_status_ca_file
            .clone()
            .or_else(|| client_ca.cloned())
            .context("--trainer-status-url needs --trainer-status-ca-file (or --client-ca-file)")?;
        Ok(Some(TrainerStatusConfig {
            url: Some(url.clone()),
            ca_file,
        }))
    }
}

/// Where the store is.
#[derive(Debug, Clone, Default)]
pub enum Storage {
    /// `store.redb` in the data directory: one process, always the leader.
    #[default]
    Redb,
    /// etcd, shared by every replica; one of them leads at a time.
    Etcd(EtcdConfig),
}

/// How a replica shares its store and takes part in leadership.
#[derive(Debug, Clone, Default)]
pub struct Replication {
    pub storage: Storage,
    pub election: ElectionTimings,
    /// Who this replica is in the election (default: the host name, then
    /// the API address).
    pub identity: Option<String>,
    /// `host:port` at which the other replicas reach this one's API
    /// (default: the API's listen address).
    pub advertise_api: Option<String>,
    /// `host:port` at which spokes reach this replica's gRPC endpoint
    /// (default: its listen address); followers send spokes here.
    pub advertise_grpc: Option<String>,
}

/// The storage flags of `trainhub serve` (kube-apiserver's names), and the
/// leader election's.
#[derive(Debug, Clone, clap::Args)]
pub struct StorageArgs {
    /// Where the hub keeps its objects: `redb` (a file in --data-dir, one
    /// process) or `etcd3` (shared by several hub replicas, one of which
    /// leads: runs dispatch, the spoke sessions and the controllers).
    /// `--store` is an alias.
    #[arg(long, alias = "store", default_value = "redb", value_parser = ["redb", "etcd3", "etcd"])]
    pub storage_backend: String,
    /// etcd client URLs, comma-separated (`https://10.0.0.1:2379,...`).
    #[arg(long, value_delimiter = ',')]
    pub etcd_servers: Vec<String>,
    /// PEM: the CA that signs etcd's serving certificates.
    #[arg(long)]
    pub etcd_cafile: Option<PathBuf>,
    /// PEM: this hub's client certificate for etcd (with --etcd-keyfile).
    #[arg(long)]
    pub etcd_certfile: Option<PathBuf>,
    /// PEM: the key of --etcd-certfile.
    #[arg(long)]
    pub etcd_keyfile: Option<PathBuf>,
    /// Every etcd key the hub writes starts with this; the leader election
    /// is at `PREFIX-leader`.
    #[arg(long, default_value = "/trainhub")]
    pub etcd_prefix: String,
    /// `host:port` at which the other replicas reach this replica's API
    /// (default: --listen).
    #[arg(long)]
    pub advertise_address: Option<String>,
    /// `host:port` at which spokes reach this replica's gRPC endpoint
    /// (default: --grpc-listen); a follower refuses spokes with the
    /// leader's.
    #[arg(long)]
    pub grpc_advertise_address: Option<String>,
    #[command(flatten)]
    pub election: crate::leader::ElectionArgs,
}

impl StorageArgs {
    /// # Errors
    ///
    /// etcd without --etcd-servers.
    pub fn replication(&self) -> Result<Replication> {
        let StorageArgs {
            storage_backend,
            etcd_servers,
            etcd_cafile,
            etcd_certfile,
            etcd_keyfile,
            etcd_prefix,
            advertise_address,
            grpc_advertise_address,
            election,
        } = self;
        let storage = match storage_backend.as_str() {
            "redb" => Storage::Redb,
            _ => {
                let endpoints: Vec<String> = etcd_servers
                    .iter()
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .collect();
                if endpoints.is_empty() {
                    anyhow::bail!(
                        "--storage-backend {storage_backend} needs --etcd-servers (comma-separated client URLs)"
                    );
                }
                Storage::Etcd(EtcdConfig {
                    endpoints,
                    ca_file: etcd_cafile.clone(),
                    cert_file: etcd_certfile.clone(),
                    key_file: etcd_keyfile.clone(),
                    prefix: etcd_prefix.clone(),
                })
            }
        };
        Ok(Replication {
            storage,
            election: election.timings(),
            identity: None,
            advertise_api: advertise_address.clone(),
            advertise_grpc: grpc_advertise_address.clone(),
        })
    }
}

/// The election a replica on a shared store campaigns in.
struct Election {
    client: etcd_client::Client,
    name: String,
    replication: Replication,
}

/// Where a serving hub listens.
#[derive(Debug, Clone, Copy)]
pub struct Addrs {
    pub api: SocketAddr,
    pub grpc: Option<SocketAddr>,
}

/// A hub, opened and ready to serve.
pub struct Hub {
    pub store: Arc<dyn Store>,
    pub plugins: Arc<Registry>,
    pub server: Arc<Server>,
    /// The dispatch of the hub's first term. On redb, the only one. With a
    /// shared store every term this replica leads builds its own dispatch
    /// from the store (as after a restart) over the store fenced by that
    /// term; see [`Hub::leading`].
    pub dispatch: Arc<Dispatch>,
    /// Pod logs as the API serves them: from the leading dispatch, or, on
    /// a follower, streamed from the leader.
    pub logs: Arc<dyn trainhub_apiserver::server::LogSource>,
    admission: Arc<TrainerAdmission>,
    /// The dispatch of the term this replica leads, None while it follows.
    current: watch::Sender<Option<Arc<Dispatch>>>,
    /// The token followers present for pod logs, while this replica leads.
    peer_token: Arc<crate::peer::PeerToken>,
    /// The `TrainerPlugin` objects' plugins, loaded on every replica.
    object_plugins: Arc<crate::plugins::objects::ObjectPlugins>,
    /// Signs the TrainJobs' status tokens; in the store, for all replicas.
    status_key: Arc<crate::trainer_status::SigningKey>,
    /// What the trainer's pods are told, if the hub offers it.
    reporting: Option<Arc<crate::trainer_status::Reporting>>,
    election: Option<Election>,
    /// Detached when the hub is dropped (see [`Hub::drop`]).
    dashboard: crate::dashboard::Dashboard,
    config: Config,
}

impl Drop for Hub {
    /// Breaks the dashboard's links to the API server, whose routes hold
    /// the dashboard: without this a hub dropped (served or not) would
    /// keep its store, and redb's lock on its file, for the life of the
    /// process.
    fn drop(&mut self) {
        self.dashboard.detach();
    }
}

impl Hub {
    /// Opens the embedded store (redb), loads the plugins and builds the
    /// API server. The hub always leads.
    pub fn open(config: Config) -> Result<Hub> {
        make_data_dir(&config)?;
        let store: Arc<dyn Store> = Arc::new(
            RedbStore::open(&config.data_dir.join("store.redb"), WATCH_HISTORY)
                .with_context(|| format!("opening the store in {}", config.data_dir.display()))?,
        );
        Self::assemble(config, store, None)
    }

    /// Opens the store `replication` names: redb as [`Hub::open`] does, or
    /// etcd, where this hub is one replica of several and leads only when
    /// elected.
    pub async fn open_replicated(config: Config, replication: Replication) -> Result<Hub> {
        let etcd = match &replication.storage {
            Storage::Redb => return Self::open(config),
            Storage::Etcd(etcd) => etcd.clone(),
        };
        replication
            .election
            .check()
            .map_err(|e| anyhow::anyhow!("leader election: {e}"))?;
        make_data_dir(&config)?;
        let opened = EtcdStore::open(&etcd, WATCH_HISTORY)
            .await
            .with_context(|| format!("opening the etcd store at {:?}", etcd.endpoints))?;
        let client = opened.client();
        let store: Arc<dyn Store> = opened;
        let election = Election {
            client,
            name: crate::leader::election_name(&etcd.prefix),
            replication,
        };
        Self::assemble(config, store, Some(election))
    }

    fn assemble(config: Config, store: Arc<dyn Store>, election: Option<Election>) -> Result<Hub> {
        // Compiled plugins are cached by digest; TRAINHUB_PLUGIN_CACHE_DIR
        // shares one cache between hubs (tests).
        let cache_dir = std::env::var_os("TRAINHUB_PLUGIN_CACHE_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| config.data_dir.join("plugin-cache"));
        let host = Arc::new(Host::new(&HostConfig {
            cache_dir: Some(cache_dir),
            ..HostConfig::default()
        })?);
        let builtins = builtin::load(&host).context("loading the built-in plugins")?;
        // What compiling them took goes back to the system now, not over the
        // allocator's decay time.
        crate::memory::release_freed();
        // The plugins directory is a source of TrainerPlugin objects (see
        // `serve`), not scanned by the registry itself.
        let plugins = Arc::new(Registry::new(host, builtins, None));
        let object_plugins = crate::plugins::objects::ObjectPlugins::new(
            plugins.clone(),
            Arc::new(
                crate::plugins::sources::Sources::new(&config.plugin_sources)
                    .context("the plugin modules' sources")?,
            ),
        );
        let tokens = match &config.token_file {
            Some(path) => Some(
                TokenFile::load(path)
                    .with_context(|| format!("reading the token file {}", path.display()))?,
            ),
            None => None,
        };
        let policy = match &config.policy_file {
            Some(path) => Policy::load(path)
                .with_context(|| format!("reading the policy file {}", path.display()))?,
            None => Policy::default(),
        };
        let admin_groups = policy.admin_groups.clone();
        let admission = Arc::new(
            TrainerAdmission::new(store.clone(), plugins.clone())
                .context("compiling the served CRDs' schemas")?
                .with_admin_groups(policy.admin_groups.clone()),
        );
        let dispatch = Dispatch::new(
            store.clone(),
            admission.clone(),
            plugins.clone(),
            config.dispatch,
        );
        let status_key = crate::trainer_status::SigningKey::new(store.clone());
        let reporting = match &config.trainer_status {
            Some(c) => {
                let ca = std::fs::read_to_string(&c.ca_file)
                    .with_context(|| format!("reading {}", c.ca_file.display()))?;
                let reporting = Arc::new(crate::trainer_status::Reporting::new(
                    c.url.as_deref(),
                    ca,
                    status_key.clone(),
                ));
                dispatch.report_trainer_status(reporting.clone());
                Some(reporting)
            }
            None => None,
        };
        let (current, _) = watch::channel(None);
        let peer_token = Arc::new(crate::peer::PeerToken::default());
        let log_source: Arc<dyn trainhub_apiserver::server::LogSource> = match &election {
            None => crate::dispatch::leader_log_source(current.subscribe()),
            Some(_) => Arc::new(crate::peer::ReplicaLogs {
                current: current.subscribe(),
                store: store.clone(),
            }),
        };
        let mut builder = Server::builder(store.clone())
            .admission(Arc::new(crate::plugins::objects::PluginAdmission {
                inner: Arc::new(spokes::SpokeAdmission {
                    inner: Arc::new(
                        crate::kueue::KueueAdmission::new(store.clone(), admission.clone())
                            .context("Kueue's admission")?,
                    ),
                }),
            }))
            .logs(log_source.clone())
            .readiness({
                let leading = current.subscribe();
                Arc::new(move || {
                    let role = if leading.borrow().is_some() {
                        "leader (runs dispatch, the spoke sessions and the controllers)"
                    } else {
                        "follower (serves the API; another replica leads)"
                    };
                    vec![("role".to_string(), role.to_string())]
                })
            })
            .authenticator(Arc::new(
                Authenticator::new(tokens, config.client_ca.is_some())
                    .with_issued_tokens(status_key.clone()),
            ))
            .authorizer(Arc::new(crate::trainer_status::JobTokens {
                inner: Arc::new(PolicyAuthorizer::new(policy)),
            }))
            .status_posts(Arc::new(crate::trainer_status::StatusPosts::default()))
            .request_limits(config.api_limits.request_limits())
            .watch_send_timeout(config.api_limits.http_write_timeout)
            .version(trainhub_apiserver::server::VersionInfo::kubernetes_level(
                "trainhub",
                env!("CARGO_PKG_VERSION"),
            ))
            .namespace_lifecycle(true)
            .protected_namespaces(&[SYSTEM_NAMESPACE]);
        let (mut public, authenticated) = crate::metrics::routes(current.subscribe(), admin_groups);
        if election.is_some() {
            public = public.merge(crate::peer::routes(
                current.subscribe(),
                peer_token.clone(),
                store.clone(),
            ));
        }
        let dashboard =
            crate::dashboard::Dashboard::new(store.clone(), status_key.clone(), &config.dashboard);
        public = public.merge(dashboard.routes());
        builder = builder.routes(public, authenticated);
        for def in api::resources()? {
            builder = builder.resource(def);
        }
        let server = builder.build();
        dashboard.attach(&server);
        Ok(Hub {
            store,
            plugins,
            server,
            dispatch,
            logs: log_source,
            admission,
            current,
            peer_token,
            object_plugins,
            status_key,
            reporting,
            election,
            dashboard,
            config,
        })
    }

    /// The dispatch of the term this replica leads; None while it follows.
    pub fn leading(&self) -> watch::Receiver<Option<Arc<Dispatch>>> {
        self.current.subscribe()
    }

    /// Creates the namespaces `default` and `kubeflow-system`, and those
    /// that objects of an existing store are in (a store written before
    /// namespaces were served has none), then installs `objects` that are
    /// not there yet (runtimes shipped with the hub, the SDK's version
    /// ConfigMap), through admission like any create. Idempotent.
    pub async fn install(&self, objects: Vec<Value>) -> Result<()> {
        let created = self
            .server
            .ensure_namespaces(&[trainhub_apiserver::namespace::DEFAULT, SYSTEM_NAMESPACE])
            .await
            .map_err(|e| anyhow::anyhow!("creating namespaces: {}", e.message))?;
        for namespace in created {
            tracing::info!(%namespace, "namespace created");
        }
        for object in objects {
            let name = object["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            match self.server.create_object(object).await {
                Ok(_) => tracing::info!(%name, "installed"),
                Err(e) if e.code == 409 => {}
                Err(e) => return Err(anyhow::anyhow!("installing {name}: {}", e.message)),
            }
        }
        Ok(())
    }

    /// Serves the API and runs the controllers until `shutdown` resolves.
    /// `ready` is called once the listener accepts connections.
    pub async fn serve(
        self,
        ready: impl FnOnce(Addrs),
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<()> {
        let read = |p: &PathBuf| {
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
        };
        let cert = read(&self.config.tls_cert)?;
        let key = read(&self.config.tls_key)?;
        self.status_key.ensure().await?;
        // The plugins are loaded before anything is dispatched: a TrainJob
        // admitted with one finds it after a restart. The directory's
        // objects are written now by the single writer, by the leader
        // otherwise.
        if let Some(dir) = &self.config.plugins_dir
            && self.election.is_none()
            && let Err(problem) = crate::plugins::objects::sync_dir(
                &self.server,
                dir,
                &mut crate::plugins::objects::Digests::default(),
            )
            .await
        {
            tracing::warn!(dir = %dir.display(), %problem, "plugins directory");
        }
        self.object_plugins.load_now(self.store.as_ref()).await;
        // The serving certificate follows its files (rotation without a
        // restart), for the API and the spokes' endpoint alike.
        let serving = ReloadingCert::load(
            "serving certificate",
            &self.config.tls_cert,
            &self.config.tls_key,
            trainhub_apiserver::reload::DEFAULT_RELOAD_INTERVAL,
        )?;
        let client_ca = self.config.client_ca.as_ref().map(read).transpose()?;
        let tls = trainhub_apiserver::tls::server_config_with_resolver(
            serving.clone(),
            client_ca.as_deref(),
        )?;
        let listener = tokio::net::TcpListener::bind(self.config.listen)
            .await
            .with_context(|| format!("listening on {}", self.config.listen))?;
        let addr = listener.local_addr()?;
        if let Some(reporting) = &self.reporting {
            reporting.set_url(&format!("https://{addr}"));
        }
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let mut grpc_addr = None;
        let grpc_listener = match self.config.grpc_listen {
            Some(listen) => {
                let listener = tokio::net::TcpListener::bind(listen)
                    .await
                    .with_context(|| format!("listening on {listen} (gRPC)"))?;
                grpc_addr = Some(listener.local_addr()?);
                Some(listener)
            }
            None => None,
        };
        let mut advertised_api = None;
        let role = match &self.election {
            None => {
                crate::metrics::hub().leader.set(1);
                crate::leader::single()
            }
            Some(election) => {
                let r = &election.replication;
                let api = r.advertise_api.clone().unwrap_or_else(|| addr.to_string());
                advertised_api = Some(api.clone());
                let me = Replica {
                    identity: r
                        .identity
                        .clone()
                        .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
                        .map(|host| format!("{host}:{}", addr.port()))
                        .unwrap_or_else(|| api.clone()),
                    api,
                    grpc: r
                        .advertise_grpc
                        .clone()
                        .or_else(|| grpc_addr.map(|a| a.to_string())),
                };
                tracing::info!(identity = %me.identity, election = %election.name, "campaigning for leadership");
                crate::metrics::hub().leader.set(0);
                crate::leader::spawn(
                    election.client.clone(),
                    election.name.clone(),
                    me,
                    r.election,
                    wait(stop_rx.clone()),
                )
            }
        };
        let grpc = match grpc_listener {
            Some(listener) => {
                let spoke_ca = self
                    .config
                    .spoke_ca
                    .as_ref()
                    .context("the gRPC endpoint needs the spokes' CA (spoke_ca)")?;
                let tls = GrpcTls {
                    cert_pem: cert.clone(),
                    key_pem: key.clone(),
                    client_ca_pem: read(spoke_ca)?,
                    reloading: Some(serving.clone()),
                };
                let (current, role) = (self.current.subscribe(), role.clone());
                let stop = wait(stop_rx.clone());
                Some(tokio::spawn(async move {
                    let limits = grpc::GrpcLimits::default();
                    if let Err(e) =
                        grpc::serve_replica(listener, &tls, limits, current, role, stop).await
                    {
                        tracing::error!(error = %e, "the spokes' gRPC endpoint failed");
                    }
                }))
            }
            None => None,
        };
        let terms = Terms {
            store: self.store.clone(),
            server: self.server.clone(),
            admission: self.admission.clone(),
            plugins: self.plugins.clone(),
            dispatch_config: self.config.dispatch,
            event_ttl: self.config.event_ttl,
            single_writer: self.election.is_none(),
            reporting: self.reporting.clone(),
            object_plugins: self.object_plugins.clone(),
            plugins_dir: self.config.plugins_dir.clone(),
            peer: advertised_api.map(|api| (self.peer_token.clone(), api, cert.clone())),
        };
        // Every replica loads the TrainerPlugin objects.
        let loader = tokio::spawn(
            self.object_plugins
                .clone()
                .run(self.store.clone(), wait(stop_rx.clone())),
        );
        let leadership = tokio::spawn(terms.run(
            self.dispatch.clone(),
            role,
            self.current.clone(),
            stop_rx.clone(),
        ));
        ready(Addrs {
            api: addr,
            grpc: grpc_addr,
        });
        tracing::info!(%addr, "serving the Kubernetes API");
        let warming = tokio::spawn({
            let dashboard = self.dashboard.clone();
            async move { dashboard.warm().await }
        });
        let router = self.server.router();
        let stop = async move {
            shutdown.await;
            let _ = stop_tx.send(true);
        };
        let options = self.config.api_limits.serve_options();
        trainhub_apiserver::tls::serve_with(listener, tls, router, stop, options).await;
        warming.abort();
        let _ = warming.await;
        let _ = leadership.await;
        let _ = loader.await;
        if let Some(grpc) = grpc {
            let _ = grpc.await;
        }
        Ok(())
    }
}

fn make_data_dir(config: &Config) -> Result<()> {
    // The store and the keys are inside: created for no one else (0700).
    std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
        .create(&config.data_dir)
        .with_context(|| format!("creating the data directory {}", config.data_dir.display()))
}

/// What each term of leadership runs: dispatch (with the spoke sessions),
/// the lifecycle, event-expiry, namespace and Spoke-object controllers,
/// every write they make fenced by the term.
struct Terms {
    store: Arc<dyn Store>,
    server: Arc<Server>,
    admission: Arc<TrainerAdmission>,
    plugins: Arc<Registry>,
    dispatch_config: crate::dispatch::DispatchConfig,
    event_ttl: Duration,
    /// One process writes the store (redb): one term, for ever.
    single_writer: bool,
    /// What the trainer's pods are told to post their progress with.
    reporting: Option<Arc<crate::trainer_status::Reporting>>,
    /// Whose outcomes the leader writes to the `TrainerPlugin`s' status.
    object_plugins: Arc<crate::plugins::objects::ObjectPlugins>,
    /// A plugins directory whose components the leader keeps as objects.
    plugins_dir: Option<PathBuf>,
    /// With replicas: the token, API address and serving certificate a
    /// leader publishes for the followers' pod-log requests.
    peer: Option<(Arc<crate::peer::PeerToken>, String, String)>,
}

impl Terms {
    /// Runs a term each time `role` says Leader, until `stop`. A term ends
    /// as soon as the role changes: its work stops, its spoke sessions are
    /// closed, and the replica goes on as a follower.
    async fn run(
        self,
        first: Arc<Dispatch>,
        mut role: watch::Receiver<Role>,
        current: watch::Sender<Option<Arc<Dispatch>>>,
        stop: watch::Receiver<bool>,
    ) {
        let mut first = Some(first);
        loop {
            let term = tokio::select! {
                r = role.wait_for(Role::is_leader) => match r.as_deref() {
                    Ok(Role::Leader(term)) => term.clone(),
                    _ => return,
                },
                () = wait(stop.clone()) => return,
            };
            let store = crate::leader::TermStore::fence(self.store.clone(), term.clone());
            // Dispatch state comes from the store at the start of each
            // term, as after a restart; only redb's single term may use the
            // dispatch built with the hub.
            let dispatch = match first.take().filter(|_| self.single_writer) {
                Some(d) => d,
                None => {
                    let dispatch = Dispatch::new(
                        store.clone(),
                        self.admission.clone(),
                        self.plugins.clone(),
                        self.dispatch_config,
                    );
                    if let Some(reporting) = &self.reporting {
                        dispatch.report_trainer_status(reporting.clone());
                    }
                    dispatch
                }
            };
            if !self.single_writer {
                tracing::info!(key = %term.key, revision = term.revision, "leading: dispatch, spoke sessions and controllers start");
            }
            let (end_tx, end_rx) = watch::channel(false);
            let mut tasks = vec![
                tokio::spawn(controller::run_lifecycle(
                    store.clone(),
                    wait(end_rx.clone()),
                )),
                tokio::spawn(
                    self.server
                        .with_store(store.clone())
                        .run_namespace_controller(wait(end_rx.clone())),
                ),
                tokio::spawn(
                    self.server
                        .with_store(store.clone())
                        .run_quota_controller(wait(end_rx.clone())),
                ),
                tokio::spawn(dispatch.clone().run(wait(end_rx.clone()))),
            ];
            if !self.event_ttl.is_zero() {
                tasks.push(tokio::spawn(controller::events::run(
                    store.clone(),
                    self.event_ttl,
                    wait(end_rx.clone()),
                )));
            }
            if let Some(dir) = &self.plugins_dir {
                tasks.push(tokio::spawn(crate::plugins::objects::run_dir(
                    self.server.with_store(store.clone()),
                    dir.clone(),
                    PLUGIN_RESCAN,
                    wait(end_rx.clone()),
                )));
            }
            tasks.push(tokio::spawn(crate::plugins::objects::run_status(
                self.server.with_store(store.clone()),
                self.object_plugins.clone(),
                self.plugins.builtins().to_vec(),
                wait(end_rx.clone()),
            )));
            spokes::apply_cordons(store.as_ref(), &dispatch);
            tasks.push(tokio::spawn(spokes::run(
                store.clone(),
                self.server.with_store(store.clone()),
                dispatch.clone(),
                wait(end_rx.clone()),
            )));
            // Spokes are taken only once dispatch knows what the store
            // holds: their hellos' runs are then adopted, not stopped.
            let ended = tokio::select! {
                () = dispatch.loaded() => false,
                _ = role.wait_for(|r| *r != Role::Leader(term.clone())) => true,
                () = wait(stop.clone()) => true,
            };
            if ended {
                let _ = end_tx.send(true);
                for task in tasks {
                    let _ = task.await;
                }
                if *stop.borrow() {
                    return;
                }
                continue;
            }
            if let Some((token, api, cert)) = &self.peer
                && let Err(e) = token.publish(store.as_ref(), api, cert).await
            {
                tracing::warn!(error = %e, "followers cannot stream pod logs from this leader");
            }
            current.send_replace(Some(dispatch.clone()));
            let stopping = tokio::select! {
                _ = role.wait_for(|r| *r != Role::Leader(term.clone())) => false,
                () = wait(stop.clone()) => true,
            };
            current.send_replace(None);
            if let Some((token, _, _)) = &self.peer {
                token.revoke();
            }
            dispatch.close_all_sessions(grpc::NOT_LEADING);
            let _ = end_tx.send(true);
            for task in tasks {
                let _ = task.await;
            }
            if stopping {
                return;
            }
            tracing::warn!(key = %term.key, revision = term.revision, "the leadership term ended: dispatch, spoke sessions and controllers stopped; following");
        }
    }
}

async fn wait(mut rx: tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

/// What `trainhub dev` installs: the built-in ClusterTrainingRuntimes and the
/// ConfigMap the Kubeflow SDK reads the trainer version from.
pub fn default_objects() -> Result<Vec<Value>> {
    let mut objects = Vec::new();
    for (name, text) in render::BUILTIN_RUNTIMES {
        objects.extend(render::parse_documents(name, text)?);
    }
    objects.push(json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "kubeflow-trainer-public", "namespace": SYSTEM_NAMESPACE},
        "data": {"kubeflow_trainer_version": trainhub_api::TRAINER_VERSION},
    }));
    Ok(objects)
}
