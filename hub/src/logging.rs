//! Logs and traces: `tracing` to stderr, as text or JSON, filtered by
//! `RUST_LOG` (default `info`, changeable at run time through `PUT
//! /debug/flags/v`), and OpenTelemetry traces when `OTEL_EXPORTER_OTLP_ENDPOINT`
//! is set (see `trainhub_telemetry`).

use trainhub_telemetry::{LogFormat, Options, Telemetry};

/// Installs logging and tracing for `service` (`trainhub`); keep the
/// returned guard until exit, it flushes the traces. `None` when a
/// subscriber is already installed (logs go wherever that one sends them).
pub fn init(format: &str) -> Option<Telemetry> {
    let log_format = if format == "json" {
        LogFormat::Json
    } else {
        LogFormat::Text
    };
    Telemetry::init(Options {
        service_name: "trainhub",
        log_format,
        resource: Vec::new(),
    })
    .ok()
}
