//! From a stored TrainJob to the core's job: its queue, priority, spoke
//! selector and demand (pod sets after the ML and pod-group policies),
//! and the plugin calls deferred while the plugin host is overloaded.

use std::hash::Hasher as _;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use serde_json::Value;
use trainhub_api::constants::CONDITION_FAILED;
use trainhub_api::trainer::TrainJob;
use trainhub_apiserver::selector::LabelSelector;
use trainhub_apiserver::store::Key;
use trainhub_builtin_plugins::quantity::Quantity;
use trainhub_plugin_sdk as sdk;

use super::core::{self, JobInfo, PodSetDemand, Want};
use super::reports::trainjob_event;
use super::writer::update_status;
use super::{
    ANNOTATION_PRIORITY, ANNOTATION_SPOKE_SELECTOR, CONDITION_PLUGINS_DEFERRED, Dispatch,
    REASON_BUILD_FAILED, REASON_PLUGIN_CALL_DEFERRED, hash_json, job_key, lock,
};
use crate::api::TRAINJOBS;
use crate::controller::lifecycle::{format_time, is_finished, is_true, set_condition};
use crate::plugins::Pipeline;

/// Backoff of a deferred plugin call: 1 s, doubling, at most 5 minutes.
const DEFER_FIRST: Duration = Duration::from_secs(1);
const DEFER_MAX: Duration = Duration::from_secs(300);

/// Why a pipeline step for a TrainJob failed; `transient` when a plugin
/// call could not run now (retried, see `Dispatch::defer`) rather than
/// failed.
#[derive(Debug)]
pub(super) struct StepError {
    pub(super) message: String,
    pub(super) transient: bool,
}

impl From<String> for StepError {
    fn from(message: String) -> Self {
        StepError {
            message,
            transient: false,
        }
    }
}

impl From<crate::plugins::PipelineError> for StepError {
    fn from(e: crate::plugins::PipelineError) -> Self {
        StepError {
            transient: e.is_transient(),
            message: e.to_string(),
        }
    }
}

/// The pipeline steps dispatch runs for a TrainJob, each deferred (and
/// retried) on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Step {
    /// The ML and pod-group policies (the TrainJob's demand).
    Enforce,
    /// The objects for the winning spoke.
    Build,
    /// PostExecution: the TrainJob status from the JobSet status.
    Status,
}

/// A TrainJob's plugin calls of one step deferred in a row (their backoff), and
/// whether a retry is already scheduled (one at a time: a deferral writes
/// the TrainJob's status, whose watch event must not schedule another).
#[derive(Debug, Default)]
pub(super) struct Deferral {
    attempts: u32,
    pending: bool,
}

/// What a TrainJob asks for, and the enforced runtime info it comes from.
struct Demand {
    pod_sets: Vec<PodSetDemand>,
    info: sdk::RuntimeInfo,
}

