//! `flashsale.order.v1.OrderService` over tonic: the caller comes from the verified token, the
//! request becomes domain values (junk is `INVALID_ARGUMENT` with field violations), the use
//! case runs, the answer goes back.

use std::pin::Pin;

use flashsale_contract::to_timestamp;
use flashsale_messaging::waiting::Place;
use flashsale_platform::{
    ApiError,
    auth::{Caller, Role},
};
use flashsale_proto::order::v1::{
    self as pb, CancelOrderRequest, CancelOrderResponse, CreateOrderRequest, CreateOrderResponse,
    GetOrderRequest, GetOrderResponse, ListOrdersRequest, ListOrdersResponse,
    ListPendingOrdersRequest, ListPendingOrdersResponse, ListStuckOrdersRequest,
    ListStuckOrdersResponse, LookupOrdersRequest, LookupOrdersResponse, PayOrderRequest,
    PayOrderResponse, WatchOrderRequest, WatchOrderResponse, order_service_server::OrderService,
};
use tonic::{Request, Response, Status};

use crate::{
    app::{Checkout, Intake, Queries, Stuck, StuckOrder, reason_to_proto, status_to_proto},
    domain::{
        Order, OrderError, Payment, PlaceOrder, Status as OrderStatus, parse_order_id,
        parse_order_ids,
    },
};

/// The gRPC face of the order service.
#[derive(Clone)]
pub struct OrderApi {
    intake: Intake,
    checkout: Checkout,
    queries: Queries,
    stuck: Stuck,
}

impl OrderApi {
    pub fn new(intake: Intake, checkout: Checkout, queries: Queries, stuck: Stuck) -> Self {
        Self {
            intake,
            checkout,
            queries,
            stuck,
        }
    }
}

const BUYER: &[Role] = &[Role::User];
const BUYER_OR_ADMIN: &[Role] = &[Role::User, Role::Admin];
const ADMIN: &[Role] = &[Role::Admin];
/// Product-stock's questions about orders (the hold sweeper, the gate rebuild).
const SERVICE: &[Role] = &[Role::Service];

/// The caller, if `roles` may call this; admin calls are audited (see
/// [`flashsale_platform::auth::authorize`]).
fn authorize<T: std::fmt::Debug>(req: &Request<T>, roles: &[Role]) -> Result<Caller, Status> {
    Ok(flashsale_platform::auth::authorize(req, roles)?)
}

pub fn order_to_proto(o: Order) -> pb::Order {
    let (refund_status, refund_cents) = match &o.refund {
        None => (pb::RefundStatus::None, 0),
        Some(r) if r.completed => (pb::RefundStatus::Completed, r.amount_cents),
        Some(r) => (pb::RefundStatus::Recorded, r.amount_cents),
    };
    pb::Order {
        order_id: o.order_id.to_string(),
        user_id: o.user_id,
        request_id: o.request_id,
        sku: o.sku,
        quantity: o.quantity,
        unit_price_cents: o.unit_price_cents,
        total_cents: o.total_cents,
        status: status_to_proto(o.status) as i32,
        cancel_reason: o.cancel_reason.map_or(0, |r| reason_to_proto(r) as i32),
        payment_deadline: o.payment_deadline.map(to_timestamp),
        payment_id: o.payment_id.unwrap_or_default(),
        refund_status: refund_status as i32,
        refund_cents,
        create_time: Some(to_timestamp(o.created_at)),
        update_time: Some(to_timestamp(o.updated_at)),
    }
}

fn stuck_to_proto(s: StuckOrder) -> pb::StuckOrder {
    let o = s.order;
    pb::StuckOrder {
        order_id: o.order_id.to_string(),
        sku: o.sku,
        user_id: o.user_id,
        status: status_to_proto(o.status) as i32,
        since: Some(to_timestamp(o.since)),
        update_time: Some(to_timestamp(o.updated_at)),
        events: s
            .events
            .into_iter()
            .map(|w| pb::WaitingEvent {
                place: match w.place {
                    Place::Outbox => pb::WaitingPlace::Outbox,
                    Place::DeadLetter => pb::WaitingPlace::DeadLetter,
                } as i32,
                message_id: w.message_id.to_string(),
                r#type: w.message_type,
                queue: w.queue,
                error: w.error,
                attempts: w.attempts,
                time: Some(to_timestamp(w.at)),
            })
            .collect(),
    }
}

