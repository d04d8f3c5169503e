//! What the services log during a sale, in the production format: one JSON object a line,
//! naming the orders and their traces, and never a secret — no signing secret, no token, no
//! payment provider key or webhook secret, no payment signature.

use std::{
    io::Write,
    sync::{Arc, Mutex},
};

use flashsale_platform::{
    auth::DEV_SECRET,
    settings::TelemetrySettings,
    telemetry::{EnvFilter, init_to},
};
use serde_json::Value;

use crate::full_stack::FullStack;

/// Every line the services write, kept.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .map_err(|_| std::io::Error::other("log buffer poisoned"))?
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Every string in `v`, at any depth.
fn strings<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
    match v {
        Value::String(s) => out.push(s),
        Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
        Value::Object(o) => o.values().for_each(|x| strings(x, out)),
        _ => {}
    }
}

/// A run of at least 48 hexadecimal digits: an HMAC-SHA256 signature's length, longer than
/// any id the services log (a trace id is 32).
fn has_signature_like(s: &str) -> bool {
    let mut run = 0;
    for c in s.chars() {
        run = if c.is_ascii_hexdigit() { run + 1 } else { 0 };
        if run >= 48 {
            return true;
        }
    }
    false
}

#[tokio::test]
async fn a_sale_logs_json_lines_with_orders_and_traces_and_never_a_secret() {
    let captured = Captured::default();
    let writer = captured.clone();
    let settings = TelemetrySettings {
        log_format: "json".into(),
        ..Default::default()
    };
    // Debug and up from the services themselves; the libraries at info.
    let filter = EnvFilter::new(
        "debug,sqlx=info,lapin=info,amq_protocol=info,pinky_swear=info,h2=info,hyper=info,\
         hyper_util=info,tower=info,tonic=info,rustls=info,reqwest=info,opentelemetry=info",
    );
    let _telemetry = init_to(&settings, "logs-test", filter, move || writer.clone()).unwrap();

    let stack = FullStack::spawn(|_| {}).await;
    let run = stack
        .sale(&[
            "--sku",
            "CLI-LOGS-1",
            "--buyers",
            "40",
            "--stock",
            "20",
            "--concurrency",
            "8",
            "--pay",
            "0.5",
            "--never-pay",
            "0.25",
            "--pay-late",
            "0.25",
            "--max-duration-secs",
            "120",
            "--json",
        ])
        .await;
    assert!(run.ok, "the sale failed: {}", run.stderr);
    drop(stack);

    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.len() >= 50, "only {} log lines", lines.len());
    let mut with_order_and_trace = 0;
    for line in &lines {
        let v: Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(
            v["level"].is_string() && v["timestamp"].is_string(),
            "{line}"
        );
        if v.get("order_id").is_some() && v["trace_id"].as_str().is_some_and(|t| t.len() == 32) {
            with_order_and_trace += 1;
        }
        for secret in [
            DEV_SECRET,
            flashsale_contract::payment::DEV_WEBHOOK_SECRET,
            flashsale_contract::payment::DEV_PAYMENT_API_KEY,
            "Bearer ",
            // Every JWT starts with the base64 of `{"`.
            "eyJ",
        ] {
            assert!(
                !line.contains(secret),
                "a secret ({secret}) in the log: {line}"
            );
        }
        let mut values = Vec::new();
        strings(&v, &mut values);
        assert!(
            !values.iter().any(|s| has_signature_like(s)),
            "a signature-like value in the log: {line}"
        );
    }
    assert!(
        with_order_and_trace > 0,
        "no line names an order with its trace:\n{}",
        lines
            .iter()
            .take(40)
            .copied()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn a_signature_is_told_from_an_id() {
    assert!(has_signature_like(&"ab12".repeat(16)));
    assert!(!has_signature_like("4bf92f3577b34da6a3ce929d0e0e4736"));
    assert!(!has_signature_like("0195e7a2-5b7c-7d3e-8f00-123456789abc"));
}
