//! A local etcd cluster on loopback, for tests and for trying the
//! replicated store on one machine. Not for production: members run
//! without TLS, on `127.0.0.1`, with their data under one directory.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::store::StoreError;

/// How long a member (or the whole cluster) may take to answer.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Set to make tests fail, rather than skip, when `etcd` is not installed.
pub const REQUIRE_ETCD_ENV: &str = "TRAINHUB_REQUIRE_ETCD";

/// Names the etcd binary to run (default: `etcd` on `PATH`).
pub const ETCD_BINARY_ENV: &str = "TRAINHUB_ETCD";

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    data_dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

/// A local etcd cluster: `members` processes of `etcd` on free loopback
/// ports, each with its own data directory under `dir`, killed when this is
/// dropped. Each member logs to `dir/<name>.log`.
pub struct LocalEtcd {
    binary: PathBuf,
    initial_cluster: String,
    token: String,
    members: Vec<Member>,
}

impl LocalEtcd {
    /// The etcd binary: `$TRAINHUB_ETCD`, else `etcd` found on `PATH`.
    pub fn binary() -> Option<PathBuf> {
        if let Some(path) = std::env::var_os(ETCD_BINARY_ENV) {
            return Some(PathBuf::from(path));
        }
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path)
            .map(|dir| dir.join("etcd"))
            .find(|candidate| candidate.is_file())
    }

    /// Starts a cluster, or returns `None` after printing why when `etcd` is
    /// not installed and `TRAINHUB_REQUIRE_ETCD` is unset (CI sets it, so
    /// there a missing etcd is an error).
    pub fn start_or_skip(members: usize, dir: &Path) -> Result<Option<LocalEtcd>, StoreError> {
        if Self::binary().is_none() && std::env::var_os(REQUIRE_ETCD_ENV).is_none() {
            eprintln!(
                "skipped: etcd is not installed (apt-get install etcd-server, or set {ETCD_BINARY_ENV}); set {REQUIRE_ETCD_ENV}=1 to fail instead"
            );
            return Ok(None);
        }
        Self::start(members, dir).map(Some)
    }

    /// Starts `members` etcd processes forming one new cluster and waits
    /// until every member answers `/health`.
    ///
    /// # Errors
    /// `etcd` missing, a member that exits or does not become healthy within
    /// 30 s (the error quotes the end of its log).
    pub fn start(members: usize, dir: &Path) -> Result<LocalEtcd, StoreError> {
        let binary = Self::binary().ok_or_else(|| {
            StoreError::Storage(format!(
                "etcd is not installed (apt-get install etcd-server, or set {ETCD_BINARY_ENV})"
            ))
        })?;
        if members == 0 {
            return Err(StoreError::Storage("an etcd cluster needs a member".into()));
        }
        std::fs::create_dir_all(dir)
            .map_err(|e| StoreError::Storage(format!("creating {}: {e}", dir.display())))?;
        let mut list = Vec::with_capacity(members);
        for i in 0..members {
            let name = format!("m{i}");
            list.push(Member {
                client_port: free_port()?,
                peer_port: free_port()?,
                data_dir: dir.join(format!("{name}.etcd")),
                log: dir.join(format!("{name}.log")),
                name,
                child: None,
            });
        }
        let initial_cluster = list
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = LocalEtcd {
            binary,
            initial_cluster,
            token: format!("trainhub-{}-{}", std::process::id(), list[0].client_port),
            members: list,
        };
        for i in 0..members {
            cluster.spawn(i)?;
        }
        for i in 0..members {
            cluster.wait_healthy(i)?;
        }
        Ok(cluster)
    }

    /// Client URLs of all members (`http://127.0.0.1:PORT`), killed ones
    /// included.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len()).map(|i| self.endpoint(i)).collect()
    }

    /// Client URL of member `i`.
    pub fn endpoint(&self, i: usize) -> String {
        self.members
            .get(i)
            .map(|m| format!("http://127.0.0.1:{}", m.client_port))
            .unwrap_or_default()
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// SIGKILLs member `i` (no effect if it is not running).
    pub fn kill(&mut self, i: usize) {
        if let Some(member) = self.members.get_mut(i)
            && let Some(mut child) = member.child.take()
        {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `i` again on its ports and data directory, and waits
    /// until it answers `/health`.
    pub fn restart(&mut self, i: usize) -> Result<(), StoreError> {
        self.kill(i);
        self.spawn(i)?;
        self.wait_healthy(i)
    }

    fn spawn(&mut self, i: usize) -> Result<(), StoreError> {
        let member = self
            .members
            .get_mut(i)
            .ok_or_else(|| StoreError::Storage(format!("no etcd member {i}")))?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&member.log)
            .map_err(|e| StoreError::Storage(format!("opening {}: {e}", member.log.display())))?;
        let log2 = log
            .try_clone()
            .map_err(|e| StoreError::Storage(format!("{}: {e}", member.log.display())))?;
        let client = format!("http://127.0.0.1:{}", member.client_port);
        let peer = format!("http://127.0.0.1:{}", member.peer_port);
        let child = Command::new(&self.binary)
            .arg("--name")
            .arg(&member.name)
            .arg("--data-dir")
            .arg(&member.data_dir)
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--initial-cluster-token", &self.token])
            .args(["--initial-cluster-state", "new"])
            .args(["--logger", "zap", "--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(|e| StoreError::Storage(format!("starting {}: {e}", self.binary.display())))?;
        member.child = Some(child);
        Ok(())
    }

    fn wait_healthy(&mut self, i: usize) -> Result<(), StoreError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let member = self
                .members
                .get_mut(i)
                .ok_or_else(|| StoreError::Storage(format!("no etcd member {i}")))?;
            if let Some(child) = member.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                member.child = None;
                return Err(StoreError::Storage(format!(
                    "etcd member {} exited ({status}): {}",
                    member.name,
                    log_tail(&member.log)
                )));
            }
            if healthy(member.client_port) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(StoreError::Storage(format!(
                    "etcd member {} not healthy after {READY_TIMEOUT:?}: {}",
                    member.name,
                    log_tail(&member.log)
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for LocalEtcd {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}

/// A port free on loopback now (bound, read and released).
fn free_port() -> Result<u16, StoreError> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| StoreError::Storage(format!("finding a free port: {e}")))
}

/// Whether the member on `port` answers `GET /health` with a healthy body
/// (etcd answers so only when the cluster has a leader).
fn healthy(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream
        .write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut body = String::new();
    let _ = stream.read_to_string(&mut body);
    body.contains("\"health\":\"true\"")
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let start = text.len().saturating_sub(2000);
    let start = (start..text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(text.len());
    text[start..].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_three_member_cluster_starts_survives_a_kill_and_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let Some(mut etcd) = LocalEtcd::start_or_skip(3, dir.path()).unwrap() else {
            return;
        };
        assert_eq!(etcd.endpoints().len(), 3);
        etcd.kill(1);
        assert!(!healthy_endpoint(&etcd, 1));
        assert!(healthy_endpoint(&etcd, 0));
        etcd.restart(1).unwrap();
        assert!(healthy_endpoint(&etcd, 1));
    }

    fn healthy_endpoint(etcd: &LocalEtcd, i: usize) -> bool {
        let port = etcd.members[i].client_port;
        healthy(port)
    }
}
