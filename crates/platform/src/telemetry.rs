//! Logs and traces: `tracing` with an `EnvFilter` from `RUST_LOG` (default `info,sqlx=warn`), pretty or
//! JSON output, optional OTLP/gRPC span export, and the W3C trace-context propagator installed
//! globally so gRPC calls and AMQP messages carry `traceparent`.

use anyhow::Context as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::{Resource, propagation::TraceContextPropagator, trace::SdkTracerProvider};
use tracing_subscriber::{EnvFilter, layer::SubscriberExt as _, util::SubscriberInitExt as _};

use crate::settings::TelemetrySettings;

/// Held by `main`; flushes pending spans when dropped.
#[must_use = "dropping the guard stops span export"]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take()
            && let Err(e) = p.shutdown()
        {
            eprintln!("telemetry: span exporter shutdown failed: {e}");
        }
    }
}

/// Installs the global subscriber and propagator. Call once, from `main`, inside the runtime.
pub fn init(settings: &TelemetrySettings, service: &'static str) -> anyhow::Result<TelemetryGuard> {
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));

    let provider = if settings.otlp_endpoint.is_empty() {
        // Spans still get ids, so trace context is propagated even without export.
        SdkTracerProvider::builder()
            .with_resource(Resource::builder().with_service_name(service).build())
            .build()
    } else {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(settings.otlp_endpoint.clone())
            .build()
            .context("build OTLP span exporter")?;
        SdkTracerProvider::builder()
            .with_resource(Resource::builder().with_service_name(service).build())
            .with_batch_exporter(exporter)
            .build()
    };
    let otel = tracing_opentelemetry::layer().with_tracer(provider.tracer(service));
    opentelemetry::global::set_tracer_provider(provider.clone());

    let registry = tracing_subscriber::registry().with(filter).with(otel);
    let result = if settings.log_format == "json" {
        registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_current_span(true),
            )
            .try_init()
    } else {
        registry.with(tracing_subscriber::fmt::layer()).try_init()
    };
    result.context("install tracing subscriber")?;
    Ok(TelemetryGuard {
        provider: Some(provider),
    })
}
