//! The gRPC server every service runs: its business services plus `grpc.health.v1.Health`,
//! server reflection (`v1` and `v1alpha`, so both current grpcurl and 1.8 work), a per-request
//! deadline, W3C trace-context extraction, load shedding (`crate::shed`), the contract's status
//! for a request that cannot be decoded (`crate::decode`), and graceful shutdown.
//!
//! Reflection lists only the services this server answers, but describes the whole contract
//! (every message, and the `google.rpc` error details a refusal carries), so a client can
//! decode any detail it receives (docs/architecture.md#the-grpc-contract).

use std::{future::Future, net::SocketAddr, time::Duration};

use anyhow::Context as _;
use tokio::net::TcpListener;
use tonic::{
    server::NamedService,
    service::{Routes, RoutesBuilder},
    transport::{Server, server::TcpIncoming},
};
use tonic_health::{ServingStatus, server::HealthReporter};

use crate::{
    decode::DecodeStatusLayer, rpc_metrics::RpcMetricsLayer, settings::GrpcSettings,
    shed::ShedLayer, tls::GrpcTlsSettings, trace::TraceContextLayer,
};

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

    /// Every service the finished server answers, as reflection lists them: the business
    /// services added, health, and both reflection versions.
    fn listed_services(&self) -> Vec<&'static str> {
        let mut listed = self.names.clone();
        listed.extend([
            tonic_health::pb::health_server::SERVICE_NAME,
            tonic_reflection::pb::v1::server_reflection_server::SERVICE_NAME,
            tonic_reflection::pb::v1alpha::server_reflection_server::SERVICE_NAME,
        ]);
        listed
    }

    /// A reflection builder that lists `listed` and describes the whole contract, health and
    /// both reflection versions (so each version can describe every service it lists).
    fn reflection<'b>(listed: &[&'static str]) -> tonic_reflection::server::Builder<'b> {
        let builder = tonic_reflection::server::Builder::configure()
            .include_reflection_service(false)
            .register_encoded_file_descriptor_set(flashsale_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(
                tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
            );
        listed
            .iter()
            .fold(builder, |b, name| b.with_service_name(*name))
    }

    fn finish(mut self) -> anyhow::Result<(Routes, HealthReporter, Vec<&'static str>)> {
        let listed = self.listed_services();
        let v1 = Self::reflection(&listed)
            .build_v1()
            .context("build reflection v1")?;
        let v1alpha = Self::reflection(&listed)
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
    let tls = settings.tls.server("grpc.tls")?;
    tracing::info!(
        %addr,
        services = ?names,
        tls = tls.is_some(),
        mutual_tls = !settings.tls.client_ca_file.is_empty(),
        "gRPC server listening"
    );
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
    let mut builder = Server::builder();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls).context("gRPC server TLS")?;
    }
    builder
        .timeout(Duration::from_millis(settings.request_timeout_ms))
        .layer(TraceContextLayer)
        .layer(RpcMetricsLayer)
        .layer(ShedLayer::new(settings.max_concurrent_requests))
        .layer(DecodeStatusLayer)
        .add_routes(routes)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
        .context("serve gRPC")
}

/// A channel to another service that connects on first use (so a service starts even while
/// the one it calls is down; calls then fail `UNAVAILABLE`). An `https://` URL is reached over
/// TLS with `tls`'s CA and client certificate, never in plain text.
pub fn lazy_channel(
    url: &str,
    timeout: Duration,
    tls: &GrpcTlsSettings,
) -> anyhow::Result<tonic::transport::Channel> {
    Ok(endpoint(url, tls)?
        .connect_timeout(Duration::from_secs(2))
        .timeout(timeout)
        .tcp_nodelay(true)
        .connect_lazy())
}

