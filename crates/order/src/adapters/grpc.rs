//! `flashsale.order.v1.OrderService` over tonic. The business RPCs arrive with the order saga
//! (issue #4); until then each one checks the caller's role and answers `UNIMPLEMENTED`.

use std::pin::Pin;

use flashsale_platform::{auth::Role, grpc::not_yet as pending};
use flashsale_proto::order::v1::{
    CancelOrderRequest, CancelOrderResponse, CreateOrderRequest, CreateOrderResponse,
    GetOrderRequest, GetOrderResponse, ListOrdersRequest, ListOrdersResponse, PayOrderRequest,
    PayOrderResponse, WatchOrderRequest, WatchOrderResponse, order_service_server::OrderService,
};
use tonic::{Request, Response, Status};

/// The gRPC face of the order service.
#[derive(Clone, Debug, Default)]
pub struct OrderApi;

const BUYER: &[Role] = &[Role::User, Role::Admin];

#[tonic::async_trait]
impl OrderService for OrderApi {
    async fn create_order(
        &self,
        req: Request<CreateOrderRequest>,
    ) -> Result<Response<CreateOrderResponse>, Status> {
        Err(pending(&req, &[Role::User], "CreateOrder"))
    }

    async fn get_order(
        &self,
        req: Request<GetOrderRequest>,
    ) -> Result<Response<GetOrderResponse>, Status> {
        Err(pending(&req, BUYER, "GetOrder"))
    }

    async fn list_orders(
        &self,
        req: Request<ListOrdersRequest>,
    ) -> Result<Response<ListOrdersResponse>, Status> {
        Err(pending(&req, BUYER, "ListOrders"))
    }

    type WatchOrderStream =
        Pin<Box<dyn futures_util::Stream<Item = Result<WatchOrderResponse, Status>> + Send>>;

    async fn watch_order(
        &self,
        req: Request<WatchOrderRequest>,
    ) -> Result<Response<Self::WatchOrderStream>, Status> {
        Err(pending(&req, BUYER, "WatchOrder"))
    }

    async fn pay_order(
        &self,
        req: Request<PayOrderRequest>,
    ) -> Result<Response<PayOrderResponse>, Status> {
        Err(pending(&req, &[Role::User], "PayOrder"))
    }

    async fn cancel_order(
        &self,
        req: Request<CancelOrderRequest>,
    ) -> Result<Response<CancelOrderResponse>, Status> {
        Err(pending(&req, BUYER, "CancelOrder"))
    }
}
