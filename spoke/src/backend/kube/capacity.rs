//! Capacity from the cluster's Nodes and Pods, and gang admission by
//! first-fit packing of every pod of the gang onto the nodes.
//!
//! A node counts when it is schedulable: not cordoned
//! (`spec.unschedulable`) and without a `NoSchedule` or `NoExecute` taint
//! (the node controller taints NotReady and unreachable nodes so too). Its
//! free capacity is its `status.allocatable` less the requests of the
//! non-terminal pods bound to it. A pod's request is what the scheduler
//! counts: per resource the larger of the sum over its containers and the
//! largest init container, plus `spec.overhead`; each pod also takes one of
//! the node's `pods`.

use std::collections::BTreeMap;

use serde_json::Value;

// GPU_RESOURCE: the GPU resource whose count ranks GPU products.
pub use crate::backend::process::devices::GPU_PRODUCT_LABEL;
use crate::backend::process::devices::GPU_RESOURCE;
use crate::backend::process::{format_milli, parse_quantity_milli};
use crate::backend::{Capacity, PodSetRequest};

/// The resource that counts pods on a node.
pub const PODS: &str = "pods";

/// Milli-units per resource.
pub type Resources = BTreeMap<String, i64>;

/// What capacity needs of a Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    pub schedulable: bool,
    pub allocatable: Resources,
    pub gpu_product: Option<String>,
}

impl NodeInfo {
    /// `(name, info)` of a Node object; None without a name.
    pub fn from_node(node: &Value) -> Option<(String, NodeInfo)> {
        let name = node["metadata"]["name"].as_str()?.to_owned();
        let cordoned = node["spec"]["unschedulable"] == true;
        let tainted = node["spec"]["taints"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .any(|t| matches!(t["effect"].as_str(), Some("NoSchedule" | "NoExecute")));
        Some((
            name,
            NodeInfo {
                schedulable: !cordoned && !tainted,
                allocatable: quantities(&node["status"]["allocatable"]),
                gpu_product: node["metadata"]["labels"][GPU_PRODUCT_LABEL]
                    .as_str()
                    .map(str::to_owned),
            },
        ))
    }
}

/// A map of Kubernetes quantities into milli-units; an unreadable quantity
/// counts as none of that resource.
fn quantities(map: &Value) -> Resources {
    map.as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), parse_quantity_milli(v.as_str()?).ok()?)))
        .collect()
}

/// What capacity needs of a Pod: where it is bound and what it requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodUsage {
    /// `spec.nodeName`; None while unscheduled.
    pub node: Option<String>,
    /// Succeeded or Failed: it holds nothing any more.
    pub terminal: bool,
    pub requests: Resources,
}

impl PodUsage {
    pub fn from_pod(pod: &Value) -> PodUsage {
        PodUsage {
            node: pod["spec"]["nodeName"]
                .as_str()
                .filter(|n| !n.is_empty())
                .map(str::to_owned),
            terminal: matches!(
                pod["status"]["phase"].as_str(),
                Some("Succeeded" | "Failed")
            ),
            requests: pod_requests(&pod["spec"]),
        }
    }

    /// Whether it holds capacity on a node now.
    pub fn holds(&self) -> Option<&str> {
        if self.terminal {
            None
        } else {
            self.node.as_deref()
        }
    }
}

/// What a pod of this spec requests, as the scheduler counts it.
pub fn pod_requests(spec: &Value) -> Resources {
    let requests = |c: &Value| quantities(&c["resources"]["requests"]);
    let list = |key: &str| spec[key].as_array().cloned().unwrap_or_default();
    let mut total = Resources::new();
    for container in list("containers") {
        for (r, m) in requests(&container) {
            let slot = total.entry(r).or_default();
            *slot = slot.saturating_add(m);
        }
    }
    for init in list("initContainers") {
        for (r, m) in requests(&init) {
            let slot = total.entry(r).or_default();
            *slot = (*slot).max(m);
        }
    }
    for (r, m) in quantities(&spec["overhead"]) {
        let slot = total.entry(r).or_default();
        *slot = slot.saturating_add(m);
    }
    total.insert(PODS.to_owned(), 1000);
    total
}

