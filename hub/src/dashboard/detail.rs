//! One TrainJob: its conditions as a timeline, where it was placed and
//! each requeue or preemption, why it is pending and where it stands in its
//! queue, its pods with their spoke and node, their logs (followed through
//! server-sent events), its events and YAML, and its trace.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Request, State};
use axum::http::{Method, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::stream::{self, Stream, StreamExt as _};
use maud::{Markup, html};
use serde_json::Value;
use trainhub_apiserver::auth::Attributes;
use trainhub_apiserver::status::ApiError;
use trainhub_apiserver::store::Key;

use super::trainjobs::Scope;
use super::view::{self, Summary, annotation, str_at};
use super::{
    Dashboard, Session, api_error_page, attributes, error_page, html_response, query_pairs,
};
use crate::api::{EVENTS, PODS, TRAINJOBS};

/// Lines of a pod's log shown before following it.
pub const LOG_TAIL_LINES: u32 = 500;
/// A log line longer than this is cut into pieces of this size.
pub const MAX_LOG_LINE_BYTES: usize = 16 * 1024;
/// A followed log ends after this; the page offers to follow it again.
const FOLLOW_LIFETIME: Duration = Duration::from_secs(30 * 60);
/// Longest namespace, name or pod name in a path (a DNS subdomain).
const MAX_NAME_BYTES: usize = 253;

const JOBSET_NAME: &str = "jobset.sigs.k8s.io/jobset-name";

fn check_names(session: &Session, names: &[&str]) -> Result<(), Response> {
    for name in names {
        if name.is_empty() || name.len() > MAX_NAME_BYTES {
            return Err(error_page(
                Some(session),
                StatusCode::BAD_REQUEST,
                &format!("a name in the path must be 1 to {MAX_NAME_BYTES} bytes"),
            ));
        }
    }
    Ok(())
}

/// The TrainJob `namespace/name` if `session` may get it (the API's 403
/// or 404 as a page otherwise).
pub(crate) fn job(
    d: &Dashboard,
    session: &Session,
    namespace: &str,
    name: &str,
) -> Result<Arc<Value>, Response> {
    check_names(session, &[namespace, name])?;
    d.authorize(
        session,
        &attributes(
            "get",
            "trainer.kubeflow.org",
            "trainjobs",
            Some(namespace),
            name,
        ),
    )?;
    d.store()
        .get(&Key::new(TRAINJOBS, Some(namespace), name))
        .map(|o| o.value)
        .ok_or_else(|| {
            api_error_page(
                session,
                &ApiError::new(
                    404,
                    "NotFound",
                    format!("trainjobs.trainer.kubeflow.org \"{name}\" not found"),
                ),
            )
        })
}

/// The caller of a page about the TrainJob `namespace/name`, and the
/// TrainJob as they may read it; the page to answer otherwise.
pub(crate) fn session_and_job(
    d: &Dashboard,
    request: Request,
    namespace: &str,
    name: &str,
) -> Result<(Session, Arc<Value>), Response> {
    let (session, _) = d.page_session(request)?;
    let job = job(d, &session, namespace, name)?;
    Ok((session, job))
}

pub(crate) async fn page(
    State(d): State<Dashboard>,
    Path((namespace, name)): Path<(String, String)>,
    request: Request,
) -> Response {
    let (session, job) = match session_and_job(&d, request, &namespace, &name) {
        Ok(found) => found,
        Err(r) => return r,
    };
    let pods: Vec<Arc<Value>> = if d.allowed(
        &session,
        &attributes("list", "", "pods", Some(&namespace), ""),
    ) {
        d.store()
            .list(PODS, Some(&namespace))
            .0
            .into_iter()
            .map(|o| o.value)
            .filter(|p| view::label(p, JOBSET_NAME) == name)
            .collect()
    } else {
        Vec::new()
    };
    let events: Option<Vec<Arc<Value>>> = d
        .allowed(
            &session,
            &attributes("list", "", "events", Some(&namespace), ""),
        )
        .then(|| {
            let pod_names: Vec<&str> = pods.iter().map(|p| str_at(p, "/metadata/name")).collect();
            let mut events: Vec<Arc<Value>> = d
                .store()
                .list(EVENTS, Some(&namespace))
                .0
                .into_iter()
                .map(|o| o.value)
                .filter(|e| {
                    let involved = str_at(e, "/involvedObject/name");
                    match str_at(e, "/involvedObject/kind") {
                        "TrainJob" => involved == name,
                        "Pod" => pod_names.contains(&involved),
                        _ => false,
                    }
                })
                .collect();
            events.sort_by(|a, b| event_time(a).cmp(event_time(b)));
            events
        });
    // The Kueue Workload of a queued TrainJob: quota reservation,
    // admission, evictions and preemptions with their reasons.
    let workload = {
        let uid = str_at(&job, "/metadata/uid");
        let wl = crate::kueue::workload::workload_name(&name, uid);
        let allowed = d.allowed(
            &session,
            &attributes("get", "kueue.x-k8s.io", "workloads", Some(&namespace), &wl),
        );
        allowed
            .then(|| {
                d.store()
                    .get(&Key::new(crate::kueue::WORKLOADS, Some(&namespace), &wl))
            })
            .flatten()
            .map(|o| o.value)
    };
    let position = if view::state(&job) == "Pending" {
        let all = d.summaries().list(d.store().as_ref(), &Scope::All).await;
        let (classes, _) = d
            .store()
            .list(crate::kueue::WORKLOAD_PRIORITY_CLASSES, None);
        let priority: HashMap<String, i32> = classes
            .iter()
            .filter_map(|c| crate::dispatch::quota::parse_priority_class(&c.value).ok())
            .map(|p| (p.name, p.value))
            .collect();
        queue_position(&all, &namespace, &name, &priority)
    } else {
        None
    };
    let can = |verb: &str| {
        d.allowed(
            &session,
            &attributes(
                verb,
                "trainer.kubeflow.org",
                "trainjobs",
                Some(&namespace),
                &name,
            ),
        )
    };
    let actions = Actions {
        patch: can("patch"),
        delete: can("delete"),
    };
    html_response(
        StatusCode::OK,
        render(&Detail {
            session: &session,
            job: &job,
            pods: &pods,
            events: events.as_deref(),
            position,
            workload: workload.as_deref(),
            actions,
            trace_url: d.trace_url(),
            now: jiff::Timestamp::now(),
        }),
    )
}

fn event_time(e: &Value) -> &str {
    [
        "/lastTimestamp",
        "/eventTime",
        "/metadata/creationTimestamp",
    ]
    .iter()
    .map(|p| str_at(e, p))
    .find(|t| !t.is_empty())
    .unwrap_or("")
}

/// Where a pending TrainJob stands among the pending TrainJobs of its
/// queue, in the hub's dispatch order: higher priority first (`priority`:
/// a TrainJob's WorkloadPriorityClass value by name; unknown or none: 0),
/// then the earlier created. Its queue is its namespace's LocalQueue, or,
/// for a TrainJob outside Kueue's queues, the hub's one queue of those.
/// (position from 1, how many are pending).
pub(crate) fn queue_position(
    all: &[Arc<Summary>],
    namespace: &str,
    name: &str,
    priority: &HashMap<String, i32>,
) -> Option<(usize, usize)> {
    let me = all
        .iter()
        .find(|s| s.namespace == namespace && s.name == name)?;
    let same_queue =
        |s: &Summary| s.queue == me.queue && (me.queue.is_empty() || s.namespace == me.namespace);
    // Kueue's priority applies to the jobs of its queues only.
    let priority_of = |s: &Summary| -> i32 {
        if s.queue.is_empty() {
            return 0;
        }
        s.labels
            .iter()
            .find(|(k, _)| k == crate::kueue::LABEL_PRIORITY_CLASS)
            .and_then(|(_, class)| priority.get(class).copied())
            .unwrap_or(0)
    };
    let mut pending: Vec<&Arc<Summary>> = all
        .iter()
        .filter(|s| s.state == "Pending" && same_queue(s))
        .collect();
    pending.sort_by_cached_key(|s| {
        (
            std::cmp::Reverse(priority_of(s)),
            s.created.clone(),
            s.namespace.clone(),
            s.name.clone(),
        )
    });
    let at = pending
        .iter()
        .position(|s| s.namespace == namespace && s.name == name)?;
    Some((at + 1, pending.len()))
}

/// What the caller may do to the TrainJob.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Actions {
    pub patch: bool,
    pub delete: bool,
}

