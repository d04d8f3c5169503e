//! Load shedding for a gRPC server: at most `grpc.max_concurrent_requests` calls in flight at
//! once (tower's concurrency limit, one semaphore for every connection); a call beyond that is
//! answered at once with `UNAVAILABLE`, reason `OVERLOADED` (tower's load shed), rather than
//! queued without bound behind the database pool. Health checks are never shed, so an overloaded
//! replica is not restarted by its liveness probe for being busy. A stream holds its place
//! only until its first answer.

use std::{
    sync::Arc,
    task::{Context, Poll},
};

use tokio::sync::Semaphore;
use tower::{
    BoxError, Service, ServiceBuilder, ServiceExt as _,
    limit::{ConcurrencyLimit, GlobalConcurrencyLimitLayer},
    load_shed::{LoadShed, error::Overloaded},
};

use crate::error::ApiError;

/// Counter of calls answered `UNAVAILABLE` because the server was at its limit.
pub const SHED_TOTAL: &str = "flashsale_grpc_shed_total";

/// The path prefix of `grpc.health.v1.Health`, which is never shed.
const HEALTH: &str = "/grpc.health.v1.Health/";

/// The layer: one shared limit of `max` calls in flight.
#[derive(Clone, Debug)]
pub struct ShedLayer {
    limit: GlobalConcurrencyLimitLayer,
}

impl ShedLayer {
    pub fn new(max: usize) -> Self {
        Self {
            limit: GlobalConcurrencyLimitLayer::with_semaphore(Arc::new(Semaphore::new(max))),
        }
    }
}

impl<S: Clone> tower::Layer<S> for ShedLayer {
    type Service = Shed<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Shed {
            limited: ServiceBuilder::new()
                .load_shed()
                .layer(self.limit.clone())
                .service(inner.clone()),
            health: inner,
        }
    }
}

/// See [`ShedLayer`].
#[derive(Clone, Debug)]
pub struct Shed<S> {
    limited: LoadShed<ConcurrencyLimit<S>>,
    /// The same service, unlimited, for health checks.
    health: S,
}

impl<S, B> Service<http::Request<B>> for Shed<S>
where
    S: Service<http::Request<B>, Response = http::Response<tonic::body::Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = BoxError;
    type Future = futures_util::future::BoxFuture<'static, Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // The limit is not waited for here: a call over it is answered, not held back.
        self.health.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path().starts_with(HEALTH) {
            let call = self.health.call(req);
            return Box::pin(async move { call.await.map_err(Into::into) });
        }
        let limited = self.limited.clone();
        Box::pin(async move {
            match limited.oneshot(req).await {
                Err(e) if e.is::<Overloaded>() => {
                    metrics::counter!(SHED_TOTAL).increment(1);
                    let status: tonic::Status = ApiError::Unavailable {
                        reason: flashsale_contract::reason::OVERLOADED,
                        message:
                            "the server is at its limit of calls in flight; retry with backoff"
                                .into(),
                    }
                    .into();
                    Ok(status.into_http())
                }
                other => other,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use flashsale_proto::outbound::v1::{
        GetShipmentRequest, GetShipmentResponse, ListShipmentsRequest, ListShipmentsResponse,
        outbound_service_client::OutboundServiceClient,
        outbound_service_server::{OutboundService, OutboundServiceServer},
    };
    use tokio::sync::{Semaphore, mpsc};
    use tonic::{Code, Request, Response, Status};
    use tonic_health::pb::{
        HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
    };

    use crate::{
        grpc::{ServerRoutes, bind, serve},
        settings::GrpcSettings,
    };

    /// GetShipment says it has started, then waits for a permit of `release`.
    struct Held {
        started: mpsc::UnboundedSender<()>,
        release: Arc<Semaphore>,
    }

    #[tonic::async_trait]
    impl OutboundService for Held {
        async fn get_shipment(
            &self,
            _: Request<GetShipmentRequest>,
        ) -> Result<Response<GetShipmentResponse>, Status> {
            let _ = self.started.send(());
            let _permit = self
                .release
                .acquire()
                .await
                .map_err(|_| Status::internal("closed"))?;
            Ok(Response::new(GetShipmentResponse { shipment: None }))
        }

        async fn list_shipments(
            &self,
            _: Request<ListShipmentsRequest>,
        ) -> Result<Response<ListShipmentsResponse>, Status> {
            Ok(Response::new(ListShipmentsResponse::default()))
        }
    }

    #[tokio::test]
    async fn a_call_over_the_limit_is_shed_unavailable_at_once_and_health_checks_still_answer() {
        let settings = GrpcSettings {
            addr: "127.0.0.1:0".to_owned(),
            max_concurrent_requests: 2,
            ..GrpcSettings::on_port(0)
        };
        let listener = bind(&settings).await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let (started_tx, mut started) = mpsc::unbounded_channel();
        let release = Arc::new(Semaphore::new(0));
        let routes = ServerRoutes::new().with_service(OutboundServiceServer::new(Held {
            started: started_tx,
            release: release.clone(),
        }));
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
        let client = OutboundServiceClient::new(channel.clone());

        // Two calls fill the limit (each on its own connection: the limit is the server's).
        let mut held = Vec::new();
        for _ in 0..2 {
            let other = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                .expect("endpoint")
                .connect()
                .await
                .expect("connect");
            let mut c = OutboundServiceClient::new(other);
            held.push(tokio::spawn(async move {
                c.get_shipment(GetShipmentRequest::default()).await
            }));
            started.recv().await.expect("the call started");
        }
        let refused = client
            .clone()
            .list_shipments(ListShipmentsRequest::default())
            .await
            .expect_err("over the limit");
        assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
        assert_eq!(
            crate::error::reason_of(&refused).as_deref(),
            Some("OVERLOADED")
        );
        let health = HealthClient::new(channel)
            .check(HealthCheckRequest::default())
            .await
            .expect("health is never shed")
            .into_inner();
        assert_eq!(health.status, ServingStatus::Serving as i32);

        release.add_permits(2);
        for call in held {
            call.await.expect("task").expect("a held call completes");
        }
        client
            .clone()
            .list_shipments(ListShipmentsRequest::default())
            .await
            .expect("served again once calls finished");

        stop.send(()).expect("server running");
        server.await.expect("server task").expect("server stops");
    }
}
