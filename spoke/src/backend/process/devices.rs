//! What this machine offers when `--capacity` is not given, and which pod
//! holds which GPU.
//!
//! Discovery is split in two: functions over the text of `nvidia-smi` and
//! `/proc/meminfo` (pure, unit-tested with recorded answers) and
//! [`discover`], which runs and reads them. A malformed answer is skipped
//! line by line, never a panic.
//!
//! - cpu: [`std::thread::available_parallelism`] (which honours the
//!   cgroup's cpu quota and the affinity mask);
//! - memory: `MemTotal` less [`memory_reserve`], the larger of 1Gi and 10%,
//!   kept for the spoke, the sandbox and the page cache;
//! - `nvidia.com/gpu`: one per line of
//!   `nvidia-smi --query-gpu=index,uuid,name,memory.total --format=csv,noheader`,
//!   and the product (most GPUs first) as the label `nvidia.com/gpu.product`
//!   with spaces as `-`, as NVIDIA's GPU feature discovery writes it.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The extended resource of NVIDIA GPUs.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// The annotation of a process pod naming the GPUs it holds (UUIDs,
/// comma-separated).
pub const DEVICES_ANNOTATION: &str = "trainhub.kubeflow.org/devices";

/// What the NVIDIA container toolkit reads: no GPU visible.
const NO_NVIDIA_DEVICES: &str = "void";

const GI: u64 = 1 << 30;

/// One GPU as `nvidia-smi` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub memory_mib: Option<u64>,
}

/// What discovery found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Discovered {
    /// Resource name → allocatable milli-units.
    pub capacity: BTreeMap<String, i64>,
    pub gpus: Vec<Gpu>,
    /// The `nvidia.com/gpu.product` label value.
    pub product: Option<String>,
}

/// The GPUs of an `nvidia-smi --query-gpu=index,uuid,name,memory.total
/// --format=csv,noheader` answer, by index; a line that does not read as
/// one is skipped (and logged).
pub fn parse_nvidia_smi(text: &str) -> Vec<Gpu> {
    let mut gpus: Vec<Gpu> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|line| {
            let gpu = parse_gpu_line(line);
            if gpu.is_none() {
                tracing::warn!(
                    line,
                    "nvidia-smi: a line that is not index, uuid, name, memory.total; skipped"
                );
            }
            gpu
        })
        .collect();
    gpus.sort_by_key(|g| g.index);
    let mut seen = std::collections::BTreeSet::new();
    gpus.retain(|g| seen.insert(g.uuid.clone()));
    gpus
}

/// `0, GPU-8f6e…, NVIDIA A100-SXM4-80GB, 81920 MiB`; the name may hold commas.
fn parse_gpu_line(line: &str) -> Option<Gpu> {
    let fields: Vec<&str> = line.split(',').map(str::trim).collect();
    let [index, uuid, name @ .., memory] = fields.as_slice() else {
        return None;
    };
    let name = name.join(", ");
    let uuid_ok = !uuid.is_empty() && !uuid.contains(char::is_whitespace);
    if !uuid_ok || name.is_empty() {
        return None;
    }
    Some(Gpu {
        index: index.parse().ok()?,
        uuid: (*uuid).to_owned(),
        name,
        memory_mib: memory.split_whitespace().next()?.parse().ok(),
    })
}

/// `MemTotal` of a `/proc/meminfo`, in bytes.
pub fn parse_mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut words = line.strip_prefix("MemTotal:")?.split_whitespace();
    let amount: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => amount.checked_mul(1024),
        None => Some(amount),
        Some(_) => None,
    }
}

/// What is kept back from `MemTotal`: the larger of 1Gi and 10%.
pub fn memory_reserve(total: u64) -> u64 {
    (total / 10).max(GI)
}

/// A GPU name as the value of `nvidia.com/gpu.product`: words joined by `-`.
pub fn product_label(name: &str) -> String {
    name.split_whitespace().collect::<Vec<_>>().join("-")
}

/// The product most of `gpus` are (the first by name on a tie).
fn main_product(gpus: &[Gpu]) -> Option<String> {
    let mut count: BTreeMap<String, usize> = BTreeMap::new();
    for gpu in gpus {
        *count.entry(product_label(&gpu.name)).or_default() += 1;
    }
    let most = count.values().copied().max()?;
    count.into_iter().find(|(_, n)| *n == most).map(|(p, _)| p)
}

