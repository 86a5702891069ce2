//! The hub process: store, plugins, admission, API server and controllers,
//! assembled from a [`Config`] and served until shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::{Value, json};
use trainhub_apiserver::auth::{Authenticator, Policy, PolicyAuthorizer, TokenFile};
use trainhub_apiserver::reload::ReloadingCert;
use trainhub_apiserver::server::Server;
use trainhub_apiserver::store::{RedbStore, Store};

use crate::admission::TrainerAdmission;
use crate::dispatch::{Dispatch, DispatchConfig};
use crate::grpc::{self, GrpcTls};
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
    pub dispatch: Arc<Dispatch>,
    config: Config,
}

impl Hub {
    /// Opens the store, loads the plugins and builds the API server.
    pub fn open(config: Config) -> Result<Hub> {
        // The store is inside: created for no one else (0700).
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(&config.data_dir)
            .with_context(|| {
                format!("creating the data directory {}", config.data_dir.display())
            })?;
        let store: Arc<dyn Store> = Arc::new(
            RedbStore::open(&config.data_dir.join("store.redb"), WATCH_HISTORY)
                .with_context(|| format!("opening the store in {}", config.data_dir.display()))?,
        );
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
        let plugins = Arc::new(Registry::new(host, builtins, config.plugins_dir.clone()));
        if config.plugins_dir.is_some() {
            plugins
                .watch(PLUGIN_RESCAN)
                .context("watching the plugins directory")?;
        }
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
                .with_admin_groups(policy.admin_groups.clone()),
        );
        let dispatch = Dispatch::new(
            store.clone(),
            admission.clone(),
            plugins.clone(),
            config.dispatch,
        );
        let mut builder = Server::builder(store.clone())
            .admission(Arc::new(spokes::SpokeAdmission {
                inner: admission.clone(),
            }))
            .logs(dispatch.log_source())
            .authenticator(Arc::new(Authenticator::new(
                tokens,
                config.client_ca.is_some(),
            )))
            .authorizer(Arc::new(PolicyAuthorizer::new(policy)))
            .request_limits(config.api_limits.request_limits())
            .watch_send_timeout(config.api_limits.http_write_timeout)
            .version(trainhub_apiserver::server::VersionInfo::kubernetes_level(
                "trainhub",
                env!("CARGO_PKG_VERSION"),
            ))
            .namespace_lifecycle(true)
            .protected_namespaces(&[SYSTEM_NAMESPACE]);
        let (public, authenticated) = crate::metrics::routes(dispatch.clone(), admin_groups);
        builder = builder.routes(public, authenticated);
        for def in api::resources()? {
            builder = builder.resource(def);
        }
        Ok(Hub {
            store,
            plugins,
            server: builder.build(),
            dispatch,
            config,
        })
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
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let lifecycle = tokio::spawn(controller::run_lifecycle(
            self.store.clone(),
            wait(stop_rx.clone()),
        ));
        let event_expiry = (!self.config.event_ttl.is_zero()).then(|| {
            tokio::spawn(controller::events::run(
                self.store.clone(),
                self.config.event_ttl,
                wait(stop_rx.clone()),
            ))
        });
        let namespaces = tokio::spawn(
            self.server
                .clone()
                .run_namespace_controller(wait(stop_rx.clone())),
        );
        let dispatch = tokio::spawn(self.dispatch.clone().run(wait(stop_rx.clone())));
        spokes::apply_cordons(self.store.as_ref(), &self.dispatch);
        let spoke_objects = tokio::spawn(spokes::run(
            self.store.clone(),
            self.server.clone(),
            self.dispatch.clone(),
            wait(stop_rx.clone()),
        ));
        let mut grpc_addr = None;
        let grpc = match self.config.grpc_listen {
            Some(listen) => {
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
                let listener = tokio::net::TcpListener::bind(listen)
                    .await
                    .with_context(|| format!("listening on {listen} (gRPC)"))?;
                grpc_addr = Some(listener.local_addr()?);
                let dispatch = self.dispatch.clone();
                let stop = wait(stop_rx.clone());
                Some(tokio::spawn(async move {
                    if let Err(e) = grpc::serve(listener, &tls, dispatch, stop).await {
                        tracing::error!(error = %e, "the spokes' gRPC endpoint failed");
                    }
                }))
            }
            None => None,
        };
        ready(Addrs {
            api: addr,
            grpc: grpc_addr,
        });
        tracing::info!(%addr, "serving the Kubernetes API");
        let router = self.server.router();
        let stop = async move {
            shutdown.await;
            let _ = stop_tx.send(true);
        };
        let options = self.config.api_limits.serve_options();
        trainhub_apiserver::tls::serve_with(listener, tls, router, stop, options).await;
        let _ = lifecycle.await;
        let _ = namespaces.await;
        if let Some(expiry) = event_expiry {
            let _ = expiry.await;
        }
        let _ = dispatch.await;
        let _ = spoke_objects.await;
        if let Some(grpc) = grpc {
            let _ = grpc.await;
        }
        Ok(())
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
