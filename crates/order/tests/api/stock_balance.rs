//! The order service against several product-stock replicas: one client spreads its calls over
//! all of them (`upstream.product_stock_url` lists them), and goes on with the others when one
//! stops.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use flashsale_order::infra::stock::{GrpcStock, StockPort as _};
use flashsale_platform::{
    auth::{JwtKeys, ServiceToken},
    settings::UpstreamSettings,
};
use flashsale_proto::product::v1::{
    self as pb,
    product_stock_service_server::{ProductStockService, ProductStockServiceServer},
};
use tonic::{Request, Response, Status, transport::server::TcpIncoming};
use uuid::Uuid;

/// A product-stock replica that grants every reservation and counts the calls it answered.
struct Replica(Arc<AtomicUsize>);

fn granted(quantity: i64) -> pb::ReserveStockResponse {
    pb::ReserveStockResponse {
        unit_price_cents: 100 * quantity,
        deduction_policy: pb::DeductionPolicy::ReserveThenCommit as i32,
        gate_available: 1_000,
        ..Default::default()
    }
}

#[tonic::async_trait]
impl ProductStockService for Replica {
    async fn reserve_stock(
        &self,
        req: Request<pb::ReserveStockRequest>,
    ) -> Result<Response<pb::ReserveStockResponse>, Status> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(Response::new(granted(req.into_inner().quantity)))
    }

    async fn reserve_stock_batch(
        &self,
        req: Request<pb::ReserveStockBatchRequest>,
    ) -> Result<Response<pb::ReserveStockBatchResponse>, Status> {
        self.0.fetch_add(1, Ordering::SeqCst);
        let outcomes = req
            .into_inner()
            .items
            .into_iter()
            .map(|item| pb::ReserveStockOutcome {
                reserved: Some(granted(item.quantity)),
                ..Default::default()
            })
            .collect();
        Ok(Response::new(pb::ReserveStockBatchResponse { outcomes }))
    }

    async fn create_product(
        &self,
        _: Request<pb::CreateProductRequest>,
    ) -> Result<Response<pb::CreateProductResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }

    async fn get_product(
        &self,
        _: Request<pb::GetProductRequest>,
    ) -> Result<Response<pb::GetProductResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }

    async fn update_product(
        &self,
        _: Request<pb::UpdateProductRequest>,
    ) -> Result<Response<pb::UpdateProductResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }

    async fn list_products(
        &self,
        _: Request<pb::ListProductsRequest>,
    ) -> Result<Response<pb::ListProductsResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }

    async fn adjust_stock(
        &self,
        _: Request<pb::AdjustStockRequest>,
    ) -> Result<Response<pb::AdjustStockResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }

    async fn get_gate_buyers(
        &self,
        _: Request<pb::GetGateBuyersRequest>,
    ) -> Result<Response<pb::GetGateBuyersResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }

    async fn commit_reservation(
        &self,
        _: Request<pb::CommitReservationRequest>,
    ) -> Result<Response<pb::CommitReservationResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }

    async fn reconcile_stock(
        &self,
        _: Request<pb::ReconcileStockRequest>,
    ) -> Result<Response<pb::ReconcileStockResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
}

/// A running replica: its port, its call count, and the sender that stops it.
struct Running {
    port: u16,
    calls: Arc<AtomicUsize>,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

async fn replica() -> Running {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let calls = Arc::new(AtomicUsize::new(0));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(ProductStockServiceServer::new(Replica(calls.clone())))
            .serve_with_incoming_shutdown(TcpIncoming::from(listener), async {
                let _ = stopped.await;
            }),
    );
    Running {
        port,
        calls,
        stop,
        server,
    }
}

async fn reserve(stock: &GrpcStock) -> bool {
    stock
        .reserve(Uuid::new_v4(), "buyer", "BAL-1", 1)
        .await
        .is_ok()
}

#[tokio::test]
async fn one_client_spreads_its_calls_over_every_replica_and_keeps_going_when_one_stops() {
    let (a, b) = (replica().await, replica().await);
    let keys = JwtKeys::new(b"balance-test-secret").unwrap();
    let token = Arc::new(ServiceToken::new(keys, "order").unwrap());
    let upstream = UpstreamSettings {
        product_stock_url: format!("http://127.0.0.1:{}, http://127.0.0.1:{}", a.port, b.port),
        product_stock_refresh_ms: 100,
    };
    let stock = GrpcStock::new(
        &upstream,
        &Default::default(),
        token,
        Duration::from_secs(5),
    )
    .unwrap();

    const CALLS: usize = 60;
    for i in 0..CALLS {
        assert!(reserve(&stock).await, "call {i} refused");
    }
    let (on_a, on_b) = (
        a.calls.load(Ordering::SeqCst),
        b.calls.load(Ordering::SeqCst),
    );
    assert_eq!(on_a + on_b, CALLS, "every call answered once");
    assert!(on_a > 0 && on_b > 0, "calls on a: {on_a}, on b: {on_b}");

    // One replica stops. Calls routed to it in the moment before the client notices may fail;
    // then every call goes to the other.
    a.stop.send(()).unwrap();
    a.server.await.unwrap().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut in_a_row = 0;
    while in_a_row < 10 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "calls did not settle on the remaining replica"
        );
        if reserve(&stock).await {
            in_a_row += 1;
        } else {
            in_a_row = 0;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let (a_before, b_before) = (
        a.calls.load(Ordering::SeqCst),
        b.calls.load(Ordering::SeqCst),
    );
    for i in 0..CALLS {
        assert!(reserve(&stock).await, "call {i} after the stop refused");
    }
    assert_eq!(
        a.calls.load(Ordering::SeqCst),
        a_before,
        "none reach the stopped one"
    );
    assert_eq!(b.calls.load(Ordering::SeqCst), b_before + CALLS);

    // It comes back on the same port: calls reach it again.
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", a.port))
        .await
        .unwrap();
    let back = Arc::new(AtomicUsize::new(0));
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(ProductStockServiceServer::new(Replica(back.clone())))
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while back.load(Ordering::SeqCst) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the replica that came back got no call"
        );
        assert!(reserve(&stock).await);
    }
    server.abort();
    b.stop.send(()).ok();
}
