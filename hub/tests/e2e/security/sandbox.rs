//! A TrainJob's command against the platform and its neighbours, on the
//! process backend of `trainhub dev`: it cannot read the hub's token, the
//! CA's key, the store or another job's directory (as root, with run uids
//! and namespaces; as an unprivileged user, with user namespaces); its
//! `setsid` grandchild dies with it; its memory limit stops it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{DevHub, tail, wait_for};

const DEADLINE: Duration = Duration::from_secs(120);

fn running_as_root() -> bool {
    trainhub_spoke::backend::process::sandbox::effective_uid() == Some(0)
}

/// A one-node TrainJob of the built-in `python-distributed` runtime running `sh -c SCRIPT`.
fn trainjob(name: &str, script: &str, resources: Value) -> String {
    json!({
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {
            "runtimeRef": {"name": "python-distributed"},
            "trainer": {
                "numNodes": 1,
                "command": ["sh", "-c", script],
                "resourcesPerNode": resources,
            }
        }
    })
    .to_string()
}

fn apply(hub: &DevHub, manifest: &str) {
    let out = hub.kubectl_stdin(&["apply", "-f", "-"], Some(manifest));
    assert!(
        out.status.success(),
        "kubectl apply: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        tail(&hub.log(), 30)
    );
}

/// The logs of a TrainJob's pods, as its author reads them.
fn logs(hub: &DevHub, job: &str) -> String {
    let out = hub.kubectl(&[
        "logs",
        "--tail=-1",
        "-l",
        &format!("jobset.sigs.k8s.io/jobset-name={job}"),
    ]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The first pod of a TrainJob, once there is one.
fn pod(hub: &DevHub, job: &str) -> Option<Value> {
    let out = hub.kubectl(&[
        "get",
        "pods",
        "-l",
        &format!("jobset.sigs.k8s.io/jobset-name={job}"),
        "-o",
        "json",
    ]);
    let list: Value = serde_json::from_slice(&out.stdout).ok()?;
    list["items"].get(0).cloned()
}

/// The TrainJob's terminal condition (`Complete` or `Failed`), once it has one.
fn finished(hub: &DevHub, job: &str) -> Option<String> {
    let out = hub.kubectl(&["get", "trainjob", job, "-o", "json"]);
    let job: Value = serde_json::from_slice(&out.stdout).ok()?;
    job["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["status"] == "True" && (c["type"] == "Complete" || c["type"] == "Failed"))
        .and_then(|c| c["type"].as_str())
        .map(str::to_owned)
}

/// The local spokes' start line about their sandbox (they start once the
/// hub serves).
async fn sandbox_line(hub: &DevHub) -> String {
    wait_for(
        "the sandbox line",
        DEADLINE,
        || hub.log(),
        || {
            hub.log()
                .lines()
                .find(|l| l.contains("process sandbox:"))
                .map(str::to_owned)
        },
    )
    .await
}

/// Every file named `name` under `dir`.
fn find_files(dir: &Path, name: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                out.extend(find_files(&path, name));
            } else if entry.file_name() == name {
                out.push(path);
            }
        }
    }
    out
}

/// The process (in this PID namespace) running `sleep MARKER`.
fn pid_of_sleep(marker: &str) -> Option<u32> {
    let wanted = format!("sleep\0{marker}\0");
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            (cmdline == wanted.as_bytes()).then_some(pid)
        })
}

