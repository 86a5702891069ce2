//! What the process backend holds, on disk, so that an agent killed with
//! SIGKILL (as the OOM killer does) leaves nothing running behind it.
//!
//! One record per run in `<work_dir>/.runs/`: the run's key, TrainJob,
//! directory, and each pod process it started (pid, process group and the
//! process's start time from `/proc/<pid>/stat`, so a pid the kernel has
//! since given to another process is never mistaken for it), plus, once the
//! run has finished, its last report and pod files (its logs stay
//! readable), and the GPUs each pod holds. A record is written atomically (temp file, fsync, rename,
//! fsync of the directory) when the run is created, after every process it
//! starts, when it finishes and when it is lost; it is removed when the run
//! is stopped.
//!
//! On start the backend kills every process group a record names that is
//! still alive, waits until those processes are gone, and keeps each run
//! that had not finished as lost (`SpokeRestarted`). Processes of an earlier
//! agent are not its children: it cannot wait for them or read their exit
//! status, so it never adopts them.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::backend::RunKey;

/// The directory of the records, inside the work directory.
pub const RECORDS_DIR: &str = ".runs";

/// One process a pod started: its own process group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessRecord {
    /// The pod's uid.
    pub pod: String,
    pub pid: u32,
    pub pgid: u32,
    /// Field 22 of `/proc/<pid>/stat` (clock ticks since boot).
    pub start_time: u64,
}

/// One pod's files, kept for the logs of a finished run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRecord {
    pub name: String,
    pub dir: PathBuf,
    pub containers: Vec<String>,
}

/// One run as written to disk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub run_id: String,
    pub generation: i64,
    pub namespace: String,
    pub name: String,
    pub dir: PathBuf,
    #[serde(default)]
    pub processes: Vec<ProcessRecord>,
    #[serde(default)]
    pub finished: bool,
    /// Why the run was lost (`SpokeRestarted`, `Fenced`).
    #[serde(default)]
    pub lost: Option<String>,
    /// A finished run's last JobSet status and pods.
    #[serde(default)]
    pub status: Option<Value>,
    #[serde(default)]
    pub pods: Vec<Value>,
    #[serde(default)]
    pub pod_files: Vec<PodRecord>,
    /// Pod uid → the GPUs (UUIDs) it holds while its processes may run.
    #[serde(default)]
    pub devices: BTreeMap<String, Vec<String>>,
}

impl RunRecord {
    pub fn key(&self) -> RunKey {
        RunKey {
            run_id: self.run_id.clone(),
            generation: self.generation,
        }
    }
}

/// The file of one run's record, and the record as last written.
#[derive(Debug)]
pub struct RecordFile {
    path: PathBuf,
    record: Mutex<RunRecord>,
    /// Removed: later updates write nothing (a pod ending after its run
    /// was stopped must not bring the file back).
    removed: AtomicBool,
}

/// A file name for a run: the run id with anything but `[A-Za-z0-9-]`
/// replaced, and the generation.
fn file_name(key: &RunKey) -> String {
    let id: String = key
        .run_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(128)
        .collect();
    format!("{id}.{}.json", key.generation)
}

impl RecordFile {
    /// The record of a new run under `work_dir`, written before anything
    /// of it starts.
    ///
    /// # Errors
    ///
    /// The records directory or the file cannot be written.
    pub fn create(work_dir: &Path, record: RunRecord) -> std::io::Result<Self> {
        let dir = work_dir.join(RECORDS_DIR);
        std::fs::create_dir_all(&dir)?;
        let file = RecordFile {
            path: dir.join(file_name(&record.key())),
            record: Mutex::new(record),
            removed: AtomicBool::new(false),
        };
        file.save()?;
        Ok(file)
    }

    /// Changes the record and writes it; once removed, writes nothing.
    ///
    /// # Errors
    ///
    /// The file cannot be written; the record in memory has changed anyway.
    pub fn update(&self, change: impl FnOnce(&mut RunRecord)) -> std::io::Result<()> {
        let mut record = self.record.lock().unwrap_or_else(PoisonError::into_inner);
        change(&mut record);
        if self.removed.load(Ordering::SeqCst) {
            return Ok(());
        }
        write_atomically(&self.path, &record)
    }

    fn save(&self) -> std::io::Result<()> {
        let record = self.record.lock().unwrap_or_else(PoisonError::into_inner);
        write_atomically(&self.path, &record)
    }

    /// Removes the file (the run was stopped).
    pub fn remove(&self) {
        // Under the record's lock: no update is writing meanwhile.
        let _record = self.record.lock().unwrap_or_else(PoisonError::into_inner);
        self.removed.store(true, Ordering::SeqCst);
        match std::fs::remove_file(&self.path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "could not remove a run record");
            }
        }
    }
}

