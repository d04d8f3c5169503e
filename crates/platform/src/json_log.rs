//! The production log format (`telemetry.log_format = "json"`): one JSON object per line and
//! event, with the event's own fields and those of every span it happened in (so an event deep
//! inside a request carries the request's `order_id`, `sku`, `user`), and the OpenTelemetry
//! `trace_id` and `span_id` of the span it happened in, to open the trace in a viewer:
//!
//! ```json
//! {"timestamp":"…","level":"INFO","target":"flashsale_order::app::intake","message":"…",
//!  "order_id":"…","sku":"WINE-1","span":"place_by","trace_id":"4bf9…","span_id":"00f0…"}
//! ```
//!
//! The event's fields win over its spans' where names clash, and an inner span's over an
//! outer one's.

use std::{
    fmt,
    sync::{Arc, OnceLock},
};

use opentelemetry::trace::TraceContextExt as _;
use serde_json::{Map, Value};
use tracing::{Dispatch, Event, Subscriber, dispatcher::WeakDispatch, field::Field};
use tracing_subscriber::{
    fmt::{
        FmtContext, FormatEvent, FormattedFields,
        format::{JsonFields, Writer},
        time::{FormatTime as _, SystemTime},
    },
    layer::Layer,
    registry::LookupSpan,
};

/// The format; install it with `fmt::layer().fmt_fields(JsonFields::new()).event_format(f)`
/// (the spans' fields must be recorded as JSON for the events to carry them), and
/// `f.dispatch_layer()` in the same subscriber (the trace is read through the subscriber).
#[derive(Clone, Debug, Default)]
pub struct JsonLog {
    dispatch: Arc<OnceLock<WeakDispatch>>,
}

impl JsonLog {
    pub fn new() -> Self {
        Self::default()
    }

    /// The layer that tells this format which subscriber it formats for.
    pub fn dispatch_layer(&self) -> DispatchOf {
        DispatchOf(self.dispatch.clone())
    }
}

/// Hands the subscriber it is registered in to its [`JsonLog`].
#[derive(Debug)]
pub struct DispatchOf(Arc<OnceLock<WeakDispatch>>);

impl<S: Subscriber> Layer<S> for DispatchOf {
    fn on_register_dispatch(&self, subscriber: &Dispatch) {
        let _ = self.0.set(subscriber.downgrade());
    }
}

impl<S> FormatEvent<S, JsonFields> for JsonLog
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, JsonFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut line = Map::new();
        let mut timestamp = String::new();
        if SystemTime
            .format_time(&mut Writer::new(&mut timestamp))
            .is_ok()
        {
            line.insert("timestamp".into(), timestamp.into());
        }
        let meta = event.metadata();
        line.insert("level".into(), meta.level().as_str().into());
        line.insert("target".into(), meta.target().into());
        // The trace first, while no span's extensions are borrowed here: reading the
        // OpenTelemetry context may need to borrow them itself.
        // The nearest traced span's: a `LOG_SCOPE` span is not traced (crate::trace).
        let ids = ctx.lookup_current().and_then(|span| {
            let dispatch = self.dispatch.get()?.upgrade()?;
            span.scope()
                .find_map(|s| tracing_opentelemetry::get_otel_context(&s.id(), &dispatch))
        });
        if let Some(scope) = ctx.event_scope() {
            let mut name = None;
            for span in scope.from_root() {
                name = Some(span.name());
                let ext = span.extensions();
                let Some(fields) = ext.get::<FormattedFields<JsonFields>>() else {
                    continue;
                };
                if let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(fields) {
                    line.extend(fields);
                }
            }
            if let Some(name) = name {
                line.insert("span".into(), name.into());
            }
        }
        event.record(&mut Visitor(&mut line));
        if let Some(cx) = ids {
            let span = cx.span();
            let sc = span.span_context();
            if sc.is_valid() {
                line.insert("trace_id".into(), sc.trace_id().to_string().into());
                line.insert("span_id".into(), sc.span_id().to_string().into());
            }
        }
        writeln!(writer, "{}", Value::Object(line))
    }
}

/// An event's fields as JSON values.
struct Visitor<'a>(&'a mut Map<String, Value>);

