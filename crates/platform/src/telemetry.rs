//! Logs and traces: `tracing` with an `EnvFilter` from `RUST_LOG` (default `info,sqlx=warn`), pretty or
//! JSON output, optional OTLP/gRPC span export, and the W3C trace-context propagator installed
//! globally so gRPC calls and AMQP messages carry `traceparent`.
//!
//! The standard OpenTelemetry variables apply: `OTEL_SERVICE_NAME` names the service in its
//! spans (default: the service's own name); `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_ENDPOINT` turns export on where `telemetry.otlp_endpoint` is empty (the
//! setting wins where both are given); `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG` pick
//! the sampler (default: every trace, or as the caller's `traceparent` says, where spans are
//! exported; where they are not, spans get ids, so trace context still propagates and logs name
//! their trace, but only a trace the caller sampled is recorded); and `OTEL_SDK_DISABLED=true`
//! turns tracing off: no span is exported, recorded or given ids.

use anyhow::Context as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::{
    Resource,
    propagation::TraceContextPropagator,
    trace::{Sampler, SdkTracerProvider},
};
pub use tracing_subscriber::EnvFilter;
use tracing_subscriber::{Layer as _, layer::SubscriberExt as _, util::SubscriberInitExt as _};

/// The spans exported where spans are exported, whatever the log filter: every span at `info`
/// and above (the services' own spans, per request, batch, event and call on behalf of one)
/// except those that only give log lines their fields ([`crate::trace::LOG_SCOPE`]).
pub const EXPORTED_SPANS: &str = "info,flashsale::log_scope=off";

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
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));
    init_to(settings, service, filter, std::io::stdout)
}

/// [`init`] with the events `filter` lets through written to `writer` (a test reads what the
/// services log).
pub fn init_to<W>(
    settings: &TelemetrySettings,
    service: &'static str,
    filter: EnvFilter,
    writer: W,
) -> anyhow::Result<TelemetryGuard>
where
    W: for<'a> tracing_subscriber::fmt::MakeWriter<'a> + Send + Sync + 'static,
{
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());

    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    // The resource's own detectors read OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES.
    let resource = if env("OTEL_SERVICE_NAME").is_some() {
        Resource::builder().build()
    } else {
        Resource::builder().with_service_name(service).build()
    };
    let export = match export_to(settings, &env) {
        Export::Nowhere => None,
        Export::Setting(endpoint) => Some(
            opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint)
                .build(),
        ),
        // The exporter reads the endpoint from the environment itself.
        Export::Environment => Some(
            opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .build(),
        ),
    };
    // Spans get ids even without export, so trace context is propagated; the sampler comes
    // from OTEL_TRACES_SAMPLER where it is set. Without export, recording a trace of our own
    // would be work thrown away: only a caller's sampled trace is.
    let builder = SdkTracerProvider::builder().with_resource(resource);
    let builder = if export.is_none() && env("OTEL_TRACES_SAMPLER").is_none() {
        builder.with_sampler(Sampler::ParentBased(Box::new(Sampler::AlwaysOff)))
    } else {
        builder
    };
    let exported = export.is_some();
    let provider = match export {
        None => builder.build(),
        Some(exporter) => builder
            .with_batch_exporter(exporter.context("build OTLP span exporter")?)
            .build(),
    };
    // The log level (RUST_LOG) filters what is logged, not what is traced: exported spans are
    // the services' own, at `info` ([`EXPORTED_SPANS`]), whatever the logs show. Where nothing
    // is exported, spans serve the logs and the trace context only, and follow the log filter.
    let span_filter = if exported {
        EnvFilter::new(EXPORTED_SPANS)
    } else {
        EnvFilter::new(format!("{filter},{}=off", crate::trace::LOG_SCOPE))
    };
    let disabled = env("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
    // What every span costs is paid for the unsampled ones too, on every poll of an
    // instrumented future: no busy/idle clock reads at each enter and exit, no OpenTelemetry
    // context attached at each enter (nothing here reads `Context::current()`: trace context
    // is taken from the span itself), no thread, source-location or target attributes.
    let otel = (!disabled).then(|| {
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer(service))
            .with_tracked_inactivity(false)
            .with_context_activation(false)
            .with_threads(false)
            .with_location(false)
            .with_target(false)
            .with_filter(span_filter)
    });
    opentelemetry::global::set_tracer_provider(provider.clone());

    let registry = tracing_subscriber::registry().with(otel);
    let result = if settings.log_format == "json" {
        // One JSON line per event, with its spans' fields and its trace (json_log.rs).
        let format = crate::json_log::JsonLog::new();
        let logs = format.dispatch_layer().and_then(
            tracing_subscriber::fmt::layer()
                .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
                .event_format(format)
                .with_writer(writer),
        );
        registry.with(logs.with_filter(filter)).try_init()
    } else {
        registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(writer)
                    .with_filter(filter),
            )
            .try_init()
    };
    result.context("install tracing subscriber")?;
    Ok(TelemetryGuard {
        provider: Some(provider),
    })
}

/// Where spans go.
#[derive(Debug, PartialEq, Eq)]
enum Export {
    Nowhere,
    /// `telemetry.otlp_endpoint`.
    Setting(String),
    /// The endpoint the standard variables name.
    Environment,
}

/// The setting first, then the standard variables; nothing when `OTEL_SDK_DISABLED` is true.
fn export_to(settings: &TelemetrySettings, env: &dyn Fn(&str) -> Option<String>) -> Export {
    if env("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return Export::Nowhere;
    }
    if !settings.otlp_endpoint.is_empty() {
        return Export::Setting(settings.otlp_endpoint.clone());
    }
    if env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some()
        || env("OTEL_EXPORTER_OTLP_ENDPOINT").is_some()
    {
        return Export::Environment;
    }
    Export::Nowhere
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(endpoint: &str) -> TelemetrySettings {
        TelemetrySettings {
            otlp_endpoint: endpoint.into(),
            ..Default::default()
        }
    }

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| {
            pairs
                .iter()
                .find(|(k, v)| k == name && !v.trim().is_empty())
                .map(|(_, v)| v.clone())
        }
    }

    #[test]
    fn spans_go_where_the_setting_or_else_the_standard_variables_say() {
        assert_eq!(export_to(&settings(""), &vars(&[])), Export::Nowhere);
        let endpoint = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")];
        assert_eq!(
            export_to(&settings(""), &vars(&endpoint)),
            Export::Environment
        );
        let traces = [("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:4317")];
        assert_eq!(
            export_to(&settings(""), &vars(&traces)),
            Export::Environment
        );
        assert_eq!(
            export_to(&settings("http://set:4317"), &vars(&endpoint)),
            Export::Setting("http://set:4317".into())
        );
        // Empty variables count as unset; the SDK switch turns everything off.
        let empty = [("OTEL_EXPORTER_OTLP_ENDPOINT", " ")];
        assert_eq!(export_to(&settings(""), &vars(&empty)), Export::Nowhere);
        let off = [("OTEL_SDK_DISABLED", "TRUE"), endpoint[0]];
        assert_eq!(
            export_to(&settings("http://set:4317"), &vars(&off)),
            Export::Nowhere
        );
        let not_off = [("OTEL_SDK_DISABLED", "false"), endpoint[0]];
        assert_eq!(
            export_to(&settings(""), &vars(&not_off)),
            Export::Environment
        );
    }
}
