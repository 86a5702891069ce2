//! JSON log lines with the trace and span ids of the current span:
//! `{"timestamp", "level", "target", "fields": {...}, "span": {...},
//! "trace_id", "span_id"}`, the shape of tracing-subscriber's JSON format
//! plus the ids (OpenTelemetry's log data model names them so).

use std::fmt;
use std::sync::{Arc, OnceLock};

use opentelemetry::trace::TraceContextExt;
use serde_json::{Map, Value};
use tracing::dispatcher::WeakDispatch;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// The formatter. It reads the OpenTelemetry context of the current span
/// through the subscriber it is installed in, given once that exists
/// (while an event is being formatted, `tracing` does not hand out the
/// current dispatcher).
#[derive(Clone, Default)]
pub(crate) struct JsonWithTrace {
    pub(crate) dispatch: Arc<OnceLock<WeakDispatch>>,
}

struct Fields(Map<String, Value>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().into(), Value::String(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0
            .insert(field.name().into(), Value::String(value.to_string()));
    }
}

impl<S, N> FormatEvent<S, N> for JsonWithTrace
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut line = Map::new();
        line.insert(
            "timestamp".into(),
            jiff::Timestamp::now().to_string().into(),
        );
        line.insert("level".into(), meta.level().as_str().into());
        line.insert("target".into(), meta.target().into());
        let mut fields = Fields(Map::new());
        event.record(&mut fields);
        line.insert("fields".into(), Value::Object(fields.0));
        if let Some(span) = ctx.lookup_current() {
            let mut current = Map::new();
            current.insert("name".into(), span.name().into());
            let extensions = span.extensions();
            if let Some(recorded) = extensions.get::<FormattedFields<N>>()
                && let Ok(Value::Object(map)) = serde_json::from_str::<Value>(recorded)
            {
                current.extend(map);
            }
            drop(extensions);
            line.insert("span".into(), Value::Object(current));
            if let Some(dispatch) = self.dispatch.get().and_then(WeakDispatch::upgrade)
                && let Some(cx) = tracing_opentelemetry::get_otel_context(&span.id(), &dispatch)
            {
                let otel = cx.span();
                let sc = otel.span_context();
                if sc.is_valid() {
                    line.insert("trace_id".into(), sc.trace_id().to_string().into());
                    line.insert("span_id".into(), sc.span_id().to_string().into());
                }
            }
        }
        let text = serde_json::to_string(&Value::Object(line)).map_err(|_| fmt::Error)?;
        writeln!(writer, "{text}")
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use opentelemetry::trace::TracerProvider;
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl Write for Buffer {
        fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend_from_slice(data);
            Ok(data.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_in_a_traced_span_carry_its_trace_and_span_ids() {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let format = JsonWithTrace::default();
        let subscriber = tracing_subscriber::registry()
            .with(
                tracing_subscriber::fmt::layer()
                    .event_format(format.clone())
                    .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
                    .with_writer(move || writer.clone()),
            )
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        let traceparent = tracing::subscriber::with_default(subscriber, || {
            tracing::dispatcher::get_default(|d| format.dispatch.set(d.downgrade()).ok());
            tracing::info!("outside");
            let span = tracing::info_span!("work", job = "a");
            let _entered = span.enter();
            tracing::info!(n = 3, "inside");
            let cx = tracing_opentelemetry::OpenTelemetrySpanExt::context(&span);
            let sc = cx.span().span_context().clone();
            (sc.trace_id().to_string(), sc.span_id().to_string())
        });
        let text = String::from_utf8(buffer.0.lock().unwrap_or_else(|p| p.into_inner()).clone())
            .unwrap_or_default();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or(Value::Null))
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(lines[0]["fields"]["message"], "outside");
        assert!(lines[0].get("trace_id").is_none(), "{text}");
        assert_eq!(lines[1]["fields"]["n"], 3);
        assert_eq!(lines[1]["span"]["name"], "work");
        assert_eq!(lines[1]["span"]["job"], "a");
        assert_eq!(lines[1]["trace_id"], traceparent.0.as_str(), "{text}");
        assert_eq!(lines[1]["span_id"], traceparent.1.as_str(), "{text}");
    }
}
