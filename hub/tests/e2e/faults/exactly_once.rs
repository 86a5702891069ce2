//! A TrainJob never runs twice at once, under faults: the real hub binary,
//! external `trainspoke` processes (process backend) over real gRPC and
//! mutual TLS. The TrainJob appends a timestamped mark with its working
//! directory (which names the spoke and the run's generation) to a file
//! every 0.2 s; the marks of two runs must never overlap in time.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::watch;

use crate::common::{DevHub, alive, free_port, processes_with, tail, trainspoke_binary, wait_for};

/// A `trainspoke` process; SIGKILLed when dropped.
struct Spoke {
    name: String,
    child: Option<Child>,
    args: Vec<String>,
    work_dir: PathBuf,
    log: PathBuf,
}

impl Spoke {
    /// Starts `trainspoke` as `name`, dialing `hub_port`, with its files
    /// under `dir`.
    fn start(hub: &DevHub, dir: &Path, name: &str, hub_port: u16, extra: &[&str]) -> Spoke {
        let issued = hub
            .ca()
            .issue_client(name, &[trainhub::grpc::SPOKE_GROUP])
            .unwrap();
        let ca = dir.join("ca.crt");
        std::fs::write(&ca, hub.ca().cert_pem()).unwrap();
        let cert = dir.join(format!("{name}.crt"));
        let key = dir.join(format!("{name}.key"));
        std::fs::write(&cert, &issued.cert_pem).unwrap();
        std::fs::write(&key, &issued.key_pem).unwrap();
        let work_dir = dir.join(name);
        let mut args: Vec<String> = vec![
            "--hub".into(),
            format!("https://127.0.0.1:{hub_port}"),
            "--ca".into(),
            ca.display().to_string(),
            "--cert".into(),
            cert.display().to_string(),
            "--key".into(),
            key.display().to_string(),
            "--work-dir".into(),
            work_dir.display().to_string(),
            "--label".into(),
            format!("name={name}"),
            "--heartbeat-seconds".into(),
            "1".into(),
            "--capacity".into(),
            "cpu=4,memory=8Gi".into(),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        let mut spoke = Spoke {
            name: name.to_string(),
            child: None,
            args,
            work_dir,
            log: dir.join(format!("{name}.log")),
        };
        spoke.launch();
        spoke
    }

    fn launch(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(trainspoke_binary())
            .args(&self.args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting trainspoke");
        self.child = Some(child);
    }

    /// SIGKILL to the agent alone (not its children), as the OOM killer
    /// would.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The run records the spoke keeps.
    fn records(&self) -> Vec<String> {
        std::fs::read_dir(self.work_dir.join(".runs"))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.ends_with(".json"))
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Spoke {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A directory the runs' uids can reach (not under /tmp, which each run
/// has its own of), with the marks file every run may append to.
fn marks_dir() -> (tempfile::TempDir, PathBuf) {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let marks = dir.path().join("marks");
    std::fs::write(&marks, "").unwrap();
    std::fs::set_permissions(&marks, std::fs::Permissions::from_mode(0o666)).unwrap();
    (dir, marks)
}

/// A TrainJob that appends `<unix time> <working directory>` to `marks`
/// every 0.2 s: 150 times (30 s, longer than any wait of these tests, so
/// only a kill ends it early) in its first run, 25 times in later ones.
fn marking_trainjob(name: &str, marks: &Path) -> String {
    let script = format!(
        "case $(pwd) in */*-1/*) n=150;; *) n=25;; esac; i=0; while [ $i -lt $n ]; do echo \"$(date +%s.%N) $(pwd)\" >> {}; i=$((i+1)); sleep 0.2; done",
        marks.display()
    );
    json!({
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "runtimeRef": {"name": "python-distributed"},
            "trainer": {"numNodes": 1, "command": ["sh", "-c", script]}
        }
    })
    .to_string()
}

/// One mark: when, and which run (the spoke's work directory and the
/// run's `<jobset>-<generation>` directory).
#[derive(Debug, Clone)]
struct Mark {
    at: f64,
    run: String,
}

fn read_marks(marks: &Path, spokes: &[&Spoke]) -> Vec<Mark> {
    let text = std::fs::read_to_string(marks).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let (at, dir) = line.split_once(' ')?;
            let at: f64 = at.parse().ok()?;
            let spoke = spokes
                .iter()
                .find(|s| dir.starts_with(&*s.work_dir.to_string_lossy()))?;
            let rest = dir.strip_prefix(&*spoke.work_dir.to_string_lossy())?;
            // `/<namespace>/<jobset>-<generation>/<pod>`
            let run_dir = rest.split('/').nth(2)?;
            Some(Mark {
                at,
                run: format!("{}:{run_dir}", spoke.name),
            })
        })
        .collect()
}

/// The [first, last] mark of each run, in order of their first mark;
/// fails if two overlap.
fn assert_no_overlap(marks: &[Mark]) -> Vec<(String, f64, f64)> {
    let mut spans: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for m in marks {
        let span = spans.entry(m.run.clone()).or_insert((m.at, m.at));
        span.0 = span.0.min(m.at);
        span.1 = span.1.max(m.at);
    }
    let mut spans: Vec<(String, f64, f64)> =
        spans.into_iter().map(|(r, (a, b))| (r, a, b)).collect();
    spans.sort_by(|a, b| a.1.total_cmp(&b.1));
    for pair in spans.windows(2) {
        assert!(
            pair[0].2 < pair[1].1,
            "two runs overlap in time: {pair:?}\nall runs: {spans:?}"
        );
    }
    spans
}

fn complete(hub: &DevHub, name: &str) -> bool {
    let out = hub.kubectl_ok(&["get", "trainjob", name, "-o", "json"]);
    let job: Value = serde_json::from_str(&out).unwrap();
    job["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Complete" && c["status"] == "True")
    })
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn logs(hub: &DevHub, spokes: &[&Spoke], marks: &Path) -> String {
    let mut text = format!("hub log:\n{}", tail(&hub.log(), 40));
    for s in spokes {
        text.push_str(&format!("\n{} log:\n{}", s.name, tail(&s.log(), 25)));
    }
    text.push_str(&format!(
        "\nmarks:\n{}",
        tail(&std::fs::read_to_string(marks).unwrap_or_default(), 10)
    ));
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spoke_agent_killed_mid_run_leaves_no_orphans_and_the_job_runs_once_at_a_time() {
    let grpc = free_port();
    let hub = DevHub::start_args(
        &[
            "--spokes",
            "0",
            "--grpc-port",
            &grpc.to_string(),
            "--worker-lost-timeout-seconds",
            "30",
        ],
        |_| {},
    );
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (_marks_dir, marks) = marks_dir();
    let fence = ["--fence-after-seconds", "20"];
    let mut a = Spoke::start(&hub, dir.path(), "spoke-a", grpc, &fence);
    hub.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(&marking_trainjob("marked", &marks)),
    );
    let needle = marks.display().to_string();
    let orphans = wait_for(
        "the run marking on spoke-a",
        Duration::from_secs(30),
        || logs(&hub, &[&a], &marks),
        || {
            let n = read_marks(&marks, &[&a]).len();
            let pids = processes_with(&needle);
            (n >= 3 && !pids.is_empty()).then_some(pids)
        },
    )
    .await;
    let b = Spoke::start(&hub, dir.path(), "spoke-b", grpc, &fence);

    // The agent alone dies; its run's processes live on as orphans.
    a.kill();
    let killed_at = now();
    a.launch();
    wait_for(
        "the orphans killed by the restarted agent",
        Duration::from_secs(15),
        || {
            format!(
                "alive: {:?}\n{}",
                orphans.iter().filter(|p| alive(**p)).collect::<Vec<_>>(),
                logs(&hub, &[&a, &b], &marks)
            )
        },
        || orphans.iter().all(|p| !alive(*p)).then_some(()),
    )
    .await;
    // The agent logs it just after the kill: wait for the line, not assume it.
    wait_for(
        "the restarted agent saying the run is lost",
        Duration::from_secs(10),
        || tail(&a.log(), 30),
        || {
            a.log()
                .contains("its processes are killed and the run is lost")
                .then_some(())
        },
    )
    .await;
    wait_for(
        "the TrainJob placed again and complete",
        Duration::from_secs(45),
        || logs(&hub, &[&a, &b], &marks),
        || complete(&hub, "marked").then_some(()),
    )
    .await;
    let spans = assert_no_overlap(&read_marks(&marks, &[&a, &b]));
    assert_eq!(spans.len(), 2, "two runs, one after the other: {spans:?}");
    assert!(
        spans[0].0.starts_with("spoke-a:") && spans[0].0.ends_with("-1"),
        "{spans:?}"
    );
    assert!(spans[1].0.ends_with("-2"), "generation 2: {spans:?}");
    assert!(
        spans[1].1 > killed_at,
        "the second run began after the agent was killed: {spans:?}"
    );
    // The last mark of the first run was made before the orphans died:
    // nothing of it ran on after the restart.
    assert!(
        !read_marks(&marks, &[&a])
            .iter()
            .any(|m| m.run == spans[0].0 && m.at > spans[1].1),
        "{spans:?}"
    );
}