impl Dispatch {
    /// What dispatch needs of a stored TrainJob. A TrainJob whose pod sets
    /// cannot be computed is marked Failed.
    pub(super) fn job_info(&self, object: &Value) -> Option<JobInfo> {
        let meta = &object["metadata"];
        let namespace = meta["namespace"].as_str()?;
        let name = meta["name"].as_str()?;
        let uid = meta["uid"].as_str()?.to_string();
        let status = &object["status"];
        // A deferral's condition written after the call already succeeded
        // (their writes race) is removed when its own write comes back.
        if is_true(status, CONDITION_PLUGINS_DEFERRED)
            && !lock(&self.deferred).keys().any(|(u, _)| *u == uid)
        {
            self.clear_deferred_condition(namespace, name, &uid);
        }
        let managed_elsewhere = object["spec"]["managedBy"]
            .as_str()
            .is_some_and(|m| m != trainhub_api::constants::MANAGED_BY_TRAINJOB_CONTROLLER);
        let want = if !meta["deletionTimestamp"].is_null() {
            Want::Delete
        } else if is_finished(status) {
            Want::Finished
        } else if object["spec"]["suspend"] == true || managed_elsewhere {
            Want::Suspend
        } else {
            Want::Run
        };
        let annotations = &meta["annotations"];
        let queue_ref = self
            .queues
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .resolve(object);
        let priority = match &queue_ref {
            Some((_, priority)) => *priority,
            None => annotations[ANNOTATION_PRIORITY]
                .as_str()
                .and_then(|p| p.trim().parse().ok())
                .unwrap_or(0),
        };
        let selector = match annotations[ANNOTATION_SPOKE_SELECTOR].as_str() {
            Some(s) => match LabelSelector::parse(s) {
                Ok(sel) => Some(sel),
                Err(e) => {
                    self.fail(
                        namespace,
                        name,
                        "InvalidSpokeSelector",
                        &format!("annotation {ANNOTATION_SPOKE_SELECTOR}: {}", e.message),
                    );
                    return None;
                }
            },
            None => None,
        };
        let created = meta["creationTimestamp"]
            .as_str()
            .and_then(|t| t.parse::<Timestamp>().ok())
            .map_or(0, |t| t.as_millisecond());
        let queue = if want == Want::Run {
            self.observe.queued(&uid, object, name)
        } else {
            self.observe.forget(&uid);
            tracing::Span::none()
        };
        let _queued = queue.enter();
        let pod_sets = if want == Want::Run {
            let generation = meta["generation"].as_i64().unwrap_or(0);
            let cache_key = (uid.clone(), generation);
            match self.demand.get(&cache_key) {
                Some(pod_sets) => {
                    // Computed meanwhile (say, by a call that started after
                    // one that was deferred): that step is done.
                    self.undefer(namespace, name, &uid, Step::Enforce);
                    pod_sets
                }
                None => match self.compute_demand(object) {
                    Ok(d) => {
                        self.undefer(namespace, name, &uid, Step::Enforce);
                        let pod_sets: Arc<[PodSetDemand]> = d.pod_sets.into();
                        self.demand.insert(cache_key.clone(), pod_sets.clone());
                        self.enforced.insert(cache_key, Arc::new(d.info));
                        pod_sets
                    }
                    Err(e) if e.transient => {
                        let key = Key::new(TRAINJOBS, Some(namespace), name);
                        let (ns, n) = (namespace.to_string(), name.to_string());
                        let retry_uid = uid.clone();
                        self.defer(
                            namespace,
                            name,
                            &uid,
                            Step::Enforce,
                            &e.message,
                            move |this| {
                                // Placements are committed before they are acted
                                // on, so the stored one is the TrainJob's own.
                                let Some(object) = this.store.get(&key) else {
                                    return;
                                };
                                if object.value["metadata"]["uid"].as_str() != Some(&retry_uid) {
                                    return;
                                }
                                let placement = this.stored_placement(&ns, &n, &retry_uid);
                                this.upsert(&object.value, placement);
                            },
                        );
                        // Placed on a spoke (say, after a hub restart): it
                        // stays known as placed meanwhile, so its run is not
                        // stopped as a stranger's; the retry fills its
                        // demand in.
                        if self
                            .stored_placement(namespace, name, &uid)
                            .is_some_and(|p| p.spoke.is_some())
                        {
                            Arc::from([])
                        } else {
                            return None;
                        }
                    }
                    Err(e) => {
                        self.fail(namespace, name, REASON_BUILD_FAILED, &e.message);
                        return None;
                    }
                },
            }
        } else {
            Arc::from([])
        };
        Some(JobInfo {
            key: job_key(namespace, name),
            uid,
            priority,
            created,
            selector,
            pod_sets,
            want,
            queue: queue_ref.map(|(q, _)| q),
        })
    }

