//! Running one run: the supervisor task that drives [`RunState`] with the
//! events of the pods' processes, and the pod tasks that start those
//! processes, one process group (and, where the machine allows, one
//! sandbox and one cgroup) each.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::future::join_all;
use jiff::Timestamp;
use rand::Rng as _;
use tokio::sync::mpsc;

use super::Shared;
use super::devices::{Vendor, gpus_requested, visible_env};
use super::plan::{PodIdentity, Process, ResolveContext, RunPlan};
use super::records::{ProcessRecord, RecordFile};
use super::rewrite::Endpoints;
use super::sandbox::{Launch, Sandbox};
use super::state::{ContainerRef, PodEvent, RunState};
use crate::backend::RunKey;

/// The process groups of a run's pods, and whether they may still start.
///
/// Starting a process and killing a pod take the same lock, so a pod that
/// is killed starts nothing afterwards and nothing it started escapes.
#[derive(Debug)]
pub(super) struct Procs {
    sandbox: Arc<Sandbox>,
    /// Where every process started is written down (see [`super::records`]).
    record: Option<Arc<RecordFile>>,
    inner: Mutex<ProcsInner>,
}

#[derive(Debug, Default)]
struct ProcsInner {
    /// The whole run was killed: nothing starts any more.
    closed: bool,
    killed: BTreeSet<String>,
    groups: BTreeMap<String, BTreeSet<u32>>,
    /// Pods that have cgroups.
    cgroups: BTreeSet<String>,
}

impl Procs {
    pub(super) fn new(sandbox: Arc<Sandbox>, record: Option<Arc<RecordFile>>) -> Self {
        Procs {
            sandbox,
            record,
            inner: Mutex::default(),
        }
    }

    /// The run's record, where a pod's GPUs are written down.
    fn record(&self) -> Option<&Arc<RecordFile>> {
        self.record.as_ref()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ProcsInner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts a process for pod `uid` unless it was killed (Ok(None)).
    fn spawn(
        &self,
        uid: &str,
        start: impl FnOnce() -> std::io::Result<tokio::process::Child>,
    ) -> std::io::Result<Option<tokio::process::Child>> {
        let mut inner = self.lock();
        if inner.closed || inner.killed.contains(uid) {
            return Ok(None);
        }
        if self.sandbox.cgroups().is_some() {
            inner.cgroups.insert(uid.to_owned());
        }
        let child = start()?;
        if let Some(pid) = child.id() {
            inner.groups.entry(uid.to_owned()).or_default().insert(pid);
            self.write_down(uid, pid);
        }
        Ok(Some(child))
    }

    /// Adds a process (its own group) to the run's record, so that a
    /// restarted agent finds and kills it.
    fn write_down(&self, pod: &str, pid: u32) {
        let Some(record) = &self.record else { return };
        let Some(start_time) = super::records::start_time(pid) else {
            // Already gone.
            return;
        };
        let written = record.update(|r| {
            r.processes.push(ProcessRecord {
                pod: pod.to_owned(),
                pid,
                pgid: pid,
                start_time,
            })
        });
        if let Err(err) = written {
            tracing::error!(pid, %err, "could not write a started process to its run record: an agent restart would not kill it");
        }
    }

    /// Stops every process of the run as kubelet stops a pod: SIGTERM to
    /// every process group, then, for what is left after `grace`, SIGKILL
    /// (and the pods' cgroups). Nothing starts any more.
    pub(super) async fn terminate_all(&self, grace: Duration) {
        let groups: Vec<u32> = {
            let mut inner = self.lock();
            inner.closed = true;
            inner.groups.values().flatten().copied().collect()
        };
        if !groups.is_empty() && !grace.is_zero() {
            groups.iter().for_each(|g| signal_group(*g, "TERM"));
            let deadline = tokio::time::Instant::now() + grace;
            while tokio::time::Instant::now() < deadline
                && self.lock().groups.values().any(|g| !g.is_empty())
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        self.kill_all();
    }

    /// A container's main process ended: the rest of its group goes with it,
    /// as a container's processes do.
    fn ended(&self, uid: &str, pgid: Option<u32>) {
        let Some(pgid) = pgid else { return };
        let mut inner = self.lock();
        if let Some(groups) = inner.groups.get_mut(uid) {
            groups.remove(&pgid);
        }
        drop(inner);
        kill_group(pgid);
    }

    /// Kills every process of the given pods; they start nothing more.
    pub(super) fn kill_pods(&self, uids: &[String]) {
        let mut inner = self.lock();
        let mut groups = Vec::new();
        let mut cgroups = Vec::new();
        for uid in uids {
            inner.killed.insert(uid.clone());
            groups.extend(inner.groups.remove(uid).into_iter().flatten());
            cgroups.extend(inner.cgroups.take(uid));
        }
        drop(inner);
        groups.into_iter().for_each(kill_group);
        self.remove_cgroups(cgroups);
    }

    /// Kills every process of the run; nothing starts any more.
    pub(super) fn kill_all(&self) {
        let mut inner = self.lock();
        inner.closed = true;
        let groups: Vec<u32> = std::mem::take(&mut inner.groups)
            .into_values()
            .flatten()
            .collect();
        let cgroups: Vec<String> = std::mem::take(&mut inner.cgroups).into_iter().collect();
        drop(inner);
        groups.into_iter().for_each(kill_group);
        self.remove_cgroups(cgroups);
    }

    /// Kills whatever is left in the pods' cgroups (processes that left
    /// their group or session) and removes the groups.
    fn remove_cgroups(&self, pods: Vec<String>) {
        if pods.is_empty() || self.sandbox.cgroups().is_none() {
            return;
        }
        let sandbox = Arc::clone(&self.sandbox);
        let work = move || {
            if let Some(cgroups) = sandbox.cgroups() {
                pods.iter().for_each(|pod| cgroups.remove_pod(pod));
            }
        };
        // Freezing and waiting for the group to empty may take a moment.
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => drop(handle.spawn_blocking(work)),
            Err(_) => work(),
        }
    }
}

/// The reason kubelet gives a container its memory limit stopped.
pub(super) const OOM_KILLED: &str = "OOMKilled";

/// Opens (creating) a container's log for appending, never through a
/// symlink: the pod's directory is the run's, which could have put one there.
fn open_log(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other(format!(
            "{} is not a regular file",
            path.display()
        )));
    }
    Ok(file)
}

