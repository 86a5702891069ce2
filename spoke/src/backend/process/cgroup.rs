//! Control groups for the pods' containers: memory and CPU limits from the
//! container's `resources.limits`, the OOM kill count behind the
//! `OOMKilled` reason, and killing every process of a pod at once.
//!
//! The groups are made under this process's own cgroup (as `/proc/self/cgroup`
//! names it, in each hierarchy), in a directory of their own per backend:
//! `<own>/trainhub-<pid>-<n>/<pod uid>/<container>`. cgroup v1 (the `memory`
//! hierarchy, with `cpu`, `pids` and `freezer` when mounted) and v2 (when
//! this process may enable the `memory` controller for its subtree) are
//! supported. Creating the directory needs write access to the own cgroup:
//! root, or a delegated v2 subtree.

use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The CFS period the CPU quota is a share of (the kernel's default).
const CPU_PERIOD_US: i64 = 100_000;
/// The smallest quota the kernel takes.
const CPU_MIN_QUOTA_US: i64 = 1_000;
/// How long a group may take to freeze or to empty after a kill.
const SETTLE: Duration = Duration::from_secs(2);

/// What a container may use: its `resources.limits` (requests are not enforced).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub memory_bytes: Option<u64>,
    pub cpu_milli: Option<i64>,
}

impl Limits {
    /// From a container's `resources.limits` as milli-units per resource.
    pub fn from_milli(memory_milli: Option<i64>, cpu_milli: Option<i64>) -> Self {
        Limits {
            memory_bytes: memory_milli
                .filter(|m| *m > 0)
                .map(|m| (m as u64).div_ceil(1000)),
            cpu_milli: cpu_milli.filter(|m| *m > 0),
        }
    }
}

/// `cpu.cfs_quota_us` (v1) or the quota of `cpu.max` (v2) for a CPU limit.
pub fn cpu_quota_us(cpu_milli: i64) -> i64 {
    cpu_milli
        .saturating_mul(CPU_PERIOD_US)
        .saturating_div(1000)
        .max(CPU_MIN_QUOTA_US)
}

#[derive(Debug)]
enum Layout {
    /// One directory per hierarchy; `memory` always, the others when mounted.
    V1 {
        memory: PathBuf,
        cpu: Option<PathBuf>,
        pids: Option<PathBuf>,
        freezer: Option<PathBuf>,
    },
    V2 {
        base: PathBuf,
        cpu: bool,
        pids: bool,
    },
}

/// The control groups of one process backend.
#[derive(Debug)]
pub struct Cgroups {
    layout: Layout,
}

/// A hierarchy as `/proc/self/mountinfo` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mount {
    root: String,
    point: PathBuf,
    v2: bool,
    controllers: BTreeSet<String>,
}

fn parse_mountinfo(text: &str) -> Vec<Mount> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let fields: Vec<&str> = left.split(' ').collect();
        let rfields: Vec<&str> = right.split(' ').collect();
        let (Some(root), Some(point), Some(fstype)) =
            (fields.get(3), fields.get(4), rfields.first())
        else {
            continue;
        };
        let v2 = *fstype == "cgroup2";
        if !v2 && *fstype != "cgroup" {
            continue;
        }
        let controllers = rfields
            .get(2)
            .map(|o| o.split(',').map(str::to_owned).collect())
            .unwrap_or_default();
        out.push(Mount {
            root: unescape(root),
            point: PathBuf::from(unescape(point)),
            v2,
            controllers,
        });
    }
    out
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let code = rest
            .get(i + 1..i + 4)
            .and_then(|o| u8::from_str_radix(o, 8).ok());
        match code {
            Some(c) => {
                out.push(char::from(c));
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// `/proc/self/cgroup`: (controllers, path) per hierarchy; v2's controllers are empty.
fn parse_self_cgroup(text: &str) -> Vec<(Vec<String>, String)> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let _id = parts.next()?;
            let controllers = parts.next()?;
            let path = parts.next()?;
            let list = controllers
                .split(',')
                .filter(|c| !c.is_empty())
                .map(str::to_owned)
                .collect();
            Some((list, path.to_owned()))
        })
        .collect()
}

/// Where this process's group of a hierarchy is, given its mount.
fn own_dir(mount: &Mount, path: &str) -> PathBuf {
    let relative = if mount.root == "/" {
        path
    } else {
        path.strip_prefix(mount.root.as_str()).unwrap_or(path)
    };
    mount.point.join(relative.trim_start_matches('/'))
}

