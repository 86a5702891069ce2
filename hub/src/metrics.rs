//! The hub's Prometheus metrics, served on `/metrics` of the API port.
//!
//! Counters and histograms are recorded where things happen; gauges that
//! mirror state (TrainJobs by state, queue depth, spokes) are read from the
//! store and the dispatcher at each scrape.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::http::{StatusCode, header};
use axum::routing::get;
use axum::{Extension, Router};
use trainhub_apiserver::auth::{DEFAULT_ADMIN_GROUPS, UserInfo};

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
                "Plugin calls by plugin, phase and outcome (ok, timeout, out-of-memory, trap)",
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

/// The hub's own routes on the API port: `GET /metrics` (no
/// authentication: it shows counts, spoke and plugin names, nothing of a
/// TrainJob's content) and kube-apiserver's `GET`/`PUT /debug/flags/v`
/// (the log level; admin groups only).
pub fn routes(dispatch: Arc<Dispatch>) -> (Router, Router) {
    let public = Router::new().route(
        "/metrics",
        get(move || {
            let dispatch = dispatch.clone();
            async move {
                dispatch.refresh_metrics();
                (
                    [(header::CONTENT_TYPE, OPENMETRICS)],
                    hub().registry.render(),
                )
            }
        }),
    );
    let authenticated = Router::new().route("/debug/flags/v", get(get_level).put(put_level));
    (public, authenticated)
}

/// What `/metrics` answers: the OpenMetrics text format (Prometheus reads
/// it, and its classic text parser too).
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

fn is_admin(user: &UserInfo) -> bool {
    DEFAULT_ADMIN_GROUPS.iter().any(|g| user.in_group(g))
}

async fn get_level(Extension(user): Extension<UserInfo>) -> (StatusCode, String) {
    if !is_admin(&user) {
        return forbidden(&user);
    }
    match trainhub_telemetry::level_handle() {
        Some(level) => (StatusCode::OK, format!("{}\n", level.current())),
        None => (StatusCode::NOT_FOUND, "no log level to change\n".into()),
    }
}

/// Sets the log level: a verbosity as kube-apiserver takes it (`4`) or a
/// `RUST_LOG` filter (`info,trainhub=debug`).
async fn put_level(Extension(user): Extension<UserInfo>, body: String) -> (StatusCode, String) {
    if !is_admin(&user) {
        return forbidden(&user);
    }
    let Some(level) = trainhub_telemetry::level_handle() else {
        return (StatusCode::NOT_FOUND, "no log level to change\n".into());
    };
    match level.set(&body) {
        Ok(filter) => {
            tracing::warn!(user = %user.name, %filter, "log level changed");
            (
                StatusCode::OK,
                format!("successfully set log filter to {filter}\n"),
            )
        }
        Err(e) => (StatusCode::BAD_REQUEST, format!("{e}\n")),
    }
}

fn forbidden(user: &UserInfo) -> (StatusCode, String) {
    (
        StatusCode::FORBIDDEN,
        format!(
            "user {:?} may not change the log level: it takes one of the groups {}\n",
            user.name,
            DEFAULT_ADMIN_GROUPS.join(", ")
        ),
    )
}
