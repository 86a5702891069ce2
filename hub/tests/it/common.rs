//! Shared fixtures: one plugin host for the whole test binary, the wasm
//! components built with the hub, and the upstream manifests.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use serde_json::Value;
use trainhub::plugins::{Host, HostConfig};

/// One host for every test, as one hub serves every TrainJob: a test that
/// breaks a plugin also shows the host keeps serving the others.
pub fn host() -> Arc<Host> {
    static HOST: OnceLock<Arc<Host>> = OnceLock::new();
    HOST.get_or_init(|| {
        let cache = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("wasm-cache");
        Arc::new(
            Host::new(&HostConfig {
                cache_dir: Some(cache),
                ..HostConfig::default()
            })
            .expect("plugin host"),
        )
    })
    .clone()
}

/// A component built with the hub, by file stem (`acme_plugin`, ...).
pub fn wasm(stem: &str) -> Vec<u8> {
    let path = PathBuf::from(trainhub::builtin::WASM_DIR).join(format!("{stem}.wasm"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `shared/upstream/kubeflow-trainer`, beside the checkout.
pub fn upstream_dir() -> PathBuf {
    let shared = std::env::var_os("TRAINHUB_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared"));
    shared.join("upstream/kubeflow-trainer")
}

pub fn repo_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The documents of a YAML file.
pub fn documents(path: &std::path::Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    trainhub::render::parse_documents(&path.display().to_string(), &text).expect("parse")
}

/// A TrainJob on the torch runtime, as JSON, for plugin calls.
pub fn torch_job_json() -> String {
    serde_json::json!({
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "probe", "namespace": "default"},
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"numNodes": 2}}
    })
    .to_string()
}

pub fn torch_runtime_json() -> String {
    let docs = documents(&repo_dir().join("manifests/runtimes/torch-distributed.yaml"));
    docs[0].to_string()
}