/// A victim job keeps a file in its directory; a thief job tries the hub's
/// secrets and the victim's file, by relative and absolute paths. Every
/// attempt is refused and nothing secret reaches the thief's log.
async fn secrets_stay_hidden(hub: &DevHub) {
    let data = hub.dir.path();
    let token = std::fs::read_to_string(data.join("tokens.csv"))
        .expect("tokens.csv")
        .split(',')
        .next()
        .expect("a token")
        .to_owned();
    let ca_key = std::fs::read_to_string(data.join("pki/ca.key")).expect("the CA key");
    let key_line = ca_key
        .lines()
        .find(|l| !l.starts_with("-----") && l.len() > 20)
        .expect("a line of key material")
        .to_owned();

    apply(
        hub,
        &trainjob(
            "victim",
            "echo VICTIM-SECRET-7 > mine.txt; echo ready; sleep 600",
            json!({}),
        ),
    );
    wait_for(
        "the victim ready",
        DEADLINE,
        || tail(&hub.log(), 30),
        || logs(hub, "victim").contains("ready").then_some(()),
    )
    .await;
    let mine = find_files(&data.join("spokes"), "mine.txt");
    assert_eq!(mine.len(), 1, "{mine:?}");
    let victim_dir = mine[0].parent().expect("the victim's pod directory");
    let victim_rel = format!(
        "../../{}/{}/mine.txt",
        victim_dir
            .parent()
            .and_then(Path::file_name)
            .expect("run dir")
            .to_string_lossy(),
        victim_dir.file_name().expect("pod dir").to_string_lossy()
    );

    let targets = [
        "../../../../../tokens.csv".to_owned(),
        "../../../../../pki/ca.key".to_owned(),
        data.join("tokens.csv").display().to_string(),
        data.join("pki/ca.key").display().to_string(),
        data.join("store.redb").display().to_string(),
        mine[0].display().to_string(),
        victim_rel,
    ];
    let script = format!(
        "for f in {}; do cat \"$f\" 2>&1 || echo \"refused $f\"; done; echo \"data: $(ls -A {} 2>&1 | tr '\\n' ' ')\"; echo finished",
        targets
            .iter()
            .map(|t| format!("'{t}'"))
            .collect::<Vec<_>>()
            .join(" "),
        data.display()
    );
    apply(hub, &trainjob("thief", &script, json!({})));
    let state = wait_for(
        "the thief finished",
        DEADLINE,
        || tail(&hub.log(), 30),
        || finished(hub, "thief"),
    )
    .await;
    let log = logs(hub, "thief");
    assert_eq!(state, "Complete", "{log}");
    assert!(log.contains("finished"), "{log}");
    assert!(!log.contains(&token), "the admin token leaked:\n{log}");
    assert!(!log.contains(&key_line), "the CA key leaked:\n{log}");
    assert!(
        !log.contains("VICTIM-SECRET-7"),
        "the victim's file leaked:\n{log}"
    );
    assert_eq!(
        log.matches("refused ").count(),
        targets.len(),
        "every read is refused:\n{log}"
    );
    assert!(
        log.contains("No such file or directory") || log.contains("Permission denied"),
        "{log}"
    );
    // The data directory shows nothing but the way to the thief's own pod.
    let listing = log
        .lines()
        .find_map(|l| l.strip_prefix("data: "))
        .expect("the listing");
    assert_eq!(listing.trim(), "spokes", "{log}");

    hub.kubectl_ok(&["delete", "trainjob", "victim", "thief"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trainjob_cannot_read_the_hubs_secrets_or_another_jobs_files() {
    let hub = DevHub::start_args(&["--spokes", "1"], |_| {});
    let line = sandbox_line(&hub).await;
    assert!(line.contains("namespaces"), "{line}");
    if running_as_root() {
        assert!(line.contains("run uids 2000000000-2000065535"), "{line}");
    }
    use std::os::unix::fs::PermissionsExt as _;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(hub.dir.path()), 0o700);
    assert_eq!(mode(&hub.dir.path().join("pki")), 0o700);
    assert_eq!(mode(&hub.dir.path().join("pki/ca.key")), 0o600);
    assert_eq!(mode(&hub.dir.path().join("tokens.csv")), 0o600);
    secrets_stay_hidden(&hub).await;
}

/// The same, with the hub (and its spokes) run by an unprivileged user:
/// nobody (65534) when the test runs as root, else the test's own user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trainjob_cannot_read_the_secrets_of_an_unprivileged_hub() {
    const NOBODY: u32 = 65534;
    let hub = if running_as_root() {
        let cache = tempfile::tempdir().unwrap();
        let as_nobody = |path: &Path| {
            let status = std::process::Command::new("chown")
                .args(["-R", &format!("{NOBODY}:{NOBODY}")])
                .arg(path)
                .status()
                .unwrap();
            assert!(status.success());
        };
        // The tests' plugin cache, copied for nobody to use.
        let shared = crate::common::plugin_cache();
        if shared.is_dir() {
            let status = std::process::Command::new("cp")
                .arg("-a")
                .arg(format!("{}/.", shared.display()))
                .arg(cache.path())
                .status()
                .unwrap();
            assert!(status.success());
        }
        as_nobody(cache.path());
        let hub = DevHub::start_as(
            NOBODY,
            &["--spokes", "1"],
            &[(
                "TRAINHUB_PLUGIN_CACHE_DIR",
                cache.path().display().to_string(),
            )],
            as_nobody,
        );
        std::mem::forget(cache);
        hub
    } else {
        DevHub::start_args(&["--spokes", "1"], |_| {})
    };
    let line = sandbox_line(&hub).await;
    // Without root: no run uids; user namespaces hide the files instead. A
    // machine that forbids them must say so, and then nothing protects.
    assert!(!line.contains("run uids"), "{line}");
    assert!(
        line.contains("user, mount and PID namespaces"),
        "user namespaces are allowed on this machine, for this user: {line}"
    );
    secrets_stay_hidden(&hub).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setsid_grandchild_dies_with_its_trainjob() {
    let hub = DevHub::start_args(&["--spokes", "1"], |_| {});
    let marker = format!("1000.{}77", std::process::id());
    apply(
        &hub,
        &trainjob(
            "escapee",
            &format!("setsid sleep {marker} & echo started; sleep 1000"),
            json!({}),
        ),
    );
    let pid = wait_for(
        "the grandchild",
        DEADLINE,
        || tail(&hub.log(), 30),
        || {
            if !logs(&hub, "escapee").contains("started") {
                return None;
            }
            pid_of_sleep(&marker)
        },
    )
    .await;
    let session = |pid: u32| -> Option<String> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        fields.get(3).map(|s| s.to_string())
    };
    // It leads a session of its own: the pod's process group is not its.
    assert_eq!(session(pid), Some(pid.to_string()), "setsid took effect");
    hub.kubectl_ok(&["delete", "trainjob", "escapee"]);
    wait_for(
        "the grandchild to be killed",
        Duration::from_secs(60),
        || tail(&hub.log(), 30),
        || pid_of_sleep(&marker).is_none().then_some(()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_hog_is_stopped_by_its_limit() {
    let hub = DevHub::start_args(&["--spokes", "1"], |_| {});
    let line = sandbox_line(&hub).await;
    if !line.contains("limits by cgroup") {
        assert!(!running_as_root(), "root, yet no cgroup limits: {line}");
        eprintln!("skipped: no cgroups for this user: {line}");
        return;
    }
    apply(
        &hub,
        &trainjob(
            "hog",
            "echo start; python3 -c 'x = bytearray(1024 * 1024 * 1024); print(\"survived\")'",
            json!({"limits": {"memory": "64Mi", "cpu": "1"}}),
        ),
    );
    let state = wait_for(
        "the hog finished",
        DEADLINE,
        || tail(&hub.log(), 30),
        || finished(&hub, "hog"),
    )
    .await;
    assert_eq!(state, "Failed");
    let pod = pod(&hub, "hog").expect("the hog's pod");
    assert_eq!(pod["status"]["phase"], "Failed", "{pod:#}");
    let terminated = &pod["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(terminated["reason"], "OOMKilled", "{pod:#}");
    assert_eq!(terminated["exitCode"], 137, "{pod:#}");
    assert!(!logs(&hub, "hog").contains("survived"));
    // The hub keeps serving.
    hub.kubectl_ok(&["get", "trainjobs"]);
}