pub(crate) struct Detail<'a> {
    pub session: &'a Session,
    pub job: &'a Value,
    pub pods: &'a [Arc<Value>],
    /// None: the caller may not list events.
    pub events: Option<&'a [Arc<Value>]>,
    pub position: Option<(usize, usize)>,
    /// The TrainJob's Kueue Workload, if it has one the caller may get.
    pub workload: Option<&'a Value>,
    pub actions: Actions,
    pub trace_url: Option<&'a str>,
    pub now: jiff::Timestamp,
}

/// The link of a trace id, when the id is plain hex (as W3C trace ids are).
pub(crate) fn trace_link(template: &str, trace_id: &str) -> Option<String> {
    (!trace_id.is_empty()
        && trace_id.len() <= 64
        && trace_id.chars().all(|c| c.is_ascii_hexdigit()))
    .then(|| template.replace("{traceId}", trace_id))
}

/// An object's conditions, oldest transition first.
fn conditions_of(object: &Value) -> Vec<&Value> {
    let mut conditions: Vec<&Value> = object
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .map(|c| c.iter().collect())
        .unwrap_or_default();
    conditions
        .sort_by(|a, b| str_at(a, "/lastTransitionTime").cmp(str_at(b, "/lastTransitionTime")));
    conditions
}

/// Conditions as a timeline: when, type = status, reason, message.
fn timeline(conditions: &[&Value]) -> Markup {
    html! {
        ol.timeline {
            @for c in conditions {
                li data-status=(str_at(c, "/status")) {
                    time { (str_at(c, "/lastTransitionTime")) }
                    " " strong { (str_at(c, "/type")) } " = " (str_at(c, "/status"))
                    @if !str_at(c, "/reason").is_empty() { " · " (str_at(c, "/reason")) }
                    @if !str_at(c, "/message").is_empty() { div.message { (str_at(c, "/message")) } }
                }
            }
        }
    }
}

