//! What dispatch tells operators: the spans of each TrainJob's trace after
//! admission, and the dispatch latency metrics.
//!
//! Every span here is a child of the context admission stored on the
//! TrainJob (the `trainhub.kubeflow.org/traceparent` annotation), never of
//! an in-memory span, so the work a restarted hub does joins the same
//! trace. Spans cost nothing when traces are not exported
//! ([`trainhub_telemetry::span!`]).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use serde_json::Value;
use tracing::Span;
use trainhub_telemetry::metrics::labels;
use trainhub_telemetry::propagation::{self, Parent};

use trainhub_api::constants::{CONDITION_COMPLETE, CONDITION_FAILED};
use trainhub_api::trainer::TrainJobStatus;

use crate::admission::ANNOTATION_TRACEPARENT;
use crate::metrics;

/// One TrainJob seen queued by this hub.
struct Job {
    queued: Instant,
    offered: bool,
    placed: Option<Instant>,
    running: bool,
    parent: Option<Parent>,
    /// Open from queued to the first offer.
    queue: Span,
}

/// Last hello or heartbeat of a spoke.
struct SpokeSeen {
    at: Instant,
    capacity: Vec<(String, i64, i64)>,
}

#[derive(Default)]
pub(crate) struct Observer {
    jobs: Mutex<HashMap<String, Job>>,
    spokes: Mutex<HashMap<String, SpokeSeen>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The parent a TrainJob's spans continue: the stored context, or (for a
/// TrainJob admitted while traces were off) a new root.
fn parent_of(object: &Value, name: &str) -> Option<Parent> {
    if !trainhub_telemetry::tracing_enabled() {
        return None;
    }
    let stored = object["metadata"]["annotations"][ANNOTATION_TRACEPARENT]
        .as_str()
        .and_then(Parent::from_traceparent);
    stored.or_else(|| {
        let root = trainhub_telemetry::span!("trainjob", trainjob = name);
        propagation::traceparent(&root)
            .as_deref()
            .and_then(Parent::from_traceparent)
    })
}

macro_rules! child {
    ($parent:expr, $name:literal $(, $($fields:tt)*)?) => {{
        let span = trainhub_telemetry::span!($name $(, $($fields)*)?);
        if let Some(parent) = $parent {
            parent.adopt(&span);
        }
        span
    }};
}

impl Observer {
    /// The TrainJob `run_id` wants to run: starts its queue span (once) and
    /// returns it, for the work done before it is offered.
    pub(crate) fn queued(&self, run_id: &str, object: &Value, name: &str) -> Span {
        let mut jobs = lock(&self.jobs);
        if let Some(job) = jobs.get(run_id) {
            return job.queue.clone();
        }
        let parent = parent_of(object, name);
        let queue = child!(parent.as_ref(), "queue", trainjob = name);
        jobs.insert(
            run_id.to_string(),
            Job {
                queued: Instant::now(),
                offered: false,
                placed: None,
                running: false,
                parent,
                queue: queue.clone(),
            },
        );
        queue
    }

    /// A TrainJob found placed when the hub starts: it is not queued, and
    /// its latencies were measured by the hub that placed it.
    pub(crate) fn resumed(&self, object: &Value) {
        let meta = &object["metadata"];
        let (Some(run_id), Some(name)) = (meta["uid"].as_str(), meta["name"].as_str()) else {
            return;
        };
        let now = Instant::now();
        lock(&self.jobs).insert(
            run_id.to_string(),
            Job {
                queued: now,
                offered: true,
                placed: Some(now),
                running: true,
                parent: parent_of(object, name),
                queue: Span::none(),
            },
        );
    }

    /// An offer goes to `spoke`: the trace context it carries.
    pub(crate) fn offered(
        &self,
        run_id: &str,
        spoke: &str,
        generation: i64,
    ) -> HashMap<String, String> {
        let mut jobs = lock(&self.jobs);
        let Some(job) = jobs.get_mut(run_id) else {
            return HashMap::new();
        };
        if !job.offered {
            job.offered = true;
            metrics::hub()
                .queue_wait
                .observe(job.queued.elapsed().as_secs_f64());
            job.queue = Span::none();
        }
        let span = child!(job.parent.as_ref(), "offer", spoke, generation);
        propagation::inject(&span)
    }

    pub(crate) fn withdrawn(&self, run_id: &str, spoke: &str, generation: i64) {
        if let Some(job) = lock(&self.jobs).get(run_id) {
            let _span = child!(job.parent.as_ref(), "withdraw", spoke, generation);
        }
    }

