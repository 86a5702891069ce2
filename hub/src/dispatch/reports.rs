//! What spokes report of their runs: reports taken only from the spoke a
//! run is placed on, its pods and events written only if they are the
//! run's (see [`authority`]), its JobSet status mapped to the TrainJob's by
//! the PostExecution plugins; and the Events the hub records on TrainJobs.

use std::collections::{BTreeSet, HashMap};

use jiff::Timestamp;
use serde_json::{Value, json};
use trainhub_api::constants::LABEL_JOBSET_NAME;
use trainhub_api::jobset::JobSetStatus;
use trainhub_apiserver::store::{Key, Op};
use trainhub_proto as pb;

use super::core::{JobKey, Verdict};
use super::intake::Step;
use super::writer::Write;
use super::{ANNOTATION_RUN, ANNOTATION_SPOKE, Dispatch, authority, hash_of, job_key, lock};
use crate::api::{EVENTS, PODS, TRAINJOBS};
use crate::controller::lifecycle::format_time;

/// Events remembered per TrainJob (to remove them with it); a spoke's
/// events past this are refused.
pub const MAX_EVENTS_PER_TRAINJOB: usize = 10_000;

impl Dispatch {
    /// A run report: taken if the run is placed on this spoke, else refused
    /// (and the run stopped: it must not run there). Of a taken report,
    /// only the pods and events of that run are written (see
    /// [`authority`]); the others are refused and logged with the spoke's
    /// name.
    pub(super) fn on_report(&self, spoke: &str, report: pb::RunReport) {
        let verdict = lock(&self.state).check_run(spoke, &report.run_id, report.generation);
        let key = match verdict {
            Verdict::Accept(key) => key,
            Verdict::Stale | Verdict::Foreign => {
                if verdict == Verdict::Foreign {
                    tracing::warn!(
                        spoke,
                        run = %report.run_id,
                        generation = report.generation,
                        "refused a report on a run not placed on this spoke"
                    );
                }
                self.send(
                    spoke,
                    pb::hub_message::Message::Stop(pb::Stop {
                        run_id: report.run_id,
                        generation: report.generation,
                        reason: "not placed on this spoke".into(),
                    }),
                );
                return;
            }
        };
        self.observe.reported(&report.run_id, spoke);
        self.show_pods(spoke, &key, &report);
        self.record_spoke_events(spoke, &key, &report);
        let status_hash = hash_of(&report.jobset_status_json);
        let changed =
            lock(&self.statuses).insert(report.run_id.clone(), status_hash) != Some(status_hash);
        if changed
            && let Err(message) = self.map_status(&key, &report.run_id, &report.jobset_status_json)
        {
            tracing::warn!(trainjob = %key, message, "mapping the run's status");
        }
    }

    /// Refuses an object a spoke reported: logged with the spoke's name.
    fn refuse(&self, spoke: &str, job: &JobKey, run_id: &str, what: &str, why: &str) {
        tracing::warn!(
            spoke,
            trainjob = %job,
            run = run_id,
            refused = why,
            "refused {what} a spoke reported: a spoke writes only the objects of the runs placed on it"
        );
    }

    /// Whether the object at `key` in the store, if any, is someone else's
    /// than run `run_id` (another run's, or the hub's own).
    fn owned_by_other(&self, key: &Key, run_id: &str) -> Option<String> {
        let existing = self.store.get(key)?;
        let run = existing.value["metadata"]["annotations"][ANNOTATION_RUN].as_str();
        match run.map(|r| r.rsplit_once('.').map_or(r, |(id, _)| id)) {
            Some(id) if id == run_id => None,
            Some(id) => Some(format!("{key} exists and belongs to run {id}")),
            None => Some(format!("{key} exists and was not written by a spoke")),
        }
    }

    /// Why `name` belongs to another TrainJob of the namespace than `job`:
    /// a longer TrainJob name that it matches by its pod sets.
    fn other_owner(&self, name: &str, job: &JobKey) -> Option<String> {
        let state = lock(&self.state);
        let ours = state.pod_set_names(job).unwrap_or_default();
        if authority::of_pod_sets(name, &job.name, &ours) {
            return None;
        }
        authority::longer_owners(name, &job.name).find_map(|other| {
            let other_key = job_key(&job.namespace, other);
            let sets = state.pod_set_names(&other_key)?;
            authority::of_pod_sets(name, other, &sets)
                .then(|| format!("{name:?} is a pod name of TrainJob {other_key}"))
        })
    }