fn make_dir(path: &Path) -> io::Result<()> {
    match std::fs::create_dir(path) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        other => other,
    }
}

impl Cgroups {
    /// The control groups of a new backend, or why there are none.
    pub fn create() -> Result<Self, String> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| format!("reading /proc/self/mountinfo: {e}"))?;
        let own = std::fs::read_to_string("/proc/self/cgroup")
            .map_err(|e| format!("reading /proc/self/cgroup: {e}"))?;
        let name = format!(
            "trainhub-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let mounts = parse_mountinfo(&mountinfo);
        let own = parse_self_cgroup(&own);
        let v1_dir = |controller: &str| -> Option<PathBuf> {
            let mount = mounts
                .iter()
                .find(|m| !m.v2 && m.controllers.contains(controller))?;
            let (_, path) = own
                .iter()
                .find(|(list, _)| list.iter().any(|c| c == controller))?;
            Some(own_dir(mount, path).join(&name))
        };
        if let Some(memory) = v1_dir("memory") {
            for controller in ["freezer", "memory", "cpu", "pids"] {
                if let Some(parent) = v1_dir(controller).as_deref().and_then(Path::parent) {
                    remove_stale(parent, false);
                }
            }
            make_dir(&memory).map_err(|e| format!("creating {}: {e}", memory.display()))?;
            let optional = |controller: &str| {
                let dir = v1_dir(controller)?;
                match make_dir(&dir) {
                    Ok(()) => Some(dir),
                    Err(e) => {
                        tracing::debug!(dir = %dir.display(), error = %e, "cgroup controller not used");
                        None
                    }
                }
            };
            return Ok(Cgroups {
                layout: Layout::V1 {
                    cpu: optional("cpu"),
                    pids: optional("pids"),
                    freezer: optional("freezer"),
                    memory,
                },
            });
        }
        let mount = mounts
            .iter()
            .find(|m| m.v2)
            .ok_or("no cgroup hierarchy with the memory controller is mounted")?;
        let (_, path) = own
            .iter()
            .find(|(list, _)| list.is_empty())
            .ok_or("this process is in no cgroup v2 group")?;
        let own_dir = own_dir(mount, path);
        let available = std::fs::read_to_string(own_dir.join("cgroup.controllers"))
            .map_err(|e| format!("reading {}/cgroup.controllers: {e}", own_dir.display()))?;
        let available: BTreeSet<&str> = available.split_whitespace().collect();
        if !available.contains("memory") {
            return Err(format!(
                "the memory controller is not delegated to {}",
                own_dir.display()
            ));
        }
        let cpu = available.contains("cpu");
        let pids = available.contains("pids");
        let enable = controllers_line(cpu, pids);
        // Controllers for our subtree: refused while this group holds
        // processes itself (v2's no-internal-process rule), unless enabled already.
        let enabled =
            std::fs::read_to_string(own_dir.join("cgroup.subtree_control")).unwrap_or_default();
        if !enabled.split_whitespace().any(|c| c == "memory") {
            std::fs::write(own_dir.join("cgroup.subtree_control"), &enable).map_err(|e| {
                format!(
                    "enabling {enable} in {}/cgroup.subtree_control: {e}",
                    own_dir.display()
                )
            })?;
        }
        remove_stale(&own_dir, true);
        let base = own_dir.join(&name);
        make_dir(&base).map_err(|e| format!("creating {}: {e}", base.display()))?;
        std::fs::write(base.join("cgroup.subtree_control"), &enable)
            .map_err(|e| format!("enabling {enable} in {}: {e}", base.display()))?;
        Ok(Cgroups {
            layout: Layout::V2 { base, cpu, pids },
        })
    }

    /// What is enforced, for the start line.
    pub fn describe(&self) -> String {
        match &self.layout {
            Layout::V1 {
                memory,
                cpu,
                pids,
                freezer,
            } => {
                let mut parts = vec!["memory"];
                if cpu.is_some() {
                    parts.push("cpu");
                }
                if pids.is_some() {
                    parts.push("pids");
                }
                if freezer.is_some() {
                    parts.push("freezer");
                }
                let _ = memory;
                format!("cgroup v1 ({})", parts.join(", "))
            }
            Layout::V2 { cpu, pids, .. } => format!(
                "cgroup v2 ({})",
                controllers_line(*cpu, *pids)
                    .replace('+', "")
                    .replace(' ', ", ")
            ),
        }
    }

    /// The backend's group in every hierarchy it uses.
    fn bases(&self) -> Vec<&PathBuf> {
        match &self.layout {
            Layout::V1 {
                memory,
                cpu,
                pids,
                freezer,
            } => std::iter::once(memory)
                .chain(cpu)
                .chain(pids)
                .chain(freezer)
                .collect(),
            Layout::V2 { base, .. } => vec![base],
        }
    }

    /// Every directory of a pod (one per hierarchy).
    fn pod_dirs(&self, pod_uid: &str) -> Vec<PathBuf> {
        self.bases().into_iter().map(|d| d.join(pod_uid)).collect()
    }

    /// Makes the group of one container with its limits; returns the
    /// `cgroup.procs` files its first process must join (before it forks).
    ///
    /// # Errors
    ///
    /// A group cannot be made or a limit cannot be written.
    pub fn create_container(
        &self,
        pod_uid: &str,
        container: &str,
        limits: Limits,
    ) -> io::Result<Vec<PathBuf>> {
        let mut procs = Vec::new();
        let write = |path: PathBuf, value: String| {
            std::fs::write(&path, &value).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("writing {value:?} to {}: {e}", path.display()),
                )
            })
        };
        match &self.layout {
            Layout::V1 {
                memory,
                cpu,
                pids,
                freezer,
            } => {
                for base in std::iter::once(memory)
                    .chain(cpu)
                    .chain(pids)
                    .chain(freezer)
                {
                    let dir = base.join(pod_uid).join(container);
                    std::fs::create_dir_all(&dir)?;
                    procs.push(dir.join("cgroup.procs"));
                }
                let dir = memory.join(pod_uid).join(container);
                if let Some(bytes) = limits.memory_bytes {
                    write(dir.join("memory.limit_in_bytes"), bytes.to_string())?;
                    // With swap accounting, the limit covers swap too: a
                    // limit is what the container may use, not what it may
                    // push out.
                    let memsw = dir.join("memory.memsw.limit_in_bytes");
                    if memsw.exists() {
                        write(memsw, bytes.to_string())?;
                    }
                }
                if let (Some(milli), Some(cpu)) = (limits.cpu_milli, cpu) {
                    let dir = cpu.join(pod_uid).join(container);
                    write(dir.join("cpu.cfs_period_us"), CPU_PERIOD_US.to_string())?;
                    write(
                        dir.join("cpu.cfs_quota_us"),
                        cpu_quota_us(milli).to_string(),
                    )?;
                }
            }
            Layout::V2 { base, cpu, pids } => {
                let pod = base.join(pod_uid);
                make_dir(&pod)?;
                write(
                    pod.join("cgroup.subtree_control"),
                    controllers_line(*cpu, *pids),
                )?;
                let dir = pod.join(container);
                make_dir(&dir)?;
                if let Some(bytes) = limits.memory_bytes {
                    write(dir.join("memory.max"), bytes.to_string())?;
                    let swap = dir.join("memory.swap.max");
                    if swap.exists() {
                        write(swap, "0".into())?;
                    }
                    // The whole container is killed on OOM, as kubelet asks
                    // of cgroup v2.
                    let group = dir.join("memory.oom.group");
                    if group.exists() {
                        write(group, "1".into())?;
                    }
                }
                if let (Some(milli), true) = (limits.cpu_milli, *cpu) {
                    write(
                        dir.join("cpu.max"),
                        format!("{} {CPU_PERIOD_US}", cpu_quota_us(milli)),
                    )?;
                }
                procs.push(dir.join("cgroup.procs"));
            }
        }
        Ok(procs)
    }

    /// Whether the kernel's OOM killer killed a process of the container.
    pub fn oom_killed(&self, pod_uid: &str, container: &str) -> bool {
        let (file, key) = match &self.layout {
            Layout::V1 { memory, .. } => (
                memory
                    .join(pod_uid)
                    .join(container)
                    .join("memory.oom_control"),
                "oom_kill",
            ),
            Layout::V2 { base, .. } => (
                base.join(pod_uid).join(container).join("memory.events"),
                "oom_kill",
            ),
        };
        std::fs::read_to_string(file).is_ok_and(|text| {
            text.lines().any(|l| {
                l.split_once(' ')
                    .is_some_and(|(k, v)| k == key && v.trim().parse::<u64>().is_ok_and(|n| n > 0))
            })
        })
    }

    /// Kills every process of a container's group and removes the group.
    pub fn remove_container(&self, pod_uid: &str, container: &str) {
        let dirs: Vec<PathBuf> = self
            .pod_dirs(pod_uid)
            .into_iter()
            .map(|d| d.join(container))
            .collect();
        self.kill_tree(&dirs, &self.freezer_dir(pod_uid).map(|d| d.join(container)));
    }

    /// Kills every process of a pod (whatever its session or parent) and
    /// removes its groups.
    pub fn remove_pod(&self, pod_uid: &str) {
        let dirs = self.pod_dirs(pod_uid);
        self.kill_tree(&dirs, &self.freezer_dir(pod_uid));
    }

    fn freezer_dir(&self, pod_uid: &str) -> Option<PathBuf> {
        match &self.layout {
            Layout::V1 { freezer, .. } => freezer.as_ref().map(|f| f.join(pod_uid)),
            Layout::V2 { base, .. } => Some(base.join(pod_uid)),
        }
    }

    /// Freezes `freezer` (so nothing forks meanwhile), SIGKILLs every process
    /// under `dirs`, thaws, and removes the directories once empty.
    fn kill_tree(&self, dirs: &[PathBuf], freezer: &Option<PathBuf>) {
        if !dirs.iter().any(|d| d.exists()) {
            return;
        }
        let v2 = matches!(self.layout, Layout::V2 { .. });
        if v2 && let Some(dir) = freezer {
            // cgroup.kill (Linux 5.14) kills the whole subtree atomically.
            if std::fs::write(dir.join("cgroup.kill"), "1").is_ok() {
                remove_when_empty(dirs);
                return;
            }
        }
        if let Some(dir) = freezer {
            freeze(dir, v2, true);
        }
        let pids: BTreeSet<u32> = dirs.iter().flat_map(|d| procs_under(d)).collect();
        kill_pids(&pids);
        // Thawed whether or not the freeze completed: a frozen process
        // cannot act on its SIGKILL.
        if let Some(dir) = freezer {
            thaw_tree(dir, v2);
        }
        remove_when_empty(dirs);
    }

    /// Kills every process of every pod and removes the backend's groups.
    pub fn remove_all(&self) {
        let bases = self.bases();
        let mut pods = BTreeSet::new();
        for base in &bases {
            if let Ok(entries) = std::fs::read_dir(base) {
                for entry in entries.flatten() {
                    if entry.path().is_dir() {
                        pods.insert(entry.file_name().to_string_lossy().into_owned());
                    }
                }
            }
        }
        for pod in pods {
            self.remove_pod(&pod);
        }
        for base in bases {
            let _ = std::fs::remove_dir(base);
        }
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        self.remove_all();
    }
}

