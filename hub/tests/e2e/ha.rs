//! Several hub replicas on a real 3-member etcd (`LocalEtcd`): `trainhub
//! serve --storage-backend etcd3` processes and external `trainspoke`
//! processes that list every replica. One replica leads; followers serve
//! the API; spokes follow the leader; a leader that dies is replaced and
//! its spokes' runs go on.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use trainhub_apiserver::kubeconfig::{Kubeconfig, KubeconfigParams};
use trainhub_apiserver::pki::PemDir;
use trainhub_apiserver::store::etcd::LocalEtcd;

use crate::common::{free_port, plugin_cache, processes_with, tail, trainspoke_binary, wait_for};

/// Short election timings, so failover takes seconds.
const ELECTION: [&str; 6] = [
    "--leader-elect-lease-duration",
    "3s",
    "--leader-elect-renew-deadline",
    "2s",
    "--leader-elect-retry-period",
    "500ms",
];

/// One `trainhub serve` replica; SIGKILLed when dropped.
struct Replica {
    /// SIGSTOPped: it answers nothing until SIGCONT.
    stopped: bool,
    api: u16,
    grpc: u16,
    dir: PathBuf,
    kubeconfig: PathBuf,
    child: Option<Child>,
}

impl Replica {
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("hub.log")).unwrap_or_default()
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn signal(&mut self, signal: &str) {
        if let Some(child) = self.child.as_ref() {
            let _ = Command::new("kill")
                .args([signal, &child.id().to_string()])
                .status();
        }
    }

    fn kill(&mut self) {
        self.signal("-KILL");
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
    }

    /// `kubectl get trainjobs --watch -o <output>` on this replica, its
    /// output written to `file`.
    fn watch_trainjobs(&self, output: &str, file: &std::path::Path) -> Child {
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["get", "trainjobs", "--watch", "-o", output])
            .stdout(std::fs::File::create(file).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    }

    /// A metric's value on this replica's /metrics.
    fn metric(&self, name: &str) -> Option<f64> {
        let out = self.kubectl(&["get", "--raw", "/metrics"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    }

    fn kubectl(&self, args: &[&str]) -> Output {
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["--request-timeout", "10s"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("kubectl is installed")
    }

    fn kubectl_stdin(&self, args: &[&str], input: &str) -> Output {
        use std::io::Write as _;
        let mut child = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["--request-timeout", "10s"])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl is installed");
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(input.as_bytes());
        }
        child.wait_with_output().expect("kubectl output")
    }

    /// Whether this replica says it leads (`trainhub_leader 1` on /metrics).
    fn leads(&self) -> Option<bool> {
        self.child.as_ref()?;
        let out = self.kubectl(&["get", "--raw", "/metrics"]);
        if !out.status.success() {
            return None;
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text.lines().find(|l| l.starts_with("trainhub_leader "))?;
        Some(line.trim_end().ends_with(" 1"))
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A `trainspoke` process; SIGKILLed when dropped.
struct Spoke {
    name: String,
    work_dir: PathBuf,
    log: PathBuf,
    child: Child,
}

impl Spoke {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The run directories (`<jobset>-<generation>`) the spoke started for
    /// `job` in namespace default.
    fn runs_of(&self, job: &str) -> Vec<String> {
        std::fs::read_dir(self.work_dir.join("default"))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| {
                        n.strip_prefix(job)
                            .and_then(|rest| rest.strip_prefix('-'))
                            .is_some_and(|g| g.chars().all(|c| c.is_ascii_digit()))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Spoke {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// etcd, the PKI and the replicas of one test.
struct Ha {
    dir: tempfile::TempDir,
    etcd: LocalEtcd,
    pki: PemDir,
    replicas: Vec<Replica>,
    spokes: Vec<Spoke>,
}

impl Ha {
    /// `n` replicas on a fresh 3-member etcd; None when etcd is missing
    /// (and `TRAINHUB_REQUIRE_ETCD` unset).
    fn start(n: usize) -> Option<Ha> {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let etcd = local_etcd(3, dir.path())?;
        let pki = PemDir::new(dir.path().join("pki"));
        let ca = pki.load_or_create_ca("trainhub-ha-test-ca").unwrap();
        let issued = ca
            .issue_server(
                "trainhub",
                &["localhost"],
                &[std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)],
            )
            .unwrap();
        pki.write("hub", &issued).unwrap();
        let token = "ha-admin-token";
        std::fs::write(
            dir.path().join("tokens.csv"),
            format!("{token},admin,admin,\"system:masters\"\n"),
        )
        .unwrap();
        let mut ha = Ha {
            dir,
            etcd,
            pki,
            replicas: Vec::new(),
            spokes: Vec::new(),
        };
        for i in 0..n {
            let (api, grpc) = (free_port(), free_port());
            let rdir = ha.dir.path().join(format!("replica-{i}"));
            std::fs::create_dir_all(&rdir).unwrap();
            let kubeconfig = rdir.join("kubeconfig");
            Kubeconfig::write(
                &kubeconfig,
                &KubeconfigParams {
                    cluster_name: format!("ha-{i}"),
                    server_url: format!("https://127.0.0.1:{api}"),
                    ca_pem: ca.cert_pem().to_string(),
                    user_name: "admin".into(),
                    token: Some(token.into()),
                    client_cert_pem: None,
                    client_key_pem: None,
                    namespace: Some("default".into()),
                },
            )
            .unwrap();
            ha.replicas.push(Replica {
                stopped: false,
                api,
                grpc,
                dir: rdir,
                kubeconfig,
                child: None,
            });
            ha.launch(i);
        }
        Some(ha)
    }

    fn launch(&mut self, i: usize) {
        let endpoints = self.etcd.endpoints().join(",");
        let pki = &self.pki;
        let tokens = self.dir.path().join("tokens.csv");
        let r = &mut self.replicas[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(r.dir.join("hub.log"))
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_trainhub"))
            .arg("serve")
            .arg("--data-dir")
            .arg(r.dir.join("data"))
            .args(["--listen", &format!("127.0.0.1:{}", r.api)])
            .args(["--grpc-listen", &format!("127.0.0.1:{}", r.grpc)])
            .arg("--tls-cert-file")
            .arg(pki.cert_path("hub"))
            .arg("--tls-private-key-file")
            .arg(pki.key_path("hub"))
            .arg("--client-ca-file")
            .arg(pki.cert_path("ca"))
            .arg("--spoke-ca-file")
            .arg(pki.cert_path("ca"))
            .arg("--token-auth-file")
            .arg(&tokens)
            .args(["--storage-backend", "etcd3", "--etcd-servers", &endpoints])
            .args(ELECTION)
            .env("TRAINHUB_PLUGIN_CACHE_DIR", plugin_cache())
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting trainhub serve");
        r.child = Some(child);
    }

    /// Starts a `trainspoke` that lists the replicas' gRPC endpoints in
    /// `order`.
    fn spoke(&mut self, name: &str, order: &[usize]) {
        let ca = self.pki.load_or_create_ca("trainhub-ha-test-ca").unwrap();
        let issued = ca
            .issue_client(name, &[trainhub::grpc::SPOKE_GROUP])
            .unwrap();
        self.pki.write(name, &issued).unwrap();
        let hubs: Vec<String> = order
            .iter()
            .map(|&i| format!("https://127.0.0.1:{}", self.replicas[i].grpc))
            .collect();
        let work_dir = self.dir.path().join("spokes").join(name);
        let log = self.dir.path().join(format!("{name}.log"));
        let child = Command::new(trainspoke_binary())
            .args(["--hub", &hubs.join(",")])
            .arg("--ca")
            .arg(self.pki.cert_path("ca"))
            .arg("--cert")
            .arg(self.pki.cert_path(name))
            .arg("--key")
            .arg(self.pki.key_path(name))
            .arg("--work-dir")
            .arg(&work_dir)
            .args(["--label", &format!("name={name}")])
            .args(["--capacity", "cpu=64,memory=64Gi"])
            .args(["--heartbeat-seconds", "1", "--run-as-user", "none"])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("starting trainspoke");
        self.spokes.push(Spoke {
            name: name.to_string(),
            work_dir,
            log,
            child,
        });
    }

    fn logs(&self) -> String {
        let mut text = String::new();
        for (i, r) in self.replicas.iter().enumerate() {
            text.push_str(&format!("\n--- replica {i} log:\n{}", tail(&r.log(), 60)));
        }
        for s in &self.spokes {
            text.push_str(&format!("\n--- {} log:\n{}", s.name, tail(&s.log(), 20)));
        }
        text
    }

    /// Waits until exactly one live replica leads and the others answer
    /// as followers; returns its index.
    async fn leader(&self, within: Duration) -> usize {
        wait_for(
            "exactly one leader",
            within,
            || self.logs(),
            || {
                let roles: Vec<(usize, Option<bool>)> = self
                    .replicas
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| r.child.is_some() && !r.stopped)
                    .map(|(i, r)| (i, r.leads()))
                    .collect();
                if roles.iter().any(|(_, r)| r.is_none()) {
                    return None;
                }
                let leaders: Vec<usize> = roles
                    .iter()
                    .filter(|(_, r)| *r == Some(true))
                    .map(|(i, _)| *i)
                    .collect();
                assert!(leaders.len() <= 1, "two replicas lead at once: {leaders:?}");
                leaders.first().copied()
            },
        )
        .await
    }

    /// Any live replica other than `not`.
    fn other(&self, not: usize) -> &Replica {
        self.replicas
            .iter()
            .enumerate()
            .find(|(i, r)| *i != not && r.child.is_some() && !r.stopped)
            .map(|(_, r)| r)
            .expect("another live replica")
    }
}

/// A local etcd cluster under `dir`; None when etcd is missing (and not
/// required). A start that lost a free port to another process (the ports
/// are picked, then bound by etcd) is tried again with others.
fn local_etcd(members: usize, dir: &std::path::Path) -> Option<LocalEtcd> {
    let mut last = None;
    for attempt in 0..3 {
        match LocalEtcd::start_or_skip(members, &dir.join(format!("etcd-{attempt}"))) {
            Ok(etcd) => return etcd,
            Err(e) => last = Some(e),
        }
    }
    panic!("etcd did not start: {last:?}")
}

fn trainjob(name: &str, script: &str) -> String {
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

/// The TrainJobs (by name) that replica `r` lists, with whether each is
/// Complete.
fn trainjobs(r: &Replica) -> Option<BTreeMap<String, bool>> {
    let out = r.kubectl(&["get", "trainjobs", "-o", "json"]);
    if !out.status.success() {
        return None;
    }
    let list: Value = serde_json::from_slice(&out.stdout).ok()?;
    Some(
        list["items"]
            .as_array()?
            .iter()
            .map(|j| {
                let complete = j["status"]["conditions"].as_array().is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "Complete" && c["status"] == "True")
                });
                (
                    j["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    complete,
                )
            })
            .collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_leads_a_follower_serves_creates_lists_and_watches_and_spokes_follow_the_leader()
 {
    let Some(mut ha) = Ha::start(2) else {
        return;
    };
    let leader = ha.leader(Duration::from_secs(60)).await;
    let follower = 1 - leader;
    // The follower first: it refuses the spoke and names the leader.
    ha.spoke("spoke-a", &[follower, leader]);

    // A watch on the follower, from before the create.
    let watch_out = ha.dir.path().join("watch.txt");
    let mut watch = ha.replicas[follower].watch_trainjobs(
        "jsonpath={.metadata.name} {.status.conditions[*].type}{\"\\n\"}",
        &watch_out,
    );

    let f = &ha.replicas[follower];
    for (i, role) in [(follower, "role ok: follower"), (leader, "role ok: leader")] {
        let out = ha.replicas[i].kubectl(&["get", "--raw", "/readyz?verbose"]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains(role),
            "replica {i} is ready and says {role:?}: {text}"
        );
    }
    let out = f.kubectl_stdin(&["create", "-f", "-"], &trainjob("hello", "echo hello"));
    assert!(
        out.status.success(),
        "a follower serves creates: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        ha.logs()
    );
    let listed = trainjobs(f).unwrap();
    assert!(
        listed.contains_key("hello"),
        "the follower lists it: {listed:?}"
    );
    wait_for(
        "hello Complete (read from the follower)",
        Duration::from_secs(90),
        || ha.logs(),
        || {
            trainjobs(&ha.replicas[follower])?
                .get("hello")
                .copied()
                .filter(|c| *c)
        },
    )
    .await;
    wait_for(
        "the follower's watch to see hello Complete",
        Duration::from_secs(20),
        || std::fs::read_to_string(&watch_out).unwrap_or_default(),
        || {
            std::fs::read_to_string(&watch_out)
                .ok()?
                .lines()
                .any(|l| l.starts_with("hello ") && l.contains("Complete"))
                .then_some(())
        },
    )
    .await;
    let _ = watch.kill();
    let _ = watch.wait();
    // Pod logs asked of the follower come from the leader's spoke session.
    let f = &ha.replicas[follower];
    let pods = f.kubectl(&["get", "pods", "-o", "name"]);
    let pod = String::from_utf8_lossy(&pods.stdout)
        .lines()
        .find(|l| l.contains("hello"))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("hello's pod listed on the follower\n{}", ha.logs()));
    let logs = f.kubectl(&["logs", &pod]);
    assert!(
        logs.status.success() && String::from_utf8_lossy(&logs.stdout).contains("hello"),
        "kubectl logs through the follower: {}{}\n{}",
        String::from_utf8_lossy(&logs.stdout),
        String::from_utf8_lossy(&logs.stderr),
        ha.logs()
    );
    // The leader's side of that hop takes its term's token, not a user's.
    let path = format!(
        "{}?namespace=default&pod={}",
        trainhub::peer::PEER_LOGS_PATH,
        pod.trim_start_matches("pod/")
    );
    let direct = ha.replicas[leader].kubectl(&["get", "--raw", &path]);
    assert!(
        !direct.status.success()
            && String::from_utf8_lossy(&direct.stderr).contains("Unauthorized"),
        "the peer path refuses the admin's token: {}",
        String::from_utf8_lossy(&direct.stderr)
    );
    let spoke_log = ha.spokes[0].log();
    assert!(
        spoke_log.contains("does not lead: following it to the leader"),
        "the spoke was sent from the follower to the leader:\n{}",
        ha.logs()
    );
    assert_eq!(ha.spokes[0].runs_of("hello").len(), 1, "{}", ha.logs());
    let follower_log = ha.replicas[follower].log();
    assert!(
        !follower_log.contains("spoke connected"),
        "a follower holds no spoke session:\n{}",
        tail(&follower_log, 40)
    );
    ha.etcd.kill(0);
}

/// A TrainJob that runs `seconds` with a marker in its command line (to
/// find its processes).
fn long_job(name: &str, seconds: u32) -> String {
    trainjob(name, &format!("sleep {seconds}; echo ha-long-{name}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_leader_loses_no_acknowledged_create_places_each_job_once_and_running_jobs_keep_their_processes()
 {
    // A burst of 1,000 creates from 8 clients (the long jobs outlast it).
    const CLIENTS: usize = 8;
    const PER_CLIENT: usize = 125;
    let Some(mut ha) = Ha::start(3) else {
        return;
    };
    let leader = ha.leader(Duration::from_secs(60)).await;
    ha.spoke("spoke-a", &[0, 1, 2]);
    ha.spoke("spoke-b", &[2, 1, 0]);
    // kubectl watching a follower from the start, through the failover.
    let watched = (0..3).find(|i| *i != leader).unwrap();
    let watch_out = ha.dir.path().join("follower-watch.txt");
    let mut follower_watch = ha.replicas[watched].watch_trainjobs(
        "jsonpath={.metadata.name} {.metadata.resourceVersion} {.status.conditions[*].type}{\"\\n\"}",
        &watch_out,
    );

    // Two jobs running before the kill; their processes must survive it.
    let via = ha.other(leader);
    for name in ["long-a", "long-b"] {
        let out = via.kubectl_stdin(&["create", "-f", "-"], &long_job(name, 120));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let before: BTreeMap<&str, BTreeSet<u32>> = wait_for(
        "the long jobs' processes",
        Duration::from_secs(60),
        || ha.logs(),
        || {
            let pids: BTreeMap<&str, BTreeSet<u32>> = ["long-a", "long-b"]
                .into_iter()
                .map(|n| (n, processes_with(&format!("ha-long-{n}"))))
                .collect();
            pids.values().all(|p| !p.is_empty()).then_some(pids)
        },
    )
    .await;
    // Only the processes that last: a shell's fork carries its command
    // line until it execs (`sleep`), and is gone a moment later.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before: BTreeMap<&str, BTreeSet<u32>> = before
        .into_iter()
        .map(|(n, pids)| {
            let lasting = &pids & &processes_with(&format!("ha-long-{n}"));
            assert!(!lasting.is_empty(), "{n}: no process lasted 2 s: {pids:?}");
            (n, lasting)
        })
        .collect();

    // Concurrent creates through every replica; the leader dies midway.
    let acknowledged = Arc::new(Mutex::new(BTreeSet::new()));
    let configs: Vec<PathBuf> = ha.replicas.iter().map(|r| r.kubeconfig.clone()).collect();
    let mut clients = Vec::new();
    for c in 0..CLIENTS {
        let (acknowledged, configs) = (acknowledged.clone(), configs.clone());
        clients.push(std::thread::spawn(move || {
            for k in 0..PER_CLIENT {
                let name = format!("burst-{c}-{k}");
                // Each create goes to the next replica that answers.
                for attempt in 0..configs.len() {
                    let config = &configs[(c + k + attempt) % configs.len()];
                    let out = {
                        use std::io::Write as _;
                        let mut child = Command::new("kubectl")
                            .arg("--kubeconfig")
                            .arg(config)
                            .args(["--request-timeout", "5s", "create", "-f", "-"])
                            .stdin(Stdio::piped())
                            .stdout(Stdio::piped())
                            .stderr(Stdio::piped())
                            .spawn()
                            .unwrap();
                        if let Some(mut stdin) = child.stdin.take() {
                            let _ = stdin.write_all(trainjob(&name, "true").as_bytes());
                        }
                        child.wait_with_output().unwrap()
                    };
                    let err = String::from_utf8_lossy(&out.stderr);
                    if out.status.success() || err.contains("AlreadyExists") {
                        acknowledged.lock().unwrap().insert(name.clone());
                        break;
                    }
                }
            }
        }));
    }
    wait_for(
        "a third of the creates",
        Duration::from_secs(120),
        || ha.logs(),
        || (acknowledged.lock().unwrap().len() >= CLIENTS * PER_CLIENT / 3).then_some(()),
    )
    .await;
    let killed_pid = ha.replicas[leader].pid();
    ha.replicas[leader].kill();
    let killed_at = Instant::now();
    let new_leader = ha.leader(Duration::from_secs(30)).await;
    assert_ne!(new_leader, leader);
    assert!(
        killed_at.elapsed() < Duration::from_secs(20),
        "a new leader led {:?} after the kill of {killed_pid:?}",
        killed_at.elapsed()
    );
    // The runs going before the kill still run, as the same processes,
    // once the spokes are with the new leader.
    wait_for(
        "both spokes connected to the new leader",
        Duration::from_secs(20),
        || ha.logs(),
        || {
            let log = ha.replicas[new_leader].log();
            ha.spokes
                .iter()
                .all(|s| {
                    log.contains(&format!("spoke=\"{}\"", s.name))
                        || log.contains(&format!("spoke={}", s.name))
                })
                .then_some(())
        },
    )
    .await;
    for (name, pids) in &before {
        // Every process seen before still runs (the run may have started
        // more of its own since: the sandbox's, the shell's).
        let now = processes_with(&format!("ha-long-{name}"));
        assert!(
            pids.is_subset(&now),
            "{name}'s processes {pids:?} before the failover, {now:?} after\n{}",
            ha.logs()
        );
    }
    for c in clients {
        c.join().unwrap();
    }
    let acknowledged = acknowledged.lock().unwrap().clone();
    assert!(
        acknowledged.len() >= CLIENTS * PER_CLIENT * 9 / 10,
        "most creates acknowledged: {}",
        acknowledged.len()
    );

    // Every acknowledged create is stored, and every TrainJob completes.
    let survivor = &ha.replicas[new_leader];
    let all = wait_for(
        "every TrainJob Complete",
        Duration::from_secs(240),
        || ha.logs(),
        || {
            let jobs = trainjobs(survivor)?;
            jobs.values().all(|c| *c).then_some(jobs)
        },
    )
    .await;
    let missing: Vec<&String> = acknowledged
        .iter()
        .filter(|n| !all.contains_key(*n))
        .collect();
    assert!(missing.is_empty(), "acknowledged creates lost: {missing:?}");

    // Placed once: one run directory per TrainJob across both spokes.
    let names: Vec<String> = all.keys().cloned().collect();
    assert_placed_once(&ha, &names);
    // The long jobs ran once (above); no run was fenced, nor stopped by a
    // new leader that did not know it yet.
    for s in &ha.spokes {
        let log = s.log();
        assert!(
            !log.contains("FENCED") && !log.contains("stopping run="),
            "no run fenced or stopped:\n{}",
            ha.logs()
        );
    }
    for name in before.keys() {
        assert!(all.get(*name).copied().unwrap_or(false), "{name} Complete");
    }

    // The follower's watch saw every TrainJob through to Complete, its
    // changes in resourceVersion order, and never ended.
    let seen = wait_for(
        "the follower's watch to see every TrainJob Complete",
        Duration::from_secs(30),
        || ha.logs(),
        || {
            let text = std::fs::read_to_string(&watch_out).ok()?;
            let complete: BTreeSet<&str> = text
                .lines()
                .filter(|l| l.ends_with("Complete") || l.contains(" Complete "))
                .filter_map(|l| l.split(' ').next())
                .collect();
            names
                .iter()
                .all(|n| complete.contains(n.as_str()))
                .then(|| text.clone())
        },
    )
    .await;
    let versions: Vec<u64> = seen
        .lines()
        .filter_map(|l| l.split(' ').nth(1)?.parse().ok())
        .collect();
    assert!(
        versions.len() >= names.len() * 2,
        "a change per create and per Complete at least: {} lines",
        versions.len()
    );
    assert!(
        versions.windows(2).all(|w| w[0] <= w[1]),
        "the follower's watch saw changes in resourceVersion order"
    );
    assert!(
        follower_watch.try_wait().unwrap().is_none(),
        "the follower's watch is still open"
    );
    let _ = follower_watch.kill();
    let _ = follower_watch.wait();
}

/// Creates `name` through `r` and fails with the logs if refused.
fn create(ha: &Ha, r: &Replica, name: &str, script: &str) {
    let out = r.kubectl_stdin(&["create", "-f", "-"], &trainjob(name, script));
    assert!(
        out.status.success(),
        "creating {name}: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        ha.logs()
    );
}

async fn all_complete(ha: &Ha, via: usize, names: &[String], within: Duration) {
    wait_for(
        "the TrainJobs Complete",
        within,
        || ha.logs(),
        || {
            let jobs = trainjobs(&ha.replicas[via])?;
            names
                .iter()
                .all(|n| jobs.get(n).copied().unwrap_or(false))
                .then_some(())
        },
    )
    .await;
}

fn assert_placed_once(ha: &Ha, names: &[String]) {
    for name in names {
        let runs: Vec<String> = ha
            .spokes
            .iter()
            .flat_map(|s| {
                s.runs_of(name)
                    .into_iter()
                    .map(move |r| format!("{}:{r}", s.name))
            })
            .collect();
        if runs.len() != 1 {
            // Every line of every log that names the TrainJob.
            let mut lines = String::new();
            let logs = ha
                .replicas
                .iter()
                .map(Replica::log)
                .chain(ha.spokes.iter().map(Spoke::log));
            for (i, log) in logs.enumerate() {
                for line in log.lines().filter(|l| l.contains(name.as_str())) {
                    lines.push_str(&format!("[{i}] {line}\n"));
                }
            }
            panic!("{name} ran {runs:?}\n{lines}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_frozen_past_its_lease_is_replaced_steps_down_on_waking_and_places_nothing() {
    let Some(mut ha) = Ha::start(2) else {
        return;
    };
    let old = ha.leader(Duration::from_secs(60)).await;
    let other = 1 - old;
    ha.spoke("spoke-a", &[0, 1]);
    ha.spoke("spoke-b", &[1, 0]);
    let mut names: Vec<String> = Vec::new();
    for i in 0..3 {
        let name = format!("before-{i}");
        create(&ha, &ha.replicas[other], &name, "echo before");
        names.push(name);
    }
    create(
        &ha,
        &ha.replicas[other],
        "long-c",
        "sleep 20; echo ha-long-long-c",
    );
    names.push("long-c".into());
    let pids = wait_for(
        "long-c's processes",
        Duration::from_secs(60),
        || ha.logs(),
        || {
            let p = processes_with("ha-long-long-c");
            (!p.is_empty()).then_some(p)
        },
    )
    .await;
    all_complete(&ha, other, &names[..3], Duration::from_secs(60)).await;

    // Frozen past its lease (3 s): the other replica takes over.
    ha.replicas[old].signal("-STOP");
    ha.replicas[old].stopped = true;
    let frozen_at = Instant::now();
    let new = ha.leader(Duration::from_secs(20)).await;
    assert_eq!(new, other);
    eprintln!("a new leader {:?} after the freeze", frozen_at.elapsed());
    let now = processes_with("ha-long-long-c");
    assert!(
        pids.is_subset(&now),
        "long-c runs on as the same processes: {pids:?} before, {now:?} after\n{}",
        ha.logs()
    );
    for i in 0..3 {
        let name = format!("during-{i}");
        create(&ha, &ha.replicas[new], &name, "echo during");
        names.push(name);
    }
    all_complete(&ha, new, &names[4..], Duration::from_secs(60)).await;

    // Woken: it notices, steps down, and its term writes nothing.
    ha.replicas[old].signal("-CONT");
    ha.replicas[old].stopped = false;
    wait_for(
        "the old leader to step down",
        Duration::from_secs(10),
        || ha.logs(),
        || ha.replicas[old].leads().filter(|l| !*l).map(|_| ()),
    )
    .await;
    assert_eq!(ha.leader(Duration::from_secs(10)).await, new);
    let log = ha.replicas[old].log();
    assert!(log.contains("stepped down"), "{}", tail(&log, 30));
    let fenced = ha.replicas[old]
        .metric("trainhub_fenced_writes_total")
        .unwrap_or(0.0);
    eprintln!("writes of the old term refused after waking: {fenced}");
    for i in 0..2 {
        let name = format!("after-{i}");
        create(&ha, &ha.replicas[old], &name, "echo after");
        names.push(name);
    }
    all_complete(&ha, new, &names, Duration::from_secs(60)).await;
    assert!(
        processes_with("ha-long-long-c").is_empty(),
        "long-c finished (it was running as {pids:?})"
    );
    assert_placed_once(&ha, &names);
    for s in &ha.spokes {
        assert!(
            !s.log().contains("stopping run="),
            "no run stopped:\n{}",
            ha.logs()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_one_etcd_member_killed_the_hub_keeps_serving_creates_and_dispatch() {
    let Some(mut ha) = Ha::start(2) else {
        return;
    };
    let leader = ha.leader(Duration::from_secs(60)).await;
    ha.spoke("spoke-a", &[0, 1]);
    let mut names = Vec::new();
    create(&ha, &ha.replicas[1 - leader], "first", "echo first");
    names.push("first".to_string());
    all_complete(&ha, leader, &names, Duration::from_secs(60)).await;
    ha.etcd.kill(0);
    // etcd elects a new raft leader if the member led: writes may be
    // refused meanwhile (as kube-apiserver's are), then go through again.
    let mut refused = Vec::new();
    for i in 0..6 {
        let name = format!("degraded-{i}");
        // Through both replicas: the follower's writes and the leader's.
        let r = &ha.replicas[i % 2];
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let out = r.kubectl_stdin(&["create", "-f", "-"], &trainjob(&name, "echo degraded"));
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            if out.status.success() || err.contains("AlreadyExists") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "creates refused for 15 s after one etcd member died: {err}\n{}",
                ha.logs()
            );
            refused.push(err);
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        names.push(name);
    }
    eprintln!("creates refused after the member died: {refused:?}");
    all_complete(&ha, 1 - leader, &names, Duration::from_secs(90)).await;
    // One replica leads after it (with the tests' 2 s renew deadline, an
    // etcd election may cost the leader its term; another takes over).
    ha.leader(Duration::from_secs(20)).await;
    assert_placed_once(&ha, &names);
}

/// `trainhub dev` with two replicas on a one-member etcd and one spoke
/// (None when etcd is not installed and not required).
fn dev_replicas_on_etcd(
    dir: &std::path::Path,
    extra: &[&str],
) -> Option<(LocalEtcd, crate::common::DevHub)> {
    let etcd = local_etcd(1, dir)?;
    let endpoints = etcd.endpoints().join(",");
    let mut args = vec![
        "--etcd-servers",
        &endpoints,
        "--replicas",
        "2",
        "--spokes",
        "1",
    ];
    args.extend(ELECTION);
    args.extend_from_slice(extra);
    let hub = crate::common::DevHub::start_args(&args, |_| {});
    Some((etcd, hub))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trainhub_dev_with_etcd_starts_replicas_whose_spokes_follow_the_leader() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let Some((etcd, hub)) = dev_replicas_on_etcd(dir.path(), &[]) else {
        return;
    };
    hub.kubectl_stdin(
        &["create", "-f", "-"],
        Some(&trainjob("dev-ha", "echo dev-ha")),
    );
    crate::common::eventually("dev-ha Complete", &hub, Duration::from_secs(90), || {
        let out = hub.kubectl(&["get", "trainjob", "dev-ha", "-o", "json"]);
        let job: Value = serde_json::from_slice(&out.stdout).ok()?;
        job["status"]["conditions"]
            .as_array()?
            .iter()
            .any(|c| c["type"] == "Complete" && c["status"] == "True")
            .then_some(())
    })
    .await;
    let log = hub.log();
    assert!(
        log.contains("hub replica serving")
            && log.matches("campaigning for leadership").count() == 2,
        "two replicas campaigned:\n{}",
        tail(&log, 40)
    );
    drop(hub);
    drop(etcd);
}

/// kubectl's suite (upstream manifests applied unchanged, get, describe,
/// patch, watch, delete) against `trainhub dev` on a 3-member etcd.
#[test]
fn kubectl_suite_passes_against_the_etcd_store() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let Some(etcd) = local_etcd(3, dir.path()) else {
        return;
    };
    let endpoints = etcd.endpoints().join(",");
    let hub =
        crate::common::DevHub::start_args(&["--spokes", "0", "--etcd-servers", &endpoints], |_| {});
    crate::kubectl::kubectl_suite(&hub);
    drop(hub);
    drop(etcd);
}

/// The Kubeflow SDK's suite (runtimes, train on two nodes, logs, list,
/// delete) against `trainhub dev --spokes 2` on a 3-member etcd.
#[test]
fn kubeflow_sdk_suite_passes_against_the_etcd_store() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let Some(etcd) = local_etcd(3, dir.path()) else {
        return;
    };
    let endpoints = etcd.endpoints().join(",");
    crate::sdk::sdk_suite(&["--etcd-servers", &endpoints]);
    drop(etcd);
}

/// A plugin pushed to a real registry with `trainctl plugin push`, its
/// object printed by `trainctl plugin install` and applied through one
/// replica, is loaded by both: each admits with it (the follower too), the
/// leader builds with it, and the follower reports it Ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trainer_plugin_pushed_and_applied_through_one_replica_serves_on_both() {
    use trainhub_plugin_oci::local_registry::LocalRegistry;
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let Some(registry) = LocalRegistry::start_or_skip(&dir.path().join("registry"), None).unwrap()
    else {
        return;
    };
    let address = registry.address();
    let Some((etcd, hub)) =
        dev_replicas_on_etcd(dir.path(), &["--plugin-insecure-registries", &address])
    else {
        return;
    };
    // The second replica's API, as the hub logs it.
    let second = hub
        .log()
        .lines()
        .find(|l| l.contains("hub replica serving") && l.contains("replica=2"))
        .and_then(|l| l.split("api=").nth(1))
        .and_then(|a| a.split_whitespace().next())
        .map(|a| format!("https://{a}"))
        .expect("the second replica's address in the log");
    let via_second = |args: &[&str], stdin: Option<&str>| {
        let mut all = vec!["--server", second.as_str()];
        all.extend_from_slice(args);
        hub.kubectl_stdin(&all, stdin)
    };
    let trainctl = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_trainctl"))
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("running trainctl");
        assert!(
            out.status.success(),
            "trainctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };

    let module = PathBuf::from(trainhub::builtin::WASM_DIR).join("acme_plugin.wasm");
    let target = format!("oci://{address}/plugins/acme:v1");
    let pushed = trainctl(&[
        "plugin",
        "push",
        &module.display().to_string(),
        &target,
        "--plain-http",
    ]);
    assert!(
        pushed.contains(&format!("oci://{address}/plugins/acme:v1@sha256:")),
        "{pushed}"
    );
    let settings = dir.path().join("settings.yaml");
    std::fs::write(&settings, "cluster: c1\n").unwrap();
    let plugin = trainctl(&[
        "plugin",
        "install",
        &target,
        "--name",
        "acme",
        "--settings",
        &settings.display().to_string(),
        "--plain-http",
    ]);
    assert!(plugin.contains("@sha256:"), "pinned by digest: {plugin}");
    let out = hub.kubectl_stdin(&["apply", "-f", "-"], Some(&plugin));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let runtime = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/acme/runtime.yaml"),
    )
    .unwrap();
    let out = hub.kubectl_stdin(&["apply", "-f", "-"], Some(&runtime));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    crate::common::eventually(
        "acme Ready, as the second replica reads it",
        &hub,
        Duration::from_secs(60),
        || {
            let out = via_second(
                &[
                    "get",
                    "tplugin",
                    "acme",
                    "-o",
                    "jsonpath={.status.conditions[0].status}",
                ],
                None,
            );
            (String::from_utf8_lossy(&out.stdout) == "True").then_some(())
        },
    )
    .await;

    let job = |name: &str, project: bool| {
        let env = if project {
            "    env:\n      - name: ACME_PROJECT\n        value: recommender\n"
        } else {
            ""
        };
        format!(
            "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata:\n  name: {name}\nspec:\n  runtimeRef:\n    name: acme-distributed\n  trainer:\n    numNodes: 1\n    command: [\"true\"]\n{env}"
        )
    };
    // Each replica admits with the plugin.
    for (replica, name) in [(0, "no-project-1"), (1, "no-project-2")] {
        let out = if replica == 0 {
            hub.kubectl_stdin(&["create", "-f", "-"], Some(&job(name, false)))
        } else {
            via_second(&["create", "-f", "-"], Some(&job(name, false)))
        };
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains("ACME_PROJECT must be set"),
            "replica {}: {stderr}",
            replica + 1
        );
    }
    // Created through the follower, built by the leader with the plugin:
    // its pods have acme's env and sidecar.
    let out = via_second(&["create", "-f", "-"], Some(&job("built", true)));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    crate::common::eventually("built's pod with acme's sidecar and env", &hub, Duration::from_secs(90), || {
        let out = hub.kubectl(&[
            "get",
            "pods",
            "-l",
            "jobset.sigs.k8s.io/jobset-name=built",
            "-o",
            "jsonpath={.items[0].spec.containers[*].name} {.items[0].spec.containers[0].env[?(@.name==\"ACME_CLUSTER\")].value}",
        ]);
        (String::from_utf8_lossy(&out.stdout).trim() == "node acme-agent c1").then_some(())
    })
    .await;
    drop(hub);
    drop(etcd);
    drop(registry);
}

/// A watch from a resourceVersion etcd has compacted, asked of a replica
/// that started after the compaction (so neither its watch cache nor etcd
/// holds that history), is refused with kube-apiserver's 410 Expired; the
/// watch kubectl held on the replica ended with it; kubectl, listing and
/// watching again, sees every TrainJob and the changes after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_from_a_compacted_revision_is_410_and_kubectl_listing_again_recovers() {
    let Some(mut ha) = Ha::start(2) else {
        return;
    };
    let leader = ha.leader(Duration::from_secs(60)).await;
    let follower = 1 - leader;
    create(&ha, &ha.replicas[leader], "first", "true");
    let rv = wait_for(
        "first on the follower",
        Duration::from_secs(20),
        || ha.logs(),
        || {
            let out = ha.replicas[follower].kubectl(&[
                "get",
                "trainjob",
                "first",
                "-o",
                "jsonpath={.metadata.resourceVersion}",
            ]);
            let rv = String::from_utf8_lossy(&out.stdout).trim().to_string();
            (out.status.success() && !rv.is_empty()).then_some(rv)
        },
    )
    .await;
    let path = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs";
    let from_rv = format!("{path}?watch=1&resourceVersion={rv}");
    // A watch held on the follower from that version.
    let mut held = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&ha.replicas[follower].kubeconfig)
        .args(["get", "--raw", &from_rv])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();

    create(&ha, &ha.replicas[leader], "second", "true");
    let mut etcd = etcd_client::Client::connect(ha.etcd.endpoints(), None)
        .await
        .expect("etcd client");
    let revision = etcd
        .get("/", None)
        .await
        .expect("etcd revision")
        .header()
        .expect("header")
        .revision();
    etcd.compact(
        revision,
        Some(etcd_client::CompactionOptions::new().with_physical()),
    )
    .await
    .expect("compact");

    // The follower restarts: the watch it held ends; asked again from the
    // compacted version, it answers 410 Expired.
    ha.replicas[follower].kill();
    let ended = held.wait().expect("the held watch");
    assert!(!ended.success(), "the held watch ended with its server");
    ha.launch(follower);
    ha.leader(Duration::from_secs(60)).await;
    let refused = wait_for(
        "the follower answering the watch",
        Duration::from_secs(30),
        || ha.logs(),
        || {
            let out = ha.replicas[follower].kubectl(&["get", "--raw", &from_rv]);
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.contains("\"ERROR\"").then_some(text)
        },
    )
    .await;
    let event: Value = serde_json::from_str(refused.trim()).expect("one watch event");
    assert_eq!(event["object"]["code"], 410, "{refused}");
    assert_eq!(event["object"]["reason"], "Expired", "{refused}");

    // kubectl lists and watches again: everything, and what comes next.
    let listed = trainjobs(&ha.replicas[follower]).expect("list");
    assert!(
        listed.contains_key("first") && listed.contains_key("second"),
        "{listed:?}"
    );
    let watch_out = ha.dir.path().join("rewatch.txt");
    let mut watch = ha.replicas[follower].watch_trainjobs("name", &watch_out);
    create(&ha, &ha.replicas[leader], "third", "true");
    wait_for(
        "the new watch sees first, second and third",
        Duration::from_secs(20),
        || ha.logs(),
        || {
            let seen = std::fs::read_to_string(&watch_out).unwrap_or_default();
            ["first", "second", "third"]
                .iter()
                .all(|n| seen.contains(&format!("trainjob.trainer.kubeflow.org/{n}")))
                .then_some(())
        },
    )
    .await;
    let _ = watch.kill();
    let _ = watch.wait();
}

/// The TrainJobs `r` lists: (name, placed on a spoke, finished).
fn placements(r: &Replica) -> Option<Vec<(String, bool, bool)>> {
    let out = r.kubectl(&["get", "trainjobs", "-o", "json"]);
    if !out.status.success() {
        return None;
    }
    let list: Value = serde_json::from_slice(&out.stdout).ok()?;
    let finished = |j: &Value| {
        j["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter().any(|c| {
                (c["type"] == "Complete" || c["type"] == "Failed") && c["status"] == "True"
            })
        })
    };
    Some(
        list["items"]
            .as_array()?
            .iter()
            .map(|j| {
                (
                    j["metadata"]["name"].as_str().unwrap_or_default().into(),
                    j["metadata"]["annotations"]["trainhub.kubeflow.org/spoke"].is_string(),
                    finished(j),
                )
            })
            .collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queues_quota_holds_across_a_sigkilled_leader_and_what_waits_runs_once_quota_frees() {
    let Some(mut ha) = Ha::start(2) else {
        return;
    };
    let leader = ha.leader(Duration::from_secs(60)).await;
    ha.spoke("spoke-a", &[0, 1]);
    ha.spoke("spoke-b", &[1, 0]);
    let follower = (0..2).find(|i| *i != leader).unwrap();
    // Two CPUs of quota; the spokes have 128.
    let queues = crate::quotas::queues("2", "");
    let out = ha.replicas[follower].kubectl_stdin(&["apply", "-f", "-"], &queues);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let names: Vec<String> = (1..=4).map(|i| format!("quota-{i}")).collect();
    for name in &names {
        let out = ha.replicas[follower].kubectl_stdin(
            &["create", "-f", "-"],
            &crate::quotas::trainjob(name, 15, None),
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    wait_for(
        "two TrainJobs placed within the quota, two waiting",
        Duration::from_secs(60),
        || ha.logs(),
        || {
            let jobs = placements(&ha.replicas[follower])?;
            let placed = jobs.iter().filter(|(_, p, _)| *p).count();
            (jobs.len() == 4 && placed == 2).then_some(())
        },
    )
    .await;

    // The leader dies while two hold the whole quota and two wait for it.
    ha.replicas[leader].kill();
    let new_leader = ha.leader(Duration::from_secs(30)).await;
    assert_eq!(new_leader, follower);
    // Until every TrainJob is finished, never more than the quota's two
    // run at once: the new leader charges the runs it adopts before it
    // admits what waits.
    let survivor = &ha.replicas[new_leader];
    let started = Instant::now();
    let mut most = 0;
    loop {
        let Some(jobs) = placements(survivor) else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let now = jobs
            .iter()
            .filter(|(_, placed, done)| *placed && !done)
            .count();
        most = most.max(now);
        assert!(
            now <= 2,
            "{now} TrainJobs run on a quota of 2: {jobs:?}\n{}",
            ha.logs()
        );
        if jobs.len() == 4 && jobs.iter().all(|(_, _, done)| *done) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "not all finished: {jobs:?}\n{}",
            ha.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(most, 2, "the quota was used whole");
    all_complete(&ha, new_leader, &names, Duration::from_secs(10)).await;
    // Each ran once: the runs adopted were not started again, nor stopped.
    assert_placed_once(&ha, &names);
    for s in &ha.spokes {
        assert!(
            !s.log().contains("stopping run="),
            "no run stopped:\n{}",
            ha.logs()
        );
    }
    // The new leader's queue status says nothing is held any more.
    wait_for(
        "the ClusterQueue's status as the new leader publishes it",
        Duration::from_secs(20),
        || ha.logs(),
        || {
            let out = survivor.kubectl(&["get", "cq", "cluster-queue", "-o", "json"]);
            let cq: Value = serde_json::from_slice(&out.stdout).ok()?;
            let n = |f: &str| cq["status"][f].as_i64().unwrap_or(-1);
            (n("pendingWorkloads") == 0
                && n("reservingWorkloads") == 0
                && n("admittedWorkloads") == 0)
                .then_some(())
        },
    )
    .await;
}