/// Events that tell where the TrainJob went and why it moved.
fn is_placement(event: &Value) -> bool {
    let reason = str_at(event, "/reason");
    str_at(event, "/involvedObject/kind") == "TrainJob"
        && [
            "Placed",
            "Requeue",
            "Preempt",
            "Evict",
            "WorkerLost",
            "Withdraw",
        ]
        .iter()
        .any(|r| reason.contains(r))
}

pub(crate) fn render(d: &Detail<'_>) -> Markup {
    let job = d.job;
    let namespace = str_at(job, "/metadata/namespace");
    let name = str_at(job, "/metadata/name");
    let state = view::state(job);
    let base = view::job_href(namespace, name);
    let trace_id = annotation(job, crate::admission::ANNOTATION_TRACE_ID);
    let conditions = conditions_of(job);
    // As `kubectl get -o yaml` prints it: without managedFields.
    let mut shown = job.clone();
    if let Some(meta) = shown.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
    }
    let yaml = serde_saphyr::to_string(&shown).unwrap_or_else(|e| format!("# cannot print: {e}"));
    let body = html! {
        h1 { "TrainJob " span.name #job-name { (name) } }
        p.meta {
            "Namespace " strong { (namespace) }
            " · State " strong.state #job-state data-state=(state) { (state) }
            @if !view::spoke(job).is_empty() { " · Spoke " strong #job-spoke { (view::spoke(job)) } }
            @if !view::queue(job).is_empty() { " · Queue " strong { (view::queue(job)) } }
            " · Runtime " strong { (view::runtime(job)) }
            @if let Some(p) = view::progress(job) {
                " · Progress " strong #job-progress { (p) "%" }
                progress max="100" value=(p) {}
            }
            " · Age " (view::age(str_at(job, "/metadata/creationTimestamp"), d.now))
        }
        @if !trace_id.is_empty() {
            p.trace { "Trace "
                @match d.trace_url.and_then(|t| trace_link(t, trace_id)) {
                    Some(href) => a #trace-link href=(href) rel="noopener noreferrer" target="_blank" { code { (trace_id) } },
                    None => code #trace-id { (trace_id) },
                }
            }
        }
        section.actions #actions {
            @if d.actions.patch && !matches!(state, "Complete" | "Failed" | "Deleting") {
                @if state == "Suspended" {
                    form method="post" action={ (base) "/resume" } {
                        (view::csrf(d.session))
                        button #resume type="submit" { "Resume" }
                    }
                } @else {
                    form method="post" action={ (base) "/suspend" } {
                        (view::csrf(d.session))
                        button #suspend type="submit" { "Suspend" }
                    }
                }
            }
            @if d.actions.delete && state != "Deleting" {
                a.button.danger #delete href={ (base) "/delete" } { "Delete…" }
            }
        }
        @if state == "Pending" {
            section.pending #why-pending {
                h2 { "Why pending" }
                @if let Some((at, of)) = d.position {
                    p #queue-position {
                        "Position " strong { (at) } " of " (of) " pending in "
                        @if view::queue(job).is_empty() { "the default queue" } @else { "queue " strong { (view::queue(job)) } }
                        " (higher priority first, then first come, first served; quota may let a later one start first)."
                    }
                }
                @let reasons: Vec<&&Value> = conditions.iter().filter(|c| c["status"] != "True" || str_at(c, "/type") == "Suspended").collect();
                @for c in &reasons {
                    p { strong { (str_at(c, "/type")) } ": " (str_at(c, "/reason")) " — " (str_at(c, "/message")) }
                }
                @if let Some(wl) = d.workload {
                    @for c in conditions_of(wl).iter().filter(|c| c["status"] != "True") {
                        p { "Kueue " strong { (str_at(c, "/type")) } ": " (str_at(c, "/reason")) " — " (str_at(c, "/message")) }
                    }
                }
                @if let Some(events) = d.events {
                    @for e in events.iter().filter(|e| str_at(e, "/type") == "Warning").rev().take(3) {
                        p { strong { (str_at(e, "/reason")) } ": " (str_at(e, "/message")) }
                    }
                }
                @if reasons.is_empty() && d.position.is_none() { p { "Waiting to be offered to a spoke." } }
            }
        }
        section #conditions {
            h2 { "Conditions" }
            @if conditions.is_empty() { p.empty { "None yet." } }
            (timeline(&conditions))
        }
        section #placement {
            h2 { "Placement" }
            p { @if view::spoke(job).is_empty() { "Not placed." } @else { "On spoke " strong { (view::spoke(job)) } "." } }
            @if let Some(events) = d.events {
                ol.timeline {
                    @for e in events.iter().filter(|e| is_placement(e)) {
                        li { time { (event_time(e)) } " " strong { (str_at(e, "/reason")) } ": " (str_at(e, "/message")) }
                    }
                }
            }
        }
        @if let Some(wl) = d.workload {
            section #workload {
                h2 { "Queue: Workload " (str_at(wl, "/metadata/name")) }
                p { "ClusterQueue " strong { (str_at(wl, "/status/admission/clusterQueue")) }
                    " · queue " strong { (str_at(wl, "/spec/queueName")) } }
                (timeline(&conditions_of(wl)))
            }
        }
        section #pods {
            h2 { "Pods" }
            @if d.pods.is_empty() { p.empty { "No pods (yet, or none you may list)." } }
            @else {
                table {
                    thead { tr { th { "Pod" } th { "Phase" } th { "Spoke" } th { "Node" } } }
                    tbody {
                        @for p in d.pods {
                            tr {
                                td { a href={ "#log-" (str_at(p, "/metadata/name")) } { (str_at(p, "/metadata/name")) } }
                                td { (str_at(p, "/status/phase")) }
                                td { (annotation(p, crate::dispatch::ANNOTATION_SPOKE)) }
                                td { (str_at(p, "/spec/nodeName")) }
                            }
                        }
                    }
                }
                @for p in d.pods {
                    @let pod = str_at(p, "/metadata/name");
                    @let src = format!("{base}/logs/{}", view::segment(pod));
                    div.log id={ "log-" (pod) } {
                        h3 { "Log of " (pod) }
                        button.follow type="button" data-log=(src) { "Follow" }
                        pre.log data-src=(src) {}
                    }
                }
            }
        }
        section #events {
            h2 { "Events" }
            @match d.events {
                None => p.empty { "You may not list events in this namespace." },
                Some([]) => p.empty { "None." },
                Some(events) => table {
                    thead { tr { th { "Time" } th { "Type" } th { "Reason" } th { "Object" } th { "Message" } } }
                    tbody {
                        @for e in events {
                            tr data-type=(str_at(e, "/type")) {
                                td { (event_time(e)) }
                                td { (str_at(e, "/type")) }
                                td { (str_at(e, "/reason")) }
                                td { (str_at(e, "/involvedObject/kind")) "/" (str_at(e, "/involvedObject/name")) }
                                td { (str_at(e, "/message")) }
                            }
                        }
                    }
                },
            }
        }
        section #yaml {
            h2 { "YAML" }
            pre.yaml { (yaml) }
        }
    };
    view::layout(&format!("TrainJob {name}"), Some(d.session), body)
}