    /// Writes the Events of a report into the TrainJob's namespace, each
    /// marked with the run (a spoke's events keep their names, so a resent
    /// one is rewritten, not duplicated).
    fn record_spoke_events(&self, spoke: &str, job: &JobKey, report: &pb::RunReport) {
        let run = format!("{}.{}", report.run_id, report.generation);
        let mut taken = Vec::new();
        for raw in &report.events_json {
            let Ok(mut event) = serde_json::from_str::<Value>(raw) else {
                self.refuse(spoke, job, &report.run_id, "an event", "not JSON");
                continue;
            };
            let name = match authority::check_event(&event, job) {
                Ok(name) => name,
                Err(why) => {
                    self.refuse(spoke, job, &report.run_id, "an event", &why);
                    continue;
                }
            };
            let involved = event["involvedObject"]["name"].as_str().unwrap_or_default();
            if let Some(why) = self.other_owner(involved, job) {
                self.refuse(spoke, job, &report.run_id, "an event", &why);
                continue;
            }
            let known = lock(&self.events)
                .get(job)
                .map(|names| (names.contains(&name), names.len()));
            if known.is_some_and(|(_, n)| n >= MAX_EVENTS_PER_TRAINJOB)
                && !known.is_some_and(|(k, _)| k)
            {
                let why = format!(
                    "the TrainJob has {MAX_EVENTS_PER_TRAINJOB} events, the most a TrainJob keeps"
                );
                self.refuse(spoke, job, &report.run_id, "an event", &why);
                break;
            }
            if !known.is_some_and(|(k, _)| k)
                && let Some(why) = self.owned_by_other(
                    &Key::new(EVENTS, Some(&job.namespace), &name),
                    &report.run_id,
                )
            {
                self.refuse(spoke, job, &report.run_id, "an event", &why);
                continue;
            }
            event["apiVersion"] = "v1".into();
            event["kind"] = "Event".into();
            if !event["metadata"]["annotations"].is_object() {
                event["metadata"]["annotations"] = json!({});
            }
            event["metadata"]["annotations"][ANNOTATION_SPOKE] = spoke.into();
            event["metadata"]["annotations"][ANNOTATION_RUN] = run.clone().into();
            taken.push(event);
        }
        self.record_events(job, taken);
    }

    /// Writes Events into the TrainJob's namespace.
    pub(super) fn record_events(&self, job: &JobKey, events: Vec<Value>) {
        let mut ops = Vec::new();
        let mut written = lock(&self.events);
        let names = written.entry(job.clone()).or_default();
        for mut event in events {
            let Some(name) = event["metadata"]["name"].as_str().map(String::from) else {
                continue;
            };
            event["metadata"]["namespace"] = job.namespace.clone().into();
            if event["involvedObject"].is_object() {
                event["involvedObject"]["namespace"] = job.namespace.clone().into();
            }
            if let Some(m) = event["metadata"].as_object_mut() {
                m.remove("resourceVersion");
            }
            names.insert(name.clone());
            ops.push(Op::Put {
                key: Key::new(EVENTS, Some(&job.namespace), &name),
                value: event,
            });
        }
        drop(written);
        if !ops.is_empty() {
            self.write(ops);
        }
    }

    /// Writes the pods a report shows, removes those it no longer shows.
    /// A pod that is not the run's (see [`authority`]), or whose name
    /// another run's pod holds, is refused.
    fn show_pods(&self, spoke: &str, key: &JobKey, report: &pb::RunReport) {
        let mut candidates = Vec::new();
        let mut present = BTreeSet::new();
        let shown_before: HashMap<String, u64> =
            lock(&self.pods).get(key).cloned().unwrap_or_default();
        for raw in &report.pods_json {
            let Ok(pod) = serde_json::from_str::<Value>(raw) else {
                self.refuse(spoke, key, &report.run_id, "a pod", "not JSON");
                continue;
            };
            let name = match authority::check_pod(&pod, key) {
                Ok(name) => name,
                Err(why) => {
                    self.refuse(spoke, key, &report.run_id, "a pod", &why);
                    continue;
                }
            };
            if let Some(why) = self.other_owner(&name, key) {
                self.refuse(spoke, key, &report.run_id, "a pod", &why);
                continue;
            }
            let hash = hash_of(&(spoke, report.generation, raw));
            if shown_before.get(&name) == Some(&hash) {
                present.insert(name);
                continue;
            }
            if !shown_before.contains_key(&name)
                && let Some(why) = self
                    .owned_by_other(&Key::new(PODS, Some(&key.namespace), &name), &report.run_id)
            {
                self.refuse(spoke, key, &report.run_id, "a pod", &why);
                continue;
            }
            present.insert(name.clone());
            candidates.push((name, hash, pod));
        }
        let mut ops = Vec::new();
        let mut pods = lock(&self.pods);
        let shown = pods.entry(key.clone()).or_default();
        for (name, hash, mut pod) in candidates {
            shown.insert(name.clone(), hash);
            pod["apiVersion"] = "v1".into();
            pod["kind"] = "Pod".into();
            let meta = &mut pod["metadata"];
            meta["namespace"] = key.namespace.clone().into();
            if !meta["annotations"].is_object() {
                meta["annotations"] = json!({});
            }
            meta["annotations"][ANNOTATION_SPOKE] = spoke.into();
            meta["annotations"][ANNOTATION_RUN] =
                format!("{}.{}", report.run_id, report.generation).into();
            if meta["labels"][LABEL_JOBSET_NAME].is_null() {
                if !meta["labels"].is_object() {
                    meta["labels"] = json!({});
                }
                meta["labels"][LABEL_JOBSET_NAME] = key.name.clone().into();
            }
            if let Some(m) = meta.as_object_mut() {
                m.remove("resourceVersion");
            }
            // The spoke is where the pod runs: `kubectl get pods -o wide`
            // shows it as the node.
            if pod["spec"].is_object() && pod["spec"]["nodeName"].is_null() {
                pod["spec"]["nodeName"] = spoke.into();
            }
            ops.push(Op::Put {
                key: Key::new(PODS, Some(&key.namespace), &name),
                value: pod,
            });
        }
        let gone: Vec<String> = shown
            .keys()
            .filter(|n| !present.contains(*n))
            .cloned()
            .collect();
        for name in gone {
            shown.remove(&name);
            ops.push(Op::Remove {
                key: Key::new(PODS, Some(&key.namespace), &name),
            });
        }
        drop(pods);
        if !ops.is_empty() {
            self.write(ops);
        }
    }

