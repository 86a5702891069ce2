//! What the backend knows of the cluster, kept current by three watchers
//! (the run JobSets, every Pod, every Node), and the runs it holds.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use super::capacity::{self, NodeInfo, PodUsage, Resources};
use super::objects::{self, LABEL_GENERATION, LABEL_JOBSET_NAME, LABEL_RUN_ID};
use super::report;
use crate::backend::{PodSetRequest, RunKey, RunReport};

/// `(namespace, name)`.
pub type ObjKey = (String, String);

/// Which watcher an event came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    JobSets,
    Pods,
    Nodes,
}

/// One pod as kept: what it holds, and for a JobSet's pod, the object.
#[derive(Debug, Clone)]
pub struct StoredPod {
    pub usage: PodUsage,
    /// `jobset.sigs.k8s.io/jobset-name`.
    pub jobset: Option<String>,
    /// The pod (without managedFields), for JobSet pods only.
    pub object: Option<Value>,
}

impl StoredPod {
    pub fn of(pod: &Value) -> StoredPod {
        let jobset = pod["metadata"]["labels"][LABEL_JOBSET_NAME]
            .as_str()
            .map(str::to_owned);
        StoredPod {
            usage: PodUsage::from_pod(pod),
            object: jobset.as_ref().map(|_| report::trimmed(pod)),
            jobset,
        }
    }
}

/// A run the backend holds.
#[derive(Debug, Clone)]
pub struct RunEntry {
    pub namespace: String,
    pub name: String,
    pub report: Option<RunReport>,
    pub finished: bool,
    /// The JobSet has been seen in the cluster (so its absence means it was
    /// deleted).
    pub seen: bool,
}

/// A watcher's store, replaced whole after a relist.
#[derive(Debug)]
pub struct Store<T> {
    pub items: BTreeMap<ObjKey, T>,
    /// Items of a relist in progress.
    relist: Option<BTreeMap<ObjKey, T>>,
    /// Listed at least once.
    pub synced: bool,
}

impl<T> Default for Store<T> {
    fn default() -> Self {
        Store {
            items: BTreeMap::new(),
            relist: None,
            synced: false,
        }
    }
}

/// A watch event, as the stores take it.
#[derive(Debug, Clone)]
pub enum Change {
    Applied(Value),
    Deleted(Value),
    RelistStarted,
    Relisted(Value),
    RelistDone,
}

