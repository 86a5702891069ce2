//! Telemetry shared by the hub and its spokes: logs (text or JSON, with
//! trace ids), a log level changeable at run time, OpenTelemetry traces
//! exported over OTLP/gRPC, W3C trace context in and out, and Prometheus
//! metrics.
//!
//! Tracing is configured by the standard variables
//! (`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`,
//! `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`,
//! `OTEL_BSP_*`); when no endpoint is set (or `OTEL_SDK_DISABLED=true`, or
//! `OTEL_TRACES_EXPORTER=none`) no OpenTelemetry layer is installed and the
//! [`span!`] macro returns a disabled span without touching the subscriber.

mod json;
pub mod level;
pub mod metrics;
mod otel;
pub mod propagation;

use std::sync::atomic::{AtomicBool, Ordering};

use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, reload};

pub use level::LevelHandle;

/// The target of the spans [`span!`] makes.
pub const TRACE_TARGET: &str = "trainhub::trace";

static TRACING: AtomicBool = AtomicBool::new(false);
static LEVEL: std::sync::OnceLock<LevelHandle> = std::sync::OnceLock::new();

/// The log level of the installed subscriber, when [`Telemetry::init`]
/// installed it.
pub fn level_handle() -> Option<&'static LevelHandle> {
    LEVEL.get()
}

/// Whether traces are exported (an OTLP endpoint is configured and the
/// exporter is installed). One relaxed atomic load.
#[inline]
pub fn tracing_enabled() -> bool {
    TRACING.load(Ordering::Relaxed)
}

/// An `INFO` span that exists only when traces are exported; otherwise
/// `Span::none()`, with no call into the subscriber and no allocation.
/// Use it for the spans of a TrainJob's trace.
#[macro_export]
macro_rules! span {
    ($name:literal $(, $($fields:tt)*)?) => {
        if $crate::tracing_enabled() {
            ::tracing::info_span!(target: "trainhub::trace", $name $(, $($fields)*)?)
        } else {
            ::tracing::Span::none()
        }
    };
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("configuring the OTLP trace exporter: {0}")]
    Exporter(String),
    #[error("a logging subscriber is already installed")]
    AlreadyInstalled,
    #[error(
        "log level {0:?} is neither a verbosity (0-10) nor a filter like `info,trainhub=debug`: {1}"
    )]
    Level(String, String),
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    #[default]
    Text,
    /// One JSON object a line, with `trace_id` and `span_id` when the event
    /// is inside a span of an exported trace.
    Json,
}

/// What to set up.
#[derive(Debug, Clone)]
pub struct Options {
    /// The `service.name` unless `OTEL_SERVICE_NAME` says otherwise.
    pub service_name: &'static str,
    pub log_format: LogFormat,
    /// Resource attributes of this process (e.g. `service.instance.id`);
    /// `OTEL_RESOURCE_ATTRIBUTES` adds to them.
    pub resource: Vec<(String, String)>,
}

/// The installed telemetry. Dropping it flushes and stops the exporter.
pub struct Telemetry {
    level: LevelHandle,
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry")
            .field("tracing", &self.provider.is_some())
            .finish()
    }
}

impl Telemetry {
    /// Installs the global subscriber: the level filter (`RUST_LOG`,
    /// default `info`), logs to stderr, and the OpenTelemetry layer when an
    /// OTLP endpoint is configured.
    ///
    /// An exporter that cannot be configured is reported on stderr and
    /// left out; logging works without it.
    ///
    /// # Errors
    /// A subscriber is already installed.
    pub fn init(options: Options) -> Result<Telemetry, Error> {
        let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
        let (filter, handle) = reload::Layer::new(filter);
        let json = json::JsonWithTrace::default();
        let fmt = match options.log_format {
            // Colour only on a terminal: a file or pipe gets plain text.
            LogFormat::Text => tracing_subscriber::fmt::layer()
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .with_writer(std::io::stderr)
                .boxed(),
            LogFormat::Json => tracing_subscriber::fmt::layer()
                .event_format(json.clone())
                .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
                .with_writer(std::io::stderr)
                .boxed(),
        };
        let provider = if otel::configured() {
            match otel::provider(options.service_name, &options.resource) {
                Ok(p) => Some(p),
                Err(e) => {
                    // Logging is not installed yet: say it where it would go.
                    eprintln!("warning: {e}; traces are not exported");
                    None
                }
            }
        } else {
            None
        };
        // The trace spans are exported whatever the log level: the level
        // filters the logs only.
        let otel_layer = provider.as_ref().map(|p| {
            use opentelemetry::trace::TracerProvider;
            tracing_opentelemetry::layer()
                .with_tracer(p.tracer("trainhub"))
                .with_location(false)
                .with_threads(false)
                .with_target(false)
                .with_tracked_inactivity(false)
                .with_filter(Targets::new().with_target(TRACE_TARGET, tracing::Level::INFO))
        });
        tracing_subscriber::registry()
            .with(fmt.with_filter(filter))
            .with(otel_layer)
            .try_init()
            .map_err(|_| Error::AlreadyInstalled)?;
        tracing::dispatcher::get_default(|d| json.dispatch.set(d.downgrade()).ok());
        if provider.is_some() {
            TRACING.store(true, Ordering::Relaxed);
        }
        let level = LevelHandle::new(handle);
        let _ = LEVEL.set(level.clone());
        Ok(Telemetry { level, provider })
    }

    /// Changes the log level while running.
    pub fn level(&self) -> LevelHandle {
        self.level.clone()
    }

    /// Exports what is buffered and stops the exporter (also on drop).
    pub fn shutdown(&mut self) {
        TRACING.store(false, Ordering::Relaxed);
        if let Some(provider) = self.provider.take()
            && let Err(e) = provider.shutdown()
        {
            eprintln!("telemetry: flushing traces: {e}");
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Environment for a child process that should join this process's
/// exporter configuration: the `OTEL_EXPORTER_OTLP_*` (except headers,
/// which may hold credentials), `OTEL_TRACES_SAMPLER*` and
/// `OTEL_PROPAGATORS` variables set here. Empty when tracing is off.
pub fn child_env() -> Vec<(String, String)> {
    if !tracing_enabled() {
        return Vec::new();
    }
    std::env::vars()
        .filter(|(k, _)| {
            (k.starts_with("OTEL_EXPORTER_OTLP_") && !k.contains("HEADERS"))
                || k.starts_with("OTEL_TRACES_SAMPLER")
                || k == "OTEL_PROPAGATORS"
        })
        .collect()
}
