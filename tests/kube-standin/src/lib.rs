//! Kubernetes API servers the spoke's kube backend is tested against, and a
//! simulator that plays the cluster's controllers.
//!
//! - [`Standin`]: our own API server, built on the hub's REST machinery
//!   (`trainhub-apiserver`): the Kubernetes semantics the backend relies on,
//!   served over TLS with a bearer token.
//! - [`Kmock`]: `kmock` (PyPI), a stateful Kubernetes API emulator written
//!   by others, behind the same surface, with a thin wrapper adding what it
//!   lacks (see [`kmock`] for exactly what).
//! - [`ApiServer`]: either, so one test suite runs against both; a behaviour
//!   that passes against one and fails against the other is a bug to
//!   understand, in the backend or in a server.
//! - [`Simulator`]: the JobSet controller, Job controller, scheduler and
//!   kubelet, as a client of any of them.
//!
//! See the crate's README for what each server supports and lacks.

mod admission;
mod gc;
pub mod kmock;
mod logs;
mod resources;
pub mod sim;
mod standin;

use std::path::Path;

pub use kmock::Kmock;
pub use sim::{SimConfig, Simulator};
pub use standin::{NodeSpec, Standin, StandinConfig, client_from_kubeconfig};

/// Either server, so one test suite runs against both.
pub enum ApiServer {
    Standin(Standin),
    Kmock(Kmock),
}

impl ApiServer {
    pub fn url(&self) -> &str {
        match self {
            ApiServer::Standin(s) => s.url(),
            ApiServer::Kmock(k) => k.url(),
        }
    }

    pub fn kubeconfig(&self) -> &Path {
        match self {
            ApiServer::Standin(s) => s.kubeconfig(),
            ApiServer::Kmock(k) => k.kubeconfig(),
        }
    }

    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        match self {
            ApiServer::Standin(s) => s.client().await,
            ApiServer::Kmock(k) => k.client().await,
        }
    }

    /// `"standin"` or `"kmock"`, for test messages.
    pub fn name(&self) -> &'static str {
        match self {
            ApiServer::Standin(_) => "standin",
            ApiServer::Kmock(_) => "kmock",
        }
    }

    /// Forgets the watch history: resuming from before now gets 410.
    pub async fn compact(&self) -> anyhow::Result<()> {
        match self {
            ApiServer::Standin(s) => {
                s.compact();
                Ok(())
            }
            ApiServer::Kmock(k) => k.compact().await,
        }
    }

    /// Ends every open watch stream.
    pub async fn close_watches(&self) -> anyhow::Result<()> {
        match self {
            ApiServer::Standin(s) => {
                s.close_watches();
                Ok(())
            }
            ApiServer::Kmock(k) => k.close_watches().await,
        }
    }

    pub async fn shutdown(self) {
        match self {
            ApiServer::Standin(s) => s.shutdown().await,
            ApiServer::Kmock(k) => k.shutdown().await,
        }
    }
}