/// Kills what is left in the groups of backends whose process is gone (a
/// spoke killed with SIGKILL cannot clean up) and removes them. A group
/// whose pid is alive, whoever has it now, is left alone.
fn remove_stale(parent: &Path, v2: bool) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("trainhub-")
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let dir = entry.path();
        freeze(&dir, v2, true);
        kill_pids(&procs_under(&dir).into_iter().collect());
        thaw_tree(&dir, v2);
        remove_when_empty(&[dir]);
    }
}

fn controllers_line(cpu: bool, pids: bool) -> String {
    let mut line = String::from("+memory");
    if cpu {
        line.push_str(" +cpu");
    }
    if pids {
        line.push_str(" +pids");
    }
    line
}

/// Freezes (or thaws) a group; whether it reached the state in time.
fn freeze(dir: &Path, v2: bool, on: bool) -> bool {
    let (file, value, done) = if v2 {
        ("cgroup.freeze", if on { "1" } else { "0" }, None)
    } else {
        (
            "freezer.state",
            if on { "FROZEN" } else { "THAWED" },
            Some(if on { "FROZEN" } else { "THAWED" }),
        )
    };
    if std::fs::write(dir.join(file), value).is_err() {
        return false;
    }
    let deadline = Instant::now() + SETTLE;
    loop {
        let state = if v2 {
            std::fs::read_to_string(dir.join("cgroup.events"))
                .ok()
                .and_then(|t| {
                    t.lines()
                        .find_map(|l| l.strip_prefix("frozen ").map(|v| v.trim() == value))
                })
                .unwrap_or(false)
        } else {
            std::fs::read_to_string(dir.join("freezer.state")).is_ok_and(|s| Some(s.trim()) == done)
        };
        if state {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Thaws a group and every group under it (a v1 child frozen on its own
/// stays frozen when only its parent is thawed).
fn thaw_tree(dir: &Path, v2: bool) {
    let file = if v2 { "cgroup.freeze" } else { "freezer.state" };
    let value = if v2 { "0" } else { "THAWED" };
    if dir.join(file).exists() {
        let _ = std::fs::write(dir.join(file), value);
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                thaw_tree(&entry.path(), v2);
            }
        }
    }
}

/// Every pid in a group and its descendants.
fn procs_under(dir: &Path) -> Vec<u32> {
    let mut out = Vec::new();
    if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        out.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                out.extend(procs_under(&entry.path()));
            }
        }
    }
    out
}

