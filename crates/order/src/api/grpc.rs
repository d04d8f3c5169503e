//! `flashsale.order.v1.OrderService` over tonic: the caller comes from the verified token, the
//! per-user limits are counted, the request becomes domain values (junk, control characters in
//! any string included, is `INVALID_ARGUMENT` with field violations), the use case runs, the
//! answer goes back.

use std::{pin::Pin, time::Duration};

use flashsale_contract::{
    PAGE_TOKEN_MAX_LEN, USER_ID_MAX_LEN, check_optional_text, to_timestamp, violations,
};
use flashsale_messaging::waiting::Place;
use flashsale_platform::{
    ApiError,
    auth::{Caller, Role},
    limit::{StreamCap, UserRateLimiter},
};
use flashsale_proto::order::v1::{
    self as pb, CancelOrderRequest, CancelOrderResponse, CreateOrderRequest, CreateOrderResponse,
    GetOrderRequest, GetOrderResponse, ListOrdersRequest, ListOrdersResponse,
    ListPendingOrdersRequest, ListPendingOrdersResponse, ListRefundsRequest, ListRefundsResponse,
    GetSaleReportRequest, GetSaleReportResponse, ListStuckOrdersRequest, ListStuckOrdersResponse,
    LookupOrdersRequest, LookupOrdersResponse,
    PayOrderRequest, PayOrderResponse, RetryRefundRequest, RetryRefundResponse, WatchOrderRequest,
    WatchOrderResponse, order_service_server::OrderService,
};
use tokio::time::Instant;
use tonic::{Request, Response, Status};

use super::payment::{checkout_to_proto, list_refunds, refund_status, retry_refund};
use crate::{
    app::{
        Checkout, Intake, PayBatcher, PayCall, Queries, Refunds, Reports, SaleReport, Stuck,
        StuckOrder, pay_batcher, reason_to_proto,
        status_to_proto,
    },
    config::LimitSettings,
    domain::{
        Order, OrderError, PlaceOrder, ProviderError, StartPayment, Status as OrderStatus,
        parse_order_id, parse_order_ids,
    },
};

/// The gRPC face of the order service.
#[derive(Clone)]
pub struct OrderApi {
    intake: Intake,
    checkout: Checkout,
    /// PayOrder calls, applied in batches ([`crate::app::pay_batcher`]).
    pays: PayBatcher,
    queries: Queries,
    stuck: Stuck,
    refunds: Refunds,
    reports: Reports,
    limits: EdgeLimits,
}

impl OrderApi {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        intake: Intake,
        checkout: Checkout,
        queries: Queries,
        stuck: Stuck,
        refunds: Refunds,
        reports: Reports,
        limits: EdgeLimits,
    ) -> Self {
        Self {
            intake,
            pays: pay_batcher(checkout.clone()),
            checkout,
            queries,
            stuck,
            refunds,
            reports,
            limits,
        }
    }
}

fn sale_report_to_proto(r: SaleReport) -> pb::SaleReport {
    let at = |ms: Option<i64>| ms.and_then(flashsale_contract::ms_to_timestamp);
    let o = r.orders;
    pb::SaleReport {
        sku: r.sku,
        sale_start: at(r.product.sale_start_ms),
        sale_end: at(r.product.sale_end_ms),
        price_cents: r.product.price_cents,
        sale_price_cents: r.product.sale_price_cents,
        on_hand: r.product.on_hand,
        reserved: r.product.reserved,
        available: r.product.available,
        accepted: o.accepted,
        accepted_units: o.accepted_units,
        confirmed: o.confirmed,
        paid: o.paid,
        shipped: o.shipped,
        cancelled: o.cancelled.into_iter().collect(),
        refunds: o.refunds,
        refunded_cents: o.refunded_cents,
        revenue_cents: o.revenue_cents,
        refused: r.refused.into_iter().collect(),
        sold_out_time: at(r.sold_out_ms),
        opening_to_sold_out_ms: r.opening_to_sold_out_ms,
        seconds: r
            .seconds
            .into_iter()
            .map(|s| pb::SaleSecond {
                second: at(Some(s.second_ms)),
                accepted: s.accepted,
                refused: s.refused.into_iter().collect(),
            })
            .collect(),
    }
}