    /// The typed TrainJob, its runtime and its plugins. The typed TrainJob
    /// is read once per spec generation and metadata (status is not what
    /// the plugins are given it for).
    pub(super) fn pipeline_for(
        &self,
        object: &Value,
    ) -> Result<(Arc<TrainJob>, Arc<sdk::Runtime>, Pipeline), String> {
        let meta = &object["metadata"];
        let mut labels_and_annotations = std::collections::hash_map::DefaultHasher::new();
        hash_json(&meta["labels"], &mut labels_and_annotations);
        hash_json(&meta["annotations"], &mut labels_and_annotations);
        let cache_key = (
            meta["uid"].as_str().unwrap_or_default().to_string(),
            meta["generation"].as_i64().unwrap_or(0),
            labels_and_annotations.finish(),
        );
        let job = match self.typed.get(&cache_key) {
            Some(job) => job,
            None => {
                // From the borrowed tree: no copy of it to consume.
                let job = crate::plugins::plugin_trainjob(object)
                    .map_err(|e| format!("the stored TrainJob cannot be read: {e}"))?;
                let job = Arc::new(job);
                self.typed.insert(cache_key, job.clone());
                job
            }
        };
        // The runtime and plugins it was admitted with (see
        // `TrainerAdmission::pinned`); one without a snapshot gets one now.
        let pinned = self.admission.pinned(&job)?;
        let runtime = pinned.runtime.clone();
        let pipeline = match &pinned.plugins {
            Some(ids) => Pipeline::select(&self.plugins.pinned(ids)?, &runtime),
            None => Pipeline::select(&self.plugins.snapshot(), &runtime),
        }
        .map_err(|e| e.to_string())?;
        if pinned.plugins.is_none()
            && let (Some(namespace), Some(name), Some(uid)) = (
                job.metadata.namespace.as_deref(),
                job.metadata.name.as_deref(),
                job.metadata.uid.as_deref(),
            )
        {
            let ops = crate::admission::snapshot_ops(
                self.store.as_ref(),
                namespace,
                name,
                uid,
                &runtime,
                None,
                &pipeline.plugin_ids(),
            )?;
            self.write(ops);
        }
        Ok((job, runtime, pipeline))
    }

    /// Pod sets with counts and per-pod requests, after the ML and pod
    /// group policies.
    fn compute_demand(&self, object: &Value) -> Result<Demand, StepError> {
        let (job, runtime, pipeline) = self.pipeline_for(object)?;
        let info = pipeline.enforce(&job, &runtime).map_err(StepError::from)?;
        let pod_sets = info
            .pod_sets
            .iter()
            .map(|set| {
                let mut requests = core::Resources::new();
                for container in &set.containers {
                    for q in &container.requests {
                        let milli = milli(&q.value).map_err(|e| {
                            format!(
                                "pod set {}: container {}: {}: {e}",
                                set.name, container.name, q.name
                            )
                        })?;
                        *requests.entry(q.name.clone()).or_default() += milli;
                    }
                }
                Ok(PodSetDemand {
                    name: set.name.clone(),
                    count: set.count,
                    requests_milli: requests,
                })
            })
            .collect::<Result<_, String>>()?;
        Ok(Demand { pod_sets, info })
    }

