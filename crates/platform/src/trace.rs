//! W3C trace context across gRPC: servers continue the caller's trace (a span per request whose
//! parent is the incoming `traceparent`, named by its method, with OpenTelemetry's RPC
//! attributes), clients inject the current span's context.
//!
//! Not every span is traced. Spans whose target is [`LOG_SCOPE`] name what a piece of work is
//! about (an order, a SKU) so that the log lines inside them carry it; the trace already has a
//! span per request, message, batch and call on behalf of one, and these would only add cost:
//! each traced span is built, sampled and ended, sampled or not. [`current_context`] gives the
//! trace context of the nearest traced span.

use std::task::{Context, Poll};

use opentelemetry::propagation::{Extractor, Injector};
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

struct MetadataInjector<'a>(&'a mut tonic::metadata::MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(k), Ok(v)) = (
            tonic::metadata::MetadataKey::from_bytes(key.as_bytes()),
            tonic::metadata::MetadataValue::try_from(value.as_str()),
        ) {
            self.0.insert(k, v);
        }
    }
}

/// The target of spans that give log lines their fields and are not traced (see the module's
/// documentation): `#[tracing::instrument(target = "flashsale::log_scope", …)]`.
pub const LOG_SCOPE: &str = "flashsale::log_scope";

/// The OpenTelemetry context of the current span, or of its nearest ancestor that is traced
/// (a [`LOG_SCOPE`] span has none of its own); an empty context outside any traced span or
/// without an OpenTelemetry layer.
pub fn current_context() -> opentelemetry::Context {
    tracing::dispatcher::get_default(|dispatch| {
        let current = dispatch.current_span();
        let (Some(id), Some(registry)) = (
            current.id(),
            dispatch.downcast_ref::<tracing_subscriber::Registry>(),
        ) else {
            return opentelemetry::Context::new();
        };
        let Some(span) = tracing_subscriber::registry::LookupSpan::span(registry, id) else {
            return opentelemetry::Context::new();
        };
        span.scope()
            .find_map(|s| tracing_opentelemetry::get_otel_context(&s.id(), dispatch))
            .unwrap_or_default()
    })
}

/// Writes the current span's trace context into outgoing request metadata.
pub fn inject_current(metadata: &mut tonic::metadata::MetadataMap) {
    let cx = current_context();
    opentelemetry::global::get_text_map_propagator(|p| {
        p.inject_context(&cx, &mut MetadataInjector(metadata));
    });
}

/// A tonic client interceptor that injects the current trace context into every call.
#[derive(Clone, Copy, Debug, Default)]
pub struct InjectTraceContext;

impl tonic::service::Interceptor for InjectTraceContext {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        inject_current(request.metadata_mut());
        Ok(request)
    }
}

/// Tower layer for the server: one span per request, child of the incoming `traceparent`.
#[derive(Clone, Copy, Debug, Default)]
pub struct TraceContextLayer;

impl<S> tower::Layer<S> for TraceContextLayer {
    type Service = TraceContextService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        TraceContextService { inner }
    }
}

#[derive(Clone, Debug)]
pub struct TraceContextService<S> {
    inner: S,
}

impl<S, B, R> tower::Service<http::Request<B>> for TraceContextService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let parent = opentelemetry::global::get_text_map_propagator(|p| {
            p.extract(&HeaderExtractor(req.headers()))
        });
        // Named `pkg.Service/Method`, as OpenTelemetry's RPC conventions name a server span.
        let method = crate::rpc_metrics::method_of(req.uri().path());
        let (service, name) = method.split_once('/').unwrap_or(("unknown", "unknown"));
        let span = tracing::info_span!(
            "grpc",
            otel.name = %method,
            otel.kind = "server",
            rpc.system = "grpc",
            rpc.service = %service,
            rpc.method = %name,
            rpc.grpc.status_code = tracing::field::Empty,
        );
        let _ = span.set_parent(parent);
        let fut = self.inner.call(req);
        let answered = span.clone();
        Box::pin(
            async move {
                let result = fut.await;
                if let Ok(response) = &result {
                    let code = crate::rpc_metrics::status_number(response.headers());
                    answered.record("rpc.grpc.status_code", code);
                }
                result
            }
            .instrument(span),
        )
    }
}