/// What one user may ask of this service (`limits.*`); clones share the counts.
#[derive(Clone, Debug)]
pub struct EdgeLimits {
    pub create_order: UserRateLimiter,
    pub pay_order: UserRateLimiter,
    /// GetOrder, ListOrders and the opening of a WatchOrder.
    pub read: UserRateLimiter,
    pub cancel_order: UserRateLimiter,
    pub watch_order: StreamCap,
}

/// What a user told they have too many WatchOrder streams open is asked to wait.
const WATCH_RETRY_AFTER: Duration = Duration::from_secs(2);

impl EdgeLimits {
    pub fn new(l: &LimitSettings) -> Self {
        Self {
            create_order: UserRateLimiter::new(
                "CreateOrder",
                l.create_order_per_sec,
                l.create_order_burst,
            ),
            pay_order: UserRateLimiter::new("PayOrder", l.pay_order_per_sec, l.pay_order_burst),
            read: UserRateLimiter::new(
                "GetOrder/ListOrders/WatchOrder",
                l.read_per_sec,
                l.read_burst,
            ),
            cancel_order: UserRateLimiter::new(
                "CancelOrder",
                l.cancel_order_per_sec,
                l.cancel_order_burst,
            ),
            watch_order: StreamCap::new(
                "WatchOrder",
                usize::try_from(l.watch_streams_per_user).unwrap_or(usize::MAX),
                WATCH_RETRY_AFTER,
            ),
        }
    }

    /// The rate limiters, for the task that forgets idle users.
    pub fn rate_limiters(&self) -> Vec<UserRateLimiter> {
        vec![
            self.create_order.clone(),
            self.pay_order.clone(),
            self.read.clone(),
            self.cancel_order.clone(),
        ]
    }
}

const BUYER: &[Role] = &[Role::User];
const BUYER_OR_ADMIN: &[Role] = &[Role::User, Role::Admin];
pub(super) const ADMIN: &[Role] = &[Role::Admin];
/// Product-stock's questions about orders (the hold sweeper, the gate rebuild).
const SERVICE: &[Role] = &[Role::Service];

/// The caller, if `roles` may call this; admin calls are audited (see
/// [`flashsale_platform::auth::authorize`]).
pub(super) fn authorize<T: std::fmt::Debug>(
    req: &Request<T>,
    roles: &[Role],
) -> Result<Caller, Status> {
    Ok(flashsale_platform::auth::authorize(req, roles)?)
}

pub fn order_to_proto(o: Order) -> pb::Order {
    let (refund_status, refund_cents) = match &o.refund {
        None => (pb::RefundStatus::None, 0),
        Some(r) => (refund_status(r.state), r.amount_cents),
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
            OrderError::Closed {
                refusal,
                at_ms,
                gate_ms,
                ..
            } => {
                use flashsale_contract::{reason::meta, rfc3339_ms};
                let at = if refusal == crate::domain::Refusal::SaleEnded {
                    meta::SALE_END
                } else {
                    meta::SALE_START
                };
                ApiError::failed_precondition_with(
                    refusal.reason(),
                    message,
                    vec![(at, rfc3339_ms(at_ms)), (meta::GATE_TIME, rfc3339_ms(gate_ms))],
                )
            }
            OrderError::ReservationReleased(_) => {
                ApiError::failed_precondition(flashsale_contract::reason::ORDER_CANCELLED, message)
            }
            OrderError::IdempotencyKeyReused(_) => ApiError::failed_precondition(
                flashsale_contract::reason::IDEMPOTENCY_KEY_REUSED,
                message,
            ),
            OrderError::NotPayable(_) => ApiError::failed_precondition(
                flashsale_contract::reason::ORDER_NOT_PAYABLE,
                message,
            ),
            OrderError::NotCancellable(_) => ApiError::failed_precondition(
                flashsale_contract::reason::ORDER_NOT_CANCELLABLE,
                message,
            ),
            OrderError::PermissionDenied(m) => ApiError::PermissionDenied(m),
            OrderError::Unavailable(_) => ApiError::Unavailable {
                reason: flashsale_contract::reason::STOCK_GATE_UNAVAILABLE,
                message,
            },
            OrderError::Unauthenticated(m) => ApiError::Unauthenticated(m),
            OrderError::UnknownPayment(_) => ApiError::NotFound(message),
            OrderError::PaymentMismatch(_) => {
                ApiError::failed_precondition(flashsale_contract::reason::PAYMENT_MISMATCH, message)
            }
            OrderError::Provider(ProviderError::Unavailable(_)) => ApiError::Unavailable {
                reason: flashsale_contract::reason::PAYMENT_PROVIDER_UNAVAILABLE,
                message,
            },
            OrderError::Provider(ProviderError::Refused(_)) => ApiError::failed_precondition(
                flashsale_contract::reason::PAYMENT_PROVIDER_REFUSED,
                message,
            ),
            OrderError::RefundCompleted(_) => {
                ApiError::failed_precondition(flashsale_contract::reason::REFUND_COMPLETED, message)
            }
            OrderError::DatabaseUnavailable(_) | OrderError::WriteExpired => {
                ApiError::Unavailable {
                    reason: flashsale_contract::reason::DATABASE_UNAVAILABLE,
                    message,
                }
            }
            OrderError::Overloaded { retry_after, .. } => ApiError::ResourceExhausted {
                reason: flashsale_contract::reason::OVERLOADED,
                message,
                retry_after,
            },
            OrderError::Stopping => ApiError::Unavailable {
                reason: flashsale_contract::reason::SERVER_STOPPING,
                message,
            },
            OrderError::Internal(e) => ApiError::Internal(e),
        }
    }
}