    /// PostExecution: the TrainJob's status from the JobSet status, merged
    /// by the writer in the order reports arrived. A deferred call is
    /// retried with backoff for as long as no newer status of the run came.
    fn map_status(
        &self,
        key: &JobKey,
        run_id: &str,
        jobset_status_json: &str,
    ) -> Result<(), String> {
        if jobset_status_json.is_empty() {
            return Ok(());
        }
        let observed: JobSetStatus = serde_json::from_str(jobset_status_json)
            .map_err(|e| format!("the JobSet status reported is not readable: {e}"))?;
        let store_key = Key::new(TRAINJOBS, Some(&key.namespace), &key.name);
        let Some(object) = self.store.get(&store_key) else {
            return Ok(());
        };
        let (job, _, pipeline) = self.pipeline_for(&object.value)?;
        let uid = object.value["metadata"]["uid"].as_str().unwrap_or_default();
        let span = self.observe.status(uid);
        let mapped = match span.in_scope(|| pipeline.status(&job, &observed)) {
            Ok(mapped) => {
                self.undefer(&key.namespace, &key.name, uid, Step::Status);
                mapped
            }
            Err(e) if e.is_transient() => {
                let hash = hash_of(&jobset_status_json);
                let (retry_key, retry_uid, run_id, json) = (
                    key.clone(),
                    uid.to_string(),
                    run_id.to_string(),
                    jobset_status_json.to_string(),
                );
                self.defer(
                    &key.namespace,
                    &key.name,
                    uid,
                    Step::Status,
                    &e.to_string(),
                    move |this| {
                        let latest = lock(&this.statuses).get(&run_id) == Some(&hash);
                        if !latest {
                            // A newer status of the run came and was mapped.
                            let (ns, name) = (&retry_key.namespace, &retry_key.name);
                            this.undefer(ns, name, &retry_uid, Step::Status);
                            return;
                        }
                        if let Err(message) = this.map_status(&retry_key, &run_id, &json) {
                            tracing::warn!(trainjob = %retry_key, message, "mapping the run's status");
                        }
                    },
                );
                return Ok(());
            }
            Err(e) => return Err(e.to_string()),
        };
        let Some(mapped) = mapped else {
            return Ok(());
        };
        self.observe.status_mapped(uid, &span, &mapped);
        let mut mapped = serde_json::to_value(&mapped).map_err(|e| e.to_string())?;
        // The plugin was given the TrainJob as it was typed (cached per
        // generation and metadata); conditions it returns as it was given
        // them are not its news, and would set back conditions others
        // (quota) wrote since.
        let given = serde_json::to_value(&job.status).unwrap_or_default();
        if let (Some(out), Some(given)) = (
            mapped["conditions"].as_array_mut(),
            given["conditions"].as_array(),
        ) {
            out.retain(|c| !given.contains(c));
        }
        let _ = self.writer.send(Write {
            merge: Some((store_key, mapped)),
            ..Write::default()
        });
        Ok(())
    }
}

/// An Event the hub records on a TrainJob.
pub(super) fn trainjob_event(
    job: &JobKey,
    uid: Option<&str>,
    kind: &str,
    reason: &str,
    message: &str,
) -> Value {
    let now = Timestamp::now();
    let mut involved = json!({
        "apiVersion": format!("{}/v1alpha1", trainhub_api::constants::TRAINER_GROUP),
        "kind": "TrainJob",
        "name": job.name,
        "namespace": job.namespace,
    });
    if let Some(uid) = uid {
        involved["uid"] = uid.into();
    }
    let time = format_time(now);
    json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": format!("{}.{:016x}", job.name, hash_of(&(reason, message, now.as_nanosecond()))),
        },
        "involvedObject": involved,
        "type": kind,
        "reason": reason,
        "message": message,
        "source": {"component": "trainhub"},
        "reportingComponent": "trainhub",
        "firstTimestamp": time,
        "lastTimestamp": time,
        "count": 1,
    })
}
