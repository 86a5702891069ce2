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
    /// Local spokes (process backend) to start and connect.
    #[arg(long, default_value_t = 0)]
    pub spokes: usize,
    /// Custom plugins directory, hot-reloaded.
    #[arg(long)]
    pub plugins_dir: Option<PathBuf>,
}

const ADMIN_USER: &str = "admin";
const CONTEXT: &str = "trainhub-dev";

pub async fn run(
    args: DevArgs,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let dir = &args.data_dir;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
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
    if args.spokes > 0 {
        tracing::warn!(
            spokes = args.spokes,
            "local spokes are not available yet; the hub runs alone"
        );
    }
    let config = Config {
        data_dir: dir.clone(),
        listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), args.api_port),
        tls_cert: pki.cert_path("hub"),
        tls_key: pki.key_path("hub"),
        client_ca: Some(pki.cert_path("ca")),
        token_file: Some(dir.join("tokens.csv")),
        policy_file: Some(dir.join("policy.yaml")).filter(|p| p.exists()),
        plugins_dir: args.plugins_dir.clone(),
    };
    let hub = Hub::open(config)?;
    hub.install(hub::default_objects()?).await?;
    let ca_pem = ca.cert_pem().to_string();
    let mut written = Ok(());
    hub.serve(
        |addr| {
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
            }
        },
        shutdown,
    )
    .await?;
    written
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