fn status_filter(raw: i32) -> Result<Option<OrderStatus>, OrderError> {
    Ok(
        match pb::OrderStatus::try_from(raw)
            .map_err(|_| OrderError::invalid("status", "unknown status"))?
        {
            pb::OrderStatus::Unspecified => None,
            pb::OrderStatus::Pending => Some(OrderStatus::Pending),
            pb::OrderStatus::AwaitingPayment => Some(OrderStatus::AwaitingPayment),
            pb::OrderStatus::Paid => Some(OrderStatus::Paid),
            pb::OrderStatus::Shipped => Some(OrderStatus::Shipped),
            pb::OrderStatus::Cancelled => Some(OrderStatus::Cancelled),
        },
    )
}

/// The one mapping from order errors to the API (AIP-193 reasons).
impl From<OrderError> for ApiError {
    fn from(e: OrderError) -> Self {
        let message = e.to_string();
        match e {
            OrderError::Invalid(v) => ApiError::InvalidArgument(v),
            OrderError::WrongAmount(_) => ApiError::invalid("amount_cents", message),
            OrderError::NotFound(_) | OrderError::UnknownProduct(_) => ApiError::NotFound(message),
            OrderError::Refused(refusal, _) => {
                ApiError::failed_precondition(refusal.reason(), message)
            }
            OrderError::ReservationReleased(_) => {
                ApiError::failed_precondition("ORDER_CANCELLED", message)
            }
            OrderError::IdempotencyKeyReused(_) => {
                ApiError::failed_precondition("IDEMPOTENCY_KEY_REUSED", message)
            }
            OrderError::NotPayable(_) => {
                ApiError::failed_precondition("ORDER_NOT_PAYABLE", message)
            }
            OrderError::NotCancellable(_) => {
                ApiError::failed_precondition("ORDER_NOT_CANCELLABLE", message)
            }
            OrderError::PermissionDenied(m) => ApiError::PermissionDenied(m),
            OrderError::Unavailable(_) => ApiError::Unavailable {
                reason: "STOCK_GATE_UNAVAILABLE",
                message,
            },
            OrderError::Internal(e) => ApiError::Internal(e),
        }
    }
}

fn status(e: OrderError) -> Status {
    ApiError::from(e).into()
}

type WatchStream =
    Pin<Box<dyn futures_util::Stream<Item = Result<WatchOrderResponse, Status>> + Send>>;

#[tonic::async_trait]
impl OrderService for OrderApi {
    async fn create_order(
        &self,
        req: Request<CreateOrderRequest>,
    ) -> Result<Response<CreateOrderResponse>, Status> {
        let caller = authorize(&req, BUYER)?;
        let r = req.into_inner();
        let max = self.intake.max_quantity();
        let place = PlaceOrder::new(&caller.subject, &r.request_id, &r.sku, r.quantity, max)
            .map_err(status)?;
        let (order, replayed) = self.intake.place(place).await.map_err(status)?;
        Ok(Response::new(CreateOrderResponse {
            order: Some(order_to_proto(order)),
            replayed,
        }))
    }

    async fn get_order(
        &self,
        req: Request<GetOrderRequest>,
    ) -> Result<Response<GetOrderResponse>, Status> {
        let caller = authorize(&req, BUYER_OR_ADMIN)?;
        let id = parse_order_id(&req.get_ref().order_id).map_err(status)?;
        let order = self.queries.get(&caller, id).await.map_err(status)?;
        Ok(Response::new(GetOrderResponse {
            order: Some(order_to_proto(order)),
        }))
    }

