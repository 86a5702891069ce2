//! The sandbox of a pod's processes: what keeps a tenant's command from the
//! hub's and the spoke's secrets, from other runs, and from outliving its pod.
//!
//! # Mechanisms
//!
//! Decided once when the backend starts, from what this machine allows:
//!
//! - **Run uids** (the spoke runs as root): each run gets its own uid (and
//!   gid of the same number) from [`SandboxConfig::run_as_user`], default
//!   [`DEFAULT_RUN_UIDS`]; its pods' directories are that uid's, 0700.
//!   Processes get no supplementary groups, no capabilities and
//!   `no_new_privs` (setuid programs do not raise them).
//! - **Namespaces**: every container starts in new mount and PID namespaces
//!   (and, when the spoke is not root, a new user namespace mapping it to
//!   root inside). In the mount namespace the spoke's work directory and
//!   every path of [`SandboxConfig::hide`] are covered (a directory by an
//!   empty tmpfs, a file by an empty one of mode 000) and only the pod's own directory is
//!   mounted back, at the same path; `/tmp`, `/var/tmp` and `/dev/shm` are
//!   fresh and private to the container; `/proc` shows only the container's
//!   processes. The container's command runs with no capabilities, so it
//!   cannot undo a mount. When its main process ends, or the spoke kills it,
//!   the kernel kills every process of the PID namespace: `setsid` and
//!   double forks do not escape.
//! - **cgroups** (see [`super::cgroup`]): `resources.limits` memory and cpu,
//!   enforced; an OOM kill is reported as the container's `OOMKilled`; a
//!   pod's processes are frozen and killed together.
//!
//! The tools are util-linux's `unshare` and `setpriv` and coreutils' `env`,
//! found on the system's PATH (not the container's). A container's env
//! reaches only its own command (set by `env -i` at the end of the chain),
//! so `LD_PRELOAD` and the like never act on the privileged steps.
//!
//! The start line ([`Sandbox::describe`]) names the mechanisms in force;
//! without any, runs can read whatever the spoke's user can.

use std::ffi::OsString;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use super::cgroup::Cgroups;

/// The uids runs get when the spoke runs as root and `--run-as-user` is not given.
pub const DEFAULT_RUN_UIDS: UidRange = UidRange {
    first: 2_000_000_000,
    last: 2_000_065_535,
};

/// Where the sandbox's own tools are looked up (never the container's PATH).
const SYSTEM_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Exit code of a container whose sandbox could not be set up (its log says why).
pub const SETUP_FAILED: i32 = 126;

/// A range of uids, `FIRST-LAST` or one `UID`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UidRange {
    pub first: u32,
    pub last: u32,
}

impl std::str::FromStr for UidRange {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let parse = |t: &str| {
            t.trim().parse::<u32>().map_err(|_| {
                format!("{s:?}: expected a uid or a range FIRST-LAST of uids, such as 2000000000-2000065535")
            })
        };
        let (first, last) = match s.split_once('-') {
            Some((a, b)) => (parse(a)?, parse(b)?),
            None => (parse(s)?, parse(s)?),
        };
        if first == 0 || last < first {
            return Err(format!(
                "{s:?}: uids of runs must be above 0 (root), the last not below the first"
            ));
        }
        Ok(UidRange { first, last })
    }
}

impl std::fmt::Display for UidRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}-{}", self.first, self.last)
        }
    }
}

/// `--run-as-user`: a [`UidRange`], or `none` for runs to keep the spoke's uid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunAsUser(pub Option<UidRange>);

impl Default for RunAsUser {
    fn default() -> Self {
        RunAsUser(Some(DEFAULT_RUN_UIDS))
    }
}

impl std::str::FromStr for RunAsUser {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "none" {
            return Ok(RunAsUser(None));
        }
        s.parse()
            .map(|r| RunAsUser(Some(r)))
            .map_err(|e| format!("{e}, or none"))
    }
}

impl std::fmt::Display for RunAsUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(r) => r.fmt(f),
            None => f.write_str("none"),
        }
    }
}

