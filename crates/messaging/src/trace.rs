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
};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// Header a consumer reads the parent span from.
pub const TRACEPARENT: &str = "traceparent";

/// The current span's context as propagation headers (usually `traceparent` and maybe
/// `tracestate`); empty when there is no sampled context or no propagator is installed.
pub fn current_headers() -> BTreeMap<String, String> {
    let cx = tracing::Span::current().context();
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
    fn injector_writes_lowercase_long_strings() {
        let mut t = FieldTable::default();
        FieldTableInjector(&mut t).set("TraceParent", "00-abc".to_owned());
        assert_eq!(header_str(&t, "traceparent"), Some("00-abc"));
    }
}
