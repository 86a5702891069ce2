//! A real OCI registry on loopback, for tests and for trying plugin pushes
//! on one machine: Debian's `docker-registry` (the CNCF distribution
//! registry) serving plain HTTP on `127.0.0.1`, storing under a directory
//! the caller gives, killed when dropped. Not for production.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::Digest;

/// Set to make the registry tests fail, rather than skip, when
/// `docker-registry` is not installed (`.ci/run` sets it).
pub const REQUIRE_REGISTRY_ENV: &str = "TRAINHUB_REQUIRE_REGISTRY";
/// Names the registry binary (default: `docker-registry` on `PATH`).
pub const REGISTRY_BINARY_ENV: &str = "TRAINHUB_DOCKER_REGISTRY";

/// How long the registry may take to answer after it starts.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// A running `docker-registry`.
pub struct LocalRegistry {
    child: Option<Child>,
    port: u16,
    root: PathBuf,
    log: PathBuf,
}

impl LocalRegistry {
    /// The binary: `$TRAINHUB_DOCKER_REGISTRY`, else `docker-registry` on
    /// `PATH`.
    pub fn binary() -> Option<PathBuf> {
        if let Some(path) = std::env::var_os(REGISTRY_BINARY_ENV) {
            return Some(PathBuf::from(path));
        }
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path)
            .map(|dir| dir.join("docker-registry"))
            .find(|candidate| candidate.is_file())
    }

    /// Starts a registry storing under `dir` (requiring the credentials of
    /// `htpasswd` when given, see [`Self::start_with_htpasswd`]), or returns
    /// `None` after printing why when `docker-registry` is missing and
    /// `TRAINHUB_REQUIRE_REGISTRY` is unset (CI sets it, so there a missing
    /// registry is an error).
    ///
    /// # Errors
    /// See [`Self::start`].
    pub fn start_or_skip(
        dir: &Path,
        htpasswd: Option<&str>,
    ) -> Result<Option<LocalRegistry>, String> {
        if Self::binary().is_none() && std::env::var_os(REQUIRE_REGISTRY_ENV).is_none() {
            eprintln!(
                "skipped: docker-registry is not installed (apt-get install docker-registry, or set {REGISTRY_BINARY_ENV}); set {REQUIRE_REGISTRY_ENV}=1 to fail instead"
            );
            return Ok(None);
        }
        Self::start_with_htpasswd(dir, htpasswd).map(Some)
    }

    /// Starts a registry on a free loopback port, storing under `dir`, and
    /// waits until it answers `GET /v2/`.
    ///
    /// # Errors
    /// The binary missing, failing to start, exiting, or not answering
    /// within 30 s (the error quotes its log).
    pub fn start(dir: &Path) -> Result<LocalRegistry, String> {
        Self::start_with_htpasswd(dir, None)
    }

    /// As [`Self::start`], requiring HTTP basic credentials: `htpasswd` is
    /// the file's contents (`user:<bcrypt hash>` lines).
    ///
    /// # Errors
    /// As [`Self::start`].
    pub fn start_with_htpasswd(
        dir: &Path,
        htpasswd: Option<&str>,
    ) -> Result<LocalRegistry, String> {
        let binary = Self::binary().ok_or_else(|| {
            format!(
                "docker-registry is not installed (apt-get install docker-registry, or set {REGISTRY_BINARY_ENV})"
            )
        })?;
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let root = dir.join("data");
        let port = free_port()?;
        let mut config_text = format!(
            "version: 0.1\n\
             log:\n  level: warn\n  accesslog:\n    disabled: true\n\
             storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n\
             http:\n  addr: 127.0.0.1:{port}\n",
            root.display()
        );
        if let Some(lines) = htpasswd {
            let path = dir.join("htpasswd");
            std::fs::write(&path, lines).map_err(|e| format!("writing {}: {e}", path.display()))?;
            config_text.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: trainhub-test\n    path: {}\n",
                path.display()
            ));
        }
        let config = dir.join("config.yml");
        std::fs::write(&config, config_text)
            .map_err(|e| format!("writing {}: {e}", config.display()))?;
        let log = dir.join("registry.log");
        let log_file =
            std::fs::File::create(&log).map_err(|e| format!("creating {}: {e}", log.display()))?;
        let stderr = log_file
            .try_clone()
            .map_err(|e| format!("{}: {e}", log.display()))?;
        let child = Command::new(&binary)
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log_file)
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", binary.display()))?;
        let mut registry = LocalRegistry {
            child: Some(child),
            port,
            root,
            log,
        };
        registry.wait_ready(htpasswd.is_some())?;
        Ok(registry)
    }

    /// `127.0.0.1:PORT`, as references name it.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Where the registry keeps the blob `digest`.
    pub fn blob_path(&self, digest: &Digest) -> PathBuf {
        let hex = digest.hex();
        self.root
            .join("docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(&hex)
            .join("data")
    }

    /// Kills the registry (its storage stays).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Polls `GET /v2/` until it answers (200, or 401 when it requires
    /// credentials), for at most 30 s.
    fn wait_ready(&mut self, authenticated: bool) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let expected: &[u8] = if authenticated { b"401" } else { b"200" };
        loop {
            if self.answers_v2(expected) {
                return Ok(());
            }
            let log = || std::fs::read_to_string(&self.log).unwrap_or_default();
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(format!("docker-registry exited ({status}): {}", log()));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "docker-registry did not answer within {READY_TIMEOUT:?}: {}",
                    log()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn answers_v2(&self, status: &[u8]) -> bool {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
        let request = format!(
            "GET /v2/ HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n\r\n",
            self.port
        );
        if stream.write_all(request.as_bytes()).is_err() {
            return false;
        }
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).is_ok() && head.ends_with(status)
    }
}

impl Drop for LocalRegistry {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A port free on loopback now (another process may take it before the
/// registry binds it; the start then fails saying so).
///
/// # Errors
/// No loopback port could be bound.
pub fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("finding a free loopback port: {e}"))
}