/// How pods are isolated; see the [module documentation](self).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxConfig {
    /// Uids for runs when the spoke runs as root; None: runs keep the
    /// spoke's uid (namespaces still hide the files).
    pub run_as_user: Option<UidRange>,
    /// Files and directories runs must not see, besides the work directory
    /// (the hub's data directory, the spoke's key).
    pub hide: Vec<PathBuf>,
    /// Off: no namespaces and no run uids (cgroup limits still apply).
    /// Only for machines where the tools are missing and trust is complete.
    pub disabled: bool,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            run_as_user: Some(DEFAULT_RUN_UIDS),
            hide: Vec::new(),
            disabled: false,
        }
    }
}

/// The sandbox tools, by absolute path.
#[derive(Debug, Clone)]
struct Tools {
    sh: PathBuf,
    unshare: PathBuf,
    setpriv: PathBuf,
    env: PathBuf,
}

impl Tools {
    fn find() -> Result<Self, String> {
        let find = |name: &str| {
            std::env::split_paths(SYSTEM_PATH)
                .map(|d| d.join(name))
                .find(|p| p.is_file())
                .ok_or_else(|| format!("{name} is not installed (looked in {SYSTEM_PATH})"))
        };
        Ok(Tools {
            sh: find("sh")?,
            unshare: find("unshare")?,
            setpriv: find("setpriv")?,
            env: find("env")?,
        })
    }
}

/// The namespaces a container starts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Namespaces {
    None,
    /// Mount and PID namespaces (the spoke is root).
    MountPid,
    /// User, mount and PID namespaces (the spoke is not root).
    UserMountPid,
}

/// The isolation in force for one backend.
#[derive(Debug)]
pub struct Sandbox {
    tools: Option<Tools>,
    namespaces: Namespaces,
    uids: Option<UidRange>,
    hidden: Vec<PathBuf>,
    cgroups: Option<Cgroups>,
    /// Why a mechanism is off, for the start line.
    missing: Vec<String>,
}

/// One container to start.
#[derive(Debug, Clone)]
pub struct Launch<'a> {
    pub pod_dir: &'a Path,
    pub program: &'a str,
    pub args: &'a [String],
    pub env: Vec<(OsString, OsString)>,
    /// The run's uid (and gid), when runs get their own.
    pub uid: Option<u32>,
    /// `cgroup.procs` files the container's first process joins.
    pub cgroup_procs: Vec<PathBuf>,
}

/// Stage 1 (the spoke's user): join the container's cgroups, then go on.
/// `$@`: cgroup.procs files, `--`, the rest of the chain.
const JOIN_CGROUPS: &str = r#"for f; do shift; [ "$f" = -- ] && break; echo $$ > "$f" || { echo "sandbox: cannot join the cgroup $f" >&2; exit 126; }; done; exec "$@""#;

/// Stage 2 (root in the new namespaces): hide paths, private temporary
/// directories, the pod directory mounted back, then run the rest of the chain
/// as a child, so that the PID namespace ends when the container's command
/// does and its exit status (128+n for a signal) is passed on.
/// `$@`: the pod directory, the paths to hide, `--`, the rest of the chain.
const SETUP_MOUNTS: &str = r#"umask 022
fail() { echo "sandbox: $*" >&2; exit 126; }
P=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
pod=$1; shift
exec 3<"$pod" || fail "cannot open the pod directory $pod"
# A file no one may read (mode 000, no capabilities left to bypass it) to
# cover hidden files, on a tmpfs the private /tmp covers afterwards.
PATH=$P mount -t tmpfs -o mode=700,size=4k,nosuid,nodev trainhub-stage /tmp || fail "cannot mount a staging tmpfs on /tmp"
: > /tmp/hidden && PATH=$P chmod 000 /tmp/hidden || fail "cannot make /tmp/hidden"
for h; do
  shift; [ "$h" = -- ] && break
  if [ -d "$h" ]; then PATH=$P mount -t tmpfs -o mode=755,size=1m,nosuid,nodev trainhub-hidden "$h" || fail "cannot hide $h"
  elif [ -e "$h" ]; then PATH=$P mount --bind /tmp/hidden "$h" || fail "cannot hide $h"
  fi
done
for t in /tmp /var/tmp /dev/shm; do
  if [ -d "$t" ]; then PATH=$P mount -t tmpfs -o mode=1777,nosuid,nodev trainhub-tmp "$t" || fail "cannot mount a private $t"; fi
