//! The scheduler and the kubelets: pending pods are bound to a node with
//! room (requests against allocatable, unschedulable nodes and untolerated
//! taints skipped, `nodeSelector` honoured), then run for their
//! `STANDIN_RUN_MS` and exit with their `STANDIN_EXIT_CODE`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Event, EventSource, Node, ObjectReference, Pod, Taint, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

use super::job::failed_before;
use super::jobset::LABEL_RESTART_ATTEMPT;
use super::{
    ANNOTATION_EXIT_CODE, Cluster, ENV_EXIT_CODE, ENV_FAIL_ATTEMPTS, ENV_RUN_MS, Snapshot,
    container_env, now, quantity,
};

pub(super) async fn reconcile(c: &mut Cluster, s: &Snapshot) {
    schedule(c, s).await;
    run(c, s).await;
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

fn node_name(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

/// What a pod asks for: the sum of its containers' requests (limits where a
/// request is missing, as the API server defaults them), plus one pod slot.
pub fn requests(pod: &Pod) -> BTreeMap<String, f64> {
    let mut total = BTreeMap::from([("pods".to_string(), 1.0)]);
    for container in pod.spec.iter().flat_map(|s| &s.containers) {
        let resources = container.resources.clone().unwrap_or_default();
        let mut asked = resources.limits.unwrap_or_default();
        asked.extend(resources.requests.unwrap_or_default());
        for (name, q) in asked {
            *total.entry(name).or_default() += quantity::parse(&q.0).unwrap_or(0.0);
        }
    }
    total
}

fn tolerates(tolerations: &[Toleration], taint: &Taint) -> bool {
    tolerations.iter().any(|t| {
        let key_ok = match t.key.as_deref() {
            None | Some("") => t.operator.as_deref() == Some("Exists"),
            Some(k) => k == taint.key,
        };
        let value_ok = t.operator.as_deref() == Some("Exists")
            || t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("");
        let effect_ok = t
            .effect
            .as_deref()
            .is_none_or(|e| e.is_empty() || e == taint.effect);
        key_ok && value_ok && effect_ok
    })
}

/// Why `pod` cannot go to `node` regardless of what runs there, if it cannot.
fn excluded(node: &Node, pod: &Pod) -> Option<&'static str> {
    let spec = node.spec.clone().unwrap_or_default();
    if spec.unschedulable == Some(true) {
        return Some("node(s) were unschedulable");
    }
    let pod_spec = pod.spec.clone().unwrap_or_default();
    let tolerations = pod_spec.tolerations.unwrap_or_default();
    let untolerated = spec
        .taints
        .iter()
        .flatten()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .any(|t| !tolerates(&tolerations, t));
    if untolerated {
        return Some("node(s) had untolerated taint");
    }
    let labels = node.labels();
    let selector_ok = pod_spec
        .node_selector
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    if !selector_ok {
        return Some("node(s) didn't match Pod's node affinity/selector");
    }
    None
}

fn allocatable(node: &Node) -> BTreeMap<String, f64> {
    node.status
        .iter()
        .flat_map(|s| s.allocatable.iter().flatten())
        .map(|(k, q)| (k.clone(), quantity::parse(&q.0).unwrap_or(0.0)))
        .collect()
}

async fn schedule(c: &Cluster, s: &Snapshot) {
    // What each node already holds: its bound pods that have not finished.
    let mut used: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    for pod in &s.pods {
        if let Some(node) = node_name(pod)
            && !matches!(phase(pod), "Succeeded" | "Failed")
        {
            let on_node = used.entry(node.to_string()).or_default();
            for (k, v) in requests(pod) {
                *on_node.entry(k).or_default() += v;
            }
        }
    }
    let mut pending: Vec<&Pod> = s
        .pods
        .iter()
        .filter(|p| node_name(p).is_none() && phase(p) == "Pending")
        .filter(|p| p.meta().deletion_timestamp.is_none())
        .collect();
    pending.sort_by_key(|p| p.meta().creation_timestamp.clone().map(|t| t.0));
    for pod in pending {
        let asked = requests(pod);
        let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
        let chosen = s.nodes.iter().find(|node| {
            if let Some(reason) = excluded(node, pod) {
                *reasons.entry(reason).or_default() += 1;
                return false;
            }
            let free = allocatable(node);
            let on_node = used.get(&node.name_any()).cloned().unwrap_or_default();
            let fits = asked.iter().all(|(k, v)| {
                *v <= 0.0
                    || on_node.get(k).copied().unwrap_or(0.0) + v
                        <= free.get(k).copied().unwrap_or(0.0)
            });
            if !fits {
                *reasons.entry("Insufficient resources").or_default() += 1;
            }
            fits
        });
        match chosen {
            Some(node) => {
                let name = node.name_any();
                let on_node = used.entry(name.clone()).or_default();
                for (k, v) in &asked {
                    *on_node.entry(k.clone()).or_default() += v;
                }
                c.patch(pod, json!({"spec": {"nodeName": name}})).await;
                c.patch_status(
                    pod,
                    json!({"conditions": [condition("PodScheduled", "True", None, None)]}),
                )
                .await;
                let message = format!(
                    "Successfully assigned {}/{} to {name}",
                    pod.namespace().unwrap_or_default(),
                    pod.name_any()
                );
                event(c, pod, "Normal", "Scheduled", &message, "default-scheduler").await;
            }
            None => {
                let already = pod
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c.reason.as_deref() == Some("Unschedulable"))
                    });
                if already {
                    continue;
                }
                let detail: Vec<String> = reasons.iter().map(|(r, n)| format!("{n} {r}")).collect();
                let message = format!(
                    "0/{} nodes are available: {}.",
                    s.nodes.len(),
                    detail.join(", ")
                );
                c.patch_status(
                    pod,
                    json!({"conditions": [condition("PodScheduled", "False", Some("Unschedulable"), Some(&message))]}),
                )
                .await;
                event(
                    c,
                    pod,
                    "Warning",
                    "FailedScheduling",
                    &message,
                    "default-scheduler",
                )
                .await;
            }
        }
    }
}

