//! The idle hub's memory: starts the real `trainhub dev --spokes 0` (nothing
//! submitted), lets it settle, and prints its resident set with a breakdown
//! by kind of mapping from `/proc/PID/smaps`. Twice: the first start, which
//! compiles the built-in plugins, and a restart, which maps them from the
//! compilation cache (what a hub does on every later start).
//!
//! `cargo bench -p trainhub --bench idle -- [--settle SECONDS] [--binary PATH]`
//! (settle default 15 s: long enough for the allocator to return what
//! start-up freed; `--binary` measures another build's `trainhub`, for side
//! by side comparisons).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn main() {
    let settle = Duration::from_secs(arg("--settle", 15));
    let dir = tempfile::tempdir().expect("temp dir");
    for start in [
        "first start (compiles the plugins)",
        "restart (plugins cached)",
    ] {
        let mut hub = start_hub(dir.path());
        std::thread::sleep(settle);
        let pid = hub.id();
        let report = measure(pid);
        let _ = hub.kill();
        let _ = hub.wait();
        println!("idle hub, {start}, after {} s:", settle.as_secs());
        print!("{report}");
    }
}

/// The value after `name` on the command line, else `default`.
fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The `trainhub` binary measured: `--binary PATH`, else this build's.
fn binary() -> std::path::PathBuf {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == "--binary")
        .and_then(|i| args.get(i + 1))
        .map_or_else(
            || env!("CARGO_BIN_EXE_trainhub").into(),
            std::path::PathBuf::from,
        )
}

/// `trainhub dev --spokes 0` on free ports, ready (its kubeconfig written).
fn start_hub(dir: &Path) -> Child {
    let data = dir.join("data");
    let _ = std::fs::remove_file(data.join("kubeconfig"));
    let log = std::fs::File::create(dir.join("hub.log")).expect("log file");
    let mut child = Command::new(binary())
        .args(["dev", "--spokes", "0", "--api-port", "0", "--data-dir"])
        .arg(&data)
        .env_remove("TRAINHUB_PLUGIN_CACHE_DIR")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("starting trainhub");
    let deadline = Instant::now() + Duration::from_secs(300);
    while !data.join("kubeconfig").exists() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "trainhub exited ({status}); see {}",
                dir.join("hub.log").display()
            );
        }
        assert!(Instant::now() < deadline, "trainhub not ready within 300 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    child
}

/// One mapping of `/proc/PID/smaps`.
struct Mapping {
    start: u64,
    end: u64,
    perms: String,
    name: String,
    rss_kib: u64,
}

fn smaps(pid: u32) -> Vec<Mapping> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).expect("smaps");
    let mut maps: Vec<Mapping> = Vec::new();
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let first = fields.next().unwrap_or_default();
        if let Some((start, end)) = first.split_once('-')
            && let (Ok(start), Ok(end)) =
                (u64::from_str_radix(start, 16), u64::from_str_radix(end, 16))
        {
            let perms = fields.next().unwrap_or_default().to_string();
            let name = fields.nth(3).unwrap_or_default().to_string();
            maps.push(Mapping {
                start,
                end,
                perms,
                name,
                rss_kib: 0,
            });
        } else if first == "Rss:"
            && let Some(m) = maps.last_mut()
        {
            m.rss_kib = fields.next().and_then(|v| v.parse().ok()).unwrap_or(0);
        }
    }
    maps
}

/// The kind of a mapping, for the breakdown.
fn kind(maps: &[Mapping], i: usize) -> &'static str {
    let m = &maps[i];
    let size = m.end - m.start;
    let name = m.name.as_str();
    if name.ends_with(".cwasm") {
        return "compiled plugins, mapped from the cache";
    }
    if name.starts_with("/memfd:wasm-memory-image") {
        return "plugins' initial memory images";
    }
    if name == "[heap]" {
        return "brk heap";
    }
    if name == "[stack]" {
        return "main thread stack";
    }
    if name.starts_with('/') {
        return if Path::new(name).file_name() == binary().file_name() {
            "the trainhub binary (code, data, embedded plugins)"
        } else {
            "shared libraries and other files"
        };
    }
    if !name.is_empty() {
        return "other";
    }
    // Anonymous.
    match m.perms.as_str() {
        "r-xp" => return "plugin machine code in the heap (compiled in memory)",
        "r--p" => return "plugin code metadata in the heap (read-only)",
        _ => {}
    }
    let near_reservation = |j: Option<usize>| {
        j.and_then(|j| maps.get(j))
            .is_some_and(|n| n.name.is_empty() && n.perms == "---p" && n.end - n.start >= 1 << 30)
    };
    if near_reservation(i.checked_sub(1)) || near_reservation(Some(i + 1)) {
        return "wasm instance pool (linear memories, tables)";
    }
    let guard_before = i
        .checked_sub(1)
        .and_then(|j| maps.get(j))
        .is_some_and(|g| g.perms == "---p" && g.end == m.start && g.end - g.start <= 64 << 10);
    if guard_before && size <= 16 << 20 {
        return "thread stacks";
    }
    "heap (jemalloc) and other anonymous memory"
}

fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn measure(pid: u32) -> String {
    let maps = smaps(pid);
    let mut by_kind: BTreeMap<&str, u64> = BTreeMap::new();
    for i in 0..maps.len() {
        *by_kind.entry(kind(&maps, i)).or_default() += maps[i].rss_kib;
    }
    let mib = |kib: u64| kib as f64 / 1024.0;
    let mut out = format!(
        "  RSS {:.1} MiB (anonymous {:.1}, file {:.1}), {} threads\n",
        mib(status_kib(pid, "VmRSS:")),
        mib(status_kib(pid, "RssAnon:")),
        mib(status_kib(pid, "RssFile:") + status_kib(pid, "RssShmem:")),
        status_kib(pid, "Threads:"),
    );
    let mut kinds: Vec<_> = by_kind.into_iter().filter(|(_, kib)| *kib > 0).collect();
    kinds.sort_by_key(|k| std::cmp::Reverse(k.1));
    for (kind, kib) in kinds {
        out.push_str(&format!("  {:8.1} MiB  {kind}\n", mib(kib)));
    }
    out
}