/// The call's own deadline, from its `grpc-timeout` header (`None`: none, or unreadable; the
/// server's `grpc.request_timeout_ms` bounds it anyway). The header is 1 to 8 digits and a
/// unit: `H`ours, `M`inutes, `S`econds, `m`illi-, `u` micro-, `n`anoseconds.
fn call_timeout(metadata: &tonic::metadata::MetadataMap) -> Option<Duration> {
    let value = metadata.get("grpc-timeout")?.to_str().ok()?;
    let digits = value.get(..value.len().checked_sub(1)?)?;
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match value.as_bytes().last()? {
        b'H' => Duration::from_secs(n.checked_mul(3600)?),
        b'M' => Duration::from_secs(n.checked_mul(60)?),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

pub(super) fn status(e: OrderError) -> Status {
    ApiError::from(e).into()
}

/// `INVALID_ARGUMENT` naming every string field that failed its check, if any did.
fn check_fields<const N: usize>(
    checks: [Result<(), flashsale_contract::FieldViolation>; N],
) -> Result<(), Status> {
    let bad = violations(checks);
    if bad.is_empty() {
        Ok(())
    } else {
        Err(status(OrderError::Invalid(bad)))
    }
}

type WatchStream =
    Pin<Box<dyn futures_util::Stream<Item = Result<WatchOrderResponse, Status>> + Send>>;

#[tonic::async_trait]
impl OrderService for OrderApi {
    async fn create_order(
        &self,
        req: Request<CreateOrderRequest>,
    ) -> Result<Response<CreateOrderResponse>, Status> {
        // Taken first: the server's timer for the call's deadline started before this.
        let deadline = call_timeout(req.metadata()).and_then(|t| Instant::now().checked_add(t));
        let caller = authorize(&req, BUYER)?;
        self.limits.create_order.check(&caller.subject)?;
        let r = req.into_inner();
        let max = self.intake.max_quantity();
        let place = PlaceOrder::new(&caller.subject, &r.request_id, &r.sku, r.quantity, max)
            .map_err(status)?;
        let (order, replayed) = self
            .intake
            .place_by(place, deadline)
            .await
            .map_err(status)?;
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
        self.limits.read.check_caller(&caller)?;
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
        self.limits.read.check_caller(&caller)?;
        let r = req.into_inner();
        check_fields([
            check_optional_text("user_id", &r.user_id, USER_ID_MAX_LEN),
            check_optional_text("page_token", &r.page_token, PAGE_TOKEN_MAX_LEN),
        ])?;
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
        self.limits.read.check_caller(&caller)?;
        let id = parse_order_id(&req.get_ref().order_id).map_err(status)?;
        // Counted until the stream is dropped (the client went away or the order ended).
        let open = self.limits.watch_order.open(&caller.subject)?;
        let rx = self.queries.watch(&caller, id).await.map_err(status)?;
        let stream = futures_util::StreamExt::map(
            tokio_stream::wrappers::ReceiverStream::new(rx),
            move |item| {
                let _open = &open;
                item.map(|o| WatchOrderResponse {
                    order: Some(order_to_proto(o)),
                })
                .map_err(status)
            },
        );
        Ok(Response::new(Box::pin(stream)))
    }

    async fn pay_order(
        &self,
        req: Request<PayOrderRequest>,
    ) -> Result<Response<PayOrderResponse>, Status> {
        let caller = authorize(&req, BUYER)?;
        self.limits.pay_order.check(&caller.subject)?;
        let r = req.into_inner();
        let start =
            StartPayment::new(&r.order_id, &r.payment_id, r.amount_cents).map_err(status)?;
        let started = self
            .pays
            .call(PayCall {
                caller,
                pay: start,
                trace: flashsale_messaging::outbox::current_trace(),
            })
            .await
            .map_err(|e| status(OrderError::Internal(anyhow::Error::new(e))))?
            .map_err(status)?;
        Ok(Response::new(PayOrderResponse {
            order: Some(order_to_proto(started.order)),
            replayed: started.replayed,
            checkout: Some(checkout_to_proto(started.payment)),
        }))
    }

    async fn cancel_order(
        &self,
        req: Request<CancelOrderRequest>,
    ) -> Result<Response<CancelOrderResponse>, Status> {
        let caller = authorize(&req, BUYER_OR_ADMIN)?;
        self.limits.cancel_order.check_caller(&caller)?;
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

    async fn get_sale_report(
        &self,
        req: Request<GetSaleReportRequest>,
    ) -> Result<Response<GetSaleReportResponse>, Status> {
        authorize(&req, ADMIN)?;
        let sku = &req.get_ref().sku;
        flashsale_contract::check_sku(sku)
            .map_err(|e| status(OrderError::invalid("sku", e.to_string())))?;
        let report = self.reports.sale(sku).await.map_err(status)?;
        Ok(Response::new(GetSaleReportResponse {
            report: Some(sale_report_to_proto(report)),
        }))
    }

    async fn list_pending_orders(
        &self,
        req: Request<ListPendingOrdersRequest>,
    ) -> Result<Response<ListPendingOrdersResponse>, Status> {
        authorize(&req, SERVICE)?;
        let r = req.into_inner();
        check_fields([check_optional_text(
            "page_token",
            &r.page_token,
            PAGE_TOKEN_MAX_LEN,
        )])?;
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
        check_fields([check_optional_text(
            "page_token",
            &r.page_token,
            PAGE_TOKEN_MAX_LEN,
        )])?;
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

    async fn list_refunds(
        &self,
        req: Request<ListRefundsRequest>,
    ) -> Result<Response<ListRefundsResponse>, Status> {
        list_refunds(&self.refunds, req).await
    }

    async fn retry_refund(
        &self,
        req: Request<RetryRefundRequest>,
    ) -> Result<Response<RetryRefundResponse>, Status> {
        retry_refund(&self.refunds, req).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_calls_deadline_is_read_from_its_grpc_timeout_header_and_a_bad_one_is_none() {
        let timeout = |v: &str| {
            let mut m = tonic::metadata::MetadataMap::new();
            m.insert("grpc-timeout", v.parse().unwrap());
            call_timeout(&m)
        };
        assert_eq!(timeout("1S"), Some(Duration::from_secs(1)));
        assert_eq!(timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(timeout("3M"), Some(Duration::from_secs(180)));
        assert_eq!(
            timeout("99999999u"),
            Some(Duration::from_micros(99_999_999))
        );
        assert_eq!(timeout("5n"), Some(Duration::from_nanos(5)));
        for bad in [
            "",
            "S",
            "1",
            "1s",
            "123456789m",
            "-1S",
            "1.5S",
            "+1S",
            "1 S",
        ] {
            assert_eq!(timeout(bad), None, "{bad:?}");
        }
        assert_eq!(call_timeout(&tonic::metadata::MetadataMap::new()), None);
    }
}
