//! The runner's side of quotas: Kueue's objects read from the store into
//! the dispatcher's quota configuration, each TrainJob's queue resolved
//! from its labels, and the quota decisions published as Kueue publishes
//! them: a Workload per TrainJob of a queue, ClusterQueue and LocalQueue
//! status, and the TrainJob's own `QuotaReserved`, `Evicted` and
//! `Preempted` conditions and events.
//!
//! A TrainJob without the `kueue.x-k8s.io/queue-name` label is not managed
//! by quota: it is dispatched as capacity allows, as before quotas.
//!
//! Publishing is a diff: every [`PUBLISH_EVERY`] the runner computes what
//! each object should say and writes only what changed since it last
//! wrote. A waiting TrainJob's position is shown exactly while fewer than
//! [`POSITIONS_SHOWN`] wait ahead of it, so a long queue moving at its head
//! does not rewrite every TrainJob behind it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use serde_json::{Value, json};
use trainhub_apiserver::namespace::NAMESPACES;
use trainhub_apiserver::store::{Key, Op, Store};

use super::core::{QueueRef, QueueState, QueuedJob, Want};
use super::quota::{
    self, ClusterQueueStatus, FlavorUsage, LocalQueue, QuotaConfig, StopPolicy, Waiting,
};
use super::reports::trainjob_event;
use super::writer::{Write, update_status};
use super::{Dispatch, hash_of, job_key, lock};
use crate::api::TRAINJOBS;
use crate::controller::lifecycle::{format_time, set_condition};
use crate::kueue::workload::{self, Priority, WorkloadStatus};
use crate::kueue::{
    CLUSTER_QUEUES, COHORTS, LABEL_QUEUE_NAME, LOCAL_QUEUES, RESOURCE_FLAVORS,
    WORKLOAD_PRIORITY_CLASSES, WORKLOADS, conditions,
};

/// How often queue status, Workloads and waiting TrainJobs are published.
pub const PUBLISH_EVERY: Duration = Duration::from_millis(500);
/// A waiting TrainJob's exact position is shown while fewer than this many
/// wait ahead of it in its ClusterQueue.
pub const POSITIONS_SHOWN: usize = 100;

/// The resources whose changes reload the quota configuration.
const QUOTA_RESOURCES: [&str; 6] = [
    RESOURCE_FLAVORS,
    CLUSTER_QUEUES,
    COHORTS,
    LOCAL_QUEUES,
    WORKLOAD_PRIORITY_CLASSES,
    NAMESPACES,
];

/// On a ClusterQueue: `"true"` takes its nominal quota from the spokes:
/// each flavor's quota of each resource is the sum of what the spokes
/// providing that flavor (their labels match its nodeLabels) declare
/// allocatable, kept up to date as spokes come and go.
pub const ANNOTATION_QUOTA_FROM_SPOKES: &str = "trainhub.kubeflow.org/quota-from-spokes";

/// What the publisher reads of a TrainJob: who it is, its labels and its
/// status. Parsed from the stored JSON without building the rest (its
/// spec, annotations and managedFields are most of it), as the Workload
/// of a TrainJob is written long after the TrainJob was last read.
#[derive(serde::Deserialize)]
struct Head {
    metadata: HeadMeta,
    #[serde(default)]
    status: Value,
}

#[derive(serde::Deserialize)]
struct HeadMeta {
    name: String,
    namespace: String,
    uid: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

/// The TrainJob at `key` as [`Head`] reads it, as a JSON object of those
/// fields alone; None when it is not stored (or is not a TrainJob).
fn read_head(store: &dyn Store, key: &Key) -> Option<Value> {
    let (_, bytes) = store.get_raw(key)?;
    let head: Head = serde_json::from_slice(&bytes).ok()?;
    let m = head.metadata;
    Some(json!({
        "metadata": {"name": m.name, "namespace": m.namespace, "uid": m.uid, "labels": m.labels},
        "status": head.status,
    }))
}

/// The label every namespace carries with its own name.
const LABEL_NAMESPACE_NAME: &str = "kubernetes.io/metadata.name";

/// What resolving a TrainJob's queue reads: LocalQueues, priority classes
/// and namespace labels.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Index {
    local_queues: HashMap<(String, String), LocalQueue>,
    priority_classes: HashMap<String, i32>,
    namespace_labels: HashMap<String, Value>,
    /// ClusterQueues that take their quota from the spokes.
    from_spokes: std::collections::BTreeSet<String>,
}

impl Index {
    /// The queue of a TrainJob and its priority; None for a TrainJob
    /// without the queue-name label (not managed by quota).
    pub(super) fn resolve(&self, object: &Value) -> Option<(QueueRef, i32)> {
        let meta = &object["metadata"];
        let namespace = meta["namespace"].as_str()?;
        let local_queue = meta["labels"][LABEL_QUEUE_NAME]
            .as_str()
            .filter(|q| !q.is_empty())?;
        let lq = self
            .local_queues
            .get(&(namespace.to_string(), local_queue.to_string()));
        let mut hold = lq.filter(|l| l.stop_policy != StopPolicy::None).map(|l| {
            format!(
                "LocalQueue {local_queue} is stopped (stopPolicy {:?})",
                l.stop_policy
            )
        });
        let priority =
            workload::priority(object, |class| self.priority_classes.get(class).copied())
                .unwrap_or_else(|e| {
                    hold.get_or_insert(e);
                    Priority::default()
                });
        let mut namespace_labels = self
            .namespace_labels
            .get(namespace)
            .cloned()
            .unwrap_or_else(|| json!({}));
        if namespace_labels[LABEL_NAMESPACE_NAME].is_null() {
            namespace_labels[LABEL_NAMESPACE_NAME] = namespace.into();
        }
        let queue = QueueRef {
            local_queue: local_queue.to_string(),
            cluster_queue: lq.map(|l| l.cluster_queue.clone()),
            namespace_labels,
            tolerations: tolerations_of(object),
            priority_class: priority.class,
            drain: hold.is_some() && lq.is_some_and(|l| l.stop_policy == StopPolicy::HoldAndDrain),
            hold,
        };
        Some((queue, priority.value))
    }

