//! The order service's consumers (docs/architecture.md#the-order-saga) and the deadline
//! sweeper. Each handler runs in one transaction with its inbox row; every transition is a
//! compare-and-set, so duplicates and races (payment vs timeout, sweeper vs delayed message)
//! have one winner.

use std::time::Duration;

use chrono::{DateTime, Utc};
use flashsale_contract::to_timestamp;
use flashsale_messaging::{DelayQueue, envelope, inbox, outbox};
use flashsale_platform::failpoint::Failpoints;
use flashsale_proto::events::v1::{
    Envelope, OutboundFailed, PaymentTimeout, ReservationFailureReason, StockReservationFailed,
    envelope::Payload,
};
use sea_orm::{DatabaseConnection, DatabaseTransaction, TransactionTrait as _};
use uuid::Uuid;

use super::{
    PRODUCER,
    checkout::{cancel_in, refund},
};
use crate::{
    config::SagaSettings,
    domain::{CancelReason, Order, OrderError, Status, parse_order_id},
    infra::db::{self, Change},
};

const SWEEP_BATCH: u64 = 200;
/// Failpoint reached inside the `stock.reserved` consumer, right before its commit (one by one
/// and batched).
pub const FP_RESERVED_BEFORE_COMMIT: &str = "order.stock_reserved.before_commit";
/// Failpoint reached inside the payment-timeout consumer, right before its commit.
pub const FP_TIMEOUT_BEFORE_COMMIT: &str = "order.payment_timeout.before_commit";
/// Failpoint reached inside the `outbound.completed`/`outbound.failed` consumer, right before
/// its commit.
pub const FP_OUTBOUND_RESULT_BEFORE_COMMIT: &str = "order.outbound_result.before_commit";
/// Most orders one payment-timeout message may name (a confirmation batch holds at most 128).
pub const MAX_TIMER_ORDERS: usize = 1_000;

/// Histogram: seconds from an order's acceptance to a step of its saga, by `stage`:
/// `confirmed` (its stock persisted: AWAITING_PAYMENT), `paid`, `shipped` or `cancelled`.
pub const SAGA_SECONDS: &str = "flashsale_order_saga_seconds";

/// Records, for orders accepted at `created`, that they reached `stage` now ([`SAGA_SECONDS`]).
pub(crate) fn reached(stage: &'static str, created: impl IntoIterator<Item = DateTime<Utc>>) {
    let now = Utc::now();
    let seconds = metrics::histogram!(SAGA_SECONDS, "stage" => stage);
    for c in created {
        seconds.record((now - c).num_microseconds().unwrap_or(i64::MAX).max(0) as f64 / 1e6);
    }
}

/// The delayed payment timeout of `order_id` and `more_order_ids` (confirmed together, so
/// sharing `deadline`), caused by the `stock.reserved` that confirmed the first.
pub(super) fn payment_timer(
    cause: &Envelope,
    deadline: chrono::DateTime<Utc>,
    order_id: String,
    more_order_ids: Vec<String>,
) -> Envelope {
    let timer = PaymentTimeout {
        order_id,
        deadline: Some(to_timestamp(deadline)),
        more_order_ids,
    };
    envelope::caused_by(cause, Payload::PaymentTimeout(timer), PRODUCER)
}

/// The use cases of the saga's consumers and the deadline sweeper. Cheap to clone.
#[derive(Clone)]
pub struct Saga {
    pub(super) db: DatabaseConnection,
    /// Where payment timers wait out the buyer's time to pay.
    pub(super) payment_timeout: DelayQueue,
    /// How long a buyer has to pay once the stock is persisted.
    time_to_pay: chrono::Duration,
    sweep_interval: Duration,
    pub(super) failpoints: Failpoints,
}

impl Saga {
    pub fn new(
        db: DatabaseConnection,
        payment_timeout: DelayQueue,
        settings: &SagaSettings,
    ) -> Self {
        Self {
            db,
            payment_timeout,
            time_to_pay: chrono::Duration::milliseconds(
                i64::try_from(settings.payment_timeout_ms).unwrap_or(i64::MAX),
            ),
            sweep_interval: Duration::from_millis(settings.sweep_interval_ms),
            failpoints: Failpoints::default(),
        }
    }

