//! Prometheus metrics in the text exposition format.
//!
//! A [`Metrics`] holds a registry and the refreshers that set gauges read
//! from state (queue depth, connected spokes...) just before each scrape.

use std::sync::{Arc, Mutex};

pub use prometheus_client::metrics::counter::Counter;
pub use prometheus_client::metrics::family::Family;
pub use prometheus_client::metrics::gauge::Gauge;
pub use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
pub use prometheus_client::registry::Registry;

/// The content type of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Label pairs of a family member.
pub type Labels = Vec<(String, String)>;
/// A gauge holding a float (seconds, units of a resource).
pub type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

type Refresh = Box<dyn Fn() + Send + Sync>;

/// A registry and what refreshes its gauges.
#[derive(Clone, Default)]
pub struct Metrics {
    registry: Arc<Mutex<Registry>>,
    refresh: Arc<Mutex<Vec<Refresh>>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Metrics {
    /// Registers `metric` as `name` (counters get `_total` appended).
    pub fn register<M>(&self, name: &str, help: &str, metric: M) -> M
    where
        M: prometheus_client::metrics::TypedMetric
            + prometheus_client::encoding::EncodeMetric
            + Clone
            + Send
            + Sync
            + std::fmt::Debug
            + 'static,
    {
        lock(&self.registry).register(name, help, metric.clone());
        metric
    }

    /// Runs `refresh` before every scrape.
    pub fn on_scrape(&self, refresh: impl Fn() + Send + Sync + 'static) {
        lock(&self.refresh).push(Box::new(refresh));
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        for refresh in lock(&self.refresh).iter() {
            refresh();
        }
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &lock(&self.registry));
        text
    }
}

/// Buckets for latencies from 1 ms to about 9 minutes.
pub fn latency_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.001, 2.0, 20)
}

/// A histogram family with [`latency_buckets`].
pub fn latency_family() -> Family<Labels, Histogram> {
    Family::new_with_constructor(|| Histogram::new(latency_buckets()))
}

/// A histogram with [`latency_buckets`].
pub fn latency_histogram() -> Histogram {
    Histogram::new(latency_buckets())
}

/// Label pairs from string slices.
pub fn labels<const N: usize>(pairs: [(&str, &str); N]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_runs_refreshers_and_names_counters_with_total() {
        let metrics = Metrics::default();
        let gauge: Family<Labels, FloatGauge> =
            metrics.register("trainhub_test_free", "Free units.", Family::default());
        let counter: Counter =
            metrics.register("trainhub_test_events", "Events.", Counter::default());
        counter.inc();
        let g = gauge.clone();
        metrics.on_scrape(move || {
            g.get_or_create(&labels([("resource", "cpu")])).set(1.5);
        });
        let text = metrics.render();
        assert!(text.contains("trainhub_test_events_total 1"), "{text}");
        assert!(
            text.contains("trainhub_test_free{resource=\"cpu\"} 1.5"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
