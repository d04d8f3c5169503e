//! PayOrder and CancelOrder. PayOrder starts a payment at the provider (it never makes an order
//! PAID: only the provider's signed notification does, in `payments`); CancelOrder is a
//! compare-and-set that races the payment timeout with exactly one winner. The cancellation
//! and the refund are shared with the saga's consumers and the notifications.

use std::{collections::HashMap, sync::Arc};

use chrono::Utc;
use flashsale_messaging::{envelope, outbox, trace};
use flashsale_platform::{
    auth::{Caller, Role},
    batch::{BatchMetrics, Batcher, answered_together_or_each},
};
use flashsale_proto::events::v1::{Envelope, OrderPaid, OrderRefunded, envelope::Payload};
use sea_orm::{DatabaseConnection, DatabaseTransaction, TransactionTrait as _};
use tracing::Instrument as _;
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
    /// Two statements, neither in a transaction (a PayOrder changes nothing in the order): one
    /// reads the order with its payment, one records the provider's payment and reads both
    /// back. Only an order found past its deadline is locked, to be cancelled.
    #[tracing::instrument(target = "flashsale::log_scope", skip_all, fields(order_id = %p.order_id))]
    pub async fn start_payment(
        &self,
        caller: &Caller,
        p: StartPayment,
    ) -> Result<Started, OrderError> {
        let found = db::order_with_payment(&self.db, p.order_id).await?;
        let step = match self.step(caller, &p, found)? {
            Step::Expire => self.expire(caller, &p).await?,
            step => step,
        };
        let order = match step {
            Step::Answer(started) => return Ok(started),
            Step::Start(order) => order,
            Step::Expire => return Err(OrderError::NotPayable(Status::Cancelled)),
        };
        let created = self.create_at_provider(&order).await?;
        let recorded = db::record_payments(&self.db, &[(order.order_id, created)]).await?;
        answer_recorded(recorded.into_iter().next(), order.order_id)
    }

    /// What PayOrder does with what was read of its order.
    fn step(
        &self,
        caller: &Caller,
        p: &StartPayment,
        found: Option<db::OrderWithPayment>,
    ) -> Result<Step, OrderError> {
        let (order, started) = match found {
            Some((o, started)) if caller.role == Role::Admin || o.user_id == caller.subject => {
                (o, started)
            }
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
        Ok(match decide(&order, started) {
            Decision::Start => Step::Start(order),
            Decision::Replay(payment) => Step::Answer(Started {
                order,
                payment,
                replayed: true,
            }),
            Decision::Refuse(status) => return Err(OrderError::NotPayable(status)),
            Decision::Expire => Step::Expire,
        })
    }

    /// An order found past its deadline, decided again under its row lock (it may have moved
    /// meanwhile): cancelled (PAYMENT_TIMEOUT) and refused, or answered, or to be started.
    async fn expire(&self, caller: &Caller, p: &StartPayment) -> Result<Step, OrderError> {
        let txn = self.db.begin().await?;
        let order = owned(&txn, caller, p.order_id).await?;
        let started = payment_store::payment_of_order(&txn, order.order_id).await?;
        match decide(&order, started) {
            Decision::Expire => {
                // The deadline is strict: the timeout wins even if its message is late.
                cancel_in(&txn, &order, CancelReason::PaymentTimeout, None).await?;
                txn.commit().await?;
                Err(OrderError::NotPayable(Status::Cancelled))
            }
            Decision::Replay(payment) => {
                txn.commit().await?;
                Ok(Step::Answer(Started {
                    order,
                    payment,
                    replayed: true,
                }))
            }
            Decision::Refuse(status) => Err(OrderError::NotPayable(status)),
            Decision::Start => {
                txn.rollback().await?;
                Ok(Step::Start(order))
            }
        }
    }

    /// Asks the provider for the order's payment (the same one for the same order, so a
    /// concurrent or retried PayOrder ends with the one payment), with no lock held.
    async fn create_at_provider(&self, order: &Order) -> Result<ProviderPayment, OrderError> {
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
        Ok(created)
    }

    /// PayOrders arriving together (docs/architecture.md#batchers): one read of every order
    /// with its payment, the provider's calls at once, one statement recording every payment
    /// created and reading the orders back. An order past its deadline sends the batch one by
    /// one through [`Self::start_payment`], which cancels it under its lock.
    pub async fn start_payments(
        &self,
        items: Vec<PayCall>,
    ) -> Vec<Result<Started, OrderError>> {
        answered_together_or_each(
            &items,
            BatchMetrics {
                size: "flashsale_pay_order_batch_size",
                fallbacks: "flashsale_pay_order_batch_fallbacks_total",
            },
            |all| self.start_together(all),
            |c| {
                let started = self.start_payment(&c.caller, c.pay.clone());
                async move { Ok(started.await) }.instrument(trace::on_behalf_of(&c.trace))
            },
        )
        .await
        .into_iter()
        .map(|r| r.and_then(|answer| answer))
        .collect()
    }

    /// `Ok(None)` when some order is past its deadline (the batch goes one by one).
    async fn start_together(
        &self,
        items: &[PayCall],
    ) -> Result<Option<Vec<Result<Started, OrderError>>>, OrderError> {
        let ids: Vec<Uuid> = items.iter().map(|c| c.pay.order_id).collect();
        let found: HashMap<Uuid, db::OrderWithPayment> =
            db::orders_with_payments(&self.db, &ids)
                .await?
                .into_iter()
                .map(|(o, p)| (o.order_id, (o, p)))
                .collect();
        let mut steps = Vec::with_capacity(items.len());
        for c in items {
            let step = self.step(&c.caller, &c.pay, found.get(&c.pay.order_id).cloned());
            if matches!(step, Ok(Step::Expire)) {
                return Ok(None);
            }
            steps.push(step);
        }
        // The provider's calls at once; each answer or failure is its PayOrder's own.
        let created = futures_util::future::join_all(steps.iter().zip(items).map(|(s, c)| {
            async move {
                match s {
                    Ok(Step::Start(order)) => Some(self.create_at_provider(order).await),
                    _ => None,
                }
            }
            .instrument(trace::on_behalf_of(&c.trace))
        }))
        .await;
        let to_record: Vec<(Uuid, ProviderPayment)> = steps
            .iter()
            .zip(&created)
            .filter_map(|(s, c)| match (s, c) {
                (Ok(Step::Start(o)), Some(Ok(p))) => Some((o.order_id, p.clone())),
                _ => None,
            })
            .collect();
        let recorded: HashMap<Uuid, db::OrderWithPayment> = if to_record.is_empty() {
            HashMap::new()
        } else {
            db::record_payments(&self.db, &to_record)
                .await?
                .into_iter()
                .map(|(o, p)| (o.order_id, (o, p)))
                .collect()
        };
        Ok(Some(
            steps
                .into_iter()
                .zip(created)
                .map(|(step, created)| match (step, created) {
                    (Err(e), _) => Err(e),
                    (Ok(Step::Answer(started)), _) => Ok(started),
                    (Ok(Step::Start(_)), Some(Err(e))) => Err(e),
                    (Ok(Step::Start(o)), _) => {
                        answer_recorded(recorded.get(&o.order_id).cloned(), o.order_id)
                    }
                    (Ok(Step::Expire), _) => Err(OrderError::Internal(anyhow::anyhow!(
                        "an expired order left in a batch"
                    ))),
                })
                .collect::<Vec<_>>(),
        ))
    }

    /// Cancels an order that is not paid yet; an already cancelled order is returned as it is.
    #[tracing::instrument(target = "flashsale::log_scope", skip_all, fields(order_id = %id))]
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

/// The PayOrder batcher: the calls that arrive while a batch runs form the next one, so
/// batches grow with the load and a lone call runs at once.
pub type PayBatcher = Batcher<PayCall, Result<Started, OrderError>>;

/// Most PayOrder calls in one batch.
pub const PAY_MAX_BATCH: usize = 128;

/// Starts the PayOrder batcher: two batches at a time, each [`Checkout::start_payments`].
pub fn pay_batcher(checkout: Checkout) -> PayBatcher {
    Batcher::serving(
        "order_pay_order",
        PAY_MAX_BATCH,
        std::time::Duration::ZERO,
        2,
        checkout,
        |checkout, items| async move { checkout.start_payments(items).await },
    )
}

/// One PayOrder call, for the batcher.
#[derive(Clone, Debug)]
pub struct PayCall {
    pub caller: Caller,
    pub pay: StartPayment,
    /// The PayOrder's trace context: its call to the provider continues it.
    pub trace: outbox::TraceHeaders,
}

/// What a PayOrder does next, once its order is read.
enum Step {
    /// Answered from what was read (a replay).
    Answer(Started),
    /// Ask the provider.
    Start(Order),
    /// Past its deadline: cancel under the lock.
    Expire,
}

/// PayOrder's answer from the order as read back with its recorded payment.
fn answer_recorded(
    recorded: Option<db::OrderWithPayment>,
    order_id: Uuid,
) -> Result<Started, OrderError> {
    let Some((order, Some(stored))) = recorded else {
        return Err(OrderError::Internal(anyhow::anyhow!(
            "the payment of order {order_id} vanished"
        )));
    };
    match order.status {
        Status::AwaitingPayment | Status::Paid | Status::Shipped => Ok(Started {
            order,
            payment: stored.payment,
            replayed: false,
        }),
        other => Err(OrderError::NotPayable(other)),
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
    super::saga::reached("cancelled", [order.created_at]);
    Ok(true)
}
