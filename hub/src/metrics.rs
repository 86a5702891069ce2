//! The hub's Prometheus metrics, served on `/metrics` of the API port to
//! the policy's admin groups.
//!
//! Label values come from bounded sets only: states, plugin names and
//! phases, spoke names (certificate identities) and their resources (at
//! most [`trainhub_proto::limits::MAX_RESOURCES`] each); never a
//! TrainJob's name or uid.
//!
//! Counters and histograms are recorded where things happen; gauges that
//! mirror state (TrainJobs by state, queue depth, spokes) are read from the
//! store and the dispatcher at each scrape.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};
use trainhub_apiserver::auth::UserInfo;
use trainhub_apiserver::status::ApiError;

use trainhub_telemetry::metrics::{
    Counter, Family, FloatGauge, Gauge, Histogram, Labels, Metrics, labels, latency_family,
    latency_histogram,
};

use crate::dispatch::Dispatch;

/// Every metric of the hub.
pub struct HubMetrics {
    pub registry: Metrics,
    pub trainjobs: Family<Labels, Gauge>,
    pub queue_depth: Gauge,
    pub queue_wait: Histogram,
    pub submit_to_admitted: Histogram,
    pub admitted_to_running: Histogram,
    pub plugin_calls: Family<Labels, Histogram>,
    pub connected_spokes: Gauge,
    pub heartbeat_age: Family<Labels, FloatGauge>,
    pub spoke_connects: Family<Labels, Counter>,
    pub spoke_allocatable: Family<Labels, FloatGauge>,
    pub spoke_free: Family<Labels, FloatGauge>,
    /// 1 while this replica leads (runs dispatch, spoke sessions and the
    /// controllers), 0 while it follows.
    pub leader: Gauge,
    /// Writes refused because this replica's leadership term had ended.
    pub fenced_writes: Counter,
}

/// The hub's metrics (one set per process).
pub fn hub() -> &'static HubMetrics {
    static METRICS: OnceLock<HubMetrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        let r = Metrics::default();
        HubMetrics {
            trainjobs: r.register(
                "trainhub_trainjobs",
                "TrainJobs by state (Queued, Running, Suspended, Complete, Failed)",
                Family::default(),
            ),
            queue_depth: r.register(
                "trainhub_queue_depth",
                "TrainJobs waiting for a spoke",
                Gauge::default(),
            ),
            queue_wait: r.register(
                "trainhub_queue_wait_seconds",
                "From queued to the first offer sent to a spoke",
                latency_histogram(),
            ),
            submit_to_admitted: r.register(
                "trainhub_dispatch_submit_to_admitted_seconds",
                "From the TrainJob queued (created, requeued or restarted hub) to its placement on the spoke that admitted it",
                latency_histogram(),
            ),
            admitted_to_running: r.register(
                "trainhub_dispatch_admitted_to_running_seconds",
                "From placement to the spoke's first report of the running run",
                latency_histogram(),
            ),
            plugin_calls: r.register(
                "trainhub_plugin_call_duration_seconds",
                "Plugin calls by plugin, phase and outcome (ok, cpu-exhausted, out-of-memory, trap, deferred)",
                latency_family(),
            ),
            connected_spokes: r.register(
                "trainhub_connected_spokes",
                "Spokes with an open session",
                Gauge::default(),
            ),
            heartbeat_age: r.register(
                "trainhub_spoke_heartbeat_age_seconds",
                "Seconds since each spoke's last heartbeat (or hello)",
                Family::default(),
            ),
            spoke_connects: r.register(
                "trainhub_spoke_session_starts",
                "Sessions opened per spoke (each reconnect adds one)",
                Family::default(),
            ),
            spoke_allocatable: r.register(
                "trainhub_spoke_allocatable",
                "Capacity a spoke declares, per resource, in units (cpu cores, memory bytes)",
                Family::default(),
            ),
            spoke_free: r.register(
                "trainhub_spoke_free",
                "Capacity a spoke reports free, per resource, in units",
                Family::default(),
            ),
            leader: r.register(
                "trainhub_leader",
                "1 while this hub replica is the leader (runs dispatch, spoke sessions and controllers), 0 while it follows",
                Gauge::default(),
            ),
            fenced_writes: r.register(
                "trainhub_fenced_writes",
                "Writes refused because this replica's leadership term had ended (StoreError::Fenced)",
                Counter::default(),
            ),
            registry: r,
        }
    })
}

impl HubMetrics {
    pub fn plugin_call(&self, plugin: &str, phase: &str, outcome: &str, took: Duration) {
        self.plugin_calls
            .get_or_create(&labels([
                ("plugin", plugin),
                ("phase", phase),
                ("outcome", outcome),
            ]))
            .observe(took.as_secs_f64());
    }
}