/// A pod's log as server-sent events: `line` events, then `end`; with
/// `?follow=1`, the log followed while the pod runs. The log is the API's
/// (`pods/log`, requested as the caller): a refusal is the API's.
pub(crate) async fn logs(
    State(d): State<Dashboard>,
    Path((namespace, name, pod)): Path<(String, String, String)>,
    request: Request,
) -> Response {
    let (mut session, parts) = match d.page_session(request) {
        Ok(s) => s,
        Err(r) => return r,
    };
    if let Err(r) = check_names(&session, &[&namespace, &name, &pod]) {
        return r;
    }
    let follow = match query_pairs(&parts, Some(&session)) {
        Ok(pairs) => pairs
            .iter()
            .any(|(k, v)| k == "follow" && (v == "1" || v == "true")),
        Err(r) => return r,
    };
    if let Err(r) = d.authorize(
        &session,
        &Attributes {
            subresource: Some("log"),
            ..attributes("get", "", "pods", Some(&namespace), &pod)
        },
    ) {
        return r;
    }
    // Only the TrainJob's own pods.
    let belongs = d
        .store()
        .get(&Key::new(PODS, Some(&namespace), &pod))
        .is_some_and(|p| view::label(&p.value, JOBSET_NAME) == name);
    if !belongs {
        return error_page(
            Some(&session),
            StatusCode::NOT_FOUND,
            &format!("pods \"{pod}\" not found"),
        );
    }
    let mut path = format!(
        "/api/v1/namespaces/{}/pods/{}/log?tailLines={LOG_TAIL_LINES}",
        view::segment(&namespace),
        view::segment(&pod)
    );
    if follow {
        path.push_str("&follow=true");
    }
    let response = d
        .api(&mut session, Method::GET, &path, None, Vec::new())
        .await;
    let status = response.status();
    let body = response.into_body();
    let lines: std::pin::Pin<Box<dyn Stream<Item = Result<Event, Infallible>> + Send>> =
        if status.is_success() {
            Box::pin(log_lines(body.into_data_stream()))
        } else {
            let text = axum::body::to_bytes(body, 64 * 1024)
                .await
                .unwrap_or_default();
            let message = serde_json::from_slice::<Value>(&text)
                .ok()
                .and_then(|v| v["message"].as_str().map(str::to_string))
                .unwrap_or_else(|| format!("the API answered {status}"));
            Box::pin(stream::iter([Ok(Event::default()
                .event("problem")
                .data(message))]))
        };
    let deadline = tokio::time::Instant::now() + FOLLOW_LIFETIME;
    let lines = lines.take_until(tokio::time::sleep_until(deadline));
    let end = stream::iter([Ok(Event::default().event("end").data(""))]);
    Sse::new(lines.chain(end))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

/// The lines of a byte stream as `line` events; a line longer than
/// [`MAX_LOG_LINE_BYTES`] is cut. Holds at most one partial line.
fn log_lines<S, E>(body: S) -> impl Stream<Item = Result<Event, Infallible>> + Send
where
    S: Stream<Item = Result<Bytes, E>> + Send + Unpin + 'static,
    E: Send + 'static,
{
    struct Lines<S> {
        body: Option<S>,
        partial: Vec<u8>,
        ready: VecDeque<String>,
    }
    let state = Lines {
        body: Some(body),
        partial: Vec::new(),
        ready: VecDeque::new(),
    };
    stream::unfold(state, |mut s| async move {
        loop {
            if let Some(line) = s.ready.pop_front() {
                return Some((Ok(Event::default().event("line").data(line)), s));
            }
            let body = s.body.as_mut()?;
            match body.next().await {
                Some(Ok(chunk)) => {
                    for &b in chunk.iter() {
                        if b == b'\n' {
                            let line = std::mem::take(&mut s.partial);
                            s.ready
                                .push_back(String::from_utf8_lossy(&line).into_owned());
                        } else {
                            s.partial.push(b);
                            if s.partial.len() >= MAX_LOG_LINE_BYTES {
                                let line = std::mem::take(&mut s.partial);
                                s.ready
                                    .push_back(String::from_utf8_lossy(&line).into_owned());
                            }
                        }
                    }
                }
                Some(Err(_)) | None => {
                    s.body = None;
                    if !s.partial.is_empty() {
                        let line = std::mem::take(&mut s.partial);
                        s.ready
                            .push_back(String::from_utf8_lossy(&line).into_owned());
                    }
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_links_only_for_hex_ids() {
        let t = "https://jaeger.example/trace/{traceId}";
        assert_eq!(
            trace_link(t, "4bf92f3577b34da6a3ce929d0e0e4736").as_deref(),
            Some("https://jaeger.example/trace/4bf92f3577b34da6a3ce929d0e0e4736")
        );
        assert_eq!(trace_link(t, "\"><script>"), None);
        assert_eq!(trace_link(t, ""), None);
    }

    #[test]
    fn queue_position_is_by_priority_then_creation_per_queue() {
        let s =
            |ns: &str, name: &str, state: &'static str, queue: &str, class: &str, created: &str| {
                let labels = if class.is_empty() {
                    vec![]
                } else {
                    vec![(
                        crate::kueue::LABEL_PRIORITY_CLASS.to_string(),
                        class.to_string(),
                    )]
                };
                Arc::new(Summary {
                    namespace: ns.into(),
                    name: name.into(),
                    state,
                    queue: queue.into(),
                    runtime: String::new(),
                    spoke: String::new(),
                    progress: None,
                    created: created.into(),
                    labels,
                })
            };
        let priority: HashMap<String, i32> = [("high".to_string(), 1000)].into();
        let all = vec![
            s("ns", "a", "Pending", "q", "", "2026-01-01T00:00:03Z"),
            s("ns", "b", "Pending", "q", "", "2026-01-01T00:00:01Z"),
            s("ns", "c", "Running", "q", "", "2026-01-01T00:00:00Z"),
            s("ns", "d", "Pending", "other", "", "2026-01-01T00:00:00Z"),
            // Created last, but of a higher priority.
            s("ns", "e", "Pending", "q", "high", "2026-01-01T00:00:09Z"),
            // A LocalQueue of the same name in another namespace.
            s("other-ns", "f", "Pending", "q", "", "2026-01-01T00:00:00Z"),
            // Outside Kueue's queues: one queue across namespaces, and a
            // priority class label is not Kueue's to apply.
            s("ns", "g", "Pending", "", "high", "2026-01-01T00:00:05Z"),
            s("other-ns", "h", "Pending", "", "", "2026-01-01T00:00:04Z"),
        ];
        let at = |ns: &str, name: &str| queue_position(&all, ns, name, &priority);
        assert_eq!(at("ns", "e"), Some((1, 3)));
        assert_eq!(at("ns", "b"), Some((2, 3)));
        assert_eq!(at("ns", "a"), Some((3, 3)));
        assert_eq!(at("ns", "c"), None);
        assert_eq!(at("ns", "d"), Some((1, 1)));
        assert_eq!(at("other-ns", "f"), Some((1, 1)));
        assert_eq!(at("other-ns", "h"), Some((1, 2)));
        assert_eq!(at("ns", "g"), Some((2, 2)));
    }

    #[tokio::test]
    async fn log_lines_are_split_and_long_lines_cut() {
        let long = "x".repeat(MAX_LOG_LINE_BYTES + 10);
        let chunks: Vec<Result<Bytes, Infallible>> = vec![
            Ok(Bytes::from("one\ntw")),
            Ok(Bytes::from(format!("o\n{long}\nlast"))),
        ];
        let events: Vec<_> = log_lines(stream::iter(chunks)).collect().await;
        assert_eq!(
            events.len(),
            5,
            "one, two, the long line in two pieces, last"
        );
    }
}