impl<T> Store<T> {
    /// Takes in one event; true when `items` changed.
    fn take(&mut self, change: Change, convert: impl Fn(&Value) -> T) -> bool {
        let key = |v: &Value| -> ObjKey {
            (
                v["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                v["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        };
        match change {
            Change::Applied(v) => {
                self.items.insert(key(&v), convert(&v));
                true
            }
            Change::Deleted(v) => self.items.remove(&key(&v)).is_some(),
            Change::RelistStarted => {
                self.relist = Some(BTreeMap::new());
                false
            }
            Change::Relisted(v) => {
                self.relist
                    .get_or_insert_with(BTreeMap::new)
                    .insert(key(&v), convert(&v));
                false
            }
            Change::RelistDone => {
                self.items = self.relist.take().unwrap_or_default();
                self.synced = true;
                true
            }
        }
    }
}

/// Everything the backend knows, under one lock.
#[derive(Debug, Default)]
pub struct Inner {
    pub jobsets: Store<Value>,
    pub pods: Store<StoredPod>,
    pub nodes: Store<NodeInfo>,
    pub runs: BTreeMap<RunKey, RunEntry>,
    /// Gangs admitted (and runs started) that still hold room for their
    /// pods not yet bound to a node.
    pub reserved: BTreeMap<RunKey, Vec<PodSetRequest>>,
    /// Per run id, the highest generation stopped: its JobSets are not
    /// taken up again while they are being deleted.
    pub stopped: BTreeMap<String, i64>,
}

/// The run key a JobSet is labelled with.
pub fn key_of(jobset: &Value) -> Option<RunKey> {
    let labels = &jobset["metadata"]["labels"];
    Some(RunKey {
        run_id: labels[LABEL_RUN_ID].as_str()?.to_owned(),
        generation: labels[LABEL_GENERATION].as_str()?.parse().ok()?,
    })
}

impl Inner {
    /// Takes in a watch event; returns the runs whose report may have
    /// changed (every run after a relist).
    pub fn take(&mut self, source: Source, change: Change, kueue: bool) -> BTreeSet<RunKey> {
        let mut affected = BTreeSet::new();
        let relisted = matches!(change, Change::RelistDone);
        let object = match &change {
            Change::Applied(v) | Change::Deleted(v) => Some(v.clone()),
            _ => None,
        };
        let changed = match source {
            Source::JobSets => self.jobsets.take(change, report::trimmed),
            Source::Pods => self.pods.take(change, StoredPod::of),
            Source::Nodes => self.nodes.take(change, |v| {
                NodeInfo::from_node(v).map(|(_, n)| n).unwrap_or(NodeInfo {
                    schedulable: false,
                    allocatable: Resources::new(),
                    gpu_product: None,
                })
            }),
        };
        if !changed {
            return affected;
        }
        if relisted {
            if source == Source::JobSets {
                let all: Vec<Value> = self.jobsets.items.values().cloned().collect();
                for jobset in &all {
                    self.adopt(jobset, kueue);
                }
            }
            affected.extend(self.runs.keys().cloned());
            return affected;
        }
        let Some(object) = object else {
            return affected;
        };
        let namespace = object["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let jobset_name = match source {
            Source::JobSets => {
                self.adopt(&object, kueue);
                object["metadata"]["name"].as_str().map(str::to_owned)
            }
            Source::Pods => object["metadata"]["labels"][LABEL_JOBSET_NAME]
                .as_str()
                .map(str::to_owned),
            Source::Nodes => None,
        };
        if let Some(name) = jobset_name {
            affected.extend(
                self.runs
                    .iter()
                    .filter(|(_, e)| e.namespace == namespace && e.name == name)
                    .map(|(k, _)| k.clone()),
            );
        }
        affected
    }

    /// Takes up a run whose JobSet the cluster has (after a restart of the
    /// spoke): not one being deleted or stopped, nor one already held.
    pub fn adopt(&mut self, jobset: &Value, kueue: bool) {
        let Some(key) = key_of(jobset) else { return };
        if !jobset["metadata"]["deletionTimestamp"].is_null()
            || self.runs.contains_key(&key)
            || self
                .stopped
                .get(&key.run_id)
                .is_some_and(|g| *g >= key.generation)
        {
            return;
        }
        let finished = report::finished(&jobset["status"]);
        if !finished && !kueue {
            self.reserved
                .entry(key.clone())
                .or_insert_with(|| objects::jobset_pod_sets(jobset));
        }
        tracing::info!(run = %key.run_id, generation = key.generation, "found a run's JobSet in the cluster");
        self.runs.insert(
            key,
            RunEntry {
                namespace: jobset["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                name: jobset["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                report: None,
                finished,
                seen: true,
            },
        );
    }

    /// The run's pods as they are now.
    fn run_pods(&self, jobset: &Value, namespace: &str, name: &str) -> Vec<Value> {
        let start = (namespace.to_owned(), String::new());
        self.pods
            .items
            .range(start..)
            .take_while(|((ns, _), _)| ns == namespace)
            .filter(|(_, p)| p.jobset.as_deref() == Some(name))
            .filter_map(|(_, p)| p.object.clone())
            .filter(|p| report::pod_of(jobset, p))
            .collect()
    }

    /// The report of a run if it changed since the last one sent (which it
    /// then becomes); None while the watchers have not listed, or when
    /// nothing changed. `kueue`: a suspended JobSet not yet reported is
    /// waiting for Kueue and is not reported.
    pub fn refresh(&mut self, key: &RunKey, kueue: bool, now: &str) -> Option<RunReport> {
        if !(self.jobsets.synced && self.pods.synced) {
            return None;
        }
        let entry = self.runs.get(key)?;
        let (namespace, name) = (entry.namespace.clone(), entry.name.clone());
        let jobset = self
            .jobsets
            .items
            .get(&(namespace.clone(), name.clone()))
            .filter(|js| key_of(js).as_ref() == Some(key))
            .cloned();
        let next = match jobset {
            Some(jobset) => {
                if kueue && entry.report.is_none() && report::suspended(&jobset) {
                    return None;
                }
                let pods = self.run_pods(&jobset, &namespace, &name);
                report::build(key, &jobset, pods, entry.report.as_ref(), now)
            }
            // Deleted by someone else while it ran: it ends Failed.
            None if entry.seen && !entry.finished => RunReport {
                key: key.clone(),
                jobset_status: deleted_status(entry.report.as_ref(), &namespace, &name, now),
                pods: Vec::new(),
                finished: true,
                events: Vec::new(),
            },
            None => return None,
        };
        let entry = self.runs.get_mut(key)?;
        entry.seen = true;
        if entry.report.as_ref().is_some_and(|r| r.same_state(&next)) {
            return None;
        }
        entry.finished = next.finished;
        entry.report = Some(next.clone());
        if next.finished {
            self.reserved.remove(key);
        }
        Some(next)
    }

    /// Free capacity per schedulable node, less the room reserved for the
    /// pods of admitted gangs not yet bound.
    pub fn free(&self) -> BTreeMap<String, Resources> {
        let mut free = capacity::free_by_node(
            &self.nodes.items_by_name(),
            self.pods.items.values().map(|p| &p.usage),
        );
        for (key, sets) in &self.reserved {
            let placed = self
                .runs
                .get(key)
                .and_then(|e| e.report.as_ref())
                .map(|r| report::placed_per_set(&r.pods))
                .unwrap_or_default();
            // A reservation that no longer fits (a node went away) takes
            // what room there is.
            let _ = capacity::first_fit(&mut free, &capacity::pods_of(sets, &placed));
        }
        free
    }
}

impl Store<NodeInfo> {
    /// Nodes by name (nodes have no namespace).
    pub fn items_by_name(&self) -> BTreeMap<String, NodeInfo> {
        self.items
            .iter()
            .map(|((_, name), n)| (name.clone(), n.clone()))
            .collect()
    }
}

/// The status of a JobSet that was deleted in the cluster while its run
/// was going: the last one seen, with a Failed condition.
fn deleted_status(last: Option<&RunReport>, namespace: &str, name: &str, now: &str) -> Value {
    let mut status = last
        .map(|r| r.jobset_status.clone())
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}));
    let mut conditions = status["conditions"].as_array().cloned().unwrap_or_default();
    conditions.push(json!({
        "type": "Failed",
        "status": "True",
        "reason": "JobSetDeleted",
        "message": format!("the JobSet {namespace}/{name} was deleted in the spoke's cluster while it ran"),
        "lastTransitionTime": now,
    }));
    status["conditions"] = Value::Array(conditions);
    status["terminalState"] = "Failed".into();
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jobset(generation: i64, status: Value) -> Value {
        json!({
            "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "j", "namespace": "ml", "uid": "js1",
                "labels": {LABEL_RUN_ID: "r", LABEL_GENERATION: generation.to_string()}},
            "spec": {"replicatedJobs": [{"name": "node", "replicas": 1, "template": {"spec": {"parallelism": 2,
                "template": {"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}}}}}]},
            "status": status,
        })
    }

    fn pod(name: &str, node: Option<&str>) -> Value {
        json!({
            "metadata": {"name": name, "namespace": "ml", "labels": {
                LABEL_JOBSET_NAME: "j", objects::LABEL_REPLICATED_JOB: "node"}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
            "status": {"phase": if node.is_some() { "Running" } else { "Pending" }},
        })
    }

    fn node(name: &str) -> Value {
        json!({"metadata": {"name": name}, "spec": {}, "status": {"allocatable": {"cpu": "4", "pods": "10"}}})
    }

    fn key(generation: i64) -> RunKey {
        RunKey {
            run_id: "r".into(),
            generation,
        }
    }

    fn listed(inner: &mut Inner, source: Source, items: Vec<Value>) -> BTreeSet<RunKey> {
        inner.take(source, Change::RelistStarted, false);
        for item in items {
            inner.take(source, Change::Relisted(item), false);
        }
        inner.take(source, Change::RelistDone, false)
    }

    #[test]
    fn a_relisted_jobset_is_taken_up_and_reported_once_pods_are_listed() {
        let mut inner = Inner::default();
        let affected = listed(
            &mut inner,
            Source::JobSets,
            vec![jobset(3, json!({"restarts": 0}))],
        );
        assert_eq!(affected, BTreeSet::from([key(3)]));
        assert!(inner.reserved.contains_key(&key(3)));
        // Pods not listed yet: no report (it would show no pods).
        assert_eq!(inner.refresh(&key(3), false, "t"), None);
        let mut other = pod("k-node-0-0", None);
        other["metadata"]["labels"][LABEL_JOBSET_NAME] = "k".into();
        let mut elsewhere = pod("j-node-0-0", None);
        elsewhere["metadata"]["namespace"] = "other".into();
        listed(
            &mut inner,
            Source::Pods,
            vec![pod("j-node-0-0", Some("n1")), other, elsewhere],
        );
        let r = inner.refresh(&key(3), false, "t").unwrap();
        assert_eq!(r.jobset_status, json!({"restarts": 0}));
        assert_eq!(r.pods.len(), 1);
        // Nothing changed: nothing to send.
        assert_eq!(inner.refresh(&key(3), false, "t"), None);
        // A pod event of the run changes it.
        let affected = inner.take(
            Source::Pods,
            Change::Applied(pod("j-node-0-1", None)),
            false,
        );
        assert_eq!(affected, BTreeSet::from([key(3)]));
        assert_eq!(inner.refresh(&key(3), false, "t").unwrap().pods.len(), 2);
    }

    #[test]
    fn a_finished_run_releases_its_reservation() {
        let mut inner = Inner::default();
        listed(&mut inner, Source::Pods, vec![]);
        listed(&mut inner, Source::JobSets, vec![jobset(1, json!({}))]);
        assert!(inner.reserved.contains_key(&key(1)));
        inner.take(
            Source::JobSets,
            Change::Applied(jobset(
                1,
                json!({"conditions": [{"type": "Completed", "status": "True"}]}),
            )),
            false,
        );
        let r = inner.refresh(&key(1), false, "t").unwrap();
        assert!(r.finished);
        assert!(!inner.reserved.contains_key(&key(1)));
        assert!(inner.runs[&key(1)].finished);
    }

    #[test]
    fn a_jobset_deleted_behind_the_runs_back_fails_it() {
        let mut inner = Inner::default();
        listed(&mut inner, Source::Pods, vec![]);
        listed(
            &mut inner,
            Source::JobSets,
            vec![jobset(1, json!({"restarts": 1}))],
        );
        inner.refresh(&key(1), false, "t").unwrap();
        inner.take(
            Source::JobSets,
            Change::Deleted(jobset(1, json!({}))),
            false,
        );
        let r = inner.refresh(&key(1), false, "t").unwrap();
        assert!(r.finished);
        assert_eq!(r.jobset_status["restarts"], 1);
        assert_eq!(r.jobset_status["conditions"][0]["reason"], "JobSetDeleted");
        assert_eq!(inner.refresh(&key(1), false, "t"), None);
    }

    #[test]
    fn stopped_or_deleting_jobsets_are_not_taken_up() {
        let mut inner = Inner::default();
        inner.stopped.insert("r".into(), 2);
        listed(&mut inner, Source::JobSets, vec![jobset(2, json!({}))]);
        assert!(inner.runs.is_empty());
        let mut deleting = jobset(3, json!({}));
        deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z".into();
        inner.take(Source::JobSets, Change::Applied(deleting), false);
        assert!(inner.runs.is_empty());
        inner.take(
            Source::JobSets,
            Change::Applied(jobset(3, json!({}))),
            false,
        );
        assert!(inner.runs.contains_key(&key(3)));
    }

    #[test]
    fn kueue_runs_are_reported_once_unsuspended_and_reserve_nothing() {
        let mut inner = Inner::default();
        inner.take(Source::Pods, Change::RelistDone, true);
        let mut suspended = jobset(1, json!({}));
        suspended["spec"]["suspend"] = true.into();
        inner.take(Source::JobSets, Change::RelistStarted, true);
        inner.take(Source::JobSets, Change::Relisted(suspended.clone()), true);
        inner.take(Source::JobSets, Change::RelistDone, true);
        assert!(inner.reserved.is_empty());
        assert_eq!(inner.refresh(&key(1), true, "t"), None);
        suspended["spec"]["suspend"] = false.into();
        inner.take(Source::JobSets, Change::Applied(suspended), true);
        assert!(inner.refresh(&key(1), true, "t").is_some());
    }

    #[test]
    fn reservations_take_room_only_for_pods_not_yet_bound() {
        let mut inner = Inner::default();
        listed(&mut inner, Source::Nodes, vec![node("n1")]);
        listed(&mut inner, Source::Pods, vec![]);
        listed(&mut inner, Source::JobSets, vec![jobset(1, json!({}))]);
        // Two pods of 1 cpu reserved, none bound.
        assert_eq!(inner.free()["n1"]["cpu"], 2000);
        inner.take(
            Source::Pods,
            Change::Applied(pod("j-node-0-0", Some("n1"))),
            false,
        );
        inner.refresh(&key(1), false, "t").unwrap();
        // One bound (counted as a pod on the node), one still reserved.
        assert_eq!(inner.free()["n1"]["cpu"], 2000);
        assert_eq!(inner.free()["n1"]["pods"], 8000);
    }
}
