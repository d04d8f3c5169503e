//! W3C trace context (`traceparent`, `tracestate`) carried in AMQP headers and outbox rows.
//!
//! No maintained crate bridges OpenTelemetry propagation and lapin, so this is a small
//! [`Injector`] / [`Extractor`] over [`FieldTable`]. It uses the *global* text-map propagator:
//! the service's telemetry set-up must install `TraceContextPropagator` (without it nothing is
//! injected and consumers start fresh traces).

use std::collections::BTreeMap;

use lapin::types::{AMQPValue, FieldTable, ShortString};
use opentelemetry::{
    Context,
    propagation::{Extractor, Injector},
    trace::TraceContextExt as _,
};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// Header a consumer reads the parent span from.
pub const TRACEPARENT: &str = "traceparent";

/// The current span's context as propagation headers (usually `traceparent` and maybe
/// `tracestate`); empty when there is no sampled context or no propagator is installed.
pub fn current_headers() -> BTreeMap<String, String> {
    let cx = flashsale_platform::trace::current_context();
    let mut map = MapInjector(BTreeMap::new());
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&cx, &mut map));
    map.0
}

/// The OpenTelemetry context carried by `headers` (an empty context when there is none).
pub fn extract(headers: Option<&FieldTable>) -> Context {
    match headers {
        Some(h) => {
            let ex = FieldTableExtractor::new(h);
            opentelemetry::global::get_text_map_propagator(|p| p.extract(&ex))
        }
        None => Context::new(),
    }
}

/// Whether `headers` carry a trace that is recorded (a `traceparent` whose sampled flag is
/// set): work done for it is worth keeping in it, even at the cost of batching it less.
pub fn is_sampled(headers: &BTreeMap<String, String>) -> bool {
    headers
        .get(TRACEPARENT)
        .and_then(|tp| tp.rsplit('-').next())
        .and_then(|flags| u8::from_str_radix(flags, 16).ok())
        .is_some_and(|flags| flags & 1 == 1)
}

/// The trace id (32 lowercase hex digits) of a `traceparent` header value; `None` for one that
/// is malformed or names the invalid all-zero trace.
pub fn traceparent_trace_id(traceparent: &str) -> Option<String> {
    let mut parts = traceparent.split('-');
    let (_version, id) = (parts.next()?, parts.next()?);
    let hex = id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit());
    (hex && id.bytes().any(|b| b != b'0')).then(|| id.to_ascii_lowercase())
}

/// The trace id `headers` carry ([`traceparent_trace_id`] of their `traceparent`).
pub fn trace_id(headers: &BTreeMap<String, String>) -> Option<String> {
    traceparent_trace_id(headers.get(TRACEPARENT)?)
}

/// A span continuing the trace of `headers` (captured with [`current_headers`] where some work
/// was caused), for work a batch does on behalf of one of its callers: what the work calls or
/// writes then carries that caller's trace, not the batch's. Without headers it is a child of
/// the current span.
pub fn on_behalf_of(headers: &BTreeMap<String, String>) -> tracing::Span {
    let span = tracing::info_span!("on_behalf_of", otel.name = "on behalf of");
    if !headers.is_empty() {
        let parent =
            opentelemetry::global::get_text_map_propagator(|p| p.extract(&MapExtractor(headers)));
        // Without an OpenTelemetry layer there is no parent to set; the span still logs.
        let _ = span.set_parent(parent);
        // Linked to the batch it runs in.
        span.add_link(
            flashsale_platform::trace::current_context()
                .span()
                .span_context()
                .clone(),
        );
    }
    span
}

/// Copies string `headers` into an AMQP header table as long strings; keys longer than an AMQP
/// short string are skipped.
pub(crate) fn insert_strings<'a>(
    table: &mut FieldTable,
    headers: impl IntoIterator<Item = (&'a String, &'a String)>,
) {
    for (k, v) in headers {
        if let Ok(key) = ShortString::try_new(k.as_str()) {
            table.insert(key, AMQPValue::LongString(v.as_str().into()));
        }
    }
}

/// Reads a string header, accepting both long and short strings.
pub(crate) fn header_str<'a>(headers: &'a FieldTable, key: &str) -> Option<&'a str> {
    match headers.inner().get(key)? {
        AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok(),
        AMQPValue::ShortString(s) => Some(s.as_str()),
        _ => None,
    }
}

// === impl MapInjector ===

struct MapInjector(BTreeMap<String, String>);

impl Injector for MapInjector {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key.to_ascii_lowercase(), value);
    }
}

// === impl MapExtractor ===

struct MapExtractor<'a>(&'a BTreeMap<String, String>);

impl Extractor for MapExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

// === impl FieldTableInjector ===

/// Writes propagation headers into an AMQP header table as long strings.
pub struct FieldTableInjector<'a>(pub &'a mut FieldTable);

impl Injector for FieldTableInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let Ok(key) = ShortString::try_new(key.to_ascii_lowercase()) {
            self.0.insert(key, AMQPValue::LongString(value.into()));
        }
    }
}

// === impl FieldTableExtractor ===

/// Reads propagation headers from an AMQP header table (long or short strings).
pub struct FieldTableExtractor<'a>(&'a FieldTable);

impl<'a> FieldTableExtractor<'a> {
    /// Wraps `headers`.
    pub fn new(headers: &'a FieldTable) -> Self {
        Self(headers)
    }
}

impl Extractor for FieldTableExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        header_str(self.0, key)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.inner().keys().map(ShortString::as_str).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_names_its_trace_and_a_malformed_one_none() {
        let id = "4bf92f3577b34da6a3ce929d0e0e4736";
        let tp = format!("00-{}-00f067aa0ba902b7-01", id.to_uppercase());
        assert_eq!(traceparent_trace_id(&tp).as_deref(), Some(id));
        let headers = BTreeMap::from([(TRACEPARENT.to_owned(), tp)]);
        assert_eq!(trace_id(&headers).as_deref(), Some(id));
        for bad in [
            "",
            "00",
            "00-4bf92f3577b34da6-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        ] {
            assert_eq!(traceparent_trace_id(bad), None, "{bad}");
        }
        assert_eq!(trace_id(&BTreeMap::new()), None);
    }

    #[test]
    fn extractor_reads_long_and_short_strings() {
        let mut t = FieldTable::default();
        t.insert("a".into(), AMQPValue::LongString("x".into()));
        t.insert("b".into(), AMQPValue::ShortString("y".into()));
        t.insert("c".into(), AMQPValue::LongInt(3));
        let ex = FieldTableExtractor::new(&t);
        assert_eq!(ex.get("a"), Some("x"));
        assert_eq!(ex.get("b"), Some("y"));
        assert_eq!(ex.get("c"), None);
        assert_eq!(ex.keys(), vec!["a", "b", "c"]);
    }

    #[test]
    fn a_trace_is_sampled_when_its_traceparent_says_so() {
        let tp = |v: &str| BTreeMap::from([(TRACEPARENT.to_owned(), v.to_owned())]);
        let id = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331";
        assert!(is_sampled(&tp(&format!("{id}-01"))));
        assert!(is_sampled(&tp(&format!("{id}-03"))));
        assert!(!is_sampled(&tp(&format!("{id}-00"))));
        assert!(!is_sampled(&tp(&format!("{id}-zz"))));
        assert!(!is_sampled(&BTreeMap::new()));
    }

    #[test]
    fn injector_writes_lowercase_long_strings() {
        let mut t = FieldTable::default();
        FieldTableInjector(&mut t).set("TraceParent", "00-abc".to_owned());
        assert_eq!(header_str(&t, "traceparent"), Some("00-abc"));
    }
}
