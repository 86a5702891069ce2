//! `kube-standin`: serves a stand-in Kubernetes API server with the
//! simulator running against it, prints its kubeconfig path, and serves
//! until interrupted. For trying the spoke's kube backend (or kubectl) by
//! hand.

use trainhub_kube_standin::{SimConfig, Simulator, Standin, StandinConfig};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let standin = Standin::start(StandinConfig::default()).await?;
    let sim = Simulator::start(standin.client().await?, SimConfig::default());
    println!("serving {}", standin.url());
    println!("KUBECONFIG={}", standin.kubeconfig().display());
    tokio::signal::ctrl_c().await?;
    sim.stop().await;
    standin.shutdown().await;
    Ok(())
}