    /// The LocalQueues, by namespace and name.
    pub(super) fn local_queues(&self) -> impl Iterator<Item = &LocalQueue> {
        self.local_queues.values()
    }
}

/// The tolerations a TrainJob's pod template overrides add (a runtime's
/// own templates are not read here).
fn tolerations_of(object: &Value) -> Vec<quota::Toleration> {
    let mut out = Vec::new();
    for o in object["spec"]["podTemplateOverrides"]
        .as_array()
        .into_iter()
        .flatten()
    {
        match quota::parse_tolerations(&o["spec"]["tolerations"]) {
            Ok(t) => out.extend(t),
            Err(e) => tracing::debug!(error = %e, "TrainJob tolerations not read"),
        }
    }
    out
}

/// Reads every quota object. One that cannot be read is left out (and
/// logged): the API validated it, so this is a defect, not user input.
pub(super) fn load(store: &dyn Store) -> (QuotaConfig, Index) {
    fn each<T>(
        store: &dyn Store,
        resource: &str,
        parse: impl Fn(&Value) -> Result<T, quota::QuotaError>,
    ) -> Vec<T> {
        let (objects, _) = store.list(resource, None);
        objects
            .iter()
            .filter_map(|o| match parse(&o.value) {
                Ok(t) => Some(t),
                Err(e) => {
                    tracing::warn!(error = %e, "quota object not read");
                    None
                }
            })
            .collect()
    }
    let config = QuotaConfig {
        flavors: each(store, RESOURCE_FLAVORS, quota::parse_flavor)
            .into_iter()
            .map(|f| (f.name.clone(), f))
            .collect(),
        cluster_queues: each(store, CLUSTER_QUEUES, quota::parse_cluster_queue)
            .into_iter()
            .map(|q| (q.name.clone(), q))
            .collect(),
        cohorts: each(store, COHORTS, quota::parse_cohort)
            .into_iter()
            .map(|c| (c.name.clone(), c))
            .collect(),
    };
    let (namespaces, _) = store.list(NAMESPACES, None);
    let (cluster_queues, _) = store.list(CLUSTER_QUEUES, None);
    let index = Index {
        from_spokes: cluster_queues
            .iter()
            .filter(|o| o.value["metadata"]["annotations"][ANNOTATION_QUOTA_FROM_SPOKES] == "true")
            .map(|o| o.key.name.clone())
            .collect(),
        local_queues: each(store, LOCAL_QUEUES, quota::parse_local_queue)
            .into_iter()
            .map(|l| ((l.namespace.clone(), l.name.clone()), l))
            .collect(),
        priority_classes: each(
            store,
            WORKLOAD_PRIORITY_CLASSES,
            quota::parse_priority_class,
        )
        .into_iter()
        .map(|p| (p.name, p.value))
        .collect(),
        namespace_labels: namespaces
            .iter()
            .map(|n| {
                let labels = n.value["metadata"]["labels"].clone();
                (n.key.name.clone(), labels)
            })
            .collect(),
    };
    (config, index)
}

/// Sets the nominal quota of ClusterQueues `names` from the spokes: for
/// each flavor, each resource's quota is the sum of the allocatable of
/// the spokes providing it (`spokes`: labels, allocatable milli-units).
pub(super) fn quota_from_spokes(
    config: &mut QuotaConfig,
    names: &std::collections::BTreeSet<String>,
    spokes: &[(Value, BTreeMap<String, i64>)],
) {
    let flavors = config.flavors.clone();
    for name in names {
        let Some(cq) = config.cluster_queues.get_mut(name) else {
            continue;
        };
        for group in &mut cq.resource_groups {
            for fq in &mut group.flavors {
                let Some(flavor) = flavors.get(&fq.flavor) else {
                    continue;
                };
                for (resource, quota) in &mut fq.quotas {
                    quota.nominal = spokes
                        .iter()
                        .filter(|(labels, _)| super::core::provides(labels, &flavor.node_labels))
                        .map(|(_, allocatable)| allocatable.get(resource).copied().unwrap_or(0))
                        .fold(0i64, i64::saturating_add);
                }
            }
        }
    }
}

/// What [`quota_from_spokes`] reads of the spokes, hashed: when it
/// changes, the quota configuration is reloaded.
fn spokes_signature(spokes: &[(Value, BTreeMap<String, i64>)]) -> u64 {
    hash_of(
        &spokes
            .iter()
            .map(|(l, a)| (l.to_string(), a))
            .collect::<Vec<_>>(),
    )
}

/// Why a TrainJob was evicted, kept until its Workload shows it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Eviction {
    pub uid: String,
    pub reason: &'static str,
    pub message: String,
    /// The `Preempted` condition's reason and message, for a preemption.
    pub preempted: Option<(&'static str, String)>,
}

/// What the runner last wrote, per object, as a hash of what it said.
#[derive(Debug, Default)]
pub(super) struct Published {
    /// Whether the Workloads in the store were listed (once a run).
    listed: bool,
    workloads: HashMap<super::core::JobKey, PublishedWorkload>,
    cluster_queues: HashMap<String, u64>,
    local_queues: HashMap<(String, String), u64>,
}

/// A Workload as this publisher last wrote it.
#[derive(Debug)]
struct PublishedWorkload {
    name: String,
    /// The fingerprint it was written for (0: listed, not written by this
    /// run).
    hash: u64,
    /// What its next write keeps, while the TrainJob may still change; None:
    /// read the stored Workload (one listed, or a finished TrainJob's).
    known: Option<Box<Known>>,
}

