//! [`Standin`]: a Kubernetes API server for tests, built on the hub's REST
//! machinery (`trainhub-apiserver`) with the kinds of a spoke's cluster,
//! namespace admission, a garbage collector and simulated pod logs.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Taint;
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use trainhub_apiserver::auth::Authenticator;
use trainhub_apiserver::auth::TokenFile;
use trainhub_apiserver::kubeconfig::{Kubeconfig, KubeconfigParams};
use trainhub_apiserver::pki::Ca;
use trainhub_apiserver::server::Server;
use trainhub_apiserver::store::{Key, Op, RedbStore, Store};
use trainhub_apiserver::tls::{self, ServeOptions};

use crate::admission::StandinAdmission;
use crate::logs::SimulatedLogs;
use crate::{gc, resources};

/// One node of the simulated cluster.
#[derive(Debug, Clone, Default)]
pub struct NodeSpec {
    pub name: String,
    /// Allocatable resources as quantities: `"cpu" -> "8"`, `"memory" -> "32Gi"`,
    /// `"nvidia.com/gpu" -> "4"`. `pods` defaults to 110 when absent.
    pub allocatable: BTreeMap<String, String>,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    pub unschedulable: bool,
}

impl NodeSpec {
    /// A schedulable node with `allocatable`, e.g. `[("cpu", "8"), ("nvidia.com/gpu", "4")]`.
    pub fn new(name: &str, allocatable: &[(&str, &str)]) -> NodeSpec {
        NodeSpec {
            name: name.into(),
            allocatable: allocatable
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..NodeSpec::default()
        }
    }

    /// With a label, e.g. `nvidia.com/gpu.product`.
    pub fn label(mut self, key: &str, value: &str) -> NodeSpec {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// The `v1` Node object.
    pub fn to_node(&self) -> Value {
        let mut labels = self.labels.clone();
        labels
            .entry("kubernetes.io/hostname".into())
            .or_insert_with(|| self.name.clone());
        labels
            .entry("kubernetes.io/os".into())
            .or_insert_with(|| "linux".into());
        labels
            .entry("kubernetes.io/arch".into())
            .or_insert_with(|| "amd64".into());
        let mut allocatable = self.allocatable.clone();
        allocatable
            .entry("pods".into())
            .or_insert_with(|| "110".into());
        json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": labels},
            "spec": {"unschedulable": self.unschedulable, "taints": self.taints},
            "status": {
                "capacity": allocatable,
                "allocatable": allocatable,
                "conditions": [{
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                }],
                "nodeInfo": {"kubeletVersion": "v1.33.0", "operatingSystem": "linux", "architecture": "amd64"},
            },
        })
    }
}

/// What a stand-in (or kmock) serves at start.
#[derive(Debug, Clone)]
pub struct StandinConfig {
    pub nodes: Vec<NodeSpec>,
    /// Namespaces that exist at start.
    pub namespaces: Vec<String>,
    /// Watch events kept for resumption (until [`Standin::compact`]).
    pub history: usize,
    /// How often a watch that allows bookmarks gets one.
    pub bookmark_interval: Duration,
}

impl Default for StandinConfig {
    /// Two GPU nodes (16 CPUs, 64 GiB, 8 GPUs each) and the `default` and
    /// `kube-system` namespaces.
    fn default() -> Self {
        let gpu_node = |name: &str| {
            NodeSpec::new(
                name,
                &[("cpu", "16"), ("memory", "64Gi"), ("nvidia.com/gpu", "8")],
            )
            .label("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-80GB")
        };
        StandinConfig {
            nodes: vec![gpu_node("node-0"), gpu_node("node-1")],
            namespaces: vec!["default".into(), "kube-system".into()],
            history: 100_000,
            bookmark_interval: Duration::from_secs(1),
        }
    }
}