    /// A plugin call for this TrainJob could not run now (the host is
    /// overloaded): sets the `PluginsDeferred` condition, records a Warning
    /// event, and runs `retry` after the TrainJob's backoff (1 s, doubling
    /// per deferral in a row, at most 5 minutes). `retry` re-reads what it
    /// needs, so a TrainJob changed or deleted meanwhile is not acted on
    /// stale.
    pub(super) fn defer(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        step: Step,
        message: &str,
        retry: impl FnOnce(Arc<Dispatch>) + Send + 'static,
    ) {
        let Some(this) = self.self_arc() else { return };
        let attempt = {
            let mut deferred = lock(&self.deferred);
            let d = deferred.entry((uid.to_string(), step)).or_default();
            if d.pending {
                return;
            }
            d.pending = true;
            d.attempts = d.attempts.saturating_add(1);
            d.attempts
        };
        let backoff = DEFER_FIRST
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(16))
            .min(DEFER_MAX);
        let message = format!("{message}; retrying in {}s", backoff.as_secs());
        tracing::warn!(trainjob = %format!("{namespace}/{name}"), attempt, message, "plugin call deferred");
        let job = job_key(namespace, name);
        let event = trainjob_event(
            &job,
            Some(uid),
            "Warning",
            REASON_PLUGIN_CALL_DEFERRED,
            &message,
        );
        self.record_events(&job, vec![event]);
        let key = Key::new(TRAINJOBS, Some(namespace), name);
        let uid = uid.to_string();
        tokio::spawn(async move {
            update_status(this.store.as_ref(), &key, |status| {
                set_condition(
                    status,
                    CONDITION_PLUGINS_DEFERRED,
                    "True",
                    REASON_PLUGIN_CALL_DEFERRED,
                    &message,
                    &format_time(Timestamp::now()),
                );
                true
            })
            .await;
            tokio::time::sleep(backoff).await;
            match lock(&this.deferred).get_mut(&(uid, step)) {
                Some(d) => d.pending = false,
                // A call succeeded meanwhile: nothing to retry.
                None => return,
            }
            retry(this);
        });
    }

    /// A plugin call of `step` for this TrainJob succeeded: if that step
    /// was deferred its backoff restarts, and once no step is, the
    /// `PluginsDeferred` condition goes.
    pub(super) fn undefer(&self, namespace: &str, name: &str, uid: &str, step: Step) {
        {
            let mut deferred = lock(&self.deferred);
            if deferred.remove(&(uid.to_string(), step)).is_none()
                || deferred.keys().any(|(u, _)| u == uid)
            {
                return;
            }
        }
        self.clear_deferred_condition(namespace, name, uid);
    }

    /// Removes the `PluginsDeferred` condition, unless a step of the
    /// TrainJob is deferred again by the time it is written.
    fn clear_deferred_condition(&self, namespace: &str, name: &str, uid: &str) {
        let Some(this) = self.self_arc() else { return };
        let key = Key::new(TRAINJOBS, Some(namespace), name);
        let uid = uid.to_string();
        tokio::spawn(async move {
            update_status(this.store.as_ref(), &key, |status| {
                if lock(&this.deferred).keys().any(|(u, _)| *u == uid) {
                    return false;
                }
                let Some(conditions) = status["conditions"].as_array_mut() else {
                    return false;
                };
                let before = conditions.len();
                conditions.retain(|c| c["type"] != CONDITION_PLUGINS_DEFERRED);
                conditions.len() != before
            })
            .await;
        });
    }

    /// Marks a TrainJob Failed with `reason`.
    pub(super) fn fail(&self, namespace: &str, name: &str, reason: &str, message: &str) {
        tracing::warn!(trainjob = %format!("{namespace}/{name}"), reason, message, "TrainJob failed");
        let job = job_key(namespace, name);
        let event = trainjob_event(&job, None, "Warning", reason, message);
        self.record_events(&job, vec![event]);
        let key = Key::new(TRAINJOBS, Some(namespace), name);
        let store = self.store.clone();
        let (reason, message) = (reason.to_string(), message.to_string());
        tokio::spawn(async move {
            update_status(store.as_ref(), &key, |status| {
                if is_true(status, CONDITION_FAILED) {
                    return false;
                }
                set_condition(
                    status,
                    CONDITION_FAILED,
                    "True",
                    &reason,
                    &message,
                    &format_time(Timestamp::now()),
                );
                true
            })
            .await;
        });
    }
}

/// A Kubernetes quantity in milli-units, rounded up.
pub fn milli(text: &str) -> Result<i64, String> {
    let q = Quantity::parse(text).map_err(|e| e.0)?;
    let nanos = q.nanos();
    let milli = nanos.div_euclid(1_000_000) + i128::from(nanos.rem_euclid(1_000_000) != 0);
    i64::try_from(milli).map_err(|_| format!("quantity {text:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_become_milli_units_rounded_up() {
        assert_eq!(milli("2").unwrap(), 2000);
        assert_eq!(milli("500m").unwrap(), 500);
        assert_eq!(milli("1Gi").unwrap(), 1_073_741_824_000);
        assert_eq!(milli("1n").unwrap(), 1);
        assert!(milli("two").is_err());
    }

    /// The typed-TrainJob cache is keyed by a hash of labels and
    /// annotations: equal trees hash alike, and a change of a value, of its
    /// type or of its nesting does not.
    #[test]
    fn labels_and_annotations_hash_by_value_type_and_shape() {
        let hash = |v: &Value| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            hash_json(v, &mut h);
            h.finish()
        };
        let base = serde_json::json!({"a": "1", "b": {"c": [true, null]}});
        assert_eq!(hash(&base), hash(&base.clone()));
        for other in [
            serde_json::json!({"a": "2", "b": {"c": [true, null]}}),
            serde_json::json!({"a": 1, "b": {"c": [true, null]}}),
            serde_json::json!({"a": ["1"], "b": {"c": [true, null]}}),
            serde_json::json!({"a": "1", "b": {"c": [true]}}),
            serde_json::json!({"a": "1", "b": {"c": [null, true]}}),
            serde_json::json!({"a": "1", "b": {"c": [[true, null]]}}),
            serde_json::json!({"a": "1"}),
            Value::Null,
        ] {
            assert_ne!(hash(&base), hash(&other), "{other}");
        }
    }
}
