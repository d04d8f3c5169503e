//! `flashsale trace-sink`: a stand-in for an OpenTelemetry collector that receives the services'
//! OTLP trace exports and keeps them until it stops (SIGINT or SIGTERM), then prints how many
//! spans and traces it received, as JSON. The benchmark exports to it to measure what tracing
//! costs the services; it is also a quick check that a deployment's export works.

use std::{collections::HashSet, net::SocketAddr, process::ExitCode};

use flashsale_test_support::otlp::OtlpReceiver;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Where to listen for OTLP/gRPC trace exports.
    #[arg(long, default_value = "127.0.0.1:4317")]
    addr: SocketAddr,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    // Listening for the signals first: one that comes once spans can arrive is a stop.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let receiver = OtlpReceiver::start_on(args.addr).await?;
    eprintln!("trace-sink: receiving OTLP traces on {}", args.addr);
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    let spans = receiver.spans();
    let traces: HashSet<&str> = spans.iter().map(|s| s.trace_id.as_str()).collect();
    let services: std::collections::BTreeMap<&str, usize> =
        spans.iter().fold(Default::default(), |mut m, s| {
            *m.entry(s.service.as_str()).or_default() += 1;
            m
        });
    println!(
        "{}",
        serde_json::json!({
            "spans": spans.len(),
            "traces": traces.len(),
            "spans_by_service": services,
        })
    );
    Ok(ExitCode::SUCCESS)
}