/// SIGKILL through the `kill` command (no unsafe code here).
fn kill_pids(pids: &BTreeSet<u32>) {
    if pids.is_empty() {
        return;
    }
    let result = std::process::Command::new("kill")
        .arg("-KILL")
        .arg("--")
        .args(pids.iter().map(u32::to_string))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
    if let Err(err) = result {
        tracing::warn!(?pids, %err, "could not run kill for a pod's processes");
    }
}

/// Removes groups (children first), retrying while killed processes exit.
fn remove_when_empty(dirs: &[PathBuf]) {
    let deadline = Instant::now() + SETTLE;
    for dir in dirs {
        loop {
            match remove_tree(dir) {
                Ok(()) => break,
                Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                Err(e) if Instant::now() >= deadline => {
                    tracing::warn!(dir = %dir.display(), error = %e, "could not remove a cgroup");
                    break;
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }
}

/// rmdir of a group and its child groups (their files are not removable, only
/// the directories).
fn remove_tree(dir: &Path) -> io::Result<()> {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&entry.path())?;
            }
        }
    }
    std::fs::remove_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 /sub /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
42 31 0:39 / /mnt/with\\040space rw - ext4 /dev/sda rw
";

    #[test]
    fn mountinfo_lists_the_hierarchies_and_their_controllers() {
        let mounts = parse_mountinfo(MOUNTINFO);
        assert_eq!(mounts.len(), 4, "{mounts:#?}");
        assert_eq!(mounts[1].point, PathBuf::from("/sys/fs/cgroup/memory"));
        assert!(mounts[1].controllers.contains("memory"));
        assert!(mounts[2].controllers.contains("cpuacct"));
        assert_eq!(mounts[2].root, "/sub");
        assert!(mounts[3].v2);
        assert_eq!(unescape("/mnt/with\\040space"), "/mnt/with space");
    }

    #[test]
    fn own_groups_resolve_under_the_mount() {
        let own = parse_self_cgroup("4:memory:/process_api/abc\n1:cpu:/\n0::/\n");
        assert_eq!(
            own[0],
            (vec!["memory".to_owned()], "/process_api/abc".to_owned())
        );
        assert!(own[2].0.is_empty());
        let mounts = parse_mountinfo(MOUNTINFO);
        assert_eq!(
            own_dir(&mounts[1], "/process_api/abc"),
            PathBuf::from("/sys/fs/cgroup/memory/process_api/abc")
        );
        // A mount of a sub-tree (a cgroup namespace) strips its root.
        assert_eq!(
            own_dir(&mounts[2], "/sub/x"),
            PathBuf::from("/sys/fs/cgroup/cpu,cpuacct/x")
        );
    }

    #[test]
    fn limits_come_from_milli_units() {
        let l = Limits::from_milli(Some(64 * 1024 * 1024 * 1000), Some(500));
        assert_eq!(l.memory_bytes, Some(64 * 1024 * 1024));
        assert_eq!(l.cpu_milli, Some(500));
        // 1.5 bytes rounds up; zero is no limit.
        assert_eq!(
            Limits::from_milli(Some(1500), Some(0)).memory_bytes,
            Some(2)
        );
        assert_eq!(Limits::from_milli(None, Some(0)).cpu_milli, None);
        assert_eq!(cpu_quota_us(500), 50_000);
        assert_eq!(cpu_quota_us(2000), 200_000);
        assert_eq!(cpu_quota_us(1), CPU_MIN_QUOTA_US);
    }
}