/// Temp file, fsync, rename over `path`, fsync of the directory: after a
/// crash the file holds the old record or the new one, never a mix.
fn write_atomically(path: &Path, record: &RunRecord) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(record).map_err(std::io::Error::other)?;
    let tmp = path.with_extension("json.tmp");
    {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Every record under `work_dir` with its file. A record that cannot be
/// read is logged and left alone.
pub fn load(work_dir: &Path) -> Vec<RecordFile> {
    let dir = work_dir.join(RECORDS_DIR);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let parsed = std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice::<RunRecord>(&b).map_err(|e| e.to_string()));
        match parsed {
            Ok(record) => out.push(RecordFile {
                path,
                record: Mutex::new(record),
                removed: AtomicBool::new(false),
            }),
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e, "cannot read a run record; its processes (if any) are not killed");
            }
        }
    }
    out
}

impl RecordFile {
    /// The record as last written.
    pub fn get(&self) -> RunRecord {
        self.record
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Field 22 of `/proc/<pid>/stat` and whether the process is a zombie (it
/// has ended; only its exit status is left to collect).
fn stat(pid: u32) -> Option<(u64, bool)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold anything.
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?;
    // After the state (field 3), field 22 is the 19th.
    let start = fields.nth(18)?.parse().ok()?;
    Some((start, state == "Z" || state == "X"))
}

/// The start time of a live process, from `/proc/<pid>/stat`.
pub fn start_time(pid: u32) -> Option<u64> {
    stat(pid).map(|(start, _)| start)
}

/// Whether the process the record names still runs (same pid, same start
/// time, not a zombie).
pub fn alive(p: &ProcessRecord) -> bool {
    stat(p.pid).is_some_and(|(start, zombie)| start == p.start_time && !zombie)
}

/// Kills the process groups of `processes` still alive (SIGKILL) and waits
/// until every one of those processes is gone, up to `within`. Returns the
/// pids still alive then.
pub fn kill_and_wait(processes: &[ProcessRecord], within: Duration) -> Vec<u32> {
    let live: Vec<&ProcessRecord> = processes.iter().filter(|p| alive(p)).collect();
    let groups: BTreeSet<u32> = live.iter().map(|p| p.pgid).collect();
    for pgid in groups {
        super::run::kill_group(pgid);
    }
    let deadline = Instant::now() + within;
    loop {
        let left: Vec<u32> = live.iter().filter(|p| alive(p)).map(|p| p.pid).collect();
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(run_id: &str) -> RunRecord {
        RunRecord {
            run_id: run_id.into(),
            generation: 2,
            namespace: "ns".into(),
            name: "j".into(),
            dir: "/w/ns/j-2".into(),
            processes: Vec::new(),
            finished: false,
            lost: None,
            status: None,
            pods: Vec::new(),
            pod_files: Vec::new(),
            devices: BTreeMap::new(),
        }
    }

    #[test]
    fn records_round_trip_and_are_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        let file = RecordFile::create(dir.path(), record("uid/../x")).unwrap();
        file.update(|r| {
            r.processes.push(ProcessRecord {
                pod: "p".into(),
                pid: 7,
                pgid: 7,
                start_time: 99,
            })
        })
        .unwrap();
        let names: Vec<String> = std::fs::read_dir(dir.path().join(RECORDS_DIR))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            vec!["uid____x.2.json".to_string()],
            "no temp file left"
        );
        let loaded = load(dir.path());
        assert_eq!(loaded.len(), 1);
        assert_eq!(loaded[0].get(), file.get());
        assert_eq!(loaded[0].get().processes[0].pid, 7);
        file.remove();
        assert!(load(dir.path()).is_empty());
        file.update(|r| {
            r.devices.remove("p");
        })
        .unwrap();
        assert!(
            load(dir.path()).is_empty(),
            "an update after the removal (a pod's GPUs freed after its run was stopped) writes nothing"
        );
    }

    #[test]
    fn a_process_is_known_by_its_pid_and_start_time() {
        let me = std::process::id();
        let start = start_time(me).unwrap();
        let p = |start_time| ProcessRecord {
            pod: "p".into(),
            pid: me,
            pgid: me,
            start_time,
        };
        assert!(alive(&p(start)));
        assert!(!alive(&p(start + 1)), "a reused pid is not the process");
    }

    #[test]
    fn kill_and_wait_kills_the_whole_group() {
        use std::os::unix::process::CommandExt as _;
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & sleep 30; wait"])
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = child.id();
        let start = start_time(pid).unwrap();
        let record = ProcessRecord {
            pod: "p".into(),
            pid,
            pgid: pid,
            start_time: start,
        };
        // Reaped by a thread here, as init would reap an orphan.
        let reaper = std::thread::spawn(move || child.wait());
        let left = kill_and_wait(std::slice::from_ref(&record), Duration::from_secs(5));
        assert!(left.is_empty(), "{left:?}");
        assert!(!alive(&record));
        let status = reaper.join().unwrap().unwrap();
        assert!(!status.success());
    }
}
