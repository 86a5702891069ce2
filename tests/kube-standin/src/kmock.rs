//! [`Kmock`]: kmock (PyPI `kmock`, a stateful Kubernetes API emulator by
//! others) behind the stand-in's surface, as an independent cross-check.
//!
//! kmock runs as a Python subprocess (`$TRAINHUB_PYTHON`, else `python3`)
//! from `kmock_wrapper.py`, which adds only what kmock lacks for the
//! backend's tests; the wrapper's doc string lists each addition. What kmock
//! serves by itself: create, get, list, watch, merge-style patch (also of
//! `/status`, which it merges into the object), delete with finalizers,
//! discovery of declared resources. What it lacks and this wrapper does not
//! add: field managers and apply conflicts, JSON and strategic merge patches,
//! PUT, status subresource isolation, 409 on stale resourceVersions,
//! namespace existence, owner-reference garbage collection
//! (the simulator's orphan collection stands in), field selectors, TLS and
//! authentication (it serves plain HTTP).

use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::Api;
use kube::api::PostParams;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::StandinConfig;

const WRAPPER: &str = include_str!("kmock_wrapper.py");

/// The Python that runs kmock: `$TRAINHUB_PYTHON`, else `python3`.
pub fn python() -> String {
    std::env::var("TRAINHUB_PYTHON").unwrap_or_else(|_| "python3".into())
}

pub struct Kmock {
    url: String,
    kubeconfig: PathBuf,
    child: Child,
    /// The wrapper's stdin (commands) and stdout (their answers).
    control: Box<tokio::sync::Mutex<(ChildStdin, Lines<BufReader<ChildStdout>>)>>,
    _dir: tempfile::TempDir,
}

impl Kmock {
    /// Starts kmock on `http://127.0.0.1:<random port>` with the config's
    /// nodes.
    ///
    /// # Errors
    ///
    /// When kmock is not importable by the Python above (install it with
    /// `pip install kmock`), naming that Python.
    pub async fn start(config: StandinConfig) -> anyhow::Result<Kmock> {
        let python = python();
        let check = Command::new(&python)
            .args(["-c", "import kmock"])
            .output()
            .await
            .with_context(|| format!("running {python}"))?;
        if !check.status.success() {
            anyhow::bail!(
                "kmock is not importable by {python} (set TRAINHUB_PYTHON to a Python with `pip install kmock`): {}",
                String::from_utf8_lossy(&check.stderr).trim()
            );
        }
        let dir = tempfile::tempdir()?;
        let script = dir.path().join("kmock_wrapper.py");
        std::fs::write(&script, WRAPPER)?;
        let mut child = Command::new(&python)
            .arg(&script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting kmock with {python}"))?;
        let stdout = child.stdout.take().context("kmock's stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let port = tokio::time::timeout(std::time::Duration::from_secs(30), async {
            while let Some(line) = lines.next_line().await? {
                if let Some(port) = line.strip_prefix("PORT ") {
                    return Ok(port.trim().to_string());
                }
            }
            anyhow::bail!("kmock exited before serving")
        })
        .await
        .context("kmock did not start within 30 s")??;
        let url = format!("http://127.0.0.1:{port}");
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: kmock\n  cluster:\n    server: {url}\nusers:\n- name: kmock\n  user: {{}}\ncontexts:\n- name: kmock\n  context:\n    cluster: kmock\n    user: kmock\n    namespace: default\ncurrent-context: kmock\n"
            ),
        )?;
        let stdin = child.stdin.take().context("kmock's stdin")?;
        let kmock = Kmock {
            url,
            kubeconfig,
            child,
            control: Box::new(tokio::sync::Mutex::new((stdin, lines))),
            _dir: dir,
        };
        let client = kmock.client().await?;
        let namespaces: Api<Namespace> = Api::all(client.clone());
        for ns in &config.namespaces {
            let object: Namespace = serde_json::from_value(serde_json::json!({
                "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}
            }))?;
            namespaces.create(&PostParams::default(), &object).await?;
        }
        let nodes: Api<Node> = Api::all(client);
        for node in &config.nodes {
            let object: Node = serde_json::from_value(node.to_node())?;
            nodes.create(&PostParams::default(), &object).await?;
        }
        Ok(kmock)
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

    /// Forgets the write history: a watch from an older resourceVersion
    /// gets 410 Expired, as after etcd compaction.
    pub async fn compact(&self) -> anyhow::Result<()> {
        self.command("COMPACT").await
    }

    /// Ends every open watch stream; clients must re-watch.
    pub async fn close_watches(&self) -> anyhow::Result<()> {
        self.command("CLOSE_WATCHES").await
    }

    async fn command(&self, command: &str) -> anyhow::Result<()> {
        let mut control = self.control.lock().await;
        let (stdin, stdout) = &mut *control;
        stdin.write_all(format!("{command}\n").as_bytes()).await?;
        stdin.flush().await?;
        match stdout.next_line().await? {
            Some(line) if line == "OK" => Ok(()),
            Some(line) => anyhow::bail!("kmock: {command}: {line}"),
            None => anyhow::bail!("kmock exited during {command}"),
        }
    }

    pub async fn shutdown(mut self) {
        drop(self.control);
        let _ = self.child.kill().await;
    }
}