/// The hub's own routes on the API port, behind the API's
/// authentication (401 without credentials) and for the policy's
/// `admin_groups` only (403 otherwise), as kube-apiserver serves them to
/// `system:masters`: `GET /metrics` and `GET`/`PUT /debug/flags/v` (the
/// log level). A Prometheus scrapes `/metrics` with an admin's bearer
/// token (the Helm chart's ServiceMonitor takes it from a Secret).
///
/// Returns (public, authenticated) routes, as the API server takes them.
/// `current` is the dispatch of the term this replica leads (None while it
/// follows: the dispatch gauges are then 0 and `trainhub_leader` says so).
pub fn routes(
    current: tokio::sync::watch::Receiver<Option<Arc<Dispatch>>>,
    admin_groups: Vec<String>,
) -> (Router, Router) {
    let admins = Arc::new(admin_groups);
    let metrics = {
        let admins = admins.clone();
        get(move |Extension(user): Extension<UserInfo>| {
            let (dispatch, admins) = (current.borrow().clone(), admins.clone());
            async move {
                if let Err(refused) = admit(&user, &admins, "get", "/metrics") {
                    return refused.into_response();
                }
                // Rendered off the async workers: it reads the store.
                // One scrape at a time: a refresh resets per-spoke series
                // that a concurrent render would see half set.
                static RENDER: std::sync::Mutex<()> = std::sync::Mutex::new(());
                let text = tokio::task::spawn_blocking(move || {
                    let _one = RENDER.lock().unwrap_or_else(|p| p.into_inner());
                    match dispatch {
                        Some(dispatch) => dispatch.refresh_metrics(),
                        None => {
                            hub().connected_spokes.set(0);
                            hub().queue_depth.set(0);
                        }
                    }
                    hub().registry.render()
                })
                .await;
                match text {
                    Ok(text) => ([(header::CONTENT_TYPE, OPENMETRICS)], text).into_response(),
                    Err(e) => {
                        ApiError::internal(format!("rendering the metrics: {e}")).into_response()
                    }
                }
            }
        })
    };
    let level = {
        let (a, b) = (admins.clone(), admins);
        get(move |user: Extension<UserInfo>| get_level(user, a.clone()))
            .put(move |user: Extension<UserInfo>, body: String| put_level(user, b.clone(), body))
    };
    let authenticated = Router::new()
        .route("/metrics", metrics)
        .route("/debug/flags/v", level);
    (Router::new(), authenticated)
}

/// What `/metrics` answers: the OpenMetrics text format (Prometheus reads
/// it, and its classic text parser too).
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Admins only: the 403 kube-apiserver answers for a non-resource URL.
// ApiError is the apiserver crate's error; its size is that crate's call.
#[allow(clippy::result_large_err)]
fn admit(user: &UserInfo, admins: &[String], verb: &str, path: &str) -> Result<(), ApiError> {
    if admins.iter().any(|g| user.in_group(g)) {
        return Ok(());
    }
    tracing::info!(user = %user.name, verb, path, "forbidden: not in an admin group");
    Err(ApiError::new(
        403,
        "Forbidden",
        format!(
            "forbidden: User {:?} cannot {verb} path {path:?}: it is for the admin groups of the policy ({})",
            user.name,
            if admins.is_empty() {
                "none configured".to_string()
            } else {
                admins.join(", ")
            }
        ),
    ))
}

async fn get_level(Extension(user): Extension<UserInfo>, admins: Arc<Vec<String>>) -> Response {
    if let Err(refused) = admit(&user, &admins, "get", "/debug/flags/v") {
        return refused.into_response();
    }
    match trainhub_telemetry::level_handle() {
        Some(level) => (StatusCode::OK, format!("{}\n", level.current())).into_response(),
        None => (StatusCode::NOT_FOUND, "no log level to change\n").into_response(),
    }
}

/// Sets the log level: a verbosity as kube-apiserver takes it (`4`) or a
/// `RUST_LOG` filter (`info,trainhub=debug`).
async fn put_level(
    Extension(user): Extension<UserInfo>,
    admins: Arc<Vec<String>>,
    body: String,
) -> Response {
    if let Err(refused) = admit(&user, &admins, "put", "/debug/flags/v") {
        return refused.into_response();
    }
    let Some(level) = trainhub_telemetry::level_handle() else {
        return (StatusCode::NOT_FOUND, "no log level to change\n").into_response();
    };
    match level.set(&body) {
        Ok(filter) => {
            tracing::warn!(user = %user.name, %filter, "log level changed");
            (
                StatusCode::OK,
                format!("successfully set log filter to {filter}\n"),
            )
                .into_response()
        }
        Err(e) => (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(groups: &[&str]) -> UserInfo {
        UserInfo {
            name: "bob".into(),
            uid: String::new(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        }
    }

    #[test]
    fn only_the_policys_admin_groups_are_admitted() {
        let admins = vec!["ops".to_string()];
        assert!(admit(&user(&["ops"]), &admins, "get", "/metrics").is_ok());
        // The default admin groups are not admins when the policy names others.
        let e = admit(&user(&["system:masters"]), &admins, "get", "/metrics").unwrap_err();
        assert_eq!(e.code, 403);
        assert!(
            e.message.contains("cannot get path \"/metrics\""),
            "{}",
            e.message
        );
        assert!(e.message.contains("(ops)"), "{}", e.message);
        let none: Vec<String> = Vec::new();
        assert!(admit(&user(&["ops"]), &none, "put", "/debug/flags/v").is_err());
    }
}
