//! PayOrder and CancelOrder: compare-and-set transitions that race the payment timeout with
//! exactly one winner; a payment that loses is refused and refunded. The cancellation and the
//! refund are shared with the saga's consumers.

use flashsale_messaging::{envelope, outbox};
use flashsale_platform::auth::{Caller, Role};
use flashsale_proto::events::v1::{Envelope, OrderPaid, OrderRefunded, envelope::Payload};
use sea_orm::{DatabaseConnection, DatabaseTransaction, TransactionTrait as _};
use uuid::Uuid;

use super::{PRODUCER, cancelled_event, reason_to_proto};
use crate::{
    domain::{CancelReason, Order, OrderError, Payment, Status},
    infra::db::{self, Change},
};

/// PayOrder and CancelOrder. Cheap to clone.
#[derive(Clone)]
pub struct Checkout {
    db: DatabaseConnection,
}

/// The order, locked, if `caller` may act on it (a user only on their own: others' orders are
/// NOT_FOUND, so ids cannot be probed).
pub(super) async fn owned(
    txn: &DatabaseTransaction,
    caller: &Caller,
    id: Uuid,
) -> Result<Order, OrderError> {
    match db::order(txn, id, true).await? {
        Some(o) if caller.role == Role::Admin || o.user_id == caller.subject => Ok(o),
        _ => Err(OrderError::NotFound(id)),
    }
}

impl Checkout {
    pub fn new(db: DatabaseConnection) -> Self {
        Self { db }
    }

    /// Pays an order awaiting payment; `(order, replayed)`.
    #[tracing::instrument(skip_all, fields(order_id = %p.order_id))]
    pub async fn pay(&self, caller: &Caller, p: Payment) -> Result<(Order, bool), OrderError> {
        let txn = self.db.begin().await?;
        if let Some((order_id, amount, accepted)) = db::payment(&txn, &p.payment_id).await? {
            if order_id != p.order_id || amount != p.amount_cents {
                return Err(OrderError::IdempotencyKeyReused("payment_id"));
            }
            let order = owned(&txn, caller, order_id).await?;
            txn.commit().await?;
            return if accepted {
                Ok((order, true))
            } else {
                Err(OrderError::NotPayable(order.status))
            };
        }
        let order = owned(&txn, caller, p.order_id).await?;
        if order.user_id != caller.subject {
            return Err(OrderError::PermissionDenied(
                "only the buyer pays an order".into(),
            ));
        }
        if p.amount_cents != order.total_cents {
            return Err(OrderError::WrongAmount(order.total_cents));
        }
        let overdue = order
            .payment_deadline
            .is_some_and(|d| d <= chrono::Utc::now());
        if order.status == Status::AwaitingPayment && overdue {
            // The deadline is strict: the timeout wins even if its message is late.
            cancel_in(&txn, &order, CancelReason::PaymentTimeout, None).await?;
            db::record_payment(&txn, &p.payment_id, order.order_id, p.amount_cents, false).await?;
            refund(
                &txn,
                &order,
                &p.payment_id,
                p.amount_cents,
                CancelReason::PaymentTimeout,
                None,
            )
            .await?;
            txn.commit().await?;
            return Err(OrderError::NotPayable(Status::Cancelled));
        }
        match order.status {
            Status::AwaitingPayment => {
                let change = Change {
                    payment_id: Some(&p.payment_id),
                    note: "PayOrder",
                    ..Change::default()
                };
                if !db::transition(
                    &txn,
                    order.order_id,
                    Status::AwaitingPayment,
                    Status::Paid,
                    change,
                )
                .await?
                {
                    return Err(OrderError::Internal(anyhow::anyhow!(
                        "order changed under its row lock"
                    )));
                }
                db::record_payment(&txn, &p.payment_id, order.order_id, p.amount_cents, true)
                    .await?;
                let ev = OrderPaid {
                    order_id: order.order_id.to_string(),
                    user_id: order.user_id.clone(),
                    sku: order.sku.clone(),
                    quantity: order.quantity,
                    payment_id: p.payment_id.clone(),
                    amount_cents: p.amount_cents,
                    deduction_policy: order.policy.as_proto(),
                };
                let env = envelope::new(
                    Payload::OrderPaid(ev),
                    order.order_id.to_string(),
                    "",
                    PRODUCER,
                );
                outbox::enqueue(&txn, &env).await?;
                txn.commit().await?;
                metrics::counter!("flashsale_orders_paid_total").increment(1);
                Ok((super::load(&self.db, order.order_id).await?, false))
            }
            Status::Cancelled => {
                // The payment lost the race (timeout, cancel): the money goes back, once per order.
                db::record_payment(&txn, &p.payment_id, order.order_id, p.amount_cents, false)
                    .await?;
                let reason = order.cancel_reason.unwrap_or(CancelReason::PaymentTimeout);
                refund(&txn, &order, &p.payment_id, p.amount_cents, reason, None).await?;
                txn.commit().await?;
                Err(OrderError::NotPayable(Status::Cancelled))
            }
            other => Err(OrderError::NotPayable(other)),
        }
    }

    /// Cancels an order that is not paid yet; an already cancelled order is returned as it is.
    #[tracing::instrument(skip_all, fields(order_id = %id))]
    pub async fn cancel(&self, caller: &Caller, id: Uuid) -> Result<Order, OrderError> {
        let txn = self.db.begin().await?;
        let order = owned(&txn, caller, id).await?;
        match order.status {
            Status::Cancelled => {
                txn.commit().await?;
                Ok(order)
            }
            Status::Pending | Status::AwaitingPayment => {
                cancel_in(&txn, &order, CancelReason::UserCancelled, None).await?;
                txn.commit().await?;
                super::load(&self.db, id).await
            }
            other => Err(OrderError::NotCancellable(other)),
        }
    }
}

/// Records the order's refund (once) with `order.refunded`.
pub(super) async fn refund(
    txn: &DatabaseTransaction,
    order: &Order,
    payment_id: &str,
    amount: i64,
    reason: CancelReason,
    cause: Option<&Envelope>,
) -> Result<(), OrderError> {
    if !db::record_refund(txn, order.order_id, payment_id, amount, reason.as_db()).await? {
        return Ok(());
    }
    let payload = Payload::OrderRefunded(OrderRefunded {
        order_id: order.order_id.to_string(),
        user_id: order.user_id.clone(),
        payment_id: payment_id.to_owned(),
        amount_cents: amount,
        reason: reason_to_proto(reason) as i32,
    });
    let env = match cause {
        Some(c) => envelope::caused_by(c, payload, PRODUCER),
        None => envelope::new(payload, order.order_id.to_string(), "", PRODUCER),
    };
    outbox::enqueue(txn, &env).await?;
    metrics::counter!("flashsale_refunds_total", "reason" => reason.as_db()).increment(1);
    Ok(())
}

/// Moves `order` (locked in `txn`) to CANCELLED with `reason` and publishes
/// `order.cancelled`, which returns its stock. Returns whether it was still cancellable.
pub(super) async fn cancel_in(
    txn: &DatabaseTransaction,
    order: &Order,
    reason: CancelReason,
    cause: Option<&Envelope>,
) -> Result<bool, OrderError> {
    let change = Change {
        cancel_reason: Some(reason),
        ..Change::default()
    };
    if !db::transition(txn, order.order_id, order.status, Status::Cancelled, change).await? {
        return Ok(false);
    }
    outbox::enqueue(txn, &cancelled_event(order, order.status, reason, cause)).await?;
    metrics::counter!("flashsale_orders_cancelled_total", "reason" => reason.as_db()).increment(1);
    Ok(true)
}
