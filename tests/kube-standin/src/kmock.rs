//! kmock behind the stand-in's surface (filled in below).
use std::path::{Path, PathBuf};

use crate::StandinConfig;

pub struct Kmock {
    url: String,
    kubeconfig: PathBuf,
}

impl Kmock {
    pub async fn start(_config: StandinConfig) -> anyhow::Result<Kmock> {
        anyhow::bail!("not yet")
    }
    pub fn url(&self) -> &str {
        &self.url
    }
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        crate::client_from_kubeconfig(&self.kubeconfig).await
    }
    pub async fn shutdown(self) {}
}