/// SIGKILL to a whole process group, through the `kill` command (no unsafe
/// code here). A group already gone is fine.
pub(super) fn kill_group(pgid: u32) {
    signal_group(pgid, "KILL");
}

/// A signal (`KILL`, `TERM`) to a whole process group.
fn signal_group(pgid: u32, signal: &str) {
    let result = std::process::Command::new("kill")
        .args([&format!("-{signal}"), "--", &format!("-{pgid}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if let Err(err) = result {
        tracing::warn!(pgid, %err, "could not run kill for a process group");
    }
}

/// A fresh pod name suffix (Kubernetes' generateName alphabet) and uid.
pub(super) fn fresh_identity() -> (String, String) {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    let suffix: String = (0..5)
        .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
        .collect();
    let b: [u8; 16] = rng.random();
    let hex =
        |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
    // A version 4 UUID.
    let uid = format!(
        "{}-{}-4{}-{:x}{}-{}",
        hex(0..4),
        hex(4..6),
        &hex(6..8)[1..],
        8 | (b[8] & 3),
        &hex(8..10)[1..],
        hex(10..16)
    );
    (suffix, uid)
}

/// The GPUs a pod holds while its processes may run. Dropped (the pod's
/// task ended, or the pod never started), they are free again, out of the
/// run's record, and pods waiting for GPUs try again.
pub(super) struct DeviceLease {
    shared: Arc<Shared>,
    record: Option<Arc<RecordFile>>,
    pod: String,
    /// What it holds, every vendor's.
    devices: Vec<String>,
    /// The GPU env of its processes (see [`visible_env`]).
    env: Vec<(OsString, OsString)>,
}

impl DeviceLease {
    /// The GPUs `wants` (per vendor) for pod `pod`: Ok(None) while too few
    /// are free. Only the vendors whose GPUs the spoke found are assigned.
    ///
    /// # Errors
    ///
    /// The spoke has fewer GPUs of a vendor than wanted: the pod can never
    /// run.
    fn take(
        shared: &Arc<Shared>,
        record: Option<&Arc<RecordFile>>,
        pod: &str,
        wants: &BTreeMap<Vendor, usize>,
    ) -> Result<Option<Self>, String> {
        let mut inner = shared.lock();
        let pool = &mut inner.devices;
        let vendors = pool.vendors();
        let wants: BTreeMap<Vendor, usize> = wants
            .iter()
            .filter(|(v, _)| vendors.contains(v))
            .map(|(v, n)| (*v, *n))
            .collect();
        if let Some((vendor, count)) = wants.iter().find(|(v, n)| **n > pool.count(**v)) {
            return Err(format!(
                "the pod requests {count} {} and this spoke has {}",
                vendor.resource(),
                pool.count(*vendor)
            ));
        }
        let Some(held) = pool.assign(pod, &wants) else {
            return Ok(None);
        };
        drop(inner);
        let lease = DeviceLease {
            shared: Arc::clone(shared),
            record: record.cloned(),
            pod: pod.to_owned(),
            devices: held.values().flatten().cloned().collect(),
            env: visible_env(&vendors, &held),
        };
        lease.write_down();
        Ok(Some(lease))
    }

    fn write_down(&self) {
        let (Some(record), false) = (&self.record, self.devices.is_empty()) else {
            return;
        };
        let written = record.update(|r| {
            r.devices.insert(self.pod.clone(), self.devices.clone());
        });
        if let Err(err) = written {
            tracing::warn!(pod = %self.pod, %err, "could not write a pod's GPUs to its run record");
        }
    }

    /// The GPU env of the pod's processes: none when the spoke manages no
    /// GPU.
    fn env(&self) -> Vec<(OsString, OsString)> {
        self.env.clone()
    }
}

impl Drop for DeviceLease {
    fn drop(&mut self) {
        if !self.shared.lock().devices.release(&self.pod) {
            return;
        }
        if let Some(record) = &self.record
            && let Err(err) = record.update(|r| {
                r.devices.remove(&self.pod);
            })
        {
            tracing::warn!(pod = %self.pod, %err, "could not remove a pod's GPUs from its run record");
        }
        self.shared
            .devices_freed
            .send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// One free local port per declared container port.
fn pick_ports(declared: &BTreeSet<i32>) -> std::io::Result<BTreeMap<i32, u16>> {
    // Keep every listener open until all are picked, so the ports differ.
    let listeners = declared
        .iter()
        .map(|port| Ok((*port, std::net::TcpListener::bind("127.0.0.1:0")?)))
        .collect::<std::io::Result<Vec<_>>>()?;
    listeners
        .into_iter()
        .map(|(port, l)| Ok((port, l.local_addr()?.port())))
        .collect()
}

/// What the supervisor of one run needs.
pub(super) struct RunContext {
    pub shared: Arc<Shared>,
    pub key: RunKey,
    pub plan: Arc<RunPlan>,
    pub dir: PathBuf,
    /// The run's own uid (and gid), when runs get one.
    pub uid: Option<u32>,
    pub extra_env: Vec<(String, String)>,
    pub procs: Arc<Procs>,
}

/// Drives one run until it is Completed or Failed, reporting every change.
pub(super) async fn supervise(ctx: RunContext) {
    let (events, mut rx) = mpsc::unbounded_channel();
    let mut fresh = fresh_identity;
    let mut state = RunState::new(Arc::clone(&ctx.plan), Timestamp::now(), &mut fresh);
    let mut attempt = -1;
    let mut endpoints = Endpoints::default();
    let mut freed = ctx.shared.devices_freed.subscribe();
    loop {
        let kill = state.evaluate(Timestamp::now(), &mut fresh);
        ctx.procs.kill_pods(&kill);
        if state.restarts() != attempt {
            // Fresh ports for every attempt: the old processes' sockets may linger.
            attempt = state.restarts();
            let ports = pick_ports(&ctx.plan.ports).unwrap_or_else(|err| {
                tracing::warn!(run = ?ctx.key, %err, "could not pick local ports; container ports are not remapped");
                BTreeMap::new()
            });
            endpoints = ctx.plan.endpoints(&ports);
        }
        freed.borrow_and_update();
        let mut waiting = false;
        for i in state.to_launch() {
            match lease_devices(&ctx, &mut state, i) {
                Ok(Some(lease)) => launch(&ctx, &state, i, lease, &endpoints, &events).await,
                Ok(None) => waiting = true,
                Err(message) => cannot_run(&state, i, message, &events),
            }
        }
        ctx.shared.observe(&ctx.key, &state, &ctx.dir);
        if state.terminal_state().is_some() {
            return;
        }
        tokio::select! {
            event = rx.recv() => match event {
                Some(event) => { state.apply(event); }
                None => return,
            },
            _ = freed.changed(), if waiting => {}
        }
        while let Ok(event) = rx.try_recv() {
            state.apply(event);
        }
    }
}

/// The GPUs pod `i` requests, now its (and in its state); Ok(None) when it
/// must wait for them (it is handed out again later).
fn lease_devices(
    ctx: &RunContext,
    state: &mut RunState,
    i: usize,
) -> Result<Option<DeviceLease>, String> {
    let Some(pod) = state.pods().get(i) else {
        return Ok(None);
    };
    let wants = ctx
        .plan
        .replicated_jobs
        .get(pod.rjob)
        .map(|r| gpus_requested(&r.requests_milli))
        .unwrap_or_default();
    let lease = DeviceLease::take(&ctx.shared, ctx.procs.record(), &pod.uid, &wants)?;
    match &lease {
        Some(lease) => state.set_devices(i, lease.devices.clone()),
        None => state.hold_back(i),
    }
    Ok(lease)
}

/// Pod `i` fails with `message` without starting.
fn cannot_run(
    state: &RunState,
    i: usize,
    message: String,
    events: &mpsc::UnboundedSender<PodEvent>,
) {
    if let Some(pod) = state.pods().get(i) {
        let _ = events.send(PodEvent::CannotRun {
            uid: pod.uid.clone(),
            message,
            at: Timestamp::now(),
        });
    }
}

/// Starts pod `i`, holding `lease`: its directory, volume files and a task
/// running its containers. A pod that cannot be resolved fails with the
/// reason.
async fn launch(
    ctx: &RunContext,
    state: &RunState,
    i: usize,
    lease: DeviceLease,
    endpoints: &Endpoints,
    events: &mpsc::UnboundedSender<PodEvent>,
) {
    let Some(pod) = state.pods().get(i) else {
        return;
    };
    let id = PodIdentity {
        name: pod.name.clone(),
        uid: pod.uid.clone(),
        restarts: pod.restarts,
    };
    let dir = ctx.dir.join(&pod.name);
    let resolve = ResolveContext {
        endpoints: endpoints.clone(),
        node_name: &ctx.shared.node_name,
        extra_env: &ctx.extra_env,
        allocatable: Some(&ctx.shared.config.capacity),
        pod_dir: Some(&dir),
    };
    let prepared = match ctx
        .plan
        .resolve_pod(pod.rjob, pod.job_index, pod.index, &id, &resolve)
    {
        Err(message) => Err(message),
        Ok(resolved) => write_files(&dir, &resolved.files, ctx.uid)
            .await
            .map(|()| resolved)
            .map_err(|err| format!("cannot prepare the pod directory {}: {err}", dir.display())),
    };
    match prepared {
        Err(message) => cannot_run(state, i, message, events),
        Ok(resolved) => {
            let spec = ctx
                .plan
                .pod_spec(pod.rjob, pod.job_index, pod.index, &ctx.shared.node_name);
            let base_env = pod_base_env(
                &ctx.shared.base_env,
                ctx.uid.is_some().then_some(dir.as_path()),
                &pod_hostname(&spec, &pod.name),
                lease.env(),
            );
            let task = PodTask {
                uid: id.uid,
                dir,
                run_uid: ctx.uid,
                sandbox: Arc::clone(&ctx.shared.sandbox),
                base_env,
                procs: Arc::clone(&ctx.procs),
                events: events.clone(),
            };
            tokio::spawn(async move {
                task.run(resolved.init, resolved.main).await;
                drop(lease);
            });
        }
    }
}

/// The host name kubelet gives a pod: its `spec.hostname`, else its name,
/// cut to 63 characters without a trailing `-` or `.`.
pub(super) fn pod_hostname(spec: &serde_json::Value, pod_name: &str) -> String {
    let name = spec["hostname"]
        .as_str()
        .filter(|h| !h.is_empty())
        .unwrap_or(pod_name);
    let cut: String = name.chars().take(63).collect();
    cut.trim_end_matches(['-', '.']).to_owned()
}

/// What every container of a pod gets before its own env (which wins, as
/// a container's env wins over what its runtime sets): the spoke's `PATH`
/// and `HOME` (`home` instead when the run has its own uid: the spoke's
/// home is not the run's), `HOSTNAME`, and the GPU env.
fn pod_base_env(
    spoke: &[(OsString, OsString)],
    home: Option<&Path>,
    hostname: &str,
    devices: Vec<(OsString, OsString)>,
) -> Vec<(OsString, OsString)> {
    let mut env = spoke.to_vec();
    if let Some(home) = home {
        env.retain(|(k, _)| k != "HOME");
        env.push(("HOME".into(), home.as_os_str().to_owned()));
    }
    env.push(("HOSTNAME".into(), hostname.into()));
    env.extend(devices);
    env
}

/// The pod's directory with its volume files; the directory is the run
/// uid's (when runs get one) and closed to others, the files read-only to it.
async fn write_files(
    dir: &Path,
    files: &[(String, Vec<u8>)],
    uid: Option<u32>,
) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    tokio::fs::create_dir_all(dir).await?;
    for (relative, bytes) in files {
        let path = dir.join(relative);
        if let Some(parent) = path.parent() {
            tokio::fs::create_dir_all(parent).await?;
        }
        tokio::fs::write(&path, bytes).await?;
    }
    if let Some(uid) = uid {
        std::os::unix::fs::chown(dir, Some(uid), Some(uid))?;
    }
    tokio::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).await?;
    Ok(())
}

/// The processes of one pod.
struct PodTask {
    uid: String,
    dir: PathBuf,
    run_uid: Option<u32>,
    sandbox: Arc<Sandbox>,
    base_env: Vec<(OsString, OsString)>,
    procs: Arc<Procs>,
    events: mpsc::UnboundedSender<PodEvent>,
}

impl PodTask {
    async fn run(self, init: Vec<Process>, main: Vec<Process>) {
        for (i, process) in init.iter().enumerate() {
            match self.container(ContainerRef::Init(i), process).await {
                Some(0) => {}
                _ => return,
            }
        }
        join_all(
            main.iter()
                .enumerate()
                .map(|(i, p)| self.container(ContainerRef::Main(i), p)),
        )
        .await;
    }

    /// Runs one container to its end; its exit code, or None if the pod was
    /// killed before it started.
    async fn container(&self, which: ContainerRef, process: &Process) -> Option<i32> {
        let spawned = self.procs.spawn(&self.uid, || self.command(process));
        let mut child = match spawned {
            Ok(Some(child)) => child,
            Ok(None) => return None,
            Err(err) => {
                let _ = self.events.send(PodEvent::Exited {
                    uid: self.uid.clone(),
                    container: which,
                    exit_code: 128,
                    signal: None,
                    reason: Some("StartError".into()),
                    message: Some(format!("cannot start {:?}: {err}", process.program)),
                    at: Timestamp::now(),
                });
                return Some(128);
            }
        };
        let pgid = child.id();
        let _ = self.events.send(PodEvent::Started {
            uid: self.uid.clone(),
            container: which,
            at: Timestamp::now(),
        });
        let status = child.wait().await;
        let oom_killed = self
            .sandbox
            .cgroups()
            .is_some_and(|c| c.oom_killed(&self.uid, &process.name));
        self.procs.ended(&self.uid, pgid);
        self.remove_cgroup(&process.name).await;
        let (mut exit_code, mut signal, message) = match status {
            Ok(status) => {
                use std::os::unix::process::ExitStatusExt as _;
                match (status.code(), status.signal()) {
                    (Some(code), _) => (code, None, None),
                    (None, Some(sig)) => (128 + sig, Some(sig), None),
                    (None, None) => (1, None, None),
                }
            }
            Err(err) => (1, None, Some(format!("cannot wait for the process: {err}"))),
        };
        let mut reason = None;
        if oom_killed && exit_code != 0 {
            // As kubelet reports a container its memory limit stopped: the
            // kernel's SIGKILL, whatever the sandbox's shell made of it.
            reason = Some(OOM_KILLED.to_owned());
            exit_code = 137;
            signal = Some(9);
        }
        let _ = self.events.send(PodEvent::Exited {
            uid: self.uid.clone(),
            container: which,
            exit_code,
            signal,
            reason,
            message,
            at: Timestamp::now(),
        });
        Some(exit_code)
    }

    /// Kills what is left of a container in its cgroup (its main process
    /// ended) and removes the group.
    async fn remove_cgroup(&self, container: &str) {
        if self.sandbox.cgroups().is_none() {
            return;
        }
        let sandbox = Arc::clone(&self.sandbox);
        let (pod, container) = (self.uid.clone(), container.to_owned());
        let _ = tokio::task::spawn_blocking(move || {
            if let Some(c) = sandbox.cgroups() {
                c.remove_container(&pod, &container);
            }
        })
        .await;
    }

    fn command(&self, process: &Process) -> std::io::Result<tokio::process::Child> {
        let log = open_log(&self.dir.join(format!("{}.log", process.name)))?;
        let stderr = log.try_clone()?;
        let cgroup_procs = match self.sandbox.cgroups() {
            Some(c) => c.create_container(&self.uid, &process.name, process.limits)?,
            None => Vec::new(),
        };
        let mut env: Vec<(OsString, OsString)> = self.base_env.clone();
        for (k, v) in &process.env {
            let k = OsString::from(k);
            env.retain(|(name, _)| *name != k);
            env.push((k, OsString::from(v)));
        }
        let mut command = self.sandbox.command(&Launch {
            pod_dir: &self.dir,
            program: &process.program,
            args: &process.args,
            env,
            uid: self.run_uid,
            cgroup_procs,
        });
        command
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(stderr))
            .process_group(0)
            .kill_on_drop(true);
        command.spawn()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_identities_look_like_kubernetes_ones() {
        let (suffix, uid) = fresh_identity();
        assert_eq!(suffix.len(), 5);
        assert!(
            suffix
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        );
        assert_eq!(uid.len(), 36);
        assert_eq!(&uid[14..15], "4");
        assert!(matches!(&uid[19..20], "8" | "9" | "a" | "b"), "{uid}");
        assert_ne!(fresh_identity(), fresh_identity());
    }

    #[test]
    fn the_hostname_is_the_specs_else_the_pod_name_cut_as_kubelet_does() {
        let spec = serde_json::json!({"hostname": "j-node-0-1", "subdomain": "j"});
        assert_eq!(pod_hostname(&spec, "j-node-0-1-x7k2p"), "j-node-0-1");
        let none = serde_json::json!({"containers": []});
        assert_eq!(pod_hostname(&none, "j-node-0-1-x7k2p"), "j-node-0-1-x7k2p");
        let long = format!("{}-b", "a".repeat(62));
        assert_eq!(
            pod_hostname(&serde_json::json!({"hostname": ""}), &long),
            "a".repeat(62),
            "63 characters, the trailing '-' dropped"
        );
    }

    #[test]
    fn a_pod_env_has_its_hostname_and_gpus_and_its_own_home() {
        let spoke: Vec<(OsString, OsString)> = vec![
            ("PATH".into(), "/bin".into()),
            ("HOME".into(), "/root".into()),
        ];
        let nvidia = BTreeSet::from([Vendor::Nvidia]);
        let held = BTreeMap::from([(Vendor::Nvidia, vec!["GPU-a".to_owned()])]);
        let devices = visible_env(&nvidia, &held);
        let env = pod_base_env(&spoke, Some(Path::new("/w/p")), "j-node-0-0", devices);
        let get = |k: &str| {
            env.iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.to_string_lossy().into_owned())
        };
        assert_eq!(get("HOSTNAME").as_deref(), Some("j-node-0-0"));
        assert_eq!(get("HOME").as_deref(), Some("/w/p"));
        assert_eq!(get("PATH").as_deref(), Some("/bin"));
        assert_eq!(get("CUDA_VISIBLE_DEVICES").as_deref(), Some("GPU-a"));
        assert_eq!(get("NVIDIA_VISIBLE_DEVICES").as_deref(), Some("GPU-a"));
        let cpu_only = pod_base_env(&spoke, None, "h", visible_env(&nvidia, &BTreeMap::new()));
        assert!(cpu_only.contains(&("CUDA_VISIBLE_DEVICES".into(), "".into())));
        assert!(cpu_only.contains(&("NVIDIA_VISIBLE_DEVICES".into(), "void".into())));
        assert!(cpu_only.contains(&("HOME".into(), "/root".into())));
    }

    #[test]
    fn picked_ports_differ() {
        let ports = pick_ports(&[29500, 29501].into()).unwrap();
        assert_eq!(ports.len(), 2);
        assert_ne!(ports[&29500], ports[&29501]);
        assert_ne!(ports[&29500], 0);
    }
}