done
PATH=$P mkdir -p "$pod" || fail "cannot make $pod"
PATH=$P mount --no-canonicalize --bind /proc/self/fd/3 "$pod" || fail "cannot mount the pod directory at $pod"
exec 3<&-
cd "$pod" || fail "cannot enter $pod"
"$@"
"#;

/// The effective uid of this process.
pub fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The topmost ancestor of `dir` (itself included) that users other than its
/// owner cannot enter; a run uid could not reach `dir` through it anyway,
/// so it is hidden whole.
fn closed_ancestor(dir: &Path) -> Option<PathBuf> {
    let mut path = PathBuf::new();
    for part in dir.components() {
        path.push(part);
        match std::fs::metadata(&path) {
            Ok(meta) if meta.mode() & 0o001 == 0 => return Some(path),
            Ok(_) => {}
            Err(_) => return None,
        }
    }
    None
}

/// `paths` without those inside another one (hiding the outer hides them).
fn outermost(mut paths: Vec<PathBuf>) -> Vec<PathBuf> {
    paths.sort();
    paths.dedup();
    let mut out: Vec<PathBuf> = Vec::new();
    for p in paths {
        if !out.iter().any(|o| p.starts_with(o)) {
            out.push(p);
        }
    }
    out
}

impl Sandbox {
    /// Finds what this machine allows and sets it up for a backend whose
    /// runs live under `work_dir` (which exists).
    pub fn new(config: &SandboxConfig, work_dir: &Path) -> Self {
        let mut missing = Vec::new();
        let root = effective_uid() == Some(0);
        let cgroups = match Cgroups::create() {
            Ok(c) => Some(c),
            Err(why) => {
                missing.push(format!("no cgroup limits ({why})"));
                None
            }
        };
        let mut sandbox = Sandbox {
            tools: None,
            namespaces: Namespaces::None,
            uids: None,
            hidden: Vec::new(),
            cgroups,
            missing,
        };
        if config.disabled {
            sandbox
                .missing
                .push("no namespaces and no run uids (the sandbox is disabled)".into());
            return sandbox;
        }
        let tools = match Tools::find() {
            Ok(t) => t,
            Err(why) => {
                sandbox
                    .missing
                    .push(format!("no namespaces and no run uids ({why})"));
                return sandbox;
            }
        };
        sandbox.tools = Some(tools);
        let work_dir = std::path::absolute(work_dir).unwrap_or_else(|_| work_dir.to_path_buf());
        let mut hidden = vec![work_dir.clone()];
        hidden.extend(
            config
                .hide
                .iter()
                .map(|p| std::path::absolute(p).unwrap_or_else(|_| p.clone())),
        );
        match (root, config.run_as_user) {
            (true, Some(range)) => {
                sandbox.uids = Some(range);
                // What a run uid cannot enter, it may as well not see: this
                // also keeps the pod directory's path open to it.
                hidden.extend(closed_ancestor(&work_dir));
            }
            (true, None) => sandbox
                .missing
                .push("runs keep the spoke's uid (no --run-as-user)".into()),
            (false, _) => {}
        }
        sandbox.hidden = outermost(hidden);
        sandbox.namespaces = if root {
            Namespaces::MountPid
        } else {
            Namespaces::UserMountPid
        };
        if let Err(why) = sandbox.probe(&work_dir) {
            sandbox.namespaces = Namespaces::None;
            sandbox
                .missing
                .push(format!("no mount, PID or user namespaces ({why})"));
        }
        sandbox
    }

    /// Starts `true` in a sandbox as a container would be started.
    fn probe(&self, work_dir: &Path) -> Result<(), String> {
        let dir = work_dir.join(".sandbox-probe");
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let uid = self.uids.map(|r| r.first);
        if let Some(uid) = uid {
            std::os::unix::fs::chown(&dir, Some(uid), Some(uid))
                .map_err(|e| format!("chown {}: {e}", dir.display()))?;
        }
        let launch = Launch {
            pod_dir: &dir,
            program: "true",
            args: &[],
            env: vec![(OsString::from("PATH"), OsString::from(SYSTEM_PATH))],
            uid,
            cgroup_procs: Vec::new(),
        };
        let argv = self.argv(&launch);
        let output = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .env_clear()
            .env("PATH", SYSTEM_PATH)
            .current_dir(&dir)
            .stdin(Stdio::null())
            .output();
        let _ = std::fs::remove_dir_all(&dir);
        match output {
            Ok(out) if out.status.success() => Ok(()),
            Ok(out) => Err(String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("the probe failed")
                .to_owned()),
            Err(e) => Err(format!("running {}: {e}", argv[0].to_string_lossy())),
        }
    }