impl tracing::field::Visit for Visitor<'_> {
    fn record_f64(&mut self, field: &Field, value: f64) {
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
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0.insert(field.name().into(), value.to_string().into());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().into(), format!("{value:?}").into());
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    use tracing_subscriber::{fmt::MakeWriter, layer::SubscriberExt as _};

    use super::*;

    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Lines {
        type Writer = Lines;
        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }

    #[test]
    fn an_event_carries_its_spans_fields_and_its_trace() {
        let provider = SdkTracerProvider::builder().build();
        let lines = Lines::default();
        let format = JsonLog::new();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")))
            .with(format.dispatch_layer())
            .with(
                tracing_subscriber::fmt::layer()
                    .fmt_fields(JsonFields::new())
                    .event_format(format)
                    .with_writer(lines.clone()),
            );
        let (trace_id, span_id) = tracing::subscriber::with_default(subscriber, || {
            let outer = tracing::info_span!("grpc", order_id = "o-1", sku = "WINE");
            let _o = outer.enter();
            let inner = tracing::info_span!("place_by", sku = "WINE-2", user = "alice");
            let _i = inner.enter();
            tracing::info!(units = 3, "order accepted");
            let cx = inner.context();
            let sc = cx.span().span_context().clone();
            (sc.trace_id().to_string(), sc.span_id().to_string())
        });
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        let line: Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(line["message"], "order accepted");
        assert_eq!(line["units"], 3);
        assert_eq!(line["level"], "INFO");
        assert_eq!(line["order_id"], "o-1");
        assert_eq!(line["sku"], "WINE-2", "the inner span's field wins");
        assert_eq!(line["user"], "alice");
        assert_eq!(line["span"], "place_by");
        assert_eq!(line["trace_id"], trace_id.as_str());
        assert_eq!(line["span_id"], span_id.as_str());
        assert_eq!(trace_id.len(), 32);
        assert!(line["timestamp"].as_str().is_some_and(|t| t.contains('T')));
    }

    #[test]
    fn a_line_in_a_span_that_is_not_traced_names_the_nearest_traced_span() {
        use tracing_subscriber::Layer as _;
        let provider = SdkTracerProvider::builder().build();
        let lines = Lines::default();
        let format = JsonLog::new();
        let subscriber = tracing_subscriber::registry()
            .with(
                tracing_opentelemetry::layer()
                    .with_tracer(provider.tracer("test"))
                    .with_filter(tracing_subscriber::EnvFilter::new(
                        crate::telemetry::EXPORTED_SPANS,
                    )),
            )
            .with(format.dispatch_layer())
            .with(
                tracing_subscriber::fmt::layer()
                    .fmt_fields(JsonFields::new())
                    .event_format(format)
                    .with_writer(lines.clone()),
            );
        let (outer_sc, inner_sc, current_sc) =
            tracing::subscriber::with_default(subscriber, || {
                let outer = tracing::info_span!("grpc");
                let _o = outer.enter();
                let inner =
                    tracing::info_span!(target: "flashsale::log_scope", "place_by", sku = "WINE");
                let _i = inner.enter();
                tracing::info!("order accepted");
                (
                    outer.context().span().span_context().clone(),
                    inner.context().span().span_context().clone(),
                    crate::trace::current_context()
                        .span()
                        .span_context()
                        .clone(),
                )
            });
        assert!(outer_sc.is_valid());
        assert!(!inner_sc.is_valid(), "a log-scope span is not traced");
        assert_eq!(current_sc, outer_sc, "the context is the traced ancestor's");
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        let line: Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(line["sku"], "WINE");
        assert_eq!(line["span"], "place_by");
        assert_eq!(line["trace_id"], outer_sc.trace_id().to_string().as_str());
        assert_eq!(line["span_id"], outer_sc.span_id().to_string().as_str());
    }

    #[test]
    fn an_event_outside_any_span_has_no_trace() {
        let lines = Lines::default();
        let subscriber = tracing_subscriber::registry().with(
            tracing_subscriber::fmt::layer()
                .fmt_fields(JsonFields::new())
                .event_format(JsonLog::new())
                .with_writer(lines.clone()),
        );
        tracing::subscriber::with_default(subscriber, || tracing::warn!(n = 1, "alone"));
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        let line: Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(line["message"], "alone");
        assert!(
            line.get("trace_id").is_none() && line.get("span").is_none(),
            "{line}"
        );
    }
}
