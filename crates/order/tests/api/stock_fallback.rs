//! The order service against a product-stock that does not know `ReserveStockBatch` yet (an
//! older replica during a rolling update): the batch call answers UNIMPLEMENTED and every
//! reservation of that batch goes out as its own `ReserveStock`, each with its own answer.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use flashsale_order::infra::stock::{GrpcStock, StockPort as _};
use flashsale_platform::auth::{JwtKeys, ServiceToken};
use flashsale_proto::product::v1::{
    self as pb,
    product_stock_service_server::{ProductStockService, ProductStockServiceServer},
};
use tonic::{Request, Response, Status, transport::server::TcpIncoming};
use uuid::Uuid;

/// product-stock before the batch call: grants every reservation, priced 100 × quantity so each
/// answer can be told apart, after `delay` (so concurrent calls pile up into a batch).
struct OlderStock(Arc<Calls>);

#[derive(Default)]
struct Calls {
    batch: AtomicUsize,
    single: AtomicUsize,
    unauthenticated: AtomicUsize,
}

const DELAY: Duration = Duration::from_millis(200);

#[tonic::async_trait]
impl ProductStockService for OlderStock {
    async fn reserve_stock(
        &self,
        req: Request<pb::ReserveStockRequest>,
    ) -> Result<Response<pb::ReserveStockResponse>, Status> {
        self.0.single.fetch_add(1, Ordering::SeqCst);
        if req.metadata().get("authorization").is_none() {
            self.0.unauthenticated.fetch_add(1, Ordering::SeqCst);
        }
        tokio::time::sleep(DELAY).await;
        let r = req.into_inner();
        Ok(Response::new(pb::ReserveStockResponse {
            unit_price_cents: 100 * r.quantity,
            deduction_policy: pb::DeductionPolicy::ReserveThenCommit as i32,
            gate_available: 1_000,
            ..Default::default()
        }))
    }

    async fn reserve_stock_batch(
        &self,
        _: Request<pb::ReserveStockBatchRequest>,
    ) -> Result<Response<pb::ReserveStockBatchResponse>, Status> {
        self.0.batch.fetch_add(1, Ordering::SeqCst);
        Err(Status::unimplemented("ReserveStockBatch is not known here"))
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

#[tokio::test]
async fn a_product_stock_without_the_batch_call_gets_one_call_per_reservation() {
    let calls_seen = Arc::new(Calls::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(ProductStockServiceServer::new(OlderStock(
                calls_seen.clone(),
            )))
            .serve_with_incoming(TcpIncoming::from(listener)),
    );

    let keys = JwtKeys::new(b"fallback-test-secret").unwrap();
    let token = Arc::new(ServiceToken::new(keys, "order").unwrap());
    let stock = GrpcStock::new(
        &flashsale_platform::settings::UpstreamSettings {
            product_stock_url: format!("http://127.0.0.1:{port}"),
            ..Default::default()
        },
        &Default::default(),
        token,
        Duration::from_secs(5),
    )
    .unwrap();
    // More calls at once than batches may be in flight: the later ones wait and go together.
    const CALLS: i64 = 24;
    let calls = (1..=CALLS).map(|q| {
        let stock = &stock;
        async move {
            let got = stock
                .reserve(Uuid::new_v4(), &format!("buyer{q}"), "OLD-1", q)
                .await;
            (q, got)
        }
    });
    let answers = futures_util::future::join_all(calls).await;

    for (q, got) in answers {
        let granted = got.unwrap_or_else(|e| panic!("reservation of {q} refused: {e:?}"));
        assert_eq!(
            granted.unit_price_cents,
            100 * q,
            "each call gets its own answer"
        );
        assert!(!granted.replayed);
    }
    assert!(
        calls_seen.batch.load(Ordering::SeqCst) >= 1,
        "the concurrent reservations were tried as a batch first"
    );
    assert_eq!(
        calls_seen.single.load(Ordering::SeqCst),
        usize::try_from(CALLS).unwrap(),
        "then each went out on its own, once"
    );
    assert_eq!(calls_seen.unauthenticated.load(Ordering::SeqCst), 0);
    server.abort();
}