/// A Kubernetes API server on `https://127.0.0.1:<random port>`, with a
/// bearer token and its own CA, both in [`Standin::kubeconfig`].
///
/// Serves what the spoke's kube backend uses: resourceVersion on every object
/// and watch event, watch resume, bookmarks and 410 Gone after
/// [`Standin::compact`], server-side apply with field managers and
/// conflicts, the status subresource, label and field selectors,
/// `propagationPolicy` with owner-reference garbage collection, 409 on
/// create-exists and stale resourceVersions, 404 for objects in a missing
/// namespace, and `pods/log` with `follow`. Pods do not move by
/// themselves: run a [`crate::Simulator`] against it.
pub struct Standin {
    url: String,
    kubeconfig: PathBuf,
    server: Arc<Server>,
    store: Arc<RedbStore>,
    shutdown: Option<oneshot::Sender<()>>,
    serving: JoinHandle<()>,
    collector: JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Standin {
    pub async fn start(config: StandinConfig) -> anyhow::Result<Standin> {
        let dir = tempfile::tempdir().context("creating the stand-in's directory")?;
        let store = Arc::new(
            RedbStore::open(&dir.path().join("store.redb"), config.history)
                .context("opening the stand-in's store")?,
        );
        let dyn_store: Arc<dyn Store> = store.clone();
        let token = uuid::Uuid::new_v4().simple().to_string();
        let tokens = TokenFile::parse(
            &format!("{token},standin-admin,standin-admin,system:masters\n"),
            "stand-in tokens",
        )?;
        let mut builder = Server::builder(dyn_store.clone())
            .admission(Arc::new(StandinAdmission {
                store: dyn_store.clone(),
            }))
            .authenticator(Arc::new(Authenticator::new(Some(tokens), false)))
            .logs(Arc::new(SimulatedLogs {
                store: dyn_store.clone(),
            }))
            .bookmark_interval(config.bookmark_interval)
            .garbage_collection(true);
        for def in resources::all() {
            builder = builder.resource(def);
        }
        let server = builder.build();
        for ns in &config.namespaces {
            let object = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
            server
                .create_object(object)
                .await
                .map_err(|e| anyhow::anyhow!("creating namespace {ns}: {}", e.message))?;
        }
        for node in &config.nodes {
            create_with_status(&server, node.to_node()).await?;
        }

        let ca = Ca::generate("kube-standin-ca")?;
        let localhost = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let cert = ca.issue_server("kube-standin", &["localhost"], &[localhost])?;
        let tls_config = tls::server_config(&cert.cert_pem, &cert.key_pem, None)?;
        let listener = tokio::net::TcpListener::bind((localhost, 0)).await?;
        let url = format!("https://{}", listener.local_addr()?);
        let kubeconfig = dir.path().join("kubeconfig");
        Kubeconfig::write(
            &kubeconfig,
            &KubeconfigParams {
                cluster_name: "kube-standin".into(),
                server_url: url.clone(),
                ca_pem: ca.cert_pem().to_string(),
                user_name: "standin-admin".into(),
                token: Some(token),
                namespace: Some("default".into()),
                ..KubeconfigParams::default()
            },
        )?;
        let (shutdown, stop) = oneshot::channel::<()>();
        let app = server.router();
        let options = ServeOptions {
            shutdown_grace: Duration::from_millis(200),
            ..ServeOptions::default()
        };
        let serving = tokio::spawn(async move {
            tls::serve_with(
                listener,
                tls_config,
                app,
                async {
                    let _ = stop.await;
                },
                options,
            )
            .await;
        });
        let store_keys = server.resources().iter().map(|r| r.store_key()).collect();
        let collector = tokio::spawn(gc::run(dyn_store, store_keys));
        Ok(Standin {
            url,
            kubeconfig,
            server,
            store,
            shutdown: Some(shutdown),
            serving,
            collector,
            _dir: dir,
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// A kubeconfig (CA data and bearer token) for kube-rs and kubectl.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        client_from_kubeconfig(&self.kubeconfig).await
    }

    /// Drops the watch history: a watch from any older resourceVersion then
    /// gets 410 Gone and the client must relist.
    pub fn compact(&self) {
        self.store.compact();
    }

    /// Ends every open watch stream; clients must re-watch.
    pub fn close_watches(&self) {
        self.server.close_watches();
    }

    /// The server's store, for assertions that bypass HTTP.
    pub fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    pub async fn shutdown(mut self) {
        self.server.close_watches();
        if let Some(s) = self.shutdown.take() {
            let _ = s.send(());
        }
        let _ = (&mut self.serving).await;
        self.collector.abort();
    }
}

impl Drop for Standin {
    fn drop(&mut self) {
        self.serving.abort();
        self.collector.abort();
    }
}

/// Creates `object` and then sets its status, as a controller writing
/// through `/status` would.
async fn create_with_status(server: &Arc<Server>, object: Value) -> anyhow::Result<()> {
    let status = object["status"].clone();
    let created = server
        .create_object(object)
        .await
        .map_err(|e| anyhow::anyhow!("creating a node: {}", e.message))?;
    let name = created["metadata"]["name"].as_str().unwrap_or_default();
    let key = Key::new("nodes", None, name);
    let current = server
        .store()
        .get(&key)
        .with_context(|| format!("node {name} vanished"))?;
    let mut value = current.value.as_ref().clone();
    value["status"] = status;
    server
        .store()
        .commit(vec![Op::Update {
            key,
            value,
            expected: Some(current.rv),
        }])
        .await?;
    Ok(())
}

/// A kube-rs client from a kubeconfig file.
pub async fn client_from_kubeconfig(path: &Path) -> anyhow::Result<kube::Client> {
    let kubeconfig = kube::config::Kubeconfig::read_from(path)
        .with_context(|| format!("reading {}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .with_context(|| format!("loading {}", path.display()))?;
    Ok(kube::Client::try_from(config)?)
}