/// What a Workload's next write keeps of it: its identity and its
/// conditions (the rest of its status is computed anew), so that the
/// publisher, the only writer of Workloads, does not read back and decode
/// the Workload it wrote for each change of a TrainJob.
#[derive(Debug, PartialEq)]
struct Known {
    uid: String,
    created: String,
    /// type, status, reason, message, lastTransitionTime
    conditions: Vec<[String; 5]>,
}

impl Known {
    const FIELDS: [&'static str; 5] = ["type", "status", "reason", "message", "lastTransitionTime"];

    /// From a Workload as written; None if it is not one the publisher
    /// writes (a field missing or not a string).
    fn of(workload: &Value) -> Option<Known> {
        let meta = &workload["metadata"];
        let conditions = match &workload["status"]["conditions"] {
            Value::Null => Vec::new(),
            Value::Array(items) => items
                .iter()
                .map(|c| {
                    let [t, s, r, m, l] = Self::FIELDS.map(|f| c[f].as_str().map(String::from));
                    Some([t?, s?, r?, m?, l?])
                })
                .collect::<Option<_>>()?,
            _ => return None,
        };
        Some(Known {
            uid: meta["uid"].as_str()?.to_string(),
            created: meta["creationTimestamp"].as_str()?.to_string(),
            conditions,
        })
    }

    /// The status the next write starts from: the conditions.
    fn status(&self) -> Value {
        if self.conditions.is_empty() {
            return json!({});
        }
        let conditions: Vec<Value> = self
            .conditions
            .iter()
            .map(|c| {
                Value::Object(
                    Self::FIELDS
                        .iter()
                        .zip(c)
                        .map(|(k, v)| ((*k).to_string(), Value::from(v.as_str())))
                        .collect(),
                )
            })
            .collect();
        json!({ "conditions": conditions })
    }
}

fn waiting_message(w: &Waiting, queue: &QueueRef) -> String {
    let cq = queue.cluster_queue.as_deref().unwrap_or_default();
    if cq.is_empty() {
        return w.message.clone();
    }
    if w.position_in_cluster_queue >= POSITIONS_SHOWN {
        return format!(
            "{} ({POSITIONS_SHOWN} or more waiting ahead of it in ClusterQueue {cq})",
            w.message
        );
    }
    format!(
        "{} (position {} in ClusterQueue {cq}, {} in LocalQueue {})",
        w.message,
        w.position_in_cluster_queue + 1,
        w.position_in_local_queue + 1,
        queue.local_queue
    )
}

/// One condition to set: type, status, reason, message.
type Cond = (&'static str, &'static str, String, String);

/// The conditions a TrainJob of a queue shows (on its Workload, and the
/// same on the TrainJob), given how it stands and how it was evicted.
fn conditions_for(job: &QueuedJob, eviction: Option<&Eviction>) -> Vec<Cond> {
    let mut out: Vec<Cond> = Vec::new();
    match &job.state {
        QueueState::Waiting(w) => out.push((
            conditions::QUOTA_RESERVED,
            "False",
            w.reason.to_string(),
            waiting_message(w, &job.queue),
        )),
        QueueState::Reserved {
            cluster_queue,
            spoke,
            ..
        } => {
            out.push((
                conditions::QUOTA_RESERVED,
                "True",
                "QuotaReserved".into(),
                format!("Quota reserved in ClusterQueue {cluster_queue}"),
            ));
            out.push(match spoke {
                Some(spoke) => (
                    conditions::ADMITTED,
                    "True",
                    "Admitted".into(),
                    format!("The workload is admitted, on spoke {spoke}"),
                ),
                None => (
                    conditions::ADMITTED,
                    "False",
                    "Pending".into(),
                    "Quota reserved; waiting for a spoke to admit it".into(),
                ),
            });
        }
        QueueState::Idle => {
            if job.want == Want::Suspend {
                out.push((
                    conditions::QUOTA_RESERVED,
                    "False",
                    "Inactive".into(),
                    "The TrainJob is suspended".into(),
                ));
            }
        }
    }
    if let Some(e) = eviction {
        let reserved = matches!(job.state, QueueState::Reserved { .. });
        let (status, reason, message) = if reserved {
            (
                "False",
                "QuotaReserved".to_string(),
                format!("Previously: {}", e.message),
            )
        } else {
            ("True", e.reason.to_string(), e.message.clone())
        };
        out.push((conditions::EVICTED, status, reason.clone(), message.clone()));
        if let Some((why, m)) = &e.preempted {
            let (reason, message) = if reserved {
                (reason, format!("Previously: {m}"))
            } else {
                ((*why).to_string(), m.clone())
            };
            out.push((conditions::PREEMPTED, status, reason, message));
        }
    }
    out
}

/// A Kueue quantity list (`{name, total, borrowed}`), milli-units as
/// quantities.
fn usage_value(usage: &[FlavorUsage]) -> Value {
    usage
        .iter()
        .map(|f| {
            let resources: Vec<Value> = f
                .resources
                .iter()
                .map(|r| {
                    json!({
                        "name": r.name,
                        "total": crate::spokes::quantity(r.total),
                        "borrowed": crate::spokes::quantity(r.borrowed),
                    })
                })
                .collect();
            json!({"name": f.name, "resources": resources})
        })
        .collect()
}

/// A ClusterQueue's `status` as Kueue writes it (conditions aside).
fn cluster_queue_status(s: &ClusterQueueStatus) -> Value {
    json!({
        "flavorsReservation": usage_value(&s.flavors_reservation),
        "flavorsUsage": usage_value(&s.flavors_usage),
        "pendingWorkloads": s.pending_workloads,
        "reservingWorkloads": s.reserving_workloads,
        "admittedWorkloads": s.admitted_workloads,
    })
}

/// The `Active` condition of a ClusterQueue, Kueue's reasons.
fn cluster_queue_active(s: &ClusterQueueStatus) -> Cond {
    match &s.inactive {
        None => (
            "Active",
            "True",
            "Ready".into(),
            "Can admit new workloads".into(),
        ),
        Some(why) if why.starts_with("stopped") => (
            "Active",
            "False",
            "Stopped".into(),
            format!("Can't admit new workloads: {why}"),
        ),
        Some(why) if why.starts_with("flavor") => (
            "Active",
            "False",
            "FlavorNotFound".into(),
            format!("Can't admit new workloads: {why}"),
        ),
        Some(why) => (
            "Active",
            "False",
            "Inactive".into(),
            format!("Can't admit new workloads: {why}"),
        ),
    }
}

/// Writes the `status` of a Kueue object: `fields` replaced, `conditions`
/// set (a transition time moves only with its status).
async fn write_status(store: Arc<dyn Store>, key: Key, fields: Value, conds: Vec<Cond>) {
    update_status(store.as_ref(), &key, |status| {
        let before = status.clone();
        if !status.is_object() {
            *status = json!({});
        }
        if let (Some(s), Some(f)) = (status.as_object_mut(), fields.as_object()) {
            for (k, v) in f {
                s.insert(k.clone(), v.clone());
            }
        }
        let now = format_time(Timestamp::now());
        for (type_, state, reason, message) in &conds {
            set_condition(status, type_, state, reason, message, &now);
        }
        *status != before
    })
    .await;
}

impl Dispatch {
    /// Reads the quota objects again: the dispatcher's configuration is
    /// replaced, and if a LocalQueue, priority class or namespace changed,
    /// the TrainJobs of queues are resolved again.
    pub(super) fn reload_queues(&self) {
        let (mut config, index) = load(self.store.as_ref());
        if !index.from_spokes.is_empty() {
            let spokes = self.spoke_capacity();
            *lock(&self.spokes_seen) = spokes_signature(&spokes);
            quota_from_spokes(&mut config, &index.from_spokes, &spokes);
        }
        let changed = {
            let mut current = self.queues.write().unwrap_or_else(|p| p.into_inner());
            let changed = *current != index;
            *current = index;
            changed
        };
        let actions = lock(&self.state).set_quota_config(config, self.now());
        self.execute(actions);
        if changed {
            let (objects, _) = self.store.list(TRAINJOBS, None);
            for o in objects {
                if o.value["metadata"]["labels"][LABEL_QUEUE_NAME].is_null() {
                    continue;
                }
                // This also runs as a leader starts, before or while dispatch
                // loads the TrainJobs: one it does not hold yet comes with
                // its stored placement, as the load gives it, so its run is
                // adopted and not queued (and stopped) as another's.
                let key = job_key(&o.key.namespace, &o.key.name);
                let placement = if lock(&self.state).knows(&key) {
                    None
                } else {
                    o.value["metadata"]["uid"]
                        .as_str()
                        .and_then(|uid| self.stored_placement(&o.key.namespace, &o.key.name, uid))
                };
                self.upsert(&o.value, placement);
            }
        }
    }