/// Free capacity per schedulable node: allocatable less what the pods bound
/// to it hold.
pub fn free_by_node<'a>(
    nodes: &BTreeMap<String, NodeInfo>,
    pods: impl IntoIterator<Item = &'a PodUsage>,
) -> BTreeMap<String, Resources> {
    let mut free: BTreeMap<String, Resources> = nodes
        .iter()
        .filter(|(_, n)| n.schedulable)
        .map(|(name, n)| (name.clone(), n.allocatable.clone()))
        .collect();
    for pod in pods {
        let Some(node) = pod.holds() else { continue };
        let Some(left) = free.get_mut(node) else {
            continue;
        };
        for (r, m) in &pod.requests {
            if let Some(slot) = left.get_mut(r) {
                *slot = slot.saturating_sub(*m);
            }
        }
    }
    free
}

/// One pod to place: its pod set and what it requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodToPlace<'a> {
    pub set: &'a str,
    pub requests: Resources,
}

/// The pods of pod sets, less `placed` pods of each set (those already
/// bound), each with its request and one of `pods`.
pub fn pods_of<'a>(
    sets: &'a [PodSetRequest],
    placed: &BTreeMap<String, u32>,
) -> Vec<PodToPlace<'a>> {
    let mut out = Vec::new();
    for set in sets {
        let mut requests = set.requests_milli.clone();
        requests.insert(PODS.to_owned(), 1000);
        let left = set
            .count
            .saturating_sub(placed.get(&set.name).copied().unwrap_or(0));
        for _ in 0..left {
            out.push(PodToPlace {
                set: &set.name,
                requests: requests.clone(),
            });
        }
    }
    out
}

/// Places every pod on the first node where all its requests fit (largest
/// pods first), taking what it uses from `free`.
///
/// # Errors
///
/// A message naming the pod set and the resource of the first pod that fits
/// on no node; `free` is then partly used (pass a copy).
pub fn first_fit(
    free: &mut BTreeMap<String, Resources>,
    pods: &[PodToPlace],
) -> Result<(), String> {
    let mut order: Vec<&PodToPlace> = pods.iter().collect();
    order.sort_by_key(|p| std::cmp::Reverse(size_key(p)));
    for pod in order {
        // A node that does not say how many pods it takes is not limited.
        let fits = |left: &Resources| {
            pod.requests
                .iter()
                .all(|(r, m)| *m <= 0 || left.get(r).map_or(r == PODS, |f| f >= m))
        };
        let Some(left) = free.values_mut().find(|left| fits(left)) else {
            return Err(no_room(free, pod));
        };
        for (r, m) in &pod.requests {
            if let Some(slot) = left.get_mut(r) {
                *slot = slot.saturating_sub(*m);
            }
        }
    }
    Ok(())
}

/// Scarce resources first: GPUs, then CPU, then memory, then the rest.
fn size_key(pod: &PodToPlace) -> (i64, i64, i64, i64) {
    let get = |r: &str| pod.requests.get(r).copied().unwrap_or(0);
    let rest = pod
        .requests
        .iter()
        .filter(|(r, _)| !matches!(r.as_str(), GPU_RESOURCE | "cpu" | "memory"))
        .map(|(_, m)| *m)
        .fold(0i64, i64::saturating_add);
    (get(GPU_RESOURCE), get("cpu"), get("memory"), rest)
}

/// Why a pod fits on no node.
fn no_room(free: &BTreeMap<String, Resources>, pod: &PodToPlace) -> String {
    if free.is_empty() {
        return format!(
            "pod set {:?}: the cluster has no schedulable node (every node is cordoned or tainted NoSchedule/NoExecute)",
            pod.set
        );
    }
    for (r, want) in pod.requests.iter().filter(|(_, m)| **m > 0) {
        if r == PODS && free.values().all(|left| !left.contains_key(PODS)) {
            continue;
        }
        let best = free
            .iter()
            .map(|(node, left)| (left.get(r).copied().unwrap_or(0), node))
            .max();
        if let Some((most, node)) = best
            && most < *want
        {
            let shown = if r == "memory" || r.starts_with("hugepages-") || r == "ephemeral-storage"
            {
                format!("{} bytes", format_milli(*want))
            } else {
                format_milli(*want)
            };
            return format!(
                "pod set {:?}: a pod requests {r} {shown}; the most free on one node is {} (node {node})",
                pod.set,
                format_milli(most.max(0)),
            );
        }
    }
    let wanted: Vec<String> = pod
        .requests
        .iter()
        .filter(|(r, m)| **m > 0 && r.as_str() != PODS)
        .map(|(r, m)| format!("{r} {}", format_milli(*m)))
        .collect();
    format!(
        "pod set {:?}: no node has {} free at once, nor room for the gang's other pods beside it",
        pod.set,
        wanted.join(", ")
    )
}