    /// The same, reaching `failpoints` inside its consumers ([`FP_RESERVED_BEFORE_COMMIT`],
    /// [`FP_TIMEOUT_BEFORE_COMMIT`], [`FP_OUTBOUND_RESULT_BEFORE_COMMIT`]).
    pub fn with_failpoints(self, failpoints: Failpoints) -> Self {
        Self { failpoints, ..self }
    }

    /// The payment deadline of an order confirmed now.
    pub(super) fn payment_deadline(&self) -> chrono::DateTime<Utc> {
        Utc::now() + self.time_to_pay
    }

    /// Reaches failpoint `name` (an armed `error` fails the handler: nothing commits).
    pub(super) async fn failpoint(&self, name: &str) -> Result<(), OrderError> {
        self.failpoints
            .hit(name)
            .await
            .map_err(|e| OrderError::Internal(anyhow::Error::new(e)))
    }

    async fn claim(
        &self,
        consumer: &str,
        env: &Envelope,
    ) -> Result<Option<DatabaseTransaction>, OrderError> {
        let claim = inbox::Claim::current(env)
            .map_err(|e| OrderError::invalid("message_id", e.to_string()))?;
        let txn = self.db.begin().await?;
        Ok(inbox::claim(&txn, consumer, claim).await?.then_some(txn))
    }

    /// The order an event is about, locked; an unknown order is an invalid event.
    async fn subject(txn: &DatabaseTransaction, raw_id: &str) -> Result<Order, OrderError> {
        let id = parse_order_id(raw_id)?;
        db::order(txn, id, true)
            .await?
            .ok_or_else(|| OrderError::invalid("order_id", format!("no order {id}")))
    }

    /// `stock.reserved`: PENDING → AWAITING_PAYMENT with a deadline and its delayed timeout.
    pub async fn on_stock_reserved(
        &self,
        consumer: &str,
        env: &Envelope,
        order_id: &str,
    ) -> Result<(), OrderError> {
        let Some(txn) = self.claim(consumer, env).await? else {
            return Ok(());
        };
        let order = Self::subject(&txn, order_id).await?;
        if order.status == Status::Pending {
            let deadline = self.payment_deadline();
            let change = Change {
                payment_deadline: Some(deadline),
                note: "stock.reserved",
                ..Change::default()
            };
            if db::transition(
                &txn,
                order.order_id,
                Status::Pending,
                Status::AwaitingPayment,
                change,
            )
            .await?
            {
                reached("confirmed", [order.created_at]);
            }
            let timer = payment_timer(env, deadline, order.order_id.to_string(), Vec::new());
            outbox::enqueue_delayed(&txn, &timer, &self.payment_timeout).await?;
        }
        self.failpoint(FP_RESERVED_BEFORE_COMMIT).await?;
        txn.commit().await?;
        Ok(())
    }

    /// `stock.reservation_failed`: PENDING → CANCELLED (OUT_OF_STOCK, or HOLD_EXPIRED when
    /// product-stock had already released the hold).
    pub async fn on_reservation_failed(
        &self,
        consumer: &str,
        env: &Envelope,
        ev: &StockReservationFailed,
    ) -> Result<(), OrderError> {
        let Some(txn) = self.claim(consumer, env).await? else {
            return Ok(());
        };
        let id = parse_order_id(&ev.order_id)?;
        let Some(order) = db::order(&txn, id, true).await? else {
            // A hold that expired for an order that was never written (its caller gave up
            // between the gate and the write): nothing to cancel here.
            txn.commit().await?;
            return Ok(());
        };
        if order.status == Status::Pending {
            let reason = if ev.reason == ReservationFailureReason::OrderCancelled as i32 {
                CancelReason::HoldExpired
            } else {
                CancelReason::OutOfStock
            };
            // Nothing is reserved in product-stock for it, so no order.cancelled is needed; it
            // is published anyway, which product-stock takes as a no-op, to keep one path.
            cancel_in(&txn, &order, reason, Some(env)).await?;
        }
        txn.commit().await?;
        Ok(())
    }

