//! The order use cases, one small handle per group: [`Intake`] (CreateOrder), [`Checkout`]
//! (PayOrder, CancelOrder), [`Payments`] (the provider's notifications), [`Refunds`] (the
//! refund worker and ListRefunds), [`Reconciler`] (payments whose notification never came,
//! asked about at the provider), [`Saga`] (the consumers and the deadline sweeper) and [`Queries`]
//! (GetOrder, ListOrders, WatchOrder) and [`Stuck`] (ListStuckOrders and the stuck-order
//! gauge). The gRPC API and the event consumers call these; nothing
//! here knows about tonic or lapin.

use flashsale_messaging::envelope;
use flashsale_proto::{
    events::v1::{Envelope, OrderCancelled, envelope::Payload},
    order::v1 as pb,
};
use sea_orm::ConnectionTrait;

use crate::{
    domain::{CancelReason, Order, OrderError, Status},
    infra::db,
};

mod admission;
mod checkout;
mod intake;
mod metric_help;
mod notify_batch;
mod page;
mod payments;
mod queries;
mod reconcile;
mod refunds;
mod report;
mod refusal_tally;
mod saga;
mod saga_batch;
mod sale_window;
mod shipped_batch;
mod sold_out;
mod stuck;

pub use admission::{Admission, BACKLOG_GAUGE};
pub use metric_help::describe as describe_metrics;
pub use checkout::{Checkout, PAY_MAX_BATCH, PayBatcher, PayCall, Started, pay_batcher};
pub use intake::{
    FP_AFTER_BATCH_WRITE, Intake, PendingWrite, REMEMBERED, SOLD_OUT_REMEMBERED, WRITE_FALLBACKS,
    WRITES_EXPIRED, Written, write_pending, write_pending_batch, write_pending_batch_or_each,
    write_pending_batch_with,
};
pub use notify_batch::{MAX_BATCH as NOTIFY_MAX_BATCH, NotifyBatcher, notify_batcher};
pub use payments::{Applied, Payments, SignedNotice};
pub use queries::Queries;
pub use reconcile::{RECONCILED_TOTAL, Reconciled, Reconciler};
pub use refunds::{
    DEFAULT_REFUND_PAGE_SIZE, MAX_REFUND_PAGE_SIZE, REFUNDS_GAUGE, RefundPage, Refunds,
};
pub use saga::Saga;
pub use saga_batch::{Reserved, ReservedBatcher, reserved_batcher};
pub use shipped_batch::{Completed, CompletedBatcher, completed_batcher};
pub use report::{MAX_REPORT_SECONDS, Reports, SaleReport, SaleSecond};
pub use refusal_tally::{FLUSH_EVERY as REFUSALS_FLUSH_EVERY, RefusalTally};
pub use sale_window::{CLOCK, GateClock, OPENING_MARGIN, SaleWindows, WindowVerdict};
pub use sold_out::{Load, SoldOutCache, Verdict};
pub use stuck::{
    DEFAULT_STUCK_PAGE_SIZE, MAX_STUCK_PAGE_SIZE, STUCK_GAUGE, Stuck, StuckOrder, StuckPage,
};

/// The name this service signs its events with.
pub const PRODUCER: &str = "order";

/// The order `order_id`, which must exist.
async fn load<C: ConnectionTrait>(db: &C, order_id: uuid::Uuid) -> Result<Order, OrderError> {
    db::order(db, order_id, false)
        .await?
        .ok_or(OrderError::NotFound(order_id))
}

pub(crate) fn status_to_proto(s: Status) -> pb::OrderStatus {
    match s {
        Status::Pending => pb::OrderStatus::Pending,
        Status::AwaitingPayment => pb::OrderStatus::AwaitingPayment,
        Status::Paid => pb::OrderStatus::Paid,
        Status::Shipped => pb::OrderStatus::Shipped,
        Status::Cancelled => pb::OrderStatus::Cancelled,
    }
}

pub(crate) fn reason_to_proto(r: CancelReason) -> pb::CancelReason {
    match r {
        CancelReason::OutOfStock => pb::CancelReason::OutOfStock,
        CancelReason::PaymentTimeout => pb::CancelReason::PaymentTimeout,
        CancelReason::UserCancelled => pb::CancelReason::UserCancelled,
        CancelReason::OutboundFailed => pb::CancelReason::OutboundFailed,
        CancelReason::HoldExpired => pb::CancelReason::HoldExpired,
    }
}

/// `order.cancelled` for `order`, which was in `previous` (caused by `cause` when an event).
fn cancelled_event(
    order: &Order,
    previous: Status,
    reason: CancelReason,
    cause: Option<&Envelope>,
) -> Envelope {
    let payload = Payload::OrderCancelled(OrderCancelled {
        order_id: order.order_id.to_string(),
        user_id: order.user_id.clone(),
        sku: order.sku.clone(),
        quantity: order.quantity,
        reason: reason_to_proto(reason) as i32,
        previous_status: status_to_proto(previous) as i32,
    });
    match cause {
        Some(c) => envelope::caused_by(c, payload, PRODUCER),
        None => envelope::new(payload, order.order_id.to_string(), "", PRODUCER),
    }
}