/// Allocatable and free capacity summed over schedulable nodes, per
/// resource (free after `free_by_node` and the reservations placed).
pub fn totals(
    nodes: &BTreeMap<String, NodeInfo>,
    free: &BTreeMap<String, Resources>,
) -> Vec<Capacity> {
    let mut out: BTreeMap<String, Capacity> = BTreeMap::new();
    for (name, node) in nodes.iter().filter(|(_, n)| n.schedulable) {
        for (r, m) in &node.allocatable {
            let c = out.entry(r.clone()).or_insert_with(|| Capacity {
                resource: r.clone(),
                allocatable_milli: 0,
                free_milli: 0,
            });
            c.allocatable_milli = c.allocatable_milli.saturating_add(*m);
            let left = free
                .get(name)
                .and_then(|f| f.get(r))
                .copied()
                .unwrap_or(0)
                .max(0);
            c.free_milli = c.free_milli.saturating_add(left);
        }
    }
    out.into_values().collect()
}

/// The GPU product of the schedulable nodes with the most GPUs between them
/// (ties: the first by name), and every product seen.
pub fn gpu_product(nodes: &BTreeMap<String, NodeInfo>) -> (Option<String>, Vec<String>) {
    let mut gpus: BTreeMap<&str, i64> = BTreeMap::new();
    for node in nodes.values().filter(|n| n.schedulable) {
        if let Some(product) = &node.gpu_product {
            let n = node.allocatable.get(GPU_RESOURCE).copied().unwrap_or(0);
            let slot = gpus.entry(product).or_default();
            *slot = slot.saturating_add(n);
        }
    }
    let best = gpus
        .iter()
        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
        .map(|(p, _)| (*p).to_owned());
    (best, gpus.keys().map(|p| (*p).to_owned()).collect())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn node(name: &str, cpu: &str, gpus: &str, extra: Value) -> Value {
        let mut n = json!({
            "metadata": {"name": name, "labels": {}},
            "spec": {},
            "status": {"allocatable": {"cpu": cpu, "memory": "64Gi", "nvidia.com/gpu": gpus, "pods": "110"}},
        });
        if let Some(spec) = extra.get("spec") {
            n["spec"] = spec.clone();
        }
        if let Some(labels) = extra.get("labels") {
            n["metadata"]["labels"] = labels.clone();
        }
        n
    }

    fn nodes(list: &[Value]) -> BTreeMap<String, NodeInfo> {
        list.iter().filter_map(NodeInfo::from_node).collect()
    }

    fn set(name: &str, count: u32, reqs: &[(&str, i64)]) -> PodSetRequest {
        PodSetRequest {
            name: name.into(),
            count,
            requests_milli: reqs.iter().map(|(r, m)| (r.to_string(), *m)).collect(),
        }
    }

    #[test]
    fn cordoned_and_tainted_nodes_are_not_counted() {
        let all = nodes(&[
            node("a", "8", "4", json!({})),
            node("b", "8", "4", json!({"spec": {"unschedulable": true}})),
            node(
                "c",
                "8",
                "4",
                json!({"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}}),
            ),
            node(
                "d",
                "8",
                "4",
                json!({"spec": {"taints": [{"key": "k", "effect": "NoExecute"}]}}),
            ),
            node(
                "e",
                "4",
                "0",
                json!({"spec": {"taints": [{"key": "k", "effect": "PreferNoSchedule"}]}}),
            ),
        ]);
        assert_eq!(
            all.iter()
                .filter(|(_, n)| n.schedulable)
                .map(|(k, _)| k.as_str())
                .collect::<Vec<_>>(),
            ["a", "e"]
        );
        let free = free_by_node(&all, []);
        let caps = totals(&all, &free);
        let cpu = caps.iter().find(|c| c.resource == "cpu").unwrap();
        assert_eq!((cpu.allocatable_milli, cpu.free_milli), (12_000, 12_000));
        let gpu = caps
            .iter()
            .find(|c| c.resource == "nvidia.com/gpu")
            .unwrap();
        assert_eq!(gpu.allocatable_milli, 4000);
        let mem = caps.iter().find(|c| c.resource == "memory").unwrap();
        assert_eq!(mem.allocatable_milli, 2 * 64 * (1 << 30) * 1000);
    }

    #[test]
    fn requests_of_bound_running_pods_are_taken() {
        let all = nodes(&[
            node("a", "8", "4", json!({})),
            node("b", "8", "4", json!({})),
        ]);
        let pod = |node: &str, phase: &str| {
            PodUsage::from_pod(&json!({
                "spec": {"nodeName": node, "containers": [
                    {"name": "x", "resources": {"requests": {"cpu": "1500m", "nvidia.com/gpu": "2"}}},
                    {"name": "y", "resources": {"requests": {"cpu": "500m"}}},
                ]},
                "status": {"phase": phase},
            }))
        };
        let pending_unbound = PodUsage::from_pod(&json!({
            "spec": {"containers": [{"name": "x", "resources": {"requests": {"cpu": "8"}}}]},
            "status": {"phase": "Pending"},
        }));
        let pods = [
            pod("a", "Running"),
            pod("a", "Succeeded"),
            pod("b", "Failed"),
            pending_unbound,
        ];
        let free = free_by_node(&all, &pods);
        assert_eq!(free["a"]["cpu"], 6000);
        assert_eq!(free["a"]["nvidia.com/gpu"], 2000);
        assert_eq!(free["a"]["pods"], 109_000);
        assert_eq!(free["b"]["cpu"], 8000);
        let caps = totals(&all, &free);
        let cpu = caps.iter().find(|c| c.resource == "cpu").unwrap();
        assert_eq!((cpu.allocatable_milli, cpu.free_milli), (16_000, 14_000));
    }

    #[test]
    fn init_containers_and_overhead_count_as_the_scheduler_counts() {
        let r = pod_requests(&json!({
            "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "3", "memory": "1Gi"}}}],
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "1"}}},
                {"name": "b", "resources": {"requests": {"cpu": "1", "memory": "2Gi"}}},
            ],
            "overhead": {"cpu": "100m"},
        }));
        assert_eq!(r["cpu"], 3100);
        assert_eq!(r["memory"], 2 * (1 << 30) * 1000);
        assert_eq!(r[PODS], 1000);
    }

    #[test]
    fn a_gang_is_packed_per_node_not_by_totals() {
        // 8 GPUs free in total, but 4 per node: two pods of 4 fit, one of 8
        // does not.
        let all = nodes(&[
            node("a", "32", "4", json!({})),
            node("b", "32", "4", json!({})),
        ]);
        let free = free_by_node(&all, []);
        let two = [set("node", 2, &[("nvidia.com/gpu", 4000), ("cpu", 8000)])];
        first_fit(&mut free.clone(), &pods_of(&two, &BTreeMap::new())).unwrap();
        let one = [set("node", 1, &[("nvidia.com/gpu", 8000)])];
        let err = first_fit(&mut free.clone(), &pods_of(&one, &BTreeMap::new())).unwrap_err();
        assert_eq!(
            err,
            "pod set \"node\": a pod requests nvidia.com/gpu 8; the most free on one node is 4 (node b)"
        );
        // Three pods of 4 GPUs: the third has no node left.
        let three = [set("node", 3, &[("nvidia.com/gpu", 4000)])];
        let err = first_fit(&mut free.clone(), &pods_of(&three, &BTreeMap::new())).unwrap_err();
        assert!(
            err.starts_with(
                "pod set \"node\": a pod requests nvidia.com/gpu 4; the most free on one node is 0"
            ),
            "{err}"
        );
        // Pods already bound are not placed again.
        let placed = BTreeMap::from([("node".to_string(), 1)]);
        first_fit(&mut free.clone(), &pods_of(&three, &placed)).unwrap();
    }

    #[test]
    fn resources_that_fit_apart_but_not_together_name_the_pod_set() {
        let all = nodes(&[
            node("a", "16", "0", json!({})),
            node("b", "2", "4", json!({})),
        ]);
        let free = free_by_node(&all, []);
        let gang = [
            set("launcher", 1, &[("cpu", 1000)]),
            set("node", 1, &[("cpu", 8000), ("nvidia.com/gpu", 1000)]),
        ];
        let err = first_fit(&mut free.clone(), &pods_of(&gang, &BTreeMap::new())).unwrap_err();
        assert_eq!(
            err,
            "pod set \"node\": no node has cpu 8, nvidia.com/gpu 1 free at once, nor room for the gang's other pods beside it"
        );
        let none = BTreeMap::new();
        let err = first_fit(&mut BTreeMap::new(), &pods_of(&gang, &none)).unwrap_err();
        assert!(err.contains("no schedulable node"), "{err}");
        // Resources a node does not have at all do not fit; zero requests do.
        let err = first_fit(
            &mut free.clone(),
            &pods_of(&[set("x", 1, &[("example.com/fpga", 1000)])], &none),
        )
        .unwrap_err();
        assert!(
            err.contains("example.com/fpga 1; the most free on one node is 0"),
            "{err}"
        );
        first_fit(
            &mut free.clone(),
            &pods_of(&[set("x", 1, &[("example.com/fpga", 0)])], &none),
        )
        .unwrap();
    }

    #[test]
    fn pods_per_node_count_where_nodes_declare_them() {
        let mut small = node("a", "8", "0", json!({}));
        small["status"]["allocatable"]["pods"] = "1".into();
        let free = free_by_node(&nodes(&[small]), []);
        let gang = [set("w", 2, &[("cpu", 1000)])];
        let err = first_fit(&mut free.clone(), &pods_of(&gang, &BTreeMap::new())).unwrap_err();
        assert!(
            err.contains("requests pods 1; the most free on one node is 0"),
            "{err}"
        );
        let mut unlimited = node("a", "8", "0", json!({}));
        unlimited["status"]["allocatable"]
            .as_object_mut()
            .unwrap()
            .remove("pods");
        let free = free_by_node(&nodes(&[unlimited]), []);
        first_fit(&mut free.clone(), &pods_of(&gang, &BTreeMap::new())).unwrap();
    }

    #[test]
    fn largest_pods_are_placed_first() {
        // In set order, the 1-GPU pod would take node a and leave no room
        // for the 4-GPU pod; largest first, both fit.
        let all = nodes(&[
            node("a", "8", "4", json!({})),
            node("b", "8", "1", json!({})),
        ]);
        let gang = [
            set("small", 1, &[("nvidia.com/gpu", 1000)]),
            set("big", 1, &[("nvidia.com/gpu", 4000)]),
        ];
        first_fit(
            &mut free_by_node(&all, []),
            &pods_of(&gang, &BTreeMap::new()),
        )
        .unwrap();
    }

    #[test]
    fn the_gpu_product_of_the_most_gpus_is_chosen() {
        let all = nodes(&[
            node(
                "a",
                "8",
                "8",
                json!({"labels": {GPU_PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3"}}),
            ),
            node(
                "b",
                "8",
                "4",
                json!({"labels": {GPU_PRODUCT_LABEL: "NVIDIA-A100-SXM4-40GB"}}),
            ),
            node(
                "c",
                "8",
                "4",
                json!({"labels": {GPU_PRODUCT_LABEL: "NVIDIA-A100-SXM4-40GB"}}),
            ),
            node(
                "d",
                "8",
                "16",
                json!({"labels": {GPU_PRODUCT_LABEL: "NVIDIA-B200"}, "spec": {"unschedulable": true}}),
            ),
        ]);
        let (best, seen) = gpu_product(&all);
        assert_eq!(best.as_deref(), Some("NVIDIA-A100-SXM4-40GB"));
        assert_eq!(seen, ["NVIDIA-A100-SXM4-40GB", "NVIDIA-H100-80GB-HBM3"]);
        assert_eq!(gpu_product(&BTreeMap::new()), (None, Vec::new()));
    }

    #[test]
    fn unreadable_quantities_count_as_none() {
        let (_, n) = NodeInfo::from_node(&json!({
            "metadata": {"name": "a"},
            "status": {"allocatable": {"cpu": "lots", "memory": "1Gi"}},
        }))
        .unwrap();
        assert_eq!(n.allocatable.get("cpu"), None);
        assert!(NodeInfo::from_node(&json!({"metadata": {}})).is_none());
    }
}
