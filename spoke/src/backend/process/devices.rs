//! What this machine offers when `--capacity` is not given, and which pod
//! holds which GPU.
//!
//! Discovery is split in two: functions over the text of `nvidia-smi`,
//! `rocm-smi`, the KFD topology and `/proc/meminfo` (pure, unit-tested with
//! recorded answers) and [`discover`], which runs and reads them. A
//! malformed answer is skipped line by line (or node by node), never a
//! panic.
//!
//! - cpu: [`std::thread::available_parallelism`] (which honours the
//!   cgroup's cpu quota and the affinity mask);
//! - memory: `MemTotal` less [`memory_reserve`], the larger of 1Gi and 10%,
//!   kept for the spoke, the sandbox and the page cache;
//! - `nvidia.com/gpu`: one per line of
//!   `nvidia-smi --query-gpu=index,uuid,name,memory.total --format=csv,noheader`,
//!   and the product (most GPUs first) as the label `nvidia.com/gpu.product`
//!   with spaces as `-`, as NVIDIA's GPU feature discovery writes it;
//! - `amd.com/gpu`: one per GPU node of the KFD topology
//!   (`<sys>/class/kfd/kfd/topology/nodes/<n>/properties` with
//!   `simd_count > 0`), in node order, as ROCr enumerates its GPU agents.
//!   Each is selected by what `ROCR_VISIBLE_DEVICES` accepts: `GPU-` and its
//!   `unique_id` as 16 upper-case hex digits, or its ROCr index when the
//!   unique id is 0 or shared (the partitions of one MI300 share theirs,
//!   and ROCr refuses a UUID that matches two devices). Its name is the
//!   device's `product_name` in sysfs, else the `Card Series` that
//!   `rocm-smi --showuniqueid --showproductname --json` gives for its unique
//!   id (asked only when sysfs leaves a GPU unnamed). Without a KFD
//!   topology, `rocm-smi`'s cards alone are the GPUs. The product (most GPUs
//!   first) is the label `amd.com/gpu.product-name`, spelt as AMD's node
//!   labeller spells it (spaces as `_`, no parentheses).

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The extended resource of NVIDIA GPUs.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// The extended resource of AMD GPUs (AMD's Kubernetes device plugin).
pub const AMD_GPU_RESOURCE: &str = "amd.com/gpu";

/// The node label with the NVIDIA GPU's product (GPU feature discovery).
pub const GPU_PRODUCT_LABEL: &str = "nvidia.com/gpu.product";

/// The node label with the AMD GPU's product (AMD's node labeller).
pub const AMD_PRODUCT_LABEL: &str = "amd.com/gpu.product-name";

/// The annotation of a process pod naming the GPUs it holds (their ids,
/// comma-separated).
pub const DEVICES_ANNOTATION: &str = "trainhub.kubeflow.org/devices";

/// What the NVIDIA container toolkit reads: no GPU visible.
const NO_NVIDIA_DEVICES: &str = "void";

/// AMD's PCI vendor id, as KFD writes it (`vendor_id 4098`).
const AMD_VENDOR_ID: u64 = 0x1002;

const GI: u64 = 1 << 30;

/// Whose GPU: which resource it is counted as and which env selects it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Vendor {
    #[default]
    Nvidia,
    Amd,
}

impl Vendor {
    pub const ALL: [Vendor; 2] = [Vendor::Nvidia, Vendor::Amd];

    /// The extended resource pods request.
    pub fn resource(self) -> &'static str {
        match self {
            Vendor::Nvidia => GPU_RESOURCE,
            Vendor::Amd => AMD_GPU_RESOURCE,
        }
    }

    /// The spoke label naming the product.
    pub fn product_label(self) -> &'static str {
        match self {
            Vendor::Nvidia => GPU_PRODUCT_LABEL,
            Vendor::Amd => AMD_PRODUCT_LABEL,
        }
    }

    /// A GPU name as the value of [`Vendor::product_label`]; None when
    /// nothing of it can be a label value.
    pub fn product(self, name: &str) -> Option<String> {
        let value = match self {
            Vendor::Nvidia => product_label(name),
            Vendor::Amd => amd_product_label(name),
        };
        (!value.is_empty()).then_some(value)
    }
}

/// One GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Gpu {
    pub vendor: Vendor,
    /// Its index among its vendor's GPUs (`nvidia-smi`'s, ROCr's).
    pub index: u32,
    /// What selects it in its vendor's env, and names it in the pod
    /// annotation and the run record: NVIDIA's UUID; for AMD, ROCr's
    /// `GPU-<unique id>` or, when that cannot select it alone, its index.
    pub id: String,
    /// Its product name; empty when unknown.
    pub name: String,
    pub memory_mib: Option<u64>,
}

