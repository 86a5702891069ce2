//! Set-up shared by the benchmarks that drive a hub through its REST API.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;

use kube::api::{Api, DynamicObject};
use kube::core::{ApiResource, GroupVersionKind};
use trainhub::hub::Config;
use trainhub_apiserver::kubeconfig::{Kubeconfig, KubeconfigParams};
use trainhub_apiserver::pki::{Ca, PemDir};

/// The admin's bearer token.
pub const TOKEN: &str = "bench-token-0123456789";

/// A CA with the hub's serving certificate in `dir/pki`, and an admin
/// token in `dir/tokens.csv`.
pub fn pki_and_token(dir: &Path) -> (PemDir, Ca) {
    let pki = PemDir::new(dir.join("pki"));
    let ca = pki.load_or_create_ca("bench-ca").expect("ca");
    pki.write(
        "hub",
        &ca.issue_server("hub", &["localhost"], &[IpAddr::V4(Ipv4Addr::LOCALHOST)])
            .expect("cert"),
    )
    .expect("write cert");
    std::fs::write(
        dir.join("tokens.csv"),
        format!("{TOKEN},bench,bench,\"system:masters\"\n"),
    )
    .expect("tokens");
    (pki, ca)
}

/// A kube-rs client for TrainJobs in `default` of the hub at `api`, through
/// a kubeconfig written in `dir`.
#[allow(dead_code)] // used by the benches that create through the API
pub async fn trainjobs(dir: &Path, api: SocketAddr, ca: &Ca) -> Api<DynamicObject> {
    let kubeconfig = dir.join("kubeconfig");
    Kubeconfig::write(
        &kubeconfig,
        &KubeconfigParams {
            cluster_name: "bench".into(),
            server_url: format!("https://{api}"),
            ca_pem: ca.cert_pem().to_string(),
            user_name: "bench".into(),
            token: Some(TOKEN.into()),
            client_cert_pem: None,
            client_key_pem: None,
            namespace: Some("default".into()),
        },
    )
    .expect("kubeconfig");
    let raw = kube::config::Kubeconfig::read_from(&kubeconfig).expect("read kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(raw, &Default::default())
        .await
        .expect("config");
    let client = kube::Client::try_from(config).expect("client");
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("trainer.kubeflow.org", "v1alpha1", "TrainJob"),
        "trainjobs",
    );
    Api::namespaced_with(client, "default", &ar)
}

/// The value after `name` on the command line, as a number, else `default`.
pub fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A hub on 127.0.0.1 (any free ports) with its data in `dir/data`, the
/// material of [`pki_and_token`], default dispatch and limits, and the
/// spokes' gRPC endpoint when `spokes`.
pub fn hub_config(dir: &Path, pki: &PemDir, spokes: bool) -> Config {
    let localhost = |port| SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port);
    Config {
        token_file: Some(dir.join("tokens.csv")),
        grpc_listen: spokes.then(|| localhost(0)),
        spoke_ca: spokes.then(|| pki.cert_path("ca")),
        ..Config::local(dir.join("data"), pki.cert_path("hub"), pki.key_path("hub"))
    }
}

/// Starts `spokes` simulated spokes (the sim backend: unbounded CPU and
/// memory, runs that start at once and complete at once) dialing the hub's gRPC
/// endpoint at `grpc` with certificates from `ca`; each run's start is
/// reported on the returned channel as (run id, when).
#[allow(dead_code)] // used by the benches that dispatch
pub fn start_sim_spokes(
    grpc: SocketAddr,
    ca: &Ca,
    spokes: usize,
) -> tokio::sync::mpsc::UnboundedReceiver<(String, std::time::Instant)> {
    start_sim_spokes_labelled(grpc, ca, spokes, |_| Default::default())
}

/// As [`start_sim_spokes`], spoke `i` labelled `labels(i)`.
#[allow(dead_code)] // used by the benches that dispatch
pub fn start_sim_spokes_labelled(
    grpc: SocketAddr,
    ca: &Ca,
    spokes: usize,
    labels: impl Fn(usize) -> std::collections::BTreeMap<String, String>,
) -> tokio::sync::mpsc::UnboundedReceiver<(String, std::time::Instant)> {
    use trainhub_spoke::agent::{self, AgentConfig};
    use trainhub_spoke::backend::sim::SimBackend;
    let (started_tx, started_rx) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..spokes {
        let name = format!("sim-{i:03}");
        let issued = ca
            .issue_client(&name, &[trainhub::grpc::SPOKE_GROUP])
            .expect("spoke cert");
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let backend = SimBackend::new(
            [
                ("cpu".to_string(), 1_000_000_000),
                ("memory".to_string(), 1 << 60),
            ]
            .into(),
            std::time::Duration::ZERO,
            tx,
            Some(started_tx.clone()),
        );
        let mut config = AgentConfig::new(
            format!("https://{grpc}"),
            ca.cert_pem().to_string(),
            issued.cert_pem,
            issued.key_pem,
        );
        config.labels = labels(i);
        tokio::spawn(agent::run(config, backend, rx, std::future::pending()));
    }
    started_rx
}

/// A 4-node torch TrainJob, as the Kubeflow SDK submits one (the api
/// bench's).
#[allow(dead_code)] // used by the benches that create TrainJobs
pub fn torch_job(name: &str) -> DynamicObject {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "labels": {"team": "bench"}},
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {
                "image": "pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime",
                "command": ["torchrun", "train.py"],
                "numNodes": 4,
                "resourcesPerNode": {"limits": {"nvidia.com/gpu": "8", "cpu": "32", "memory": "256Gi"}},
                "env": [{"name": "EPOCHS", "value": "10"}],
            },
        },
    }))
    .expect("TrainJob")
}

/// A 2-node CPU TrainJob (the dispatch bench's).
#[allow(dead_code)] // used by the benches that dispatch
pub fn python_job(name: &str) -> DynamicObject {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {
            "runtimeRef": {"name": "python-distributed"},
            "trainer": {"command": ["python3", "train.py"], "numNodes": 2}
        }
    }))
    .expect("TrainJob")
}
