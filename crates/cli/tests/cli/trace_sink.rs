//! `flashsale trace-sink`: spans exported to it over OTLP are counted, by trace and by service,
//! when it stops; a bad address is refused naming the flag.

use std::time::Duration;

use opentelemetry_proto::tonic::{
    collector::trace::v1::{ExportTraceServiceRequest, trace_service_client::TraceServiceClient},
    common::v1::{AnyValue, KeyValue, any_value::Value},
    resource::v1::Resource,
    trace::v1::{ResourceSpans, ScopeSpans, Span},
};

use crate::helpers::{command, flashsale};

fn span(trace: u8, id: u8) -> Span {
    Span {
        trace_id: vec![trace; 16],
        span_id: vec![id; 8],
        name: format!("span {id}"),
        ..Default::default()
    }
}

fn from(service: &str, spans: Vec<Span>) -> ResourceSpans {
    ResourceSpans {
        resource: Some(Resource {
            attributes: vec![KeyValue {
                key: "service.name".into(),
                value: Some(AnyValue {
                    value: Some(Value::StringValue(service.into())),
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        scope_spans: vec![ScopeSpans {
            spans,
            ..Default::default()
        }],
        ..Default::default()
    }
}

#[tokio::test]
async fn the_sink_counts_what_it_received_when_it_stops() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut sink = command(&["trace-sink", "--addr", &format!("127.0.0.1:{port}")]);
    sink.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let sink = sink.spawn().unwrap();
    let url = format!("http://127.0.0.1:{port}");
    let mut client =
        flashsale_test_support::eventually(Duration::from_secs(30), "the sink listening", || {
            let url = url.clone();
            async move { TraceServiceClient::connect(url).await.ok() }
        })
        .await
        .unwrap();
    let request = ExportTraceServiceRequest {
        resource_spans: vec![
            from("order", vec![span(1, 1), span(1, 2)]),
            from("outbound", vec![span(2, 3)]),
        ],
    };
    client.export(request).await.unwrap();
    let pid = sink.id().unwrap().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let out = sink.wait_with_output().await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["spans"], 3);
    assert_eq!(report["traces"], 2);
    assert_eq!(report["spans_by_service"]["order"], 2);
    assert_eq!(report["spans_by_service"]["outbound"], 1);
}

#[tokio::test]
async fn a_bad_address_is_refused_naming_the_flag() {
    let run = flashsale(&["trace-sink", "--addr", "nowhere"], "http://127.0.0.1:1").await;
    assert!(!run.ok);
    assert!(run.stderr.contains("--addr"), "{}", run.stderr);
}