    /// The placement on the spoke that admitted first is committed.
    pub(crate) fn placed(&self, run_id: &str, spoke: &str, generation: i64) {
        if let Some(job) = lock(&self.jobs).get_mut(run_id) {
            metrics::hub()
                .submit_to_admitted
                .observe(job.queued.elapsed().as_secs_f64());
            job.placed = Some(Instant::now());
            job.running = false;
            let _span = child!(job.parent.as_ref(), "placed", spoke, generation);
        }
    }

    /// The span of the Build phase for `spoke` (and of the start it sends).
    pub(crate) fn build(&self, run_id: &str, spoke: &str, generation: i64) -> Span {
        match lock(&self.jobs).get(run_id) {
            Some(job) => child!(job.parent.as_ref(), "build", spoke, generation),
            None => Span::none(),
        }
    }

    /// A report on a placed run: the first one marks it running.
    pub(crate) fn reported(&self, run_id: &str, spoke: &str) {
        if let Some(job) = lock(&self.jobs).get_mut(run_id)
            && let Some(placed) = job.placed
            && !job.running
        {
            job.running = true;
            metrics::hub()
                .admitted_to_running
                .observe(placed.elapsed().as_secs_f64());
            let _span = child!(job.parent.as_ref(), "running", spoke);
        }
    }

    /// The span of a status mapping (the PostExecution plugins).
    pub(crate) fn status(&self, run_id: &str) -> Span {
        match lock(&self.jobs).get(run_id) {
            Some(job) => child!(
                job.parent.as_ref(),
                "status",
                conditions = tracing::field::Empty
            ),
            None => Span::none(),
        }
    }

    /// A status mapped from a report: its conditions on the status span;
    /// a `Complete` or `Failed` one ends the TrainJob's trace.
    pub(crate) fn status_mapped(&self, run_id: &str, span: &Span, status: &TrainJobStatus) {
        let conditions = status.conditions.as_deref().unwrap_or_default();
        if !span.is_disabled() {
            let text: Vec<String> = conditions
                .iter()
                .map(|c| format!("{}={}", c.type_, c.status))
                .collect();
            span.record("conditions", text.join(",").as_str());
        }
        let ended = conditions.iter().find(|c| {
            c.status == "True" && (c.type_ == CONDITION_COMPLETE || c.type_ == CONDITION_FAILED)
        });
        if let Some(c) = ended {
            self.finished(run_id, &c.type_, &c.reason);
        }
    }

    /// The TrainJob ended (`Complete` or `Failed`): its last span.
    pub(crate) fn finished(&self, run_id: &str, outcome: &str, reason: &str) {
        if let Some(job) = lock(&self.jobs).remove(run_id) {
            let _span = child!(job.parent.as_ref(), "outcome", outcome, reason);
        }
    }

    /// The TrainJob is gone or no longer wants to run.
    pub(crate) fn forget(&self, run_id: &str) {
        lock(&self.jobs).remove(run_id);
    }

    /// A spoke said hello (`connected`) or sent a heartbeat.
    pub(crate) fn spoke_seen(&self, spoke: &str, capacity: &[(String, i64, i64)], connected: bool) {
        if connected {
            metrics::hub()
                .spoke_connects
                .get_or_create(&labels([("spoke", spoke)]))
                .inc();
        }
        lock(&self.spokes).insert(
            spoke.to_string(),
            SpokeSeen {
                at: Instant::now(),
                capacity: capacity.to_vec(),
            },
        );
    }

    /// Sets the per-spoke gauges: the resources each spoke reports now
    /// (a resource it no longer reports leaves no series behind).
    pub(crate) fn refresh_spokes(&self) {
        let m = metrics::hub();
        let spokes = lock(&self.spokes);
        m.spoke_allocatable.clear();
        m.spoke_free.clear();
        for (spoke, seen) in spokes.iter() {
            m.heartbeat_age
                .get_or_create(&labels([("spoke", spoke)]))
                .set(seen.at.elapsed().as_secs_f64());
            for (resource, allocatable, free) in &seen.capacity {
                let l = labels([("spoke", spoke), ("resource", resource)]);
                m.spoke_allocatable
                    .get_or_create(&l)
                    .set(*allocatable as f64 / 1000.0);
                m.spoke_free.get_or_create(&l).set(*free as f64 / 1000.0);
            }
        }
    }
}
