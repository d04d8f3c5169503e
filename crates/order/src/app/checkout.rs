//! PayOrder and CancelOrder. PayOrder starts a payment at the provider (it never makes an order
//! PAID: only the provider's signed notification does, in `payments`); CancelOrder is a
//! compare-and-set that races the payment timeout with exactly one winner. The cancellation
//! and the refund are shared with the saga's consumers and the notifications.

use std::sync::Arc;

use chrono::Utc;
use flashsale_messaging::{envelope, outbox};
use flashsale_platform::auth::{Caller, Role};
use flashsale_proto::events::v1::{Envelope, OrderPaid, OrderRefunded, envelope::Payload};
use sea_orm::{DatabaseConnection, DatabaseTransaction, TransactionTrait as _};
use uuid::Uuid;

use super::{PRODUCER, cancelled_event, reason_to_proto};
use crate::{
    domain::{
        CancelReason, NewPayment, Order, OrderError, PaymentProvider, ProviderError,
        ProviderPayment, StartPayment, Status,
    },
    infra::{
        db::{self, Change},
        payment_store,
    },
};

/// PayOrder and CancelOrder. Cheap to clone.
#[derive(Clone)]
pub struct Checkout {
    db: DatabaseConnection,
    provider: Arc<dyn PaymentProvider>,
    /// The currency of every price (`payment.currency`).
    currency: String,
    /// Where the provider sends this service's notifications.
    notify_url: String,
}

/// What PayOrder answers: the order as it is, its payment at the provider, and whether that
/// payment had been started before.
#[derive(Clone, Debug)]
pub struct Started {
    pub order: Order,
    pub payment: ProviderPayment,
    pub replayed: bool,
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
    pub fn new(
        db: DatabaseConnection,
        provider: Arc<dyn PaymentProvider>,
        currency: &str,
        notify_url: &str,
    ) -> Self {
        Self {
            db,
            provider,
            currency: currency.to_owned(),
            notify_url: notify_url.to_owned(),
        }
    }

    /// Starts paying an order awaiting payment: the provider creates (or returns) the order's
    /// one payment, and the buyer is sent to its checkout. The order stays AWAITING_PAYMENT.
    ///
    /// The common cases read without a lock or a transaction (a PayOrder changes nothing in
    /// the order): only an order found past its deadline is locked, to be cancelled.
    #[tracing::instrument(skip_all, fields(order_id = %p.order_id))]
    pub async fn start_payment(
        &self,
        caller: &Caller,
        p: StartPayment,
    ) -> Result<Started, OrderError> {
        let order = match db::order(&self.db, p.order_id, false).await? {
            Some(o) if caller.role == Role::Admin || o.user_id == caller.subject => o,
            _ => return Err(OrderError::NotFound(p.order_id)),
        };
        if order.user_id != caller.subject {
            return Err(OrderError::PermissionDenied(
                "only the buyer pays an order".into(),
            ));
        }
        if p.amount_cents != 0 && p.amount_cents != order.total_cents {
            return Err(OrderError::WrongAmount(order.total_cents));
        }
        let started = payment_store::payment_of_order(&self.db, order.order_id).await?;
        let order = match decide(&order, started) {
            Decision::Start => order,
            Decision::Replay(payment) => {
                return Ok(Started {
                    order,
                    payment,
                    replayed: true,
                });
            }
            Decision::Refuse(status) => return Err(OrderError::NotPayable(status)),
            Decision::Expire => {
                // Decided again under the row lock: the order may have moved meanwhile.
                let txn = self.db.begin().await?;
                let order = owned(&txn, caller, p.order_id).await?;
                let started = payment_store::payment_of_order(&txn, order.order_id).await?;
                match decide(&order, started) {
                    Decision::Expire => {
                        // The deadline is strict: the timeout wins even if its message is late.
                        cancel_in(&txn, &order, CancelReason::PaymentTimeout, None).await?;
                        txn.commit().await?;
                        return Err(OrderError::NotPayable(Status::Cancelled));
                    }
                    Decision::Replay(payment) => {
                        txn.commit().await?;
                        return Ok(Started {
                            order,
                            payment,
                            replayed: true,
                        });
                    }
                    Decision::Refuse(status) => return Err(OrderError::NotPayable(status)),
                    Decision::Start => {
                        txn.rollback().await?;
                        order
                    }
                }
            }
        };
        // The provider is called with no lock held; it answers the same payment for the same
        // order, so a concurrent or retried PayOrder ends with the one payment.
        let Some(deadline) = order.payment_deadline else {
            return Err(OrderError::NotPayable(order.status));
        };
        let created = self
            .provider
            .create_payment(&NewPayment {
                order_id: order.order_id,
                amount_cents: order.total_cents,
                currency: self.currency.clone(),
                notify_url: self.notify_url.clone(),
                expires_at: deadline,
            })
            .await?;
        if created.amount_cents != order.total_cents || created.currency != self.currency {
            return Err(ProviderError::Refused(format!(
                "the provider created a payment of {} {} for an order of {} {}",
                created.amount_cents, created.currency, order.total_cents, self.currency
            ))
            .into());
        }
        // Recorded whatever the order became meanwhile, so the provider's notification can be
        // matched (and a payment the buyer makes anyway refunded). One statement, committed on
        // its own; the first payment recorded for the order wins.
        payment_store::insert_payment(&self.db, order.order_id, &created).await?;
        let stored = payment_store::payment_of_order(&self.db, order.order_id)
            .await?
            .ok_or_else(|| OrderError::Internal(anyhow::anyhow!("payment vanished")))?;
        let order = super::load(&self.db, order.order_id).await?;
        match order.status {
            Status::AwaitingPayment | Status::Paid | Status::Shipped => Ok(Started {
                order,
                payment: stored.payment,
                replayed: false,
            }),
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

/// What PayOrder does with an order, given the payment already started for it.
enum Decision {
    /// Awaiting payment within its deadline, nothing started: ask the provider.
    Start,
    /// A payment was started before: answer it again.
    Replay(ProviderPayment),
    /// Awaiting payment past its deadline: cancel it (PAYMENT_TIMEOUT) and refuse.
    Expire,
    /// Not payable in this state.
    Refuse(Status),
}

fn decide(order: &Order, started: Option<payment_store::StoredPayment>) -> Decision {
    let overdue = order.payment_deadline.is_some_and(|d| d <= Utc::now());
    match (order.status, started) {
        (Status::AwaitingPayment, _) if overdue => Decision::Expire,
        (Status::AwaitingPayment | Status::Paid | Status::Shipped, Some(s)) => {
            Decision::Replay(s.payment)
        }
        (Status::AwaitingPayment, None) => Decision::Start,
        (other, _) => Decision::Refuse(other),
    }
}

/// Records the order's refund (once) with `order.refunded`; the refund worker then asks the
/// provider to pay it (`refunds`).
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

/// `order.paid` for `order`, paid by the provider's payment `payment_id`.
pub(super) fn paid_event(order: &Order, payment_id: &str, amount_cents: i64) -> Envelope {
    let ev = OrderPaid {
        order_id: order.order_id.to_string(),
        user_id: order.user_id.clone(),
        sku: order.sku.clone(),
        quantity: order.quantity,
        payment_id: payment_id.to_owned(),
        amount_cents,
        deduction_policy: order.policy.as_proto(),
    };
    envelope::new(
        Payload::OrderPaid(ev),
        order.order_id.to_string(),
        "",
        PRODUCER,
    )
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