    /// The labels and allocatable of every spoke dispatch knows.
    fn spoke_capacity(&self) -> Vec<(Value, BTreeMap<String, i64>)> {
        lock(&self.state)
            .spoke_views()
            .into_values()
            .map(|v| (v.labels, v.allocatable))
            .collect()
    }

    /// Follows the quota objects until shutdown: every change (batched
    /// over a tenth of a second) reloads them.
    pub(super) async fn follow_queues(self: Arc<Self>) {
        use tokio::sync::broadcast::error::{RecvError, TryRecvError};
        loop {
            let mut watch = match self.store.watch(QUOTA_RESOURCES[0], None, None) {
                Ok(w) => w.also(&QUOTA_RESOURCES[1..]),
                Err(e) => {
                    tracing::warn!(error = %e, "dispatch: watching quota objects");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            self.reload_queues();
            loop {
                match watch.live.recv().await {
                    Ok(_) | Err(RecvError::Lagged(_)) => {}
                    Err(RecvError::Closed) => break,
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                loop {
                    match watch.live.try_recv() {
                        Ok(_) | Err(TryRecvError::Lagged(_)) => {}
                        Err(TryRecvError::Empty) => break,
                        Err(TryRecvError::Closed) => break,
                    }
                }
                self.reload_queues();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Publishes every [`PUBLISH_EVERY`] until the task is aborted.
    pub(super) async fn publish_queues(self: Arc<Self>) {
        let mut interval = tokio::time::interval(PUBLISH_EVERY);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            self.publish_once();
        }
    }

    /// Writes what changed since the last pass: queue status, Workloads,
    /// waiting TrainJobs' conditions.
    pub(super) fn publish_once(&self) {
        let derived = !self
            .queues
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .from_spokes
            .is_empty();
        if derived && spokes_signature(&self.spoke_capacity()) != *lock(&self.spokes_seen) {
            self.reload_queues();
        }
        let local_queues: Vec<(String, String, String)> = self
            .queues
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .local_queues()
            .map(|l| (l.namespace.clone(), l.name.clone(), l.cluster_queue.clone()))
            .collect();
        let evictions = lock(&self.evictions).clone();
        let mut published = lock(&self.published);
        self.list_workloads(&mut published);
        // What was published and is not a job of a queue any more.
        let mut gone: std::collections::HashSet<super::core::JobKey> =
            published.workloads.keys().cloned().collect();
        let (jobs, cqs, lqs) = {
            let state = lock(&self.state);
            let cqs: Vec<(String, ClusterQueueStatus)> = state.cluster_queue_statuses();
            let mut lq_statuses = state.local_queue_statuses();
            let lqs: Vec<_> = local_queues
                .into_iter()
                .map(|(ns, name, cq)| {
                    let status = lq_statuses
                        .remove(&(ns.clone(), name.clone()))
                        .unwrap_or_default();
                    let active = state.quotas().cluster_queue(&cq).is_some()
                        && state.quotas().inactive(&cq).is_none();
                    (ns, name, cq, status, active)
                })
                .collect();
            let jobs = if cqs.is_empty() && lqs.is_empty() && !state.has_queued_jobs() {
                Vec::new()
            } else {
                let workloads = &published.workloads;
                state.queued_jobs(POSITIONS_SHOWN, |key, uid, fingerprint| {
                    gone.remove(key);
                    let eviction = evictions.get(key).filter(|e| e.uid == uid);
                    workloads.get(key).map(|w| w.hash) == Some(hash_of(&(fingerprint, eviction)))
                })
            };
            (jobs, cqs, lqs)
        };
        // A queue deleted is forgotten, so one created again under its name
        // gets its status written.
        published
            .cluster_queues
            .retain(|name, _| cqs.iter().any(|(n, _)| n == name));
        published
            .local_queues
            .retain(|(ns, name), _| lqs.iter().any(|l| l.0 == *ns && l.1 == *name));
        for (name, s) in cqs {
            let fields = cluster_queue_status(&s);
            let active = cluster_queue_active(&s);
            let h = hash_of(&(fields.to_string(), &active));
            if published.cluster_queues.insert(name.clone(), h) != Some(h) {
                let key = Key::new(CLUSTER_QUEUES, None, &name);
                tokio::spawn(write_status(self.store.clone(), key, fields, vec![active]));
            }
        }
        for (ns, name, cq, s, active) in lqs {
            let fields = json!({
                "flavorsReservation": usage_value(&s.flavors_reservation),
                "flavorsUsage": usage_value(&s.flavor_usage),
                "pendingWorkloads": s.pending_workloads,
                "reservingWorkloads": s.reserving_workloads,
                "admittedWorkloads": s.admitted_workloads,
            });
            let cond: Cond = if active {
                (
                    "Active",
                    "True",
                    "Ready".into(),
                    "Can submit new workloads to localQueue".into(),
                )
            } else {
                (
                    "Active",
                    "False",
                    "ClusterQueueIsInactive".into(),
                    format!("Can't submit new workloads to clusterQueue {cq}"),
                )
            };
            let h = hash_of(&(fields.to_string(), &cond));
            if published.local_queues.insert((ns.clone(), name.clone()), h) != Some(h) {
                let key = Key::new(LOCAL_QUEUES, Some(&ns), &name);
                tokio::spawn(write_status(self.store.clone(), key, fields, vec![cond]));
            }
        }
        self.publish_workloads(&mut published, jobs, gone, &evictions);
    }

    /// Learns the Workloads in the store, once a run: those written before a
    /// restart (or by another leader) are rewritten if still wanted and
    /// removed if not.
    fn list_workloads(&self, published: &mut Published) {
        if published.listed {
            return;
        }
        published.listed = true;
        let (stored, _) = self.store.list(WORKLOADS, None);
        for w in stored {
            let owner = &w.value["metadata"]["ownerReferences"][0];
            if let Some(name) = owner["name"].as_str() {
                published.workloads.insert(
                    job_key(&w.key.namespace, name),
                    PublishedWorkload {
                        name: w.key.name.clone(),
                        hash: 0,
                        known: None,
                    },
                );
            }
        }
    }

    /// Writes the Workloads of `jobs` (those that changed, with their
    /// fingerprints) and removes those of jobs `gone`.
    fn publish_workloads(
        &self,
        published: &mut Published,
        jobs: Vec<(QueuedJob, u64)>,
        gone: std::collections::HashSet<super::core::JobKey>,
        evictions: &HashMap<super::core::JobKey, Eviction>,
    ) {
        for (job, fingerprint) in jobs {
            let eviction = evictions.get(&job.key).filter(|e| e.uid == job.uid);
            let known = published
                .workloads
                .get_mut(&job.key)
                .and_then(|w| w.known.take());
            let Some((name, known)) = self.write_workload(&job, eviction, known) else {
                continue;
            };
            let hash = hash_of(&(fingerprint, eviction));
            published
                .workloads
                .insert(job.key.clone(), PublishedWorkload { name, hash, known });
            if eviction.is_some() && matches!(job.state, QueueState::Reserved { .. }) {
                lock(&self.evictions).remove(&job.key);
            }
        }
        for key in gone {
            lock(&self.evictions).remove(&key);
            if let Some(PublishedWorkload { name, .. }) = published.workloads.remove(&key) {
                self.write(vec![Op::Remove {
                    key: Key::new(WORKLOADS, Some(&key.namespace), &name),
                }]);
            }
        }
    }

    /// Writes the Workload of `job`, and mirrors its conditions on the
    /// TrainJob once it has waited or been evicted, with an Event when it
    /// starts to wait or gets its quota (see [`Self::mirror_conditions`]).
    /// `known`: what this publisher last wrote of it, else it is read from
    /// the store. The Workload's name and what its next write keeps (None
    /// once the TrainJob finished: it is not written again but on an
    /// eviction or a deletion); None if the TrainJob is gone.
    fn write_workload(
        &self,
        job: &QueuedJob,
        eviction: Option<&Eviction>,
        known: Option<Box<Known>>,
    ) -> Option<(String, Option<Box<Known>>)> {
        let trainjob_key = Key::new(TRAINJOBS, Some(&job.key.namespace), &job.key.name);
        let trainjob = read_head(self.store.as_ref(), &trainjob_key)?;
        if trainjob["metadata"]["uid"].as_str() != Some(job.uid.as_str()) {
            return None;
        }
        let priority = Priority {
            class: job.queue.priority_class.clone(),
            value: job.priority,
        };
        let mut wl = workload::workload_for(
            &trainjob,
            &job.pod_sets,
            &priority,
            &WorkloadStatus::default(),
        );
        let name = wl["metadata"]["name"].as_str()?.to_string();
        let key = Key::new(WORKLOADS, Some(&job.key.namespace), &name);
        let now = format_time(Timestamp::now());
        let existing = match &known {
            Some(_) => None,
            None => self.store.get(&key),
        };
        let (uid, created, mut status) = match (&known, &existing) {
            (Some(k), _) => (k.uid.as_str().into(), k.created.as_str().into(), k.status()),
            (None, Some(o)) => (
                o.value["metadata"]["uid"].clone(),
                o.value["metadata"]["creationTimestamp"].clone(),
                o.value["status"].clone(),
            ),
            (None, None) => (
                workload::workload_uid(&job.uid).into(),
                now.clone().into(),
                json!({}),
            ),
        };
        wl["metadata"]["uid"] = uid;
        wl["metadata"]["creationTimestamp"] = created;
        let conds = conditions_for(job, eviction);
        let mut all = conds.clone();
        if job.want == Want::Finished {
            let st = &trainjob["status"];
            let failed = crate::controller::lifecycle::is_true(
                st,
                trainhub_api::constants::CONDITION_FAILED,
            );
            let (reason, message) = if failed {
                ("Failed", "The TrainJob failed")
            } else {
                ("Succeeded", "The TrainJob completed")
            };
            all.push((conditions::FINISHED, "True", reason.into(), message.into()));
        }
        for (type_, state, reason, message) in &all {
            set_condition(&mut status, type_, state, reason, message, &now);
        }
        match &job.state {
            QueueState::Reserved {
                cluster_queue,
                assignment,
                spoke,
            } => {
                let assignments: Vec<Value> = job
                    .pod_sets
                    .iter()
                    .map(|p| {
                        let flavors: BTreeMap<&String, &String> = p
                            .requests_milli
                            .keys()
                            .filter_map(|r| assignment.flavors.get(r).map(|f| (r, f)))
                            .collect();
                        let usage: serde_json::Map<String, Value> = p
                            .requests_milli
                            .iter()
                            .map(|(r, m)| {
                                let total = m.saturating_mul(i64::from(p.count));
                                (r.clone(), crate::spokes::quantity(total).into())
                            })
                            .collect();
                        json!({"name": p.name, "flavors": flavors, "resourceUsage": usage, "count": p.count})
                    })
                    .collect();
                status["admission"] =
                    json!({"clusterQueue": cluster_queue, "podSetAssignments": assignments});
                match spoke {
                    Some(spoke) => status["clusterName"] = spoke.as_str().into(),
                    None => drop(status.as_object_mut().map(|s| s.remove("clusterName"))),
                }
            }
            _ => {
                if let Some(s) = status.as_object_mut() {
                    s.remove("admission");
                    s.remove("clusterName");
                }
            }
        }
        wl["status"] = status;
        let known = (job.want != Want::Finished)
            .then(|| Known::of(&wl).map(Box::new))
            .flatten();
        self.write(vec![Op::Put { key, value: wl }]);
        self.mirror_conditions(job, &trainjob, &conds);
        Some((name, known))
    }

    /// Sets `conds` on the TrainJob, and records an Event when its
    /// `QuotaReserved` condition changes reason.
    fn mirror_conditions(&self, job: &QueuedJob, trainjob: &Value, conds: &[Cond]) {
        if conds.is_empty() {
            return;
        }
        let before = crate::controller::lifecycle::condition(
            &trainjob["status"],
            conditions::QUOTA_RESERVED,
        )
        .and_then(|c| c["reason"].as_str().map(String::from));
        // Admitted without ever waiting or being evicted: its Workload says
        // so, and the TrainJob is not written again for it (a write of a
        // TrainJob is the costliest a hub makes: it goes to every watcher).
        let quiet = before.is_none()
            && conds.iter().all(|c| {
                (c.0 == conditions::QUOTA_RESERVED && c.1 == "True") || c.0 == conditions::ADMITTED
            });
        if quiet {
            return;
        }
        if let Some((_, _, reason, message)) =
            conds.iter().find(|c| c.0 == conditions::QUOTA_RESERVED)
            && before.as_deref() != Some(reason.as_str())
            && reason != "Inactive"
        {
            let event = trainjob_event(&job.key, Some(&job.uid), "Normal", reason, message);
            self.record_events(&job.key, vec![event]);
        }
        let mapped: Vec<Value> = conds
            .iter()
            .map(|(t, s, r, m)| json!({"type": t, "status": s, "reason": r, "message": m}))
            .collect();
        let key = Key::new(TRAINJOBS, Some(&job.key.namespace), &job.key.name);
        let _ = self.writer.send(Write {
            merge: Some((key, json!({ "conditions": mapped }))),
            ..Write::default()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::core::JobKey;

    fn job(state: QueueState, want: Want) -> QueuedJob {
        QueuedJob {
            key: JobKey {
                namespace: "team-a".into(),
                name: "mnist".into(),
            },
            uid: "u1".into(),
            priority: 0,
            want,
            queue: QueueRef {
                local_queue: "user-queue".into(),
                cluster_queue: Some("cluster-queue".into()),
                namespace_labels: json!({}),
                tolerations: Vec::new(),
                priority_class: None,
                hold: None,
                drain: false,
            },
            pod_sets: Vec::new().into(),
            state,
        }
    }

    fn waiting(position: usize) -> QueueState {
        QueueState::Waiting(Waiting {
            reason: quota::reason::PENDING,
            message: "couldn't assign flavors".into(),
            position_in_cluster_queue: position,
            position_in_local_queue: position,
        })
    }

    #[test]
    fn a_waiting_trainjob_says_why_and_where_it_is_in_its_queues() {
        let c = conditions_for(&job(waiting(2), Want::Run), None);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].0, "QuotaReserved");
        assert_eq!(c[0].1, "False");
        assert_eq!(c[0].2, "Pending");
        assert_eq!(
            c[0].3,
            "couldn't assign flavors (position 3 in ClusterQueue cluster-queue, 3 in LocalQueue user-queue)"
        );
        // Far back: the position is capped, so the message stays put while
        // the head of the queue moves.
        let far = conditions_for(&job(waiting(500), Want::Run), None);
        assert!(
            far[0].3.contains("100 or more waiting ahead"),
            "{}",
            far[0].3
        );
    }

    /// The publisher reads a TrainJob's identity, labels and status from
    /// its stored JSON, and what the Workload and the mirrored conditions
    /// are made from is what the whole TrainJob would give.
    #[tokio::test]
    async fn the_publisher_reads_of_a_trainjob_what_a_workload_is_made_from() {
        use trainhub_apiserver::store::RedbStore;
        let dir = tempfile::tempdir().expect("tempdir");
        let store = RedbStore::open(&dir.path().join("s.redb"), 100).expect("store");
        let key = Key::new(TRAINJOBS, Some("team-a"), "mnist");
        let trainjob = json!({
            "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {
                "name": "mnist", "namespace": "team-a", "uid": "u1",
                "labels": {LABEL_QUEUE_NAME: "user-queue", "kueue.x-k8s.io/max-exec-time-seconds": "60"},
                "annotations": {"note": "x"},
                "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
            },
            "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"numNodes": 2}},
            "status": {"conditions": [{"type": "Complete", "status": "True"}]},
        });
        store
            .commit(vec![Op::Create {
                key: key.clone(),
                value: trainjob.clone(),
            }])
            .await
            .expect("stored");
        let head = read_head(&store, &key).expect("read");
        assert!(head.get("spec").is_none() && head["metadata"].get("managedFields").is_none());
        assert_eq!(head["status"], trainjob["status"]);
        let (demand, priority) = (Vec::new(), Priority::default());
        let status = WorkloadStatus::default();
        assert_eq!(
            workload::workload_for(&head, &demand, &priority, &status),
            workload::workload_for(&trainjob, &demand, &priority, &status)
        );
        assert!(read_head(&store, &Key::new(TRAINJOBS, Some("team-a"), "gone")).is_none());
    }

    /// What the publisher keeps of a Workload it wrote gives back the
    /// status its next write starts from, conditions as they were; a
    /// Workload it could not have written (a condition field missing) is
    /// read from the store instead.
    #[test]
    fn a_written_workloads_conditions_are_kept_for_its_next_write() {
        let mut status = json!({});
        set_condition(
            &mut status,
            conditions::QUOTA_RESERVED,
            "True",
            "QuotaReserved",
            "Quota reserved in ClusterQueue cq",
            "2026-11-27T19:00:00Z",
        );
        set_condition(
            &mut status,
            conditions::ADMITTED,
            "False",
            "Pending",
            "waiting for a spoke",
            "2026-11-27T19:00:01Z",
        );
        let wl = json!({
            "metadata": {"uid": "wl-uid", "creationTimestamp": "2026-11-27T18:59:59Z"},
            "status": {
                "conditions": status["conditions"].clone(),
                "admission": {"clusterQueue": "cq"},
            },
        });
        let known = Known::of(&wl).expect("kept");
        assert_eq!(
            (known.uid.as_str(), known.created.as_str()),
            ("wl-uid", "2026-11-27T18:59:59Z")
        );
        assert_eq!(
            known.status(),
            json!({"conditions": status["conditions"].clone()})
        );
        // The next write moves a transition time only where the status moved.
        let mut next = known.status();
        set_condition(
            &mut next,
            conditions::ADMITTED,
            "True",
            "Admitted",
            "on spoke s1",
            "2026-11-27T19:00:02Z",
        );
        set_condition(
            &mut next,
            conditions::QUOTA_RESERVED,
            "True",
            "QuotaReserved",
            "Quota reserved in ClusterQueue cq",
            "2026-11-27T19:00:02Z",
        );
        assert_eq!(
            next["conditions"][0]["lastTransitionTime"],
            "2026-11-27T19:00:00Z"
        );
        assert_eq!(
            next["conditions"][1]["lastTransitionTime"],
            "2026-11-27T19:00:02Z"
        );

        let none = json!({"metadata": {"uid": "u", "creationTimestamp": "t"}});
        assert_eq!(Known::of(&none).map(|k| k.status()), Some(json!({})));
        let mut odd = wl.clone();
        odd["status"]["conditions"][1]
            .as_object_mut()
            .unwrap()
            .remove("message");
        assert_eq!(Known::of(&odd), None);
        let mut nameless = wl;
        nameless["metadata"].as_object_mut().unwrap().remove("uid");
        assert_eq!(Known::of(&nameless), None);
    }

    #[test]
    fn an_evicted_trainjob_shows_why_until_it_gets_quota_again() {
        let eviction = Eviction {
            uid: "u1".into(),
            reason: quota::reason::PREEMPTED,
            message: "Preempted to make room for TrainJob team-a/urgent".into(),
            preempted: Some((quota::reason::IN_CLUSTER_QUEUE, "by team-a/urgent".into())),
        };
        let c = conditions_for(&job(waiting(0), Want::Run), Some(&eviction));
        let evicted = c.iter().find(|c| c.0 == "Evicted").unwrap();
        assert_eq!((evicted.1, evicted.2.as_str()), ("True", "Preempted"));
        let preempted = c.iter().find(|c| c.0 == "Preempted").unwrap();
        assert_eq!(
            (preempted.1, preempted.2.as_str()),
            ("True", "InClusterQueue")
        );
        let reserved = QueueState::Reserved {
            cluster_queue: "cluster-queue".into(),
            assignment: quota::Assignment::default(),
            spoke: Some("spoke-a".into()),
        };
        let c = conditions_for(&job(reserved, Want::Run), Some(&eviction));
        let evicted = c.iter().find(|c| c.0 == "Evicted").unwrap();
        assert_eq!((evicted.1, evicted.2.as_str()), ("False", "QuotaReserved"));
        assert!(evicted.3.starts_with("Previously: Preempted"));
        let admitted = c.iter().find(|c| c.0 == "Admitted").unwrap();
        assert_eq!(admitted.1, "True");
    }

    #[test]
    fn queues_resolve_from_labels_local_queues_and_priority_classes() {
        let mut index = Index::default();
        index.local_queues.insert(
            ("team-a".into(), "user-queue".into()),
            LocalQueue {
                namespace: "team-a".into(),
                name: "user-queue".into(),
                cluster_queue: "cluster-queue".into(),
                stop_policy: StopPolicy::None,
            },
        );
        index.priority_classes.insert("high".into(), 1000);
        let tj = |labels: Value| {
            json!({"metadata": {"namespace": "team-a", "name": "j", "labels": labels},
                   "spec": {"podTemplateOverrides": [{"targetJobs": [{"name": "node"}],
                     "spec": {"tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]}}]}})
        };
        assert!(index.resolve(&tj(json!({}))).is_none());
        let (q, p) = index
            .resolve(&tj(json!({"kueue.x-k8s.io/queue-name": "user-queue",
                                 "kueue.x-k8s.io/priority-class": "high"})))
            .unwrap();
        assert_eq!(p, 1000);
        assert_eq!(q.cluster_queue.as_deref(), Some("cluster-queue"));
        assert_eq!(q.priority_class.as_deref(), Some("high"));
        assert_eq!(q.hold, None);
        assert_eq!(q.tolerations.len(), 1);
        assert_eq!(q.namespace_labels["kubernetes.io/metadata.name"], "team-a");
        // A missing priority class holds it, as Kueue makes no Workload.
        let (q, p) = index
            .resolve(&tj(json!({"kueue.x-k8s.io/queue-name": "user-queue",
                                 "kueue.x-k8s.io/priority-class": "nope"})))
            .unwrap();
        assert_eq!(p, 0);
        assert!(q.hold.unwrap().contains("\"nope\""));
        // An unknown LocalQueue: no ClusterQueue (inadmissible in the core).
        let (q, _) = index
            .resolve(&tj(json!({"kueue.x-k8s.io/queue-name": "other"})))
            .unwrap();
        assert_eq!(q.cluster_queue, None);
        // A stopped LocalQueue holds its TrainJobs.
        index
            .local_queues
            .get_mut(&("team-a".into(), "user-queue".into()))
            .unwrap()
            .stop_policy = StopPolicy::Hold;
        let (q, _) = index
            .resolve(&tj(json!({"kueue.x-k8s.io/queue-name": "user-queue"})))
            .unwrap();
        assert!(q.hold.unwrap().contains("LocalQueue user-queue is stopped"));
    }

    #[test]
    fn a_queue_takes_its_quota_from_the_spokes_of_each_flavor() {
        use crate::dispatch::quota::{ClusterQueue, Flavor, FlavorQuotas, Quota, ResourceGroup};
        let flavor = |name: &str, pool: &str| Flavor {
            name: name.into(),
            node_labels: [("pool".to_string(), pool.to_string())].into(),
            ..Flavor::default()
        };
        let quotas = |flavor: &str| FlavorQuotas {
            flavor: flavor.into(),
            quotas: [("cpu".to_string(), Quota::default())].into(),
        };
        let cq = |name: &str| ClusterQueue {
            name: name.into(),
            resource_groups: vec![ResourceGroup {
                covered: vec!["cpu".into()],
                flavors: vec![quotas("x"), quotas("y")],
            }],
            ..ClusterQueue::default()
        };
        let mut config = QuotaConfig {
            flavors: [
                ("x".into(), flavor("x", "x")),
                ("y".into(), flavor("y", "y")),
            ]
            .into(),
            cluster_queues: [
                ("derived".into(), cq("derived")),
                ("fixed".into(), cq("fixed")),
            ]
            .into(),
            cohorts: BTreeMap::new(),
        };
        let spoke =
            |pool: &str, cpu: i64| (json!({"pool": pool}), [("cpu".to_string(), cpu)].into());
        let spokes = vec![
            spoke("x", 4000),
            spoke("x", 8000),
            spoke("y", 2000),
            spoke("z", 64_000),
        ];
        quota_from_spokes(&mut config, &["derived".to_string()].into(), &spokes);
        let nominal = |cq: &str, f: usize| {
            config.cluster_queues[cq].resource_groups[0].flavors[f].quotas["cpu"].nominal
        };
        assert_eq!(nominal("derived", 0), 12_000);
        assert_eq!(nominal("derived", 1), 2000);
        assert_eq!(nominal("fixed", 0), 0);
        // A spoke more changes the signature that triggers a reload.
        let mut more = spokes.clone();
        more.push(spoke("y", 1000));
        assert_ne!(spokes_signature(&spokes), spokes_signature(&more));
    }
}