    async fn list_orders(
        &self,
        req: Request<ListOrdersRequest>,
    ) -> Result<Response<ListOrdersResponse>, Status> {
        let caller = authorize(&req, BUYER_OR_ADMIN)?;
        let r = req.into_inner();
        let filter = status_filter(r.status).map_err(status)?;
        let (orders, next) = self
            .queries
            .list(&caller, &r.user_id, filter, r.page_size, &r.page_token)
            .await
            .map_err(status)?;
        Ok(Response::new(ListOrdersResponse {
            orders: orders.into_iter().map(order_to_proto).collect(),
            next_page_token: next,
        }))
    }

    type WatchOrderStream = WatchStream;

    async fn watch_order(
        &self,
        req: Request<WatchOrderRequest>,
    ) -> Result<Response<Self::WatchOrderStream>, Status> {
        let caller = authorize(&req, BUYER_OR_ADMIN)?;
        let id = parse_order_id(&req.get_ref().order_id).map_err(status)?;
        let rx = self.queries.watch(&caller, id).await.map_err(status)?;
        let stream =
            futures_util::StreamExt::map(tokio_stream::wrappers::ReceiverStream::new(rx), |item| {
                item.map(|o| WatchOrderResponse {
                    order: Some(order_to_proto(o)),
                })
                .map_err(status)
            });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn pay_order(
        &self,
        req: Request<PayOrderRequest>,
    ) -> Result<Response<PayOrderResponse>, Status> {
        let caller = authorize(&req, BUYER)?;
        let r = req.into_inner();
        let payment = Payment::new(&r.order_id, &r.payment_id, r.amount_cents).map_err(status)?;
        let (order, replayed) = self.checkout.pay(&caller, payment).await.map_err(status)?;
        Ok(Response::new(PayOrderResponse {
            order: Some(order_to_proto(order)),
            replayed,
        }))
    }

    async fn cancel_order(
        &self,
        req: Request<CancelOrderRequest>,
    ) -> Result<Response<CancelOrderResponse>, Status> {
        let caller = authorize(&req, BUYER_OR_ADMIN)?;
        let id = parse_order_id(&req.get_ref().order_id).map_err(status)?;
        let order = self.checkout.cancel(&caller, id).await.map_err(status)?;
        Ok(Response::new(CancelOrderResponse {
            order: Some(order_to_proto(order)),
        }))
    }

    async fn lookup_orders(
        &self,
        req: Request<LookupOrdersRequest>,
    ) -> Result<Response<LookupOrdersResponse>, Status> {
        authorize(&req, SERVICE)?;
        let ids = parse_order_ids(&req.get_ref().order_ids).map_err(status)?;
        let orders = self.queries.lookup(&ids).await.map_err(status)?;
        Ok(Response::new(LookupOrdersResponse {
            orders: orders.into_iter().map(order_to_proto).collect(),
        }))
    }

    async fn list_pending_orders(
        &self,
        req: Request<ListPendingOrdersRequest>,
    ) -> Result<Response<ListPendingOrdersResponse>, Status> {
        authorize(&req, SERVICE)?;
        let r = req.into_inner();
        let (orders, next) = self
            .queries
            .pending(&r.sku, r.page_size, &r.page_token)
            .await
            .map_err(status)?;
        Ok(Response::new(ListPendingOrdersResponse {
            orders: orders.into_iter().map(order_to_proto).collect(),
            next_page_token: next,
        }))
    }

    async fn list_stuck_orders(
        &self,
        req: Request<ListStuckOrdersRequest>,
    ) -> Result<Response<ListStuckOrdersResponse>, Status> {
        let caller = authorize(&req, ADMIN)?;
        let r = req.into_inner();
        let page = self
            .stuck
            .list(r.older_than_ms, r.page_size, &r.page_token)
            .await
            .map_err(status)?;
        tracing::info!(
            who = %caller.subject,
            listed = page.orders.len(),
            "stuck orders listed"
        );
        Ok(Response::new(ListStuckOrdersResponse {
            orders: page.orders.into_iter().map(stuck_to_proto).collect(),
            next_page_token: page.next_page_token,
            older_than_ms: i64::try_from(page.older_than.as_millis()).unwrap_or(i64::MAX),
        }))
    }
}