/// Capacity from the facts: `cpus` cores, `mem_total` bytes (None: unknown,
/// then no memory is declared), the GPUs found.
pub fn discovered(cpus: usize, mem_total: Option<u64>, gpus: Vec<Gpu>) -> Discovered {
    let mut capacity = BTreeMap::new();
    let milli = |n: u64| i64::try_from(n).ok().and_then(|n| n.checked_mul(1000));
    if let Some(cpu) = u64::try_from(cpus).ok().and_then(milli) {
        capacity.insert("cpu".to_owned(), cpu);
    }
    if let Some(memory) = mem_total.and_then(|t| milli(t.saturating_sub(memory_reserve(t)))) {
        capacity.insert("memory".to_owned(), memory);
    }
    if let Some(n) = u64::try_from(gpus.len()).ok().filter(|n| *n > 0) {
        capacity.extend(milli(n).map(|m| (GPU_RESOURCE.to_owned(), m)));
    }
    Discovered {
        capacity,
        product: main_product(&gpus),
        gpus,
    }
}

/// How long `nvidia-smi` may take: a wedged driver can hang it.
const NVIDIA_SMI_WITHIN: Duration = Duration::from_secs(20);

/// Discovers this machine (see the [module documentation](self)).
/// `path_env`: the `PATH` to find `nvidia-smi` on (None: the spoke's).
pub fn discover(path_env: Option<&OsStr>) -> Discovered {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let mem_total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .as_deref()
        .and_then(parse_mem_total);
    let gpus = nvidia_smi(path_env)
        .map(|text| parse_nvidia_smi(&text))
        .unwrap_or_default();
    discovered(cpus, mem_total, gpus)
}