/// What discovery found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Discovered {
    /// Resource name → allocatable milli-units.
    pub capacity: BTreeMap<String, i64>,
    /// NVIDIA's GPUs, then AMD's.
    pub gpus: Vec<Gpu>,
    /// The product labels (`nvidia.com/gpu.product`,
    /// `amd.com/gpu.product-name`) of the GPUs found.
    pub labels: BTreeMap<String, String>,
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
    let mut seen = BTreeSet::new();
    gpus.retain(|g| seen.insert(g.id.clone()));
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
        vendor: Vendor::Nvidia,
        index: index.parse().ok()?,
        id: (*uuid).to_owned(),
        name,
        memory_mib: memory.split_whitespace().next()?.parse().ok(),
    })
}

/// One GPU node of the KFD topology.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KfdGpu {
    /// The node's number (its directory under `topology/nodes/`).
    pub node: u32,
    /// `unique_id`; 0 when the kernel gives none.
    pub unique_id: u64,
    /// `drm_render_minor`: its device is `/dev/dri/renderD<minor>`.
    pub render_minor: Option<u32>,
}

/// The `key value` lines of a KFD node's `properties`; a line that is not
/// one is skipped.
fn kfd_properties(text: &str) -> BTreeMap<&str, u64> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let (key, value, None) = (words.next()?, words.next()?, words.next()) else {
                return None;
            };
            Some((key, value.parse().ok()?))
        })
        .collect()
}

/// Node `node` as a GPU, from its `properties` and `gpu_id` files; None
/// for a CPU node (`simd_count 0`), a node whose `gpu_id` is 0, or one that
/// is not AMD's.
pub fn parse_kfd_node(node: u32, properties: &str, gpu_id: Option<&str>) -> Option<KfdGpu> {
    let props = kfd_properties(properties);
    let simd_count = props.get("simd_count").copied().unwrap_or(0);
    let vendor_ok = props.get("vendor_id").is_none_or(|v| *v == AMD_VENDOR_ID);
    let gpu_id_ok = gpu_id.is_none_or(|g| g.trim().parse::<u64>().is_ok_and(|g| g != 0));
    if simd_count == 0 || !vendor_ok || !gpu_id_ok {
        return None;
    }
    Some(KfdGpu {
        node,
        unique_id: props.get("unique_id").copied().unwrap_or(0),
        render_minor: props
            .get("drm_render_minor")
            .and_then(|m| u32::try_from(*m).ok()),
    })
}

/// What selects each GPU (of unique ids `unique_ids`, in ROCr's order) in
/// `ROCR_VISIBLE_DEVICES`: `GPU-` and the unique id as 16 upper-case hex
/// digits, as ROCr writes it, when it is set and no other GPU has it; the
/// ROCr index otherwise.
pub fn rocr_ids(unique_ids: &[u64]) -> Vec<String> {
    let mut seen: BTreeMap<u64, usize> = BTreeMap::new();
    for uid in unique_ids {
        *seen.entry(*uid).or_default() += 1;
    }
    unique_ids
        .iter()
        .enumerate()
        .map(|(index, uid)| {
            if *uid != 0 && seen.get(uid) == Some(&1) {
                format!("GPU-{uid:016X}")
            } else {
                index.to_string()
            }
        })
        .collect()
}

/// One card of a `rocm-smi --showuniqueid --showproductname --json` answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmiCard {
    /// N of its `cardN` key.
    pub card: u32,
    /// `Unique ID` (`0x…`); None when `N/A`.
    pub unique_id: Option<u64>,
    /// `Card Series` (`Card series` before ROCm 6.1); None when `N/A`.
    pub name: Option<String>,
}

/// The cards of a `rocm-smi --showuniqueid --showproductname --json`
/// answer, by card number. Text before the JSON (rocm-smi's warnings) is
/// ignored; an answer that is not JSON gives none, a key that is not
/// `card<N>` is skipped.
pub fn parse_rocm_smi(text: &str) -> Vec<SmiCard> {
    let json = text.find('{').map_or("", |at| &text[at..]);
    let answer: serde_json::Map<String, serde_json::Value> = match serde_json::from_str(json) {
        Ok(answer) => answer,
        Err(err) => {
            tracing::warn!(%err, "rocm-smi: an answer that is not its JSON; no card read from it");
            return Vec::new();
        }
    };
    let field = |card: &serde_json::Value, key: &str| {
        card.as_object()?
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .and_then(|(_, v)| v.as_str())
            .map(str::trim)
            .filter(|v| !v.is_empty() && !v.eq_ignore_ascii_case("N/A"))
            .map(str::to_owned)
    };
    let mut cards: Vec<SmiCard> = answer
        .iter()
        .filter_map(|(key, card)| {
            let number = key.strip_prefix("card")?.parse().ok()?;
            let unique_id = field(card, "Unique ID").and_then(|u| {
                let hex = u.strip_prefix("0x").or(u.strip_prefix("0X")).unwrap_or(&u);
                u64::from_str_radix(hex, 16).ok()
            });
            Some(SmiCard {
                card: number,
                unique_id,
                name: field(card, "Card Series"),
            })
        })
        .collect();
    cards.sort_by_key(|c| c.card);
    cards
}

