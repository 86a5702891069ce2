//! A `trainhub dev` process for a test: its own data directory, port and
//! log; started, restarted, killed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The upstream Kubeflow Trainer manifests every client must get through.
pub fn upstream_dir() -> PathBuf {
    let shared = std::env::var_os("TRAINHUB_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared"));
    shared.join("upstream/kubeflow-trainer")
}

/// Compiled plugins are cached across the tests' hubs.
pub fn plugin_cache() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("e2e-plugin-cache")
}

/// The tokens [`tenant_files`] writes: the admin's, and alice's, a tenant
/// granted the namespace `team-a`.
pub const ADMIN: &str = "admin-token-0123456789abcdef";
pub const ALICE: &str = "alice-token-0123456789abcdef";

/// Writes a dev hub's `tokens.csv` (the admin first, then alice in group
/// `team-a`) and a `policy.yaml` granting group `team-a` its namespace.
pub fn tenant_files(dir: &Path) {
    std::fs::write(
        dir.join("tokens.csv"),
        format!("{ADMIN},admin,admin,\"system:masters\"\n{ALICE},alice,alice-uid,\"team-a\"\n"),
    )
    .expect("tokens");
    std::fs::write(
        dir.join("policy.yaml"),
        "namespaces:\n  - namespace: team-a\n    groups: [team-a]\n",
    )
    .expect("policy");
}

pub struct DevHub {
    pub dir: tempfile::TempDir,
    pub port: u16,
    /// Extra `trainhub dev` flags (spokes, dispatch settings).
    args: Vec<String>,
    /// Extra environment of the hub process.
    pub env: Vec<(String, String)>,
    /// The uid (and gid) the hub runs as; None: the test's.
    uid: Option<u32>,
    child: Option<Child>,
}

impl DevHub {
    /// Starts a hub on a free port and waits until it is ready.
    pub fn start() -> DevHub {
        Self::start_with(|_| {})
    }

    /// As [`start`], after `prepare` wrote what it wants into the data
    /// directory (tokens.csv, policy.yaml).
    pub fn start_with(prepare: impl FnOnce(&Path)) -> DevHub {
        Self::start_args(&["--spokes", "0"], prepare)
    }

    /// As [`start_with`], with `trainhub dev` flags.
    pub fn start_args(args: &[&str], prepare: impl FnOnce(&Path)) -> DevHub {
        Self::start_env(args, &[], prepare)
    }

    /// As [`start_args`], with extra environment for the hub process.
    pub fn start_env(args: &[&str], env: &[(&str, String)], prepare: impl FnOnce(&Path)) -> DevHub {
        Self::start_inner(None, args, env, prepare)
    }

    /// As [`start_env`], the hub run by `uid` (gid the same, no other
    /// groups); `prepare` must give it the data directory.
    pub fn start_as(
        uid: u32,
        args: &[&str],
        env: &[(&str, String)],
        prepare: impl FnOnce(&Path),
    ) -> DevHub {
        Self::start_inner(Some(uid), args, env, prepare)
    }

    fn start_inner(
        uid: Option<u32>,
        args: &[&str],
        env: &[(&str, String)],
        prepare: impl FnOnce(&Path),
    ) -> DevHub {
        let dir = tempfile::tempdir().expect("temp dir");
        prepare(dir.path());
        let mut hub = DevHub {
            dir,
            port: 0,
            args: args.iter().map(|a| a.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            uid,
            child: None,
        };
        hub.launch();
        hub
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    fn launch(&mut self) {
        // The hub writes it when ready; a stale one must not count.
        let _ = std::fs::remove_file(self.kubeconfig());
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("hub.log"))
            .expect("hub log");
        let mut command = Command::new(env!("CARGO_BIN_EXE_trainhub"));
        command
            .args(["dev", "--data-dir"])
            .arg(self.dir.path())
            .args(["--api-port", &self.port.to_string()])
            .args(&self.args)
            .env("TRAINHUB_PLUGIN_CACHE_DIR", plugin_cache())
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log);
        if let Some(uid) = self.uid {
            use std::os::unix::process::CommandExt as _;
            command.uid(uid).gid(uid).env("HOME", self.dir.path());
        }
        let child = command.spawn().expect("starting trainhub dev");
        self.child = Some(child);
        self.wait_ready();
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(180);
        while !self.kubeconfig().exists() {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!(
                    "trainhub dev exited with {status} before it was ready:\n{}",
                    self.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "trainhub dev not ready in time:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let text = std::fs::read_to_string(self.kubeconfig()).expect("kubeconfig");
        let server = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("server:"))
            .expect("server in kubeconfig")
            .trim()
            .trim_matches('"')
            .to_string();
        self.port = server
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("port in server URL");
    }

    /// The CA of the hub's data directory, to issue spoke certificates.
    pub fn ca(&self) -> trainhub_apiserver::pki::Ca {
        trainhub_apiserver::pki::PemDir::new(self.dir.path().join("pki"))
            .read_ca()
            .expect("the dev CA")
    }

    /// The hub process's id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("hub.log")).unwrap_or_default()
    }