/// The answer of `nvidia-smi` to the GPU query; None (said in the log)
/// when it is not installed, fails or hangs.
fn nvidia_smi(path_env: Option<&OsStr>) -> Option<String> {
    let mut command = Command::new("nvidia-smi");
    command
        .args([
            "--query-gpu=index,uuid,name,memory.total",
            "--format=csv,noheader",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if let Some(path) = path_env {
        command.env("PATH", path);
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(err) => {
            tracing::debug!(%err, "no nvidia-smi: no NVIDIA GPUs are declared");
            return None;
        }
    };
    let deadline = Instant::now() + NVIDIA_SMI_WITHIN;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                tracing::warn!("nvidia-smi did not answer in time: no NVIDIA GPUs are declared");
                return None;
            }
        }
    }
    let output = match child.wait_with_output() {
        Ok(output) => output,
        Err(err) => {
            tracing::warn!(%err, "could not read nvidia-smi's answer");
            return None;
        }
    };
    if !output.status.success() {
        tracing::warn!(status = %output.status, "nvidia-smi failed: no NVIDIA GPUs are declared");
        return None;
    }
    Some(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// GPUs a pod requests, from its `nvidia.com/gpu` request in milli-units.
pub fn gpus_requested(requests_milli: &BTreeMap<String, i64>) -> usize {
    let milli = requests_milli.get(GPU_RESOURCE).copied().unwrap_or(0);
    let whole = u64::try_from(milli).unwrap_or(0).div_ceil(1000);
    usize::try_from(whole).unwrap_or(usize::MAX)
}

/// Which pod holds which GPU (by UUID).
#[derive(Debug, Clone, Default)]
pub struct DevicePool {
    /// UUIDs in index order.
    devices: Vec<String>,
    /// Pod uid → the UUIDs it holds.
    held: BTreeMap<String, Vec<String>>,
}

impl DevicePool {
    pub fn new(devices: Vec<String>) -> Self {
        Self {
            devices,
            held: BTreeMap::new(),
        }
    }

    /// No GPU is managed: pods get no device env at all.
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    pub fn len(&self) -> usize {
        self.devices.len()
    }

    fn is_held(&self, uuid: &str) -> bool {
        self.held.values().flatten().any(|d| d == uuid)
    }

    /// `count` GPUs no other pod holds, lowest index first, now held by
    /// `pod`; None (nothing held) when fewer are free.
    ///
    /// # Guarantees
    ///
    /// Idempotent: a pod that holds GPUs gets the same ones again.
    pub fn assign(&mut self, pod: &str, count: usize) -> Option<Vec<String>> {
        if let Some(held) = self.held.get(pod) {
            return Some(held.clone());
        }
        let free: Vec<String> = self
            .devices
            .iter()
            .filter(|d| !self.is_held(d))
            .take(count)
            .cloned()
            .collect();
        if free.len() < count {
            return None;
        }
        if count > 0 {
            self.held.insert(pod.to_owned(), free.clone());
        }
        Some(free)
    }

    /// Marks `devices` (those this pool manages) as held by `pod`: what a
    /// restarted spoke takes back from its records.
    pub fn hold(&mut self, pod: &str, devices: &[String]) {
        let known: Vec<String> = devices
            .iter()
            .filter(|d| self.devices.contains(d))
            .cloned()
            .collect();
        if !known.is_empty() {
            self.held.insert(pod.to_owned(), known);
        }
    }

    /// Frees what `pod` holds; false if it held nothing.
    pub fn release(&mut self, pod: &str) -> bool {
        self.held.remove(pod).is_some()
    }
}

/// The env that makes `devices` (and only them) visible to CUDA and the
/// NVIDIA container toolkit; none visible when empty.
pub fn visible_env(devices: &[String]) -> Vec<(OsString, OsString)> {
    let list = devices.join(",");
    let nvidia = if devices.is_empty() {
        NO_NVIDIA_DEVICES.to_owned()
    } else {
        list.clone()
    };
    vec![
        ("CUDA_VISIBLE_DEVICES".into(), list.into()),
        ("NVIDIA_VISIBLE_DEVICES".into(), nvidia.into()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Recorded from a DGX A100 (UUIDs shortened).
    const DGX: &str = "\
0, GPU-1d2b1a6e-0000-0000-0000-000000000000, NVIDIA A100-SXM4-80GB, 81920 MiB
1, GPU-2d2b1a6e-0000-0000-0000-000000000000, NVIDIA A100-SXM4-80GB, 81920 MiB
";

    #[test]
    fn nvidia_smi_lines_become_gpus() {
        let gpus = parse_nvidia_smi(DGX);
        assert_eq!(gpus.len(), 2);
        assert_eq!(
            gpus[0],
            Gpu {
                index: 0,
                uuid: "GPU-1d2b1a6e-0000-0000-0000-000000000000".into(),
                name: "NVIDIA A100-SXM4-80GB".into(),
                memory_mib: Some(81920),
            }
        );
        assert_eq!(
            product_label(&gpus[0].name),
            "NVIDIA-A100-SXM4-80GB",
            "GPU feature discovery's spelling"
        );
    }

    #[test]
    fn malformed_nvidia_smi_lines_are_skipped_without_a_panic() {
        let text = "\
No devices were found
x, GPU-a, Tesla T4, 15360 MiB
1, , Tesla T4, 15360 MiB
2, GPU-c, Tesla T4, [N/A]
3, GPU-d, Some, Name, With, Commas, 100 MiB
4
, , ,
\u{0}\u{ff}, GPU-z
1, GPU-c, Tesla T4, 15360 MiB
";
        let gpus = parse_nvidia_smi(text);
        let seen: Vec<(u32, &str, Option<u64>)> = gpus
            .iter()
            .map(|g| (g.index, g.uuid.as_str(), g.memory_mib))
            .collect();
        assert_eq!(
            seen,
            vec![(1, "GPU-c", Some(15360)), (3, "GPU-d", Some(100)),],
            "a uuid listed twice counts once"
        );
        assert_eq!(gpus[1].name, "Some, Name, With, Commas");
        assert!(parse_nvidia_smi("").is_empty());
    }

    #[test]
    fn mem_total_is_read_in_bytes() {
        let meminfo = "MemTotal:       16318368 kB\nMemFree:         1000 kB\n";
        assert_eq!(parse_mem_total(meminfo), Some(16318368 * 1024));
        assert_eq!(parse_mem_total("MemFree: 1 kB"), None);
        assert_eq!(parse_mem_total("MemTotal: lots kB"), None);
        assert_eq!(parse_mem_total("MemTotal: 18446744073709551615 kB"), None);
    }

    #[test]
    fn the_reserve_is_the_larger_of_1gi_and_a_tenth() {
        assert_eq!(memory_reserve(4 * GI), GI);
        assert_eq!(memory_reserve(100 * GI), 10 * GI);
        assert_eq!(memory_reserve(0), GI);
    }

    #[test]
    fn capacity_declares_cpus_memory_less_the_reserve_and_gpus() {
        let d = discovered(8, Some(64 * GI), parse_nvidia_smi(DGX));
        let milli = |n: u64| i64::try_from(n * 1000).unwrap();
        assert_eq!(
            d.capacity,
            BTreeMap::from([
                ("cpu".to_owned(), 8000),
                ("memory".to_owned(), milli(64 * GI - 64 * GI / 10)),
                (GPU_RESOURCE.to_owned(), 2000),
            ])
        );
        assert_eq!(d.product.as_deref(), Some("NVIDIA-A100-SXM4-80GB"));
        let small = discovered(2, Some(GI / 2), Vec::new());
        assert_eq!(small.capacity.get("memory"), Some(&0));
        assert!(!small.capacity.contains_key(GPU_RESOURCE));
        assert_eq!(small.product, None);
        assert!(
            !discovered(2, None, Vec::new())
                .capacity
                .contains_key("memory")
        );
    }

    #[test]
    fn the_product_is_the_one_most_gpus_are() {
        let gpus = parse_nvidia_smi(
            "0, GPU-a, Tesla T4, 1 MiB\n1, GPU-b, NVIDIA L4, 1 MiB\n2, GPU-c, NVIDIA L4, 1 MiB\n",
        );
        assert_eq!(main_product(&gpus).as_deref(), Some("NVIDIA-L4"));
    }

    #[test]
    fn gpu_requests_round_up_to_whole_devices() {
        let req = |m: i64| BTreeMap::from([(GPU_RESOURCE.to_owned(), m)]);
        assert_eq!(gpus_requested(&req(2000)), 2);
        assert_eq!(gpus_requested(&req(1)), 1);
        assert_eq!(gpus_requested(&req(-1000)), 0);
        assert_eq!(gpus_requested(&BTreeMap::new()), 0);
    }

    fn four() -> DevicePool {
        DevicePool::new((0..4).map(|i| format!("GPU-{i}")).collect())
    }

    #[test]
    fn four_one_gpu_pods_get_distinct_devices_and_a_fifth_waits() {
        let mut pool = four();
        let got: Vec<Vec<String>> = (0..4)
            .map(|p| pool.assign(&format!("pod-{p}"), 1).unwrap())
            .collect();
        let mut all: Vec<&String> = got.iter().flatten().collect();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 4, "{got:?}");
        assert_eq!(pool.assign("pod-4", 1), None, "the fifth waits");
        assert_eq!(pool.assign("cpu-only", 0), Some(Vec::new()));
        assert_eq!(
            pool.assign("pod-2", 1).as_ref(),
            Some(&got[2]),
            "idempotent"
        );
        assert!(pool.release("pod-2"));
        assert!(!pool.release("pod-2"));
        assert_eq!(pool.assign("pod-4", 1).as_ref(), Some(&got[2]), "freed");
    }

    #[test]
    fn a_pod_wanting_more_than_is_free_takes_nothing() {
        let mut pool = four();
        pool.assign("a", 3).unwrap();
        assert_eq!(pool.assign("b", 2), None);
        assert_eq!(pool.assign("c", 1), Some(vec!["GPU-3".to_owned()]));
    }

    #[test]
    fn held_devices_taken_back_after_a_restart_are_not_given_out() {
        let mut pool = four();
        pool.hold("old", &["GPU-0".into(), "GPU-unknown".into()]);
        assert_eq!(pool.assign("new", 1), Some(vec!["GPU-1".to_owned()]));
        assert_eq!(pool.assign("more", 3), None);
    }

    #[test]
    fn the_env_makes_only_the_held_devices_visible() {
        let env = |d: &[&str]| -> Vec<(String, String)> {
            let d: Vec<String> = d.iter().map(|s| (*s).to_owned()).collect();
            visible_env(&d)
                .into_iter()
                .map(|(k, v)| (k.to_string_lossy().into(), v.to_string_lossy().into()))
                .collect()
        };
        assert_eq!(
            env(&["GPU-a", "GPU-b"]),
            vec![
                ("CUDA_VISIBLE_DEVICES".into(), "GPU-a,GPU-b".into()),
                ("NVIDIA_VISIBLE_DEVICES".into(), "GPU-a,GPU-b".into()),
            ]
        );
        assert_eq!(
            env(&[]),
            vec![
                ("CUDA_VISIBLE_DEVICES".into(), String::new()),
                ("NVIDIA_VISIBLE_DEVICES".into(), "void".into()),
            ]
        );
    }
}
