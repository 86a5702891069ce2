//! W3C trace context (`traceparent`, `tracestate`) in and out of spans.
//!
//! Every function is a no-op returning nothing when traces are not
//! exported.

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::tracing_enabled;

/// The key of the W3C `traceparent` header (and of the trace-context maps
/// in the hub–spoke messages).
pub const TRACEPARENT: &str = "traceparent";

/// A remote parent: the context a span continues.
#[derive(Clone, Debug)]
pub struct Parent(opentelemetry::Context);

impl Parent {
    /// The parent from a `traceparent` value; `None` when it is not a
    /// valid W3C trace context (or traces are off).
    pub fn from_traceparent(traceparent: &str) -> Option<Parent> {
        if !tracing_enabled() {
            return None;
        }
        let carrier = HashMap::from([(TRACEPARENT.to_string(), traceparent.to_string())]);
        Parent::extract(&carrier)
    }

    /// The parent from a map holding `traceparent` (and `tracestate`).
    pub fn extract(carrier: &HashMap<String, String>) -> Option<Parent> {
        if !tracing_enabled() {
            return None;
        }
        let cx = TraceContextPropagator::new().extract(carrier);
        cx.span()
            .span_context()
            .is_valid()
            .then(|| Parent(cx.clone()))
    }

    /// Makes `span` a child of this context. Call it before the span is
    /// entered.
    pub fn adopt(&self, span: &tracing::Span) {
        if !span.is_disabled() {
            let _ = span.set_parent(self.0.clone());
        }
    }
}

/// `span`'s context as `traceparent` (and `tracestate` when set); empty
/// when traces are off or the span is disabled.
pub fn inject(span: &tracing::Span) -> HashMap<String, String> {
    let mut carrier = HashMap::new();
    if tracing_enabled() && !span.is_disabled() {
        TraceContextPropagator::new().inject_context(&span.context(), &mut carrier);
    }
    carrier
}

/// `span`'s `traceparent`.
pub fn traceparent(span: &tracing::Span) -> Option<String> {
    inject(span).remove(TRACEPARENT)
}

/// The trace id (32 hex digits) in a `traceparent` value.
pub fn trace_id_of(traceparent: &str) -> Option<&str> {
    let mut parts = traceparent.split('-');
    let _version = parts.next()?;
    let id = parts.next()?;
    (id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())).then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_id_is_read_from_a_traceparent() {
        assert_eq!(
            trace_id_of("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        assert_eq!(trace_id_of("00-xyz-00f067aa0ba902b7-01"), None);
        assert_eq!(trace_id_of(""), None);
    }

    #[test]
    fn nothing_is_extracted_or_injected_when_tracing_is_off() {
        assert!(
            Parent::from_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
                .is_none()
        );
        assert!(inject(&tracing::Span::none()).is_empty());
    }
}