/// A TCP proxy the test controls: while cut, it forwards nothing and
/// closes nothing (a partition, not a crash); connections open at the cut
/// stay frozen for good, new ones are held until healed.
struct Proxy {
    port: u16,
    cut: Arc<watch::Sender<bool>>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(upstream: u16) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(watch::channel(false).0);
        let task = {
            let cut = cut.clone();
            tokio::spawn(async move {
                let mut connections = tokio::task::JoinSet::new();
                while let Ok((client, _)) = listener.accept().await {
                    let mut gate = cut.subscribe();
                    connections.spawn(async move {
                        // Held while cut; frozen (never closed) if cut later.
                        let _ = gate.wait_for(|c| !*c).await;
                        let Ok(server) =
                            tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                        else {
                            return;
                        };
                        let (cr, cw) = client.into_split();
                        let (sr, sw) = server.into_split();
                        let up = forward(cr, sw, gate.clone());
                        let down = forward(sr, cw, gate);
                        let _ = tokio::join!(up, down);
                    });
                }
            })
        };
        Proxy { port, cut, task }
    }

    fn set_cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies `from` to `to` until either closes; once cut, forever nothing
/// (the sockets stay open).
async fn forward(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut cut: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            _ = cut.wait_for(|c| *c) => break,
        };
        if *cut.borrow() || to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    // Frozen: hold both halves, forward nothing.
    let _hold = (from, to);
    std::future::pending::<()>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_spoke_fences_before_the_hub_requeues_and_nothing_runs_twice() {
    let grpc = free_port();
    let hub = DevHub::start_args(
        &[
            "--spokes",
            "0",
            "--grpc-port",
            &grpc.to_string(),
            "--worker-lost-timeout-seconds",
            "8",
            "--spoke-silence-seconds",
            "4",
        ],
        |_| {},
    );
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (_marks_dir, marks) = marks_dir();
    let proxy = Proxy::start(grpc).await;
    let fence = ["--fence-after-seconds", "3"];
    let a = Spoke::start(&hub, dir.path(), "spoke-a", proxy.port, &fence);
    hub.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(&marking_trainjob("parted", &marks)),
    );
    let needle = marks.display().to_string();
    let pids = wait_for(
        "the run marking on spoke-a",
        Duration::from_secs(30),
        || logs(&hub, &[&a], &marks),
        || {
            let n = read_marks(&marks, &[&a]).len();
            let pids = processes_with(&needle);
            (n >= 3 && !pids.is_empty()).then_some(pids)
        },
    )
    .await;
    let b = Spoke::start(&hub, dir.path(), "spoke-b", grpc, &fence);

    proxy.set_cut(true);
    let cut = Instant::now();
    let cut_at = now();
    wait_for(
        "spoke-a fencing its run",
        Duration::from_secs(10),
        || logs(&hub, &[&a, &b], &marks),
        || pids.iter().all(|p| !alive(*p)).then_some(()),
    )
    .await;
    let fenced = cut.elapsed();
    let fenced_at = now();
    assert!(
        fenced >= Duration::from_millis(2500),
        "fenced before fence-after: {fenced:?}"
    );
    // The spoke says so once its runs are stopped: just after they die.
    wait_for(
        "spoke-a logging FENCED",
        Duration::from_secs(10),
        || logs(&hub, &[&a, &b], &marks),
        || a.log().contains("FENCED").then_some(()),
    )
    .await;
    let on_b = wait_for(
        "the TrainJob requeued to spoke-b",
        Duration::from_secs(30),
        || logs(&hub, &[&a, &b], &marks),
        || {
            read_marks(&marks, &[&a, &b])
                .into_iter()
                .find(|m| m.run.starts_with("spoke-b:"))
        },
    )
    .await;
    assert!(
        on_b.at > fenced_at,
        "spoke-b ran before spoke-a had fenced: {on_b:?}, fenced at {fenced_at}"
    );
    assert!(
        on_b.at - cut_at >= 8.0,
        "requeued before silence + worker-lost: {:.1}s after the cut",
        on_b.at - cut_at
    );

    // Heal: spoke-a comes back and says its run was lost (Fenced); the hub
    // has placed it elsewhere, so it is stale and stopped there.
    proxy.set_cut(false);
    wait_for(
        "spoke-a back, its lost run stopped and forgotten",
        Duration::from_secs(30),
        || {
            format!(
                "records: {:?}\n{}",
                a.records(),
                logs(&hub, &[&a, &b], &marks)
            )
        },
        || {
            let back = a.log().matches("connected to the hub").count() >= 2;
            (back && a.records().is_empty()).then_some(())
        },
    )
    .await;
    assert!(
        hub.log().contains("the spoke reports a run lost"),
        "{}",
        tail(&hub.log(), 40)
    );
    wait_for(
        "the TrainJob complete on spoke-b",
        Duration::from_secs(30),
        || logs(&hub, &[&a, &b], &marks),
        || complete(&hub, "parted").then_some(()),
    )
    .await;
    let spans = assert_no_overlap(&read_marks(&marks, &[&a, &b]));
    assert_eq!(spans.len(), 2, "{spans:?}");
    assert!(spans[0].0.starts_with("spoke-a:"), "{spans:?}");
    assert!(spans[1].0.starts_with("spoke-b:"), "{spans:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spoke_whose_fence_after_is_not_below_the_worker_lost_timeout_is_refused() {
    let grpc = free_port();
    let hub = DevHub::start_args(
        &[
            "--spokes",
            "0",
            "--grpc-port",
            &grpc.to_string(),
            "--worker-lost-timeout-seconds",
            "10",
        ],
        |_| {},
    );
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let a = Spoke::start(
        &hub,
        dir.path(),
        "spoke-a",
        grpc,
        &["--fence-after-seconds", "10"],
    );
    let refused = wait_for(
        "the session refused",
        Duration::from_secs(20),
        || logs(&hub, &[&a], Path::new("/nonexistent")),
        || {
            a.log()
                .lines()
                .find(|l| l.contains("fence_after_ms 10000"))
                .map(str::to_owned)
        },
    )
    .await;
    assert!(
        refused.contains("worker-lost timeout (10000 ms)"),
        "{refused}"
    );
    assert!(
        hub.log().contains("refused a session"),
        "{}",
        tail(&hub.log(), 20)
    );
}

#[test]
fn trainhub_dev_refuses_local_spokes_that_would_not_fence_in_time() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_trainhub"))
        .args(["dev", "--data-dir"])
        .arg(dir.path())
        .args(["--api-port", "0", "--spokes", "1"])
        .args(["--worker-lost-timeout-seconds", "10"])
        .args(["--spoke-fence-after-seconds", "10"])
        .env("TRAINHUB_PLUGIN_CACHE_DIR", crate::common::plugin_cache())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("--spoke-fence-after-seconds")
            && stderr.contains("fence_after_ms 10000")
            && stderr.contains("worker-lost timeout (10000 ms)"),
        "{stderr}"
    );
}
