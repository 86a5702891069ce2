//! The replicated store: etcd's v3 API, with a watch cache per replica.
//!
//! (Issue 19, in progress: the configuration and connection are the
//! contract the hub is wired against; the store itself lands next.)

use std::path::PathBuf;
use std::sync::Arc;

use super::StoreError;

mod local;
pub use self::local::LocalEtcd;

/// Where etcd is and how to reach it.
#[derive(Debug, Clone, Default)]
pub struct EtcdConfig {
    /// Client URLs or `host:port`s (`http://` or `https://`).
    pub endpoints: Vec<String>,
    /// PEM: the CA that signs etcd's serving certificates.
    pub ca_file: Option<PathBuf>,
    /// PEM: this client's certificate and key (etcd `--client-cert-auth`).
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// Every key the hub writes starts with this (e.g. `/trainhub/`), so
    /// several hubs (or other users) can share one etcd.
    pub prefix: String,
}

impl EtcdConfig {
    /// A connected client, with TLS when a CA or client certificate is set.
    pub async fn connect(&self) -> Result<etcd_client::Client, StoreError> {
        let read = |p: &PathBuf| {
            std::fs::read(p)
                .map_err(|e| StoreError::Storage(format!("reading {}: {e}", p.display())))
        };
        let mut options = etcd_client::ConnectOptions::new()
            .with_connect_timeout(std::time::Duration::from_secs(5))
            .with_keep_alive(
                std::time::Duration::from_secs(10),
                std::time::Duration::from_secs(5),
            )
            .with_keep_alive_while_idle(true);
        if self.ca_file.is_some() || self.cert_file.is_some() {
            let mut tls = etcd_client::TlsOptions::new();
            if let Some(ca) = &self.ca_file {
                tls = tls.ca_certificate(etcd_client::Certificate::from_pem(read(ca)?));
            }
            match (&self.cert_file, &self.key_file) {
                (Some(cert), Some(key)) => {
                    tls = tls.identity(etcd_client::Identity::from_pem(read(cert)?, read(key)?));
                }
                (None, None) => {}
                _ => {
                    return Err(StoreError::Storage(
                        "etcd: a client certificate needs both its certificate and its key file"
                            .into(),
                    ));
                }
            }
            options = options.with_tls(tls);
        }
        etcd_client::Client::connect(&self.endpoints, Some(options))
            .await
            .map_err(|e| {
                StoreError::Storage(format!("connecting to etcd {:?}: {e}", self.endpoints))
            })
    }
}

/// The etcd-backed [`super::Store`].
pub struct EtcdStore {
    client: etcd_client::Client,
}

impl EtcdStore {
    /// Connects, loads the objects under the prefix into this replica's
    /// watch cache and starts following etcd's watch. `history` events are
    /// kept for resuming watches.
    pub async fn open(config: &EtcdConfig, history: usize) -> Result<Arc<EtcdStore>, StoreError> {
        let _ = history;
        let client = config.connect().await?;
        let _ = client;
        Err(StoreError::Storage(
            "the etcd store is not built yet".into(),
        ))
    }

    /// The client the store uses (the hub's leader election shares it).
    pub fn client(&self) -> etcd_client::Client {
        self.client.clone()
    }
}
