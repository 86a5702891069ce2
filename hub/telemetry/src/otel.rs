//! The OTLP trace exporter, on a small runtime of its own.
//!
//! The SDK's batch processor exports from a plain thread; tonic needs a
//! Tokio reactor. The exporter is built inside a one-thread runtime owned
//! here and each export is driven on it, so exporting works whatever
//! runtime (if any) the application runs, and never competes with it.

use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};

use crate::Error;

/// Whether the environment asks for traces to be exported.
pub(crate) fn configured() -> bool {
    let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
    let is = |name: &str, value: &str| {
        std::env::var(name).is_ok_and(|v| v.trim().eq_ignore_ascii_case(value))
    };
    (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
        && !is("OTEL_SDK_DISABLED", "true")
        && !is("OTEL_TRACES_EXPORTER", "none")
}

fn runtime() -> Result<&'static tokio::runtime::Runtime, Error> {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    if let Some(rt) = RUNTIME.get() {
        return Ok(rt);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("otlp-export")
        .enable_all()
        .build()
        .map_err(|e| Error::Exporter(format!("starting the exporter's runtime: {e}")))?;
    Ok(RUNTIME.get_or_init(|| rt))
}

/// The tracer provider: OTLP over gRPC with the batch processor (its
/// `OTEL_BSP_*` settings), the sampler of `OTEL_TRACES_SAMPLER`, and the
/// resource: `service.name` (`OTEL_SERVICE_NAME` wins over `service_name`),
/// `attributes`, then `OTEL_RESOURCE_ATTRIBUTES`.
pub(crate) fn provider(
    service_name: &'static str,
    attributes: &[(String, String)],
) -> Result<SdkTracerProvider, Error> {
    let runtime = runtime()?;
    let exporter = {
        let _entered = runtime.enter();
        opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .build()
            .map_err(|e| Error::Exporter(e.to_string()))?
    };
    // The SDK's builder reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES;
    // what they set wins over the defaults given here.
    let from_env = std::env::var("OTEL_RESOURCE_ATTRIBUTES").unwrap_or_default();
    let mut resource = Resource::builder().with_attributes(
        attributes
            .iter()
            .filter(|(k, _)| {
                !from_env
                    .split(',')
                    .any(|kv| kv.trim().starts_with(&format!("{k}=")))
            })
            .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
    );
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name(service_name);
    }
    let resource = resource.build();
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(OnRuntime {
            inner: exporter,
            runtime,
        })
        .with_resource(resource)
        .build())
}

/// Drives an exporter's futures on the exporter runtime.
#[derive(Debug)]
struct OnRuntime<E> {
    inner: E,
    runtime: &'static tokio::runtime::Runtime,
}

impl<E: SpanExporter> OnRuntime<E> {
    fn block_on(&self, future: impl Future<Output = OTelSdkResult> + Send) -> OTelSdkResult {
        if tokio::runtime::Handle::try_current().is_ok() {
            // Called from async code (a flush): block a helper thread, not
            // the caller's runtime.
            std::thread::scope(|s| s.spawn(|| self.runtime.block_on(future)).join()).unwrap_or_else(
                |_| {
                    Err(OTelSdkError::InternalFailure(
                        "the export thread panicked".into(),
                    ))
                },
            )
        } else {
            self.runtime.block_on(future)
        }
    }
}

impl<E: SpanExporter> SpanExporter for OnRuntime<E> {
    fn export(&self, batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
        std::future::ready(self.block_on(self.inner.export(batch)))
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}