    /// The delayed payment timeout of one order or of a confirmation batch's orders: each
    /// AWAITING_PAYMENT past its deadline → CANCELLED, in one transaction. A malformed or
    /// unknown id refuses the whole message and changes nothing.
    pub async fn on_payment_timeout(
        &self,
        consumer: &str,
        env: &Envelope,
        order_ids: &[&str],
    ) -> Result<(), OrderError> {
        if order_ids.is_empty() || order_ids.len() > MAX_TIMER_ORDERS {
            return Err(OrderError::invalid(
                "more_order_ids",
                format!("a payment timeout names 1..={MAX_TIMER_ORDERS} orders"),
            ));
        }
        for id in order_ids {
            parse_order_id(id)?;
        }
        let Some(txn) = self.claim(consumer, env).await? else {
            return Ok(());
        };
        for id in order_ids {
            let order = Self::subject(&txn, id).await?;
            // Each order's cancellation is correlated with that order, caused by this message.
            let cause = (env.correlation_id != *id).then(|| Envelope {
                correlation_id: (*id).to_owned(),
                ..env.clone()
            });
            Self::expire_if_due(&txn, &order, Some(cause.as_ref().unwrap_or(env))).await?;
        }
        self.failpoint(FP_TIMEOUT_BEFORE_COMMIT).await?;
        txn.commit().await?;
        Ok(())
    }

    async fn expire_if_due(
        txn: &DatabaseTransaction,
        order: &Order,
        cause: Option<&Envelope>,
    ) -> Result<bool, OrderError> {
        let due = order.payment_deadline.is_some_and(|d| d <= Utc::now());
        if order.status != Status::AwaitingPayment || !due {
            return Ok(false);
        }
        cancel_in(txn, order, CancelReason::PaymentTimeout, cause).await
    }

    /// `outbound.completed`: PAID → SHIPPED.
    pub async fn on_outbound_completed(
        &self,
        consumer: &str,
        env: &Envelope,
        order_id: &str,
    ) -> Result<(), OrderError> {
        let Some(txn) = self.claim(consumer, env).await? else {
            return Ok(());
        };
        let order = Self::subject(&txn, order_id).await?;
        if order.status == Status::Paid {
            let change = Change {
                note: "outbound.completed",
                ..Change::default()
            };
            if db::transition(&txn, order.order_id, Status::Paid, Status::Shipped, change).await? {
                reached("shipped", [order.created_at]);
            }
        }
        self.failpoint(FP_OUTBOUND_RESULT_BEFORE_COMMIT).await?;
        txn.commit().await?;
        Ok(())
    }

    /// `outbound.failed`: PAID → CANCELLED (OUTBOUND_FAILED), one refund, `order.refunded` and
    /// `order.cancelled` (which returns the unit).
    pub async fn on_outbound_failed(
        &self,
        consumer: &str,
        env: &Envelope,
        ev: &OutboundFailed,
    ) -> Result<(), OrderError> {
        let Some(txn) = self.claim(consumer, env).await? else {
            return Ok(());
        };
        let order = Self::subject(&txn, &ev.order_id).await?;
        if order.status == Status::Paid {
            cancel_in(&txn, &order, CancelReason::OutboundFailed, Some(env)).await?;
            let payment_id = order.payment_id.clone().unwrap_or_default();
            refund(
                &txn,
                &order,
                &payment_id,
                order.total_cents,
                CancelReason::OutboundFailed,
                Some(env),
            )
            .await?;
        }
        self.failpoint(FP_OUTBOUND_RESULT_BEFORE_COMMIT).await?;
        txn.commit().await?;
        Ok(())
    }

    /// Cancels every order past its deadline (in batches, skipping rows another replica holds).
    pub async fn sweep_overdue(&self) -> Result<u64, OrderError> {
        let mut total = 0;
        loop {
            let txn = self.db.begin().await?;
            let ids: Vec<Uuid> = db::overdue(&txn, SWEEP_BATCH).await?;
            let n = ids.len() as u64;
            for id in ids {
                if let Some(order) = db::order(&txn, id, true).await?
                    && Self::expire_if_due(&txn, &order, None).await?
                {
                    total += 1;
                }
            }
            txn.commit().await?;
            if n < SWEEP_BATCH {
                break;
            }
        }
        if total > 0 {
            metrics::counter!("flashsale_orders_swept_total").increment(total);
            tracing::info!(total, "cancelled orders past their payment deadline");
        }
        Ok(total)
    }

    /// Runs [`Self::sweep_overdue`] every `saga.sweep_interval_ms` until `shutdown`.
    pub async fn run_sweeper(
        self,
        shutdown: flashsale_platform::shutdown::Shutdown,
    ) -> anyhow::Result<()> {
        let period = self.sweep_interval;
        flashsale_platform::shutdown::every(period, shutdown, "deadline sweep", || {
            self.sweep_overdue()
        })
        .await
    }
}
