//! `kube-standin`: serves a stand-in Kubernetes API server with the
//! simulator running against it, prints its kubeconfig path, and serves
//! until interrupted. For trying the spoke's kube backend (or kubectl) by
//! hand.

use trainhub_kube_standin::{SimConfig, Simulator, Standin, StandinConfig};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let standin = Standin::start(StandinConfig::default()).await?;
    let sim = Simulator::start(standin.client().await?, SimConfig::default());
    println!("serving {}", standin.url());
    println!("KUBECONFIG={}", standin.kubeconfig().display());
    tokio::signal::ctrl_c().await?;
    sim.stop().await;
    standin.shutdown().await;
    Ok(())
}