fn condition(type_: &str, status: &str, reason: Option<&str>, message: Option<&str>) -> Value {
    let mut c = json!({"type": type_, "status": status, "lastTransitionTime": now()});
    if let Some(r) = reason {
        c["reason"] = r.into();
    }
    if let Some(m) = message {
        c["message"] = m.into();
    }
    c
}

/// The container's env, else the pod's annotation.
fn setting(pod: &Pod, env: &str, annotation: Option<&str>) -> Option<String> {
    let value = serde_json::to_value(pod).unwrap_or_default();
    container_env(&value, None, env)
        .or_else(|| annotation.and_then(|a| pod.annotations().get(a).cloned()))
}

/// The exit code of this attempt of `pod`.
fn exit_code(s: &Snapshot, pod: &Pod) -> i32 {
    let code = setting(pod, ENV_EXIT_CODE, Some(ANNOTATION_EXIT_CODE)).and_then(|c| c.parse().ok());
    match setting(pod, ENV_FAIL_ATTEMPTS, None).and_then(|n| n.parse::<usize>().ok()) {
        Some(failing) => {
            let restarts: usize = pod
                .labels()
                .get(LABEL_RESTART_ATTEMPT)
                .and_then(|r| r.parse().ok())
                .unwrap_or(0);
            if restarts + failed_before(&s.pods, pod) < failing {
                code.filter(|c| *c != 0).unwrap_or(1)
            } else {
                0
            }
        }
        None => code.unwrap_or(0),
    }
}

async fn run(c: &mut Cluster, s: &Snapshot) {
    let default_run = c.config.run_ms;
    for (i, pod) in s.pods.iter().enumerate() {
        if pod.meta().deletion_timestamp.is_some() {
            continue;
        }
        let Some(node) = node_name(pod) else { continue };
        let uid = pod.meta().uid.clone().unwrap_or_default();
        let containers: Vec<String> = pod
            .spec
            .iter()
            .flat_map(|s| &s.containers)
            .map(|c| c.name.clone())
            .collect();
        match phase(pod) {
            "Pending" => {
                let started = json!({"running": {"startedAt": now()}});
                let statuses: Vec<Value> = containers
                    .iter()
                    .map(|name| {
                        json!({"name": name, "ready": true, "started": true, "restartCount": 0,
                                       "image": "", "imageID": "", "state": started})
                    })
                    .collect();
                c.patch_status(
                    pod,
                    json!({
                        "phase": "Running",
                        "startTime": now(),
                        "hostIP": "10.0.0.1",
                        "podIP": format!("10.1.{}.{}", (i / 250) % 250, i % 250 + 2),
                        "conditions": [
                            condition("PodScheduled", "True", None, None),
                            condition("Initialized", "True", None, None),
                            condition("ContainersReady", "True", None, None),
                            condition("Ready", "True", None, None),
                        ],
                        "containerStatuses": statuses,
                    }),
                )
                .await;
                c.started.insert(uid, tokio::time::Instant::now());
                let message = format!("Started container on {node}");
                event(c, pod, "Normal", "Started", &message, "kubelet").await;
            }
            "Running" => {
                let started = *c
                    .started
                    .entry(uid.clone())
                    .or_insert_with(tokio::time::Instant::now);
                let run_ms = setting(pod, ENV_RUN_MS, None)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(default_run);
                if started.elapsed().as_millis() < u128::from(run_ms) {
                    continue;
                }
                let code = exit_code(s, pod);
                let (phase, reason) = if code == 0 {
                    ("Succeeded", "Completed")
                } else {
                    ("Failed", "Error")
                };
                let terminated = json!({"terminated": {"exitCode": code, "reason": reason,
                                        "startedAt": now(), "finishedAt": now()}});
                let statuses: Vec<Value> = containers
                    .iter()
                    .map(|name| {
                        json!({"name": name, "ready": false, "started": false, "restartCount": 0,
                                       "image": "", "imageID": "", "state": terminated})
                    })
                    .collect();
                c.patch_status(
                    pod,
                    json!({
                        "phase": phase,
                        "conditions": [
                            condition("PodScheduled", "True", None, None),
                            condition("Initialized", "True", None, None),
                            condition("ContainersReady", "False", Some("PodCompleted"), None),
                            condition("Ready", "False", Some("PodCompleted"), None),
                        ],
                        "containerStatuses": statuses,
                    }),
                )
                .await;
                c.started.remove(&uid);
            }
            _ => {}
        }
    }
}

/// Records a core/v1 Event about `pod`.
async fn event(c: &Cluster, pod: &Pod, type_: &str, reason: &str, message: &str, component: &str) {
    let namespace = pod.namespace().unwrap_or_default();
    let event = Event {
        metadata: ObjectMeta {
            name: Some(format!(
                "{}.{}",
                pod.name_any(),
                &uuid::Uuid::new_v4().simple().to_string()[..16]
            )),
            namespace: Some(namespace.clone()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(pod.name_any()),
            namespace: Some(namespace.clone()),
            uid: pod.meta().uid.clone(),
            ..ObjectReference::default()
        },
        reason: Some(reason.into()),
        message: Some(message.into()),
        type_: Some(type_.into()),
        count: Some(1),
        first_timestamp: Some(now()),
        last_timestamp: Some(now()),
        source: Some(EventSource {
            component: Some(component.into()),
            host: None,
        }),
        ..Event::default()
    };
    c.create(&namespace, &event).await;
}