    /// The cgroups of this backend, when the machine gives any.
    pub fn cgroups(&self) -> Option<&Cgroups> {
        self.cgroups.as_ref()
    }

    /// The uids runs get, when they get their own.
    pub fn run_uids(&self) -> Option<UidRange> {
        self.uids
    }

    /// Whether a pod's whole process tree dies with it, whatever its sessions.
    pub fn kills_trees(&self) -> bool {
        self.namespaces != Namespaces::None || self.cgroups.is_some()
    }

    /// Whether the hub's and spoke's files are out of the runs' reach.
    pub fn hides_files(&self) -> bool {
        self.namespaces != Namespaces::None || self.uids.is_some()
    }

    /// The one start line: which mechanisms are in force, and which are not.
    pub fn describe(&self) -> String {
        let mut on = Vec::new();
        if let Some(r) = self.uids {
            on.push(format!("run uids {r}"));
        }
        match self.namespaces {
            Namespaces::None => {}
            Namespaces::MountPid => on.push("mount and PID namespaces".into()),
            Namespaces::UserMountPid => on.push("user, mount and PID namespaces".into()),
        }
        if self.namespaces != Namespaces::None {
            let hidden: Vec<String> = self
                .hidden
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            on.push(format!("hiding {}", hidden.join(", ")));
        }
        if let Some(c) = &self.cgroups {
            on.push(format!("limits by {}", c.describe()));
        }
        on.push(
            if self.kills_trees() {
                "tree kill: yes"
            } else {
                "tree kill: no (process groups only)"
            }
            .into(),
        );
        let mut line = if self.hides_files() {
            format!("process sandbox: {}", on.join("; "))
        } else {
            format!(
                "process sandbox: NO ISOLATION, runs can read what this spoke's user can (its keys, the hub's data); {}",
                on.join("; ")
            )
        };
        if !self.missing.is_empty() {
            line.push_str("; off: ");
            line.push_str(&self.missing.join("; "));
        }
        line
    }

    /// The command that starts one container in the sandbox.
    ///
    /// The spoke's side sets the working directory (the pod's), stdio and
    /// the process group; the container's env reaches only its command.
    pub fn command(&self, launch: &Launch<'_>) -> tokio::process::Command {
        let argv = self.argv(launch);
        let mut command = tokio::process::Command::new(&argv[0]);
        command.args(&argv[1..]).env_clear();
        if self.is_direct(launch) {
            command.envs(launch.env.iter().map(|(k, v)| (k, v)));
        } else {
            command.env("PATH", SYSTEM_PATH);
        }
        command.current_dir(launch.pod_dir);
        command
    }

    /// Nothing to set up: the program runs as the spoke would run it.
    fn is_direct(&self, launch: &Launch<'_>) -> bool {
        self.tools.is_none()
            || (self.namespaces == Namespaces::None
                && launch.uid.is_none()
                && launch.cgroup_procs.is_empty())
    }