/// The endpoint of `url`, with `tls`'s client configuration when the URL is `https://`.
pub fn endpoint(url: &str, tls: &GrpcTlsSettings) -> anyhow::Result<tonic::transport::Endpoint> {
    let endpoint = tonic::transport::Endpoint::from_shared(url.to_owned())
        .with_context(|| format!("parse upstream URL `{url}`"))?;
    if endpoint.uri().scheme_str() == Some("https") {
        let config = tls.client("grpc.tls")?;
        return endpoint
            .tls_config(config)
            .with_context(|| format!("TLS for `{url}`"));
    }
    Ok(endpoint)
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use flashsale_proto::outbound::v1::{
        GetShipmentRequest, GetShipmentResponse, ListShipmentsRequest, ListShipmentsResponse,
        outbound_service_server::{OutboundService, OutboundServiceServer},
    };
    use prost::Message as _;
    use tonic::{Request, Response, Status};
    use tonic_reflection::pb::{v1, v1alpha};

    use super::*;

    /// A business service that answers nothing: the test is about what reflection lists.
    struct NoShipments;

    #[tonic::async_trait]
    impl OutboundService for NoShipments {
        async fn get_shipment(
            &self,
            _: Request<GetShipmentRequest>,
        ) -> Result<Response<GetShipmentResponse>, Status> {
            Err(Status::unimplemented("test"))
        }

        async fn list_shipments(
            &self,
            _: Request<ListShipmentsRequest>,
        ) -> Result<Response<ListShipmentsResponse>, Status> {
            Err(Status::unimplemented("test"))
        }
    }

    async fn v1_ask(
        channel: tonic::transport::Channel,
        requests: Vec<v1::server_reflection_request::MessageRequest>,
    ) -> Vec<v1::server_reflection_response::MessageResponse> {
        let requests: Vec<_> = requests
            .into_iter()
            .map(|m| v1::ServerReflectionRequest {
                host: String::new(),
                message_request: Some(m),
            })
            .collect();
        let count = requests.len();
        let mut stream = v1::server_reflection_client::ServerReflectionClient::new(channel)
            .server_reflection_info(futures_util::stream::iter(requests))
            .await
            .expect("reflection v1 answers")
            .into_inner();
        let mut answers = Vec::new();
        for _ in 0..count {
            let resp = stream
                .message()
                .await
                .expect("reflection v1 stream")
                .expect("one answer per request");
            answers.push(resp.message_response.expect("a response message"));
        }
        answers
    }

    async fn v1alpha_list(channel: tonic::transport::Channel) -> BTreeSet<String> {
        use v1alpha::{
            server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
        };
        let req = v1alpha::ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let mut stream = v1alpha::server_reflection_client::ServerReflectionClient::new(channel)
            .server_reflection_info(futures_util::stream::iter([req]))
            .await
            .expect("reflection v1alpha answers")
            .into_inner();
        match stream.message().await.expect("v1alpha stream") {
            Some(v1alpha::ServerReflectionResponse {
                message_response: Some(MessageResponse::ListServicesResponse(l)),
                ..
            }) => l.service.into_iter().map(|s| s.name).collect(),
            other => panic!("v1alpha ListServices answered {other:?}"),
        }
    }

    #[tokio::test]
    async fn reflection_lists_only_the_served_services_and_describes_error_details() {
        let settings = GrpcSettings {
            addr: "127.0.0.1:0".to_owned(),
            ..GrpcSettings::on_port(0)
        };
        let listener = bind(&settings).await.expect("bind port 0");
        let addr = listener.local_addr().expect("bound address");
        let routes = ServerRoutes::new().with_service(OutboundServiceServer::new(NoShipments));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            serve(listener, &settings, routes, async {
                let _ = stopped.await;
            })
            .await
        });
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("endpoint")
            .connect()
            .await
            .expect("connect");

        let expected: BTreeSet<String> = [
            "flashsale.outbound.v1.OutboundService",
            "grpc.health.v1.Health",
            "grpc.reflection.v1.ServerReflection",
            "grpc.reflection.v1alpha.ServerReflection",
        ]
        .into_iter()
        .map(str::to_owned)
        .collect();

        use v1::{
            server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
        };
        let answers = v1_ask(
            channel.clone(),
            vec![
                MessageRequest::ListServices(String::new()),
                MessageRequest::FileContainingSymbol("google.rpc.ErrorInfo".to_owned()),
                MessageRequest::FileContainingSymbol(
                    "flashsale.order.v1.CreateOrderRequest".to_owned(),
                ),
            ],
        )
        .await;
        let MessageResponse::ListServicesResponse(listed) = &answers[0] else {
            panic!("ListServices answered {:?}", answers[0]);
        };
        let listed: BTreeSet<String> = listed.service.iter().map(|s| s.name.clone()).collect();
        assert_eq!(listed, expected, "reflection v1 lists");
        assert_eq!(
            v1alpha_list(channel).await,
            expected,
            "reflection v1alpha lists"
        );

        // The whole contract stays described: error details and other services' messages.
        for (answer, file, message) in [
            (&answers[1], "google/rpc/error_details.proto", "ErrorInfo"),
            (
                &answers[2],
                "flashsale/order/v1/order.proto",
                "CreateOrderRequest",
            ),
        ] {
            let MessageResponse::FileDescriptorResponse(files) = answer else {
                panic!("FileContainingSymbol {message} answered {answer:?}");
            };
            let described = files
                .file_descriptor_proto
                .iter()
                .map(|raw| {
                    prost_types::FileDescriptorProto::decode(raw.as_slice()).expect("a file")
                })
                .find(|f| f.name() == file)
                .unwrap_or_else(|| panic!("{file} is not among the files served"));
            assert!(
                described.message_type.iter().any(|m| m.name() == message),
                "{file} lacks {message}"
            );
        }

        stop.send(()).expect("server still running");
        server
            .await
            .expect("server task")
            .expect("server stops cleanly");
    }
}