    fn signal(&mut self, signal: &str) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args([signal, &child.id().to_string()])
                .status();
            let _ = child.wait();
        }
    }

    /// Stops the hub gracefully (SIGTERM) and starts it again on the same
    /// port and data directory.
    pub fn restart(&mut self) {
        self.signal("-TERM");
        self.launch();
    }

    /// Kills the hub (SIGKILL): no chance to flush or clean up.
    pub fn kill(&mut self) {
        self.signal("-KILL");
    }

    /// Starts a killed or stopped hub again.
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "the hub is still running");
        self.launch();
    }

    /// Runs kubectl against this hub.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_stdin(args, None)
    }

    pub fn kubectl_stdin(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut cmd = Command::new("kubectl");
        cmd.arg("--kubeconfig").arg(self.kubeconfig()).args(args);
        cmd.stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("kubectl is installed");
        if let Some(input) = stdin {
            use std::io::Write;
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(input.as_bytes())
                .expect("writing stdin");
        }
        child.wait_with_output().expect("kubectl output")
    }

    /// kubectl that must succeed; returns stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed:\nstdout: {}\nstderr: {}\nhub log tail:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            tail(&self.log(), 40)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A TLS client configuration trusting the hub's CA (HTTP/1.1).
    pub fn tls_client_config(&self) -> std::sync::Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(rustls_pki_types::CertificateDer::from(
                self.ca().cert_der().to_vec(),
            ))
            .expect("the dev CA");
        let mut config =
            rustls::ClientConfig::builder_with_provider(trainhub_apiserver::tls::crypto_provider())
                .with_safe_default_protocol_versions()
                .expect("TLS versions")
                .with_root_certificates(roots)
                .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        std::sync::Arc::new(config)
    }

    /// A kube-rs client from the hub's kubeconfig.
    pub async fn client(&self) -> kube::Client {
        let kubeconfig =
            kube::config::Kubeconfig::read_from(self.kubeconfig()).expect("reading kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .expect("client config");
        kube::Client::try_from(config).expect("client")
    }
}

impl Drop for DevHub {
    fn drop(&mut self) {
        self.signal("-KILL");
    }
}

/// The interpreter of the Python-driven tests, `TRAINHUB_PYTHON` (CI sets it
/// to its virtualenv) or `python3`, once `import MODULES` works with it;
/// `pip` is what to install when it does not.
pub fn python_with(modules: &str, pip: &str) -> String {
    let python = std::env::var("TRAINHUB_PYTHON").unwrap_or_else(|_| "python3".into());
    let importable = Command::new(&python)
        .args(["-c", &format!("import {modules}")])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        importable,
        "`import {modules}` fails with {python}: `pip install {pip}` (or set TRAINHUB_PYTHON)"
    );
    python
}

pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A port free on 127.0.0.1 now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The `trainspoke` binary beside the `trainhub` one under test.
pub fn trainspoke_binary() -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_trainhub")).with_file_name("trainspoke");
    assert!(
        path.exists(),
        "{} is missing: `cargo test --workspace` builds it (or `cargo build -p trainhub-spoke`)",
        path.display()
    );
    path
}

/// [`wait_for`], failing with the tail of the hub's log.
pub async fn eventually<T>(
    what: &str,
    hub: &DevHub,
    timeout: Duration,
    check: impl FnMut() -> Option<T>,
) -> T {
    wait_for(
        what,
        timeout,
        || format!("hub log:\n{}", tail(&hub.log(), 60)),
        check,
    )
    .await
}

/// Polls `check` until it gives a value; past `timeout`, fails with `log()`.
pub async fn wait_for<T>(
    what: &str,
    timeout: Duration,
    log: impl Fn() -> String,
    mut check: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A raw spoke session's next message of the kind `pick` accepts (others
/// are skipped); fails past 30 s or when the stream ends.
pub async fn next_of<T>(
    inbound: &mut tonic::Streaming<trainhub_proto::HubMessage>,
    what: &str,
    mut pick: impl FnMut(trainhub_proto::hub_message::Message) -> Option<T>,
) -> T {
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match inbound.message().await {
                Ok(Some(trainhub_proto::HubMessage { message: Some(m) })) => {
                    if let Some(found) = pick(m) {
                        return found;
                    }
                }
                Ok(Some(_)) => {}
                other => panic!("stream ended while waiting for {what}: {other:?}"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {what} within 30s"))
}

/// Live (not zombie) processes, other than this one, whose command line
/// contains `needle`.
pub fn processes_with(needle: &str) -> std::collections::BTreeSet<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Default::default();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            if pid == std::process::id() {
                return None;
            }
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let found = String::from_utf8_lossy(&cmdline).contains(needle);
            (found && alive(pid)).then_some(pid)
        })
        .collect()
}

/// Whether `pid` is a live process (not a zombie).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}
