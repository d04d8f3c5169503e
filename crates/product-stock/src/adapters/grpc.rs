//! `flashsale.product.v1.ProductStockService` over tonic. The business RPCs arrive with the
//! stock gate (issue #3); until then each one checks the caller's role and answers
//! `UNIMPLEMENTED`.

use flashsale_platform::{auth::Role, grpc::not_yet};
use flashsale_proto::product::v1::{
    AdjustStockRequest, AdjustStockResponse, CommitReservationRequest, CommitReservationResponse,
    CreateProductRequest, CreateProductResponse, GetProductRequest, GetProductResponse,
    ListProductsRequest, ListProductsResponse, ReconcileStockRequest, ReconcileStockResponse,
    ReserveStockRequest, ReserveStockResponse, product_stock_service_server::ProductStockService,
};
use tonic::{Request, Response, Status};

/// The gRPC face of the product-stock service.
#[derive(Clone, Debug, Default)]
pub struct ProductStockApi;

const ADMIN: &[Role] = &[Role::Admin];
const SERVICE: &[Role] = &[Role::Service];
const ANYONE: &[Role] = &[Role::User, Role::Admin, Role::Service];

#[tonic::async_trait]
impl ProductStockService for ProductStockApi {
    async fn create_product(
        &self,
        req: Request<CreateProductRequest>,
    ) -> Result<Response<CreateProductResponse>, Status> {
        Err(not_yet(&req, ADMIN, "CreateProduct"))
    }

    async fn get_product(
        &self,
        req: Request<GetProductRequest>,
    ) -> Result<Response<GetProductResponse>, Status> {
        Err(not_yet(&req, ANYONE, "GetProduct"))
    }

    async fn list_products(
        &self,
        req: Request<ListProductsRequest>,
    ) -> Result<Response<ListProductsResponse>, Status> {
        Err(not_yet(&req, ANYONE, "ListProducts"))
    }

    async fn adjust_stock(
        &self,
        req: Request<AdjustStockRequest>,
    ) -> Result<Response<AdjustStockResponse>, Status> {
        Err(not_yet(&req, ADMIN, "AdjustStock"))
    }

    async fn reserve_stock(
        &self,
        req: Request<ReserveStockRequest>,
    ) -> Result<Response<ReserveStockResponse>, Status> {
        Err(not_yet(&req, SERVICE, "ReserveStock"))
    }

    async fn commit_reservation(
        &self,
        req: Request<CommitReservationRequest>,
    ) -> Result<Response<CommitReservationResponse>, Status> {
        Err(not_yet(&req, SERVICE, "CommitReservation"))
    }

    async fn reconcile_stock(
        &self,
        req: Request<ReconcileStockRequest>,
    ) -> Result<Response<ReconcileStockResponse>, Status> {
        Err(not_yet(&req, ADMIN, "ReconcileStock"))
    }
}
