//! The spoke's Prometheus metrics and its HTTP endpoint (`--http-address`):
//! `/metrics`, `/livez`, `/readyz` (ready while connected to the hub).

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::http::{StatusCode, header};
use axum::routing::get;
use trainhub_telemetry::metrics::{Counter, Family, FloatGauge, Gauge, Labels, Metrics, labels};

use crate::backend::Backend;

/// Every metric of the spoke.
pub struct SpokeMetrics {
    pub registry: Metrics,
    pub connected: Gauge,
    pub reconnects: Counter,
    pub offers: Family<Labels, Counter>,
    pub runs: Gauge,
    pub allocatable: Family<Labels, FloatGauge>,
    pub free: Family<Labels, FloatGauge>,
}

/// The spoke's metrics (one set per process).
pub fn spoke() -> &'static SpokeMetrics {
    static METRICS: OnceLock<SpokeMetrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        let r = Metrics::default();
        SpokeMetrics {
            connected: r.register(
                "trainhub_spoke_connected",
                "1 while the session with the hub is open",
                Gauge::default(),
            ),
            reconnects: r.register(
                "trainhub_spoke_reconnects",
                "Sessions with the hub opened after the first",
                Counter::default(),
            ),
            offers: r.register(
                "trainhub_spoke_offers",
                "Offers answered, by answer (admitted true or false)",
                Family::default(),
            ),
            runs: r.register(
                "trainhub_spoke_runs",
                "Runs held that have not finished",
                Gauge::default(),
            ),
            allocatable: r.register(
                "trainhub_spoke_allocatable",
                "Capacity declared, per resource, in units (cpu cores, memory bytes)",
                Family::default(),
            ),
            free: r.register(
                "trainhub_spoke_free",
                "Capacity free, per resource, in units",
                Family::default(),
            ),
            registry: r,
        }
    })
}

/// What `/metrics` answers.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

fn refresh(backend: &dyn Backend) {
    let m = spoke();
    for c in backend.capacity() {
        let l = labels([("resource", c.resource.as_str())]);
        m.allocatable
            .get_or_create(&l)
            .set(c.allocatable_milli as f64 / 1000.0);
        m.free.get_or_create(&l).set(c.free_milli as f64 / 1000.0);
    }
    let active = backend.runs().iter().filter(|r| !r.finished).count();
    m.runs.set(i64::try_from(active).unwrap_or(i64::MAX));
}

/// Serves `/metrics`, `/livez` and `/readyz` on `listener` until
/// `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    backend: Arc<dyn Backend>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let addr: Option<SocketAddr> = listener.local_addr().ok();
    let router = Router::new()
        .route(
            "/metrics",
            get(move || {
                let backend = backend.clone();
                async move {
                    refresh(backend.as_ref());
                    (
                        [(header::CONTENT_TYPE, OPENMETRICS)],
                        spoke().registry.render(),
                    )
                }
            }),
        )
        .route("/livez", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|| async {
                if spoke().connected.get() > 0 {
                    (StatusCode::OK, "ok")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "not connected to the hub")
                }
            }),
        );
    tracing::info!(?addr, "serving /metrics, /livez, /readyz (HTTP)");
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}
