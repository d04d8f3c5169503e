//! The gRPC server every service runs: its business services plus `grpc.health.v1.Health`,
//! server reflection (`v1` and `v1alpha`, so both current grpcurl and 1.8 work), a per-request
//! deadline, W3C trace-context extraction, and graceful shutdown.

use std::{future::Future, net::SocketAddr, time::Duration};

use anyhow::Context as _;
use tokio::net::TcpListener;
use tonic::{
    server::NamedService,
    service::{Routes, RoutesBuilder},
    transport::{Server, server::TcpIncoming},
};
use tonic_health::{ServingStatus, server::HealthReporter};

use crate::{settings::GrpcSettings, trace::TraceContextLayer};

/// Binds the configured address (port 0 picks a free port, as tests do).
pub async fn bind(settings: &GrpcSettings) -> anyhow::Result<TcpListener> {
    let addr: SocketAddr = settings
        .addr
        .parse()
        .with_context(|| format!("parse grpc.addr `{}`", settings.addr))?;
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("bind gRPC listener on {addr}"))
}

/// Routes of a service under construction: health and reflection are always there.
pub struct ServerRoutes {
    routes: RoutesBuilder,
    health: HealthReporter,
    names: Vec<&'static str>,
}

impl Default for ServerRoutes {
    fn default() -> Self {
        Self::new()
    }
}

impl ServerRoutes {
    pub fn new() -> Self {
        let (health, health_service) = tonic_health::server::health_reporter();
        let mut routes = RoutesBuilder::default();
        routes.add_service(health_service);
        Self {
            routes,
            health,
            names: Vec::new(),
        }
    }

    /// Adds a business service; it reports SERVING once the server runs.
    pub fn with_service<S>(mut self, svc: S) -> Self
    where
        S: tower::Service<http::Request<tonic::body::Body>, Error = std::convert::Infallible>
            + NamedService
            + Clone
            + Send
            + Sync
            + 'static,
        S::Response: axum::response::IntoResponse,
        S::Future: Send + 'static,
    {
        self.names.push(S::NAME);
        self.routes.add_service(svc);
        self
    }

    /// The health reporter, to flip services to NOT_SERVING (e.g. while a dependency is down).
    pub fn health(&self) -> HealthReporter {
        self.health.clone()
    }

    fn finish(mut self) -> anyhow::Result<(Routes, HealthReporter, Vec<&'static str>)> {
        let v1 = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(flashsale_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()
            .context("build reflection v1")?;
        let v1alpha = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(flashsale_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1alpha()
            .context("build reflection v1alpha")?;
        self.routes.add_service(v1);
        self.routes.add_service(v1alpha);
        Ok((self.routes.routes(), self.health, self.names))
    }
}

/// Serves `routes` on `listener` until `shutdown` resolves, then drains in-flight requests.
pub async fn serve(
    listener: TcpListener,
    settings: &GrpcSettings,
    routes: ServerRoutes,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let (routes, health, names) = routes.finish()?;
    for name in &names {
        health
            .set_service_status(*name, ServingStatus::Serving)
            .await;
    }
    health.set_service_status("", ServingStatus::Serving).await;
    let addr = listener.local_addr().context("gRPC listener address")?;
    tracing::info!(%addr, services = ?names, "gRPC server listening");
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let shutdown = async move {
        shutdown.await;
        for name in &names {
            health
                .set_service_status(*name, ServingStatus::NotServing)
                .await;
        }
        health
            .set_service_status("", ServingStatus::NotServing)
            .await;
    };
    Server::builder()
        .timeout(Duration::from_millis(settings.request_timeout_ms))
        .layer(TraceContextLayer)
        .add_routes(routes)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
        .context("serve gRPC")
}

/// A channel to another service that connects on first use (so a service starts even while
/// the one it calls is down; calls then fail `UNAVAILABLE`).
pub fn lazy_channel(url: &str, timeout: Duration) -> anyhow::Result<tonic::transport::Channel> {
    Ok(tonic::transport::Endpoint::from_shared(url.to_owned())
        .with_context(|| format!("parse upstream URL `{url}`"))?
        .connect_timeout(Duration::from_secs(2))
        .timeout(timeout)
        .tcp_nodelay(true)
        .connect_lazy())
}

/// `message` as a call to another service: its service token and the current trace context.
pub fn service_request<T>(
    message: T,
    token: &crate::auth::ServiceToken,
) -> Result<tonic::Request<T>, crate::ApiError> {
    let mut req = tonic::Request::new(message);
    let bearer = format!("Bearer {}", token.get()?).parse().map_err(|_| {
        crate::ApiError::internal(anyhow::anyhow!("service token is not valid metadata"))
    })?;
    req.metadata_mut().insert("authorization", bearer);
    crate::trace::inject_current(req.metadata_mut());
    Ok(req)
}