/// The AMD GPUs: `kfd` (GPU nodes with their sysfs product name, in node
/// order) named, where sysfs did not, by the `rocm-smi` card of the same
/// unique id; or, when there is no KFD GPU, `smi`'s cards in card order.
pub fn amd_gpus(kfd: &[(KfdGpu, Option<String>)], smi: &[SmiCard]) -> Vec<Gpu> {
    let smi_name = |uid: u64| {
        smi.iter()
            .find(|c| uid != 0 && c.unique_id == Some(uid))
            .and_then(|c| c.name.clone())
    };
    let found: Vec<(u64, Option<String>)> = if kfd.is_empty() {
        smi.iter()
            .map(|c| (c.unique_id.unwrap_or(0), c.name.clone()))
            .collect()
    } else {
        kfd.iter()
            .map(|(gpu, name)| {
                let name = name.clone().or_else(|| smi_name(gpu.unique_id));
                (gpu.unique_id, name)
            })
            .collect()
    };
    let uids: Vec<u64> = found.iter().map(|(uid, _)| *uid).collect();
    found
        .into_iter()
        .zip(rocr_ids(&uids))
        .zip(0u32..)
        .map(|(((_, name), id), index)| Gpu {
            vendor: Vendor::Amd,
            index,
            id,
            name: name.unwrap_or_default(),
            memory_mib: None,
        })
        .collect()
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

/// A GPU name as the value of `amd.com/gpu.product-name`: AMD's node
/// labeller's spelling (each space `_`, no parentheses), then cut to what a
/// label value may hold (letters, digits, `-`, `_`, `.`; at most 63,
/// alphanumeric at both ends).
pub fn amd_product_label(name: &str) -> String {
    let spelt: String = name
        .trim()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('_'),
            c if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') => Some(c),
            _ => None,
        })
        .collect();
    let trim = |s: &str| {
        s.trim_matches(|c: char| !c.is_ascii_alphanumeric())
            .to_owned()
    };
    let value = trim(&spelt);
    trim(&value[..value.len().min(63)])
}

