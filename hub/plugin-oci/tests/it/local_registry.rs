//! A real OCI registry on loopback: Debian's `docker-registry` (the CNCF
//! distribution registry) with filesystem storage under a temporary
//! directory, killed when dropped.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use trainhub_plugin_oci::Digest;

/// Set to make the registry tests fail, rather than skip, when
/// `docker-registry` is not installed (`.ci/run` sets it).
pub const REQUIRE_REGISTRY_ENV: &str = "TRAINHUB_REQUIRE_REGISTRY";
/// Names the registry binary (default: `docker-registry` on `PATH`).
pub const REGISTRY_BINARY_ENV: &str = "TRAINHUB_DOCKER_REGISTRY";

pub struct LocalRegistry {
    child: Option<Child>,
    port: u16,
    root: PathBuf,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl LocalRegistry {
    fn binary() -> Option<PathBuf> {
        if let Some(path) = std::env::var_os(REGISTRY_BINARY_ENV) {
            return Some(PathBuf::from(path));
        }
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path)
            .map(|dir| dir.join("docker-registry"))
            .find(|candidate| candidate.is_file())
    }

    /// Starts a registry, or returns `None` after saying why when
    /// `docker-registry` is missing and `TRAINHUB_REQUIRE_REGISTRY` is unset.
    pub fn start_or_skip() -> Option<LocalRegistry> {
        let Some(binary) = Self::binary() else {
            assert!(
                std::env::var_os(REQUIRE_REGISTRY_ENV).is_none(),
                "docker-registry is not installed (apt-get install docker-registry, or set {REGISTRY_BINARY_ENV}) and {REQUIRE_REGISTRY_ENV} is set"
            );
            eprintln!(
                "skipped: docker-registry is not installed (apt-get install docker-registry, or set {REGISTRY_BINARY_ENV}); set {REQUIRE_REGISTRY_ENV}=1 to fail instead"
            );
            return None;
        };
        Some(Self::start(&binary))
    }

    fn start(binary: &Path) -> LocalRegistry {
        let dir = tempfile::tempdir().expect("temporary directory");
        let root = dir.path().join("data");
        let port = free_port();
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\n\
                 log:\n  level: warn\n  accesslog:\n    disabled: true\n\
                 storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n\
                 http:\n  addr: 127.0.0.1:{port}\n",
                root.display()
            ),
        )
        .expect("writing the registry's config");
        let log = dir.path().join("registry.log");
        let log_file = std::fs::File::create(&log).expect("registry log");
        let child = Command::new(binary)
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("log file"))
            .stderr(log_file)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()));
        let mut registry = LocalRegistry {
            child: Some(child),
            port,
            root,
            log,
            _dir: dir,
        };
        registry.wait_ready();
        registry
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

    /// Polls `GET /v2/` until it answers 200, for at most 30 s.
    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self.answers_v2() {
                return;
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!(
                    "docker-registry exited ({status}): {}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                );
            }
            assert!(
                Instant::now() < deadline,
                "docker-registry did not answer within 30 s: {}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn answers_v2(&self) -> bool {
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
        stream.read_exact(&mut head).is_ok() && head.ends_with(b"200")
    }
}

impl Drop for LocalRegistry {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A port free on loopback now (another process may take it before the
/// registry binds it; the start then fails loudly).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}