    /// The whole chain, program first.
    fn argv(&self, launch: &Launch<'_>) -> Vec<OsString> {
        let program = if launch.program.contains('/') {
            // Relative to the pod directory, as a container's would be to
            // its working directory.
            launch.pod_dir.join(launch.program).into_os_string()
        } else {
            OsString::from(launch.program)
        };
        let tools = match &self.tools {
            Some(t) if !self.is_direct(launch) => t,
            _ => {
                let mut argv = vec![program];
                argv.extend(launch.args.iter().map(OsString::from));
                return argv;
            }
        };
        let mut argv: Vec<OsString> = Vec::new();
        if !launch.cgroup_procs.is_empty() {
            argv.extend([
                tools.sh.clone().into_os_string(),
                "-c".into(),
                JOIN_CGROUPS.into(),
                "trainhub-sandbox".into(),
            ]);
            argv.extend(
                launch
                    .cgroup_procs
                    .iter()
                    .map(|p| p.clone().into_os_string()),
            );
            argv.push("--".into());
        }
        if self.namespaces != Namespaces::None {
            argv.push(tools.unshare.clone().into_os_string());
            if self.namespaces == Namespaces::UserMountPid {
                argv.extend(["--user".into(), "--map-root-user".into()]);
            }
            argv.extend(
                [
                    "--mount",
                    "--propagation=private",
                    "--pid",
                    "--fork",
                    "--kill-child",
                    "--mount-proc",
                    "--",
                ]
                .map(OsString::from),
            );
            argv.extend([
                tools.sh.clone().into_os_string(),
                "-c".into(),
                SETUP_MOUNTS.into(),
                "trainhub-sandbox".into(),
                launch.pod_dir.as_os_str().to_owned(),
            ]);
            argv.extend(self.hidden.iter().map(|p| p.clone().into_os_string()));
            argv.push("--".into());
        }
        argv.push(tools.setpriv.clone().into_os_string());
        if let Some(uid) = launch.uid {
            argv.extend([
                format!("--reuid={uid}").into(),
                format!("--regid={uid}").into(),
                "--clear-groups".into(),
            ]);
        }
        argv.extend(
            [
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--no-new-privs",
                "--",
            ]
            .map(OsString::from),
        );
        argv.extend([tools.env.clone().into_os_string(), "-i".into(), "--".into()]);
        for (k, v) in &launch.env {
            let mut pair = k.clone();
            pair.push("=");
            pair.push(v);
            argv.push(pair);
        }
        argv.push(program);
        argv.extend(launch.args.iter().map(OsString::from));
        argv
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(namespaces: Namespaces, uids: Option<UidRange>) -> Sandbox {
        Sandbox {
            tools: Some(Tools {
                sh: "/bin/sh".into(),
                unshare: "/usr/bin/unshare".into(),
                setpriv: "/usr/bin/setpriv".into(),
                env: "/usr/bin/env".into(),
            }),
            namespaces,
            uids,
            hidden: vec!["/data".into(), "/keys/spoke.key".into()],
            cgroups: None,
            missing: Vec::new(),
        }
    }

    fn strings(argv: Vec<OsString>) -> Vec<String> {
        argv.into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn uid_ranges_parse_and_refuse_root() {
        assert_eq!(
            "100-200".parse::<UidRange>(),
            Ok(UidRange {
                first: 100,
                last: 200
            })
        );
        assert_eq!(
            "7".parse::<UidRange>().map(|r| r.to_string()),
            Ok("7".to_owned())
        );
        assert!("0".parse::<UidRange>().unwrap_err().contains("above 0"));
        assert!("9-3".parse::<UidRange>().is_err());
        assert!(
            "nobody"
                .parse::<UidRange>()
                .unwrap_err()
                .contains("FIRST-LAST")
        );
        assert_eq!(DEFAULT_RUN_UIDS.to_string(), "2000000000-2000065535");
    }

    #[test]
    fn the_container_env_reaches_only_its_command() {
        let s = sandbox(Namespaces::MountPid, Some(DEFAULT_RUN_UIDS));
        let launch = Launch {
            pod_dir: Path::new("/data/w/ns/r-1/p"),
            program: "python3",
            args: &["-c".into(), "print(1)".into()],
            env: vec![("LD_PRELOAD".into(), "/evil.so".into())],
            uid: Some(2_000_000_001),
            cgroup_procs: vec!["/cg/memory/x/cgroup.procs".into()],
        };
        let argv = strings(s.argv(&launch));
        assert_eq!(argv[0], "/bin/sh");
        assert_eq!(argv[4], "/cg/memory/x/cgroup.procs");
        let unshare = argv.iter().position(|a| a == "/usr/bin/unshare").unwrap();
        assert!(
            !argv[unshare..].contains(&"--user".to_owned()),
            "root needs no user namespace"
        );
        let setpriv = argv.iter().position(|a| a == "/usr/bin/setpriv").unwrap();
        assert_eq!(
            &argv[setpriv + 1..setpriv + 4],
            ["--reuid=2000000001", "--regid=2000000001", "--clear-groups"]
        );
        let env = argv.iter().position(|a| a == "/usr/bin/env").unwrap();
        assert!(setpriv < env);
        assert_eq!(argv[env + 3], "LD_PRELOAD=/evil.so");
        assert_eq!(argv.iter().filter(|a| a.contains("LD_PRELOAD")).count(), 1);
        assert_eq!(&argv[env + 4..], ["python3", "-c", "print(1)"]);
        // The hidden paths are the mount stage's, before its `--`.
        let pod = argv.iter().position(|a| a == "/data/w/ns/r-1/p").unwrap();
        assert_eq!(&argv[pod + 1..pod + 4], ["/data", "/keys/spoke.key", "--"]);
        let command = s.command(&launch);
        let std = command.as_std();
        let envs: Vec<_> = std.get_envs().collect();
        assert_eq!(envs.len(), 1, "only PATH: {envs:?}");
    }

    #[test]
    fn without_root_a_user_namespace_and_no_uid_change() {
        let s = sandbox(Namespaces::UserMountPid, None);
        let launch = Launch {
            pod_dir: Path::new("/w/p"),
            program: "./train.sh",
            args: &[],
            env: vec![],
            uid: None,
            cgroup_procs: vec![],
        };
        let argv = strings(s.argv(&launch));
        assert_eq!(argv[0], "/usr/bin/unshare", "no cgroups: no join stage");
        assert_eq!(&argv[1..3], ["--user", "--map-root-user"]);
        assert!(!argv.iter().any(|a| a.starts_with("--reuid")));
        assert_eq!(argv.last().map(String::as_str), Some("/w/p/./train.sh"));
    }

    #[test]
    fn nothing_to_set_up_runs_the_program_itself() {
        let s = sandbox(Namespaces::None, None);
        let launch = Launch {
            pod_dir: Path::new("/w/p"),
            program: "sh",
            args: &["-c".into(), "true".into()],
            env: vec![("A".into(), "1".into())],
            uid: None,
            cgroup_procs: vec![],
        };
        assert_eq!(strings(s.argv(&launch)), ["sh", "-c", "true"]);
        let command = s.command(&launch);
        assert_eq!(command.as_std().get_envs().count(), 1);
    }

    #[test]
    fn the_start_line_names_what_is_in_force_and_warns_without_isolation() {
        let line = sandbox(Namespaces::MountPid, Some(DEFAULT_RUN_UIDS)).describe();
        assert!(
            line.starts_with("process sandbox: run uids 2000000000-2000065535; mount and PID namespaces; hiding /data, /keys/spoke.key;"),
            "{line}"
        );
        assert!(line.ends_with("tree kill: yes"), "{line}");
        let mut bare = sandbox(Namespaces::None, None);
        bare.missing
            .push("no mount, PID or user namespaces (unshare: Operation not permitted)".into());
        let line = bare.describe();
        assert!(line.starts_with("process sandbox: NO ISOLATION"), "{line}");
        assert!(line.contains("tree kill: no"), "{line}");
        assert!(
            line.contains("off: no mount, PID or user namespaces"),
            "{line}"
        );
        assert_eq!(line.lines().count(), 1);
    }

    #[test]
    fn nested_hidden_paths_collapse_to_the_outer_one() {
        assert_eq!(
            outermost(vec![
                "/a/b/c".into(),
                "/a/b".into(),
                "/x".into(),
                "/a/bc".into()
            ]),
            vec![PathBuf::from("/a/b"), "/a/bc".into(), "/x".into()]
        );
    }

    #[test]
    fn a_closed_directory_on_the_way_is_found() {
        use std::os::unix::fs::PermissionsExt as _;
        let tmp = tempfile::tempdir().unwrap();
        let closed = tmp.path().join("closed");
        let work = closed.join("open/work");
        std::fs::create_dir_all(&work).unwrap();
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
        let found = closed_ancestor(&work);
        // /tmp itself and the tempdir are open; `closed` is the first that is not.
        assert_eq!(found, Some(closed));
    }
}