/// The product most of `gpus` of `vendor` are (the first by name on a tie).
fn main_product(gpus: &[Gpu], vendor: Vendor) -> Option<String> {
    let mut count: BTreeMap<String, usize> = BTreeMap::new();
    for gpu in gpus.iter().filter(|g| g.vendor == vendor) {
        if let Some(product) = vendor.product(&gpu.name) {
            *count.entry(product).or_default() += 1;
        }
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
    let mut labels = BTreeMap::new();
    for vendor in Vendor::ALL {
        let n = gpus.iter().filter(|g| g.vendor == vendor).count();
        if let Some(n) = u64::try_from(n).ok().filter(|n| *n > 0) {
            capacity.extend(milli(n).map(|m| (vendor.resource().to_owned(), m)));
        }
        if let Some(product) = main_product(&gpus, vendor) {
            labels.insert(vendor.product_label().to_owned(), product);
        }
    }
    Discovered {
        capacity,
        gpus,
        labels,
    }
}

/// How long `nvidia-smi` or `rocm-smi` may take: a wedged driver can hang it.
const SMI_WITHIN: Duration = Duration::from_secs(20);

/// Where a machine's sysfs is.
pub const SYSFS: &str = "/sys";

/// Discovers this machine (see the [module documentation](self)).
/// `path_env`: the `PATH` to find `nvidia-smi` and `rocm-smi` on (None:
/// the spoke's); `sys`: where sysfs is ([`SYSFS`]).
pub fn discover(path_env: Option<&OsStr>, sys: &Path) -> Discovered {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let mem_total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .as_deref()
        .and_then(parse_mem_total);
    let mut gpus = ask(
        "nvidia-smi",
        &[
            "--query-gpu=index,uuid,name,memory.total",
            "--format=csv,noheader",
        ],
        path_env,
    )
    .map(|text| parse_nvidia_smi(&text))
    .unwrap_or_default();
    gpus.extend(discover_amd(path_env, sys));
    discovered(cpus, mem_total, gpus)
}

/// The AMD GPUs of sysfs `sys`, named by `rocm-smi` where sysfs does not.
fn discover_amd(path_env: Option<&OsStr>, sys: &Path) -> Vec<Gpu> {
    let kfd = read_kfd(sys);
    let smi = if kfd.is_empty() || kfd.iter().any(|(_, name)| name.is_none()) {
        ask(
            "rocm-smi",
            &["--showuniqueid", "--showproductname", "--json"],
            path_env,
        )
        .map(|text| parse_rocm_smi(&text))
        .unwrap_or_default()
    } else {
        Vec::new()
    };
    amd_gpus(&kfd, &smi)
}

/// The GPU nodes of `sys`'s KFD topology in node order, each with the
/// `product_name` of its render device; none when there is no topology.
fn read_kfd(sys: &Path) -> Vec<(KfdGpu, Option<String>)> {
    let nodes_dir = sys.join("class/kfd/kfd/topology/nodes");
    let Ok(entries) = std::fs::read_dir(&nodes_dir) else {
        return Vec::new();
    };
    let mut nodes: Vec<u32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    nodes.sort_unstable();
    nodes
        .into_iter()
        .filter_map(|node| {
            let dir = nodes_dir.join(node.to_string());
            let properties = std::fs::read_to_string(dir.join("properties")).ok()?;
            let gpu_id = std::fs::read_to_string(dir.join("gpu_id")).ok();
            let gpu = parse_kfd_node(node, &properties, gpu_id.as_deref())?;
            let name = gpu.render_minor.and_then(|minor| {
                let path = sys.join(format!("class/drm/renderD{minor}/device/product_name"));
                let name = std::fs::read_to_string(path).ok()?;
                Some(name.trim().to_owned()).filter(|n| !n.is_empty())
            });
            Some((gpu, name))
        })
        .collect()
}

/// The answer of `program args` on `path_env` (None: the spoke's `PATH`);
/// None (said in the log) when it is not installed, fails or hangs.
fn ask(program: &str, args: &[&str], path_env: Option<&OsStr>) -> Option<String> {
    let mut command = Command::new(program);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if let Some(path) = path_env {
        command.env("PATH", path);
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(err) => {
            tracing::debug!(%err, "no {program}: no GPU is declared through it");
            return None;
        }
    };
    let deadline = Instant::now() + SMI_WITHIN;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                tracing::warn!("{program} did not answer in time: no GPU is declared through it");
                return None;
            }
        }
    }
    let output = match child.wait_with_output() {
        Ok(output) => output,
        Err(err) => {
            tracing::warn!(%err, "could not read {program}'s answer");
            return None;
        }
    };
    if !output.status.success() {
        tracing::warn!(status = %output.status, "{program} failed: no GPU is declared through it");
        return None;
    }
    Some(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Whole GPUs a pod requests per vendor, from its requests in milli-units
/// (rounded up); vendors it requests none of are left out.
pub fn gpus_requested(requests_milli: &BTreeMap<String, i64>) -> BTreeMap<Vendor, usize> {
    Vendor::ALL
        .into_iter()
        .filter_map(|vendor| {
            let milli = requests_milli.get(vendor.resource()).copied().unwrap_or(0);
            let whole = u64::try_from(milli).unwrap_or(0).div_ceil(1000);
            let whole = usize::try_from(whole).unwrap_or(usize::MAX);
            (whole > 0).then_some((vendor, whole))
        })
        .collect()
}

/// The devices of one pod, by vendor.
pub type Held = BTreeMap<Vendor, Vec<String>>;

/// Which pod holds which GPU (by id).
#[derive(Debug, Clone, Default)]
pub struct DevicePool {
    /// Per vendor, the ids in index order.
    devices: BTreeMap<Vendor, Vec<String>>,
    /// Pod uid → what it holds.
    held: BTreeMap<String, Held>,
}

impl DevicePool {
    pub fn new(gpus: &[Gpu]) -> Self {
        let mut devices: BTreeMap<Vendor, Vec<String>> = BTreeMap::new();
        for gpu in gpus {
            devices.entry(gpu.vendor).or_default().push(gpu.id.clone());
        }
        Self {
            devices,
            held: BTreeMap::new(),
        }
    }

    /// The vendors whose GPUs are managed: their pods get their env.
    pub fn vendors(&self) -> BTreeSet<Vendor> {
        self.devices.keys().copied().collect()
    }

    /// How many GPUs of `vendor` there are.
    pub fn count(&self, vendor: Vendor) -> usize {
        self.devices.get(&vendor).map_or(0, Vec::len)
    }

    fn is_held(&self, id: &str) -> bool {
        self.held
            .values()
            .flat_map(BTreeMap::values)
            .flatten()
            .any(|d| d == id)
    }

    /// For each vendor of `wants`, that many of its GPUs no other pod holds,
    /// lowest index first, now held by `pod`; None (nothing held) when
    /// fewer are free.
    ///
    /// # Guarantees
    ///
    /// Idempotent: a pod that holds GPUs gets the same ones again.
    pub fn assign(&mut self, pod: &str, wants: &BTreeMap<Vendor, usize>) -> Option<Held> {
        if let Some(held) = self.held.get(pod) {
            return Some(held.clone());
        }
        let mut got = Held::new();
        for (vendor, count) in wants.iter().filter(|(_, n)| **n > 0) {
            let free: Vec<String> = self
                .devices
                .get(vendor)
                .into_iter()
                .flatten()
                .filter(|d| !self.is_held(d))
                .take(*count)
                .cloned()
                .collect();
            if free.len() < *count {
                return None;
            }
            got.insert(*vendor, free);
        }
        if !got.is_empty() {
            self.held.insert(pod.to_owned(), got.clone());
        }
        Some(got)
    }

    /// Marks `devices` (those this pool manages) as held by `pod`: what a
    /// restarted spoke takes back from its records.
    pub fn hold(&mut self, pod: &str, devices: &[String]) {
        let mut known = Held::new();
        for id in devices {
            if let Some((vendor, _)) = self.devices.iter().find(|(_, ids)| ids.contains(id)) {
                known.entry(*vendor).or_default().push(id.clone());
            }
        }
        if !known.is_empty() {
            self.held.insert(pod.to_owned(), known);
        }
    }

    /// Frees what `pod` holds; false if it held nothing.
    pub fn release(&mut self, pod: &str) -> bool {
        self.held.remove(pod).is_some()
    }
}

/// The env that makes `held` (and only it) visible, for each of `vendors`
/// (those the spoke manages); a vendor's GPUs are none visible when the
/// pod holds none of them:
///
/// - NVIDIA: `CUDA_VISIBLE_DEVICES` and `NVIDIA_VISIBLE_DEVICES` (the
///   container toolkit's), the UUIDs; `""` and `void` for none;
/// - AMD: `ROCR_VISIBLE_DEVICES`, the ids ([`rocr_ids`]), which ROCr
///   renumbers from 0 in that order, and `HIP_VISIBLE_DEVICES`, indices
///   into what ROCr shows (`0,…,n-1`, so all of them); `""` for none
///   (ROCr shows no device when its variable is set and empty).
pub fn visible_env(vendors: &BTreeSet<Vendor>, held: &Held) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = Vec::new();
    for vendor in vendors {
        let ids = held.get(vendor).map(Vec::as_slice).unwrap_or_default();
        let list = ids.join(",");
        match vendor {
            Vendor::Nvidia => {
                let nvidia = if ids.is_empty() {
                    NO_NVIDIA_DEVICES.to_owned()
                } else {
                    list.clone()
                };
                env.push(("CUDA_VISIBLE_DEVICES".into(), list.into()));
                env.push(("NVIDIA_VISIBLE_DEVICES".into(), nvidia.into()));
            }
            Vendor::Amd => {
                let hip: Vec<String> = (0..ids.len()).map(|i| i.to_string()).collect();
                env.push(("ROCR_VISIBLE_DEVICES".into(), list.into()));
                env.push(("HIP_VISIBLE_DEVICES".into(), hip.join(",").into()));
            }
        }
    }
    env
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
                vendor: Vendor::Nvidia,
                index: 0,
                id: "GPU-1d2b1a6e-0000-0000-0000-000000000000".into(),
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
            .map(|g| (g.index, g.id.as_str(), g.memory_mib))
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
        assert_eq!(
            d.labels,
            BTreeMap::from([(
                GPU_PRODUCT_LABEL.to_owned(),
                "NVIDIA-A100-SXM4-80GB".to_owned()
            )])
        );
        let small = discovered(2, Some(GI / 2), Vec::new());
        assert_eq!(small.capacity.get("memory"), Some(&0));
        assert!(!small.capacity.contains_key(GPU_RESOURCE));
        assert!(small.labels.is_empty());
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
        assert_eq!(
            main_product(&gpus, Vendor::Nvidia).as_deref(),
            Some("NVIDIA-L4")
        );
        assert_eq!(main_product(&gpus, Vendor::Amd), None);
    }

    #[test]
    fn gpu_requests_round_up_to_whole_devices() {
        let req = |r: &str, m: i64| BTreeMap::from([(r.to_owned(), m)]);
        assert_eq!(
            gpus_requested(&req(GPU_RESOURCE, 2000)),
            BTreeMap::from([(Vendor::Nvidia, 2)])
        );
        assert_eq!(
            gpus_requested(&req(GPU_RESOURCE, 1)),
            BTreeMap::from([(Vendor::Nvidia, 1)])
        );
        assert_eq!(
            gpus_requested(&req(AMD_GPU_RESOURCE, 1500)),
            BTreeMap::from([(Vendor::Amd, 2)])
        );
        assert!(gpus_requested(&req(GPU_RESOURCE, -1000)).is_empty());
        assert!(gpus_requested(&BTreeMap::new()).is_empty());
        let both = BTreeMap::from([
            (GPU_RESOURCE.to_owned(), 1000),
            (AMD_GPU_RESOURCE.to_owned(), 3000),
        ]);
        assert_eq!(
            gpus_requested(&both),
            BTreeMap::from([(Vendor::Nvidia, 1), (Vendor::Amd, 3)])
        );
    }

    fn gpus(vendor: Vendor, ids: &[&str]) -> Vec<Gpu> {
        ids.iter()
            .zip(0..)
            .map(|(id, index)| Gpu {
                vendor,
                index,
                id: (*id).to_owned(),
                ..Gpu::default()
            })
            .collect()
    }

    fn four() -> DevicePool {
        DevicePool::new(&gpus(Vendor::Nvidia, &["GPU-0", "GPU-1", "GPU-2", "GPU-3"]))
    }

    fn wants(vendor: Vendor, n: usize) -> BTreeMap<Vendor, usize> {
        BTreeMap::from([(vendor, n)])
    }

    fn ids(held: Option<Held>) -> Option<Vec<String>> {
        held.map(|h| h.into_values().flatten().collect())
    }

    #[test]
    fn four_one_gpu_pods_get_distinct_devices_and_a_fifth_waits() {
        let mut pool = four();
        let one = wants(Vendor::Nvidia, 1);
        let got: Vec<Vec<String>> = (0..4)
            .map(|p| ids(pool.assign(&format!("pod-{p}"), &one)).unwrap())
            .collect();
        let mut all: Vec<&String> = got.iter().flatten().collect();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 4, "{got:?}");
        assert_eq!(pool.assign("pod-4", &one), None, "the fifth waits");
        assert_eq!(pool.assign("cpu-only", &BTreeMap::new()), Some(Held::new()));
        assert_eq!(
            ids(pool.assign("pod-2", &one)).as_ref(),
            Some(&got[2]),
            "idempotent"
        );
        assert!(pool.release("pod-2"));
        assert!(!pool.release("pod-2"));
        assert_eq!(
            ids(pool.assign("pod-4", &one)).as_ref(),
            Some(&got[2]),
            "freed"
        );
    }

    #[test]
    fn a_pod_wanting_more_than_is_free_takes_nothing() {
        let mut pool = four();
        pool.assign("a", &wants(Vendor::Nvidia, 3)).unwrap();
        assert_eq!(pool.assign("b", &wants(Vendor::Nvidia, 2)), None);
        assert_eq!(
            ids(pool.assign("c", &wants(Vendor::Nvidia, 1))),
            Some(vec!["GPU-3".to_owned()])
        );
    }

    #[test]
    fn held_devices_taken_back_after_a_restart_are_not_given_out() {
        let mut pool = four();
        pool.hold("old", &["GPU-0".into(), "GPU-unknown".into()]);
        assert_eq!(
            ids(pool.assign("new", &wants(Vendor::Nvidia, 1))),
            Some(vec!["GPU-1".to_owned()])
        );
        assert_eq!(pool.assign("more", &wants(Vendor::Nvidia, 3)), None);
    }

    /// A machine with two NVIDIA and two AMD GPUs.
    fn mixed() -> DevicePool {
        let mut all = gpus(Vendor::Nvidia, &["GPU-n0", "GPU-n1"]);
        all.extend(gpus(Vendor::Amd, &["GPU-00000000000000A0", "1"]));
        DevicePool::new(&all)
    }

    #[test]
    fn each_vendor_is_assigned_from_its_own_gpus() {
        let mut pool = mixed();
        assert_eq!(pool.vendors(), BTreeSet::from(Vendor::ALL));
        assert_eq!(
            (pool.count(Vendor::Nvidia), pool.count(Vendor::Amd)),
            (2, 2)
        );
        let amd = pool.assign("amd", &wants(Vendor::Amd, 2)).unwrap();
        assert_eq!(
            amd,
            Held::from([(Vendor::Amd, vec!["GPU-00000000000000A0".into(), "1".into()])])
        );
        assert_eq!(
            pool.assign("more-amd", &wants(Vendor::Amd, 1)),
            None,
            "AMD's are all held"
        );
        let both = BTreeMap::from([(Vendor::Nvidia, 1), (Vendor::Amd, 1)]);
        assert_eq!(pool.assign("both", &both), None, "all or nothing");
        let nvidia = pool.assign("nvidia", &wants(Vendor::Nvidia, 2)).unwrap();
        assert_eq!(
            nvidia,
            Held::from([(Vendor::Nvidia, vec!["GPU-n0".into(), "GPU-n1".into()])])
        );
        assert!(pool.release("amd"));
        pool.hold("restarted", &["1".into(), "GPU-n1".into()]);
        assert_eq!(
            pool.assign("after", &wants(Vendor::Amd, 1)),
            Some(Held::from([(
                Vendor::Amd,
                vec!["GPU-00000000000000A0".into()]
            )])),
            "AMD GPU 1 is held again from a record"
        );
    }

    fn env(vendors: &[Vendor], held: &Held) -> Vec<(String, String)> {
        let vendors: BTreeSet<Vendor> = vendors.iter().copied().collect();
        visible_env(&vendors, held)
            .into_iter()
            .map(|(k, v)| (k.to_string_lossy().into(), v.to_string_lossy().into()))
            .collect()
    }

    fn pair(k: &str, v: &str) -> (String, String) {
        (k.to_owned(), v.to_owned())
    }

    #[test]
    fn the_env_makes_only_the_held_devices_visible() {
        let nvidia = Held::from([(Vendor::Nvidia, vec!["GPU-a".into(), "GPU-b".into()])]);
        assert_eq!(
            env(&[Vendor::Nvidia], &nvidia),
            vec![
                pair("CUDA_VISIBLE_DEVICES", "GPU-a,GPU-b"),
                pair("NVIDIA_VISIBLE_DEVICES", "GPU-a,GPU-b"),
            ]
        );
        assert_eq!(
            env(&[Vendor::Nvidia], &Held::new()),
            vec![
                pair("CUDA_VISIBLE_DEVICES", ""),
                pair("NVIDIA_VISIBLE_DEVICES", "void"),
            ]
        );
    }

    #[test]
    fn amd_gpus_are_visible_to_rocr_by_id_and_to_hip_by_index_into_rocrs() {
        let amd = Held::from([(Vendor::Amd, vec!["GPU-1901EAD3A2ECD4A6".into(), "3".into()])]);
        assert_eq!(
            env(&[Vendor::Amd], &amd),
            vec![
                pair("ROCR_VISIBLE_DEVICES", "GPU-1901EAD3A2ECD4A6,3"),
                pair("HIP_VISIBLE_DEVICES", "0,1"),
            ],
            "HIP counts the devices ROCr shows, renumbered from 0"
        );
        assert_eq!(
            env(&[Vendor::Amd], &Held::new()),
            vec![
                pair("ROCR_VISIBLE_DEVICES", ""),
                pair("HIP_VISIBLE_DEVICES", ""),
            ],
            "set and empty: ROCr shows no device"
        );
        assert_eq!(
            env(&Vendor::ALL, &amd),
            vec![
                pair("CUDA_VISIBLE_DEVICES", ""),
                pair("NVIDIA_VISIBLE_DEVICES", "void"),
                pair("ROCR_VISIBLE_DEVICES", "GPU-1901EAD3A2ECD4A6,3"),
                pair("HIP_VISIBLE_DEVICES", "0,1"),
            ],
            "on a machine with both, the other vendor's are hidden"
        );
        assert!(env(&[], &amd).is_empty(), "no GPU managed: no env");
    }

    /// Recorded from the KFD topology of an MI210 machine (AMD's device
    /// plugin's test data): a CPU node, then a GPU node.
    const CPU_NODE: &str = "\
cpu_cores_count 64
simd_count 0
vendor_id 0
drm_render_minor 0
";
    const MI210_NODE: &str = "\
cpu_cores_count 0
simd_count 416
mem_banks_count 1
gfx_target_version 90010
vendor_id 4098
device_id 29711
location_id 25344
domain 0
drm_render_minor 128
hive_id 12609507387757274807
unique_id 1801979520617338022
num_xcc 1
";

    #[test]
    fn kfd_gpu_nodes_are_those_with_simds() {
        assert_eq!(parse_kfd_node(0, CPU_NODE, Some("0\n")), None);
        assert_eq!(
            parse_kfd_node(2, MI210_NODE, Some("53495\n")),
            Some(KfdGpu {
                node: 2,
                unique_id: 1801979520617338022,
                render_minor: Some(128),
            })
        );
        assert_eq!(
            parse_kfd_node(2, MI210_NODE, Some("0")),
            None,
            "gpu_id 0: not a GPU"
        );
        let other = MI210_NODE.replace("vendor_id 4098", "vendor_id 4318");
        assert_eq!(parse_kfd_node(2, &other, None), None, "not AMD's");
        let old = "simd_count 256\nsimd_count_typo x\nbroken\n\u{0}\u{ff} 1 2\n";
        assert_eq!(
            parse_kfd_node(1, old, None),
            Some(KfdGpu {
                node: 1,
                unique_id: 0,
                render_minor: None
            }),
            "an older kernel without unique_id; bad lines skipped"
        );
        assert_eq!(parse_kfd_node(1, "", None), None);
    }

    #[test]
    fn rocr_ids_are_uuids_when_unique_else_indices() {
        assert_eq!(
            rocr_ids(&[1801979520617338022, 0xab, 0]),
            ["GPU-1901EAD3A2ECD4A6", "GPU-00000000000000AB", "2"],
            "ROCr's spelling: 16 upper-case hex digits"
        );
        assert_eq!(
            rocr_ids(&[7, 7, 9]),
            ["0", "1", "GPU-0000000000000009"],
            "partitions of one GPU share its unique id: by index"
        );
    }

    /// What `rocm-smi --showuniqueid --showproductname --json` printed
    /// (ROCm 6.1 and later spell `Card Series`; earlier, `Card series`).
    const ROCM_SMI: &str = r#"
WARNING: AMD GPU device(s) is/are in a low-power state. Check power control/runtime_status

{"card0": {"Unique ID": "0x1901ead3a2ecd4a6", "Card Series": "AMD Instinct MI210", "Card Model": "0x740f", "Card Vendor": "Advanced Micro Devices, Inc. [AMD/ATI]", "Card SKU": "D67301", "Subsystem ID": "0x0c34", "Device Rev": "0x02", "Node ID": "2", "GUID": "53495", "GFX Version": "gfx90a"}, "card1": {"Unique ID": "N/A", "Card series": "Navi 31 [Radeon RX 7900 XT/7900 XTX]"}, "card10": {"Unique ID": "0xAB", "Card Series": "N/A"}, "system": {"Driver version": "6.7.0"}, "cardx": {}}
"#;

    #[test]
    fn rocm_smi_cards_are_read_by_number() {
        assert_eq!(
            parse_rocm_smi(ROCM_SMI),
            vec![
                SmiCard {
                    card: 0,
                    unique_id: Some(1801979520617338022),
                    name: Some("AMD Instinct MI210".into()),
                },
                SmiCard {
                    card: 1,
                    unique_id: None,
                    name: Some("Navi 31 [Radeon RX 7900 XT/7900 XTX]".into()),
                },
                SmiCard {
                    card: 10,
                    unique_id: Some(0xab),
                    name: None,
                },
            ]
        );
        assert!(parse_rocm_smi("").is_empty());
        assert!(parse_rocm_smi("{\"card0\": ").is_empty());
        assert!(parse_rocm_smi("[1, 2]").is_empty());
        assert!(parse_rocm_smi("{\"card0\": 7}")[0].name.is_none());
    }

    fn kfd(node: u32, unique_id: u64, name: Option<&str>) -> (KfdGpu, Option<String>) {
        let gpu = KfdGpu {
            node,
            unique_id,
            render_minor: Some(128 + node),
        };
        (gpu, name.map(str::to_owned))
    }

    #[test]
    fn amd_gpus_are_the_kfd_nodes_named_by_sysfs_else_by_rocm_smi() {
        let smi = parse_rocm_smi(ROCM_SMI);
        let found = amd_gpus(
            &[
                kfd(2, 1801979520617338022, None),
                kfd(3, 0x42, Some("AMD Instinct MI210")),
                kfd(4, 0, None),
            ],
            &smi,
        );
        let seen: Vec<(u32, &str, &str)> = found
            .iter()
            .map(|g| (g.index, g.id.as_str(), g.name.as_str()))
            .collect();
        assert_eq!(
            seen,
            [
                (0, "GPU-1901EAD3A2ECD4A6", "AMD Instinct MI210"),
                (1, "GPU-0000000000000042", "AMD Instinct MI210"),
                (2, "2", ""),
            ]
        );
        assert!(found.iter().all(|g| g.vendor == Vendor::Amd));

        let from_smi = amd_gpus(&[], &smi);
        let seen: Vec<(&str, &str)> = from_smi
            .iter()
            .map(|g| (g.id.as_str(), g.name.as_str()))
            .collect();
        assert_eq!(
            seen,
            [
                ("GPU-1901EAD3A2ECD4A6", "AMD Instinct MI210"),
                ("1", "Navi 31 [Radeon RX 7900 XT/7900 XTX]"),
                ("GPU-00000000000000AB", ""),
            ],
            "no KFD topology: rocm-smi's cards"
        );
        assert!(amd_gpus(&[], &[]).is_empty());
    }

    #[test]
    fn the_amd_product_label_is_the_node_labellers_spelling_as_a_valid_value() {
        assert_eq!(
            amd_product_label("AMD Instinct MI300X"),
            "AMD_Instinct_MI300X"
        );
        assert_eq!(
            amd_product_label("AMD Radeon Pro W7900 (Navi 31)"),
            "AMD_Radeon_Pro_W7900_Navi_31"
        );
        assert_eq!(
            amd_product_label("Navi 31 [Radeon RX 7900 XT/7900 XTX]"),
            "Navi_31_Radeon_RX_7900_XT7900_XTX"
        );
        assert_eq!(amd_product_label(&"x ".repeat(40)).len(), 63);
        assert!(amd_product_label(&"x ".repeat(40)).ends_with('x'));
        assert_eq!(amd_product_label(" [] "), "");
        assert_eq!(Vendor::Amd.product(" () "), None);
    }

    #[test]
    fn capacity_and_labels_count_each_vendor() {
        let mut all = parse_nvidia_smi(DGX);
        let mut amd = gpus(Vendor::Amd, &["GPU-A", "GPU-B", "2"]);
        amd[0].name = "AMD Instinct MI300X".into();
        amd[1].name = "AMD Instinct MI300X".into();
        all.extend(amd);
        let d = discovered(4, None, all);
        assert_eq!(d.capacity.get(GPU_RESOURCE), Some(&2000));
        assert_eq!(d.capacity.get(AMD_GPU_RESOURCE), Some(&3000));
        assert_eq!(
            d.labels,
            BTreeMap::from([
                (
                    GPU_PRODUCT_LABEL.to_owned(),
                    "NVIDIA-A100-SXM4-80GB".to_owned()
                ),
                (
                    AMD_PRODUCT_LABEL.to_owned(),
                    "AMD_Instinct_MI300X".to_owned()
                ),
            ])
        );
    }
}
