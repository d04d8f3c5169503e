//! Shipping paid orders (docs/architecture.md#the-order-saga): a shipment per `order.paid`; the
//! order's units deducted on product-stock with `CommitReservation`, then the warehouse asked
//! to ship (once per shipment: the shipment id is its request id); then `outbound.completed`,
//! or `outbound.failed` on a permanent refusal. A transient failure of product-stock, the
//! warehouse or the database delays a shipment with backoff and never fails it, so a paid order
//! ends shipped, or refunded only when something refused it for good.

use std::{sync::Arc, time::Duration};

use chrono::Utc;
use flashsale_messaging::{envelope, outbox};
use flashsale_platform::failpoint::Failpoints;
use flashsale_proto::events::v1::{
    Envelope, OrderPaid, OutboundCompleted, OutboundFailed, envelope::Payload,
};
use sea_orm::{DatabaseConnection, DatabaseTransaction, TransactionTrait as _};
use uuid::Uuid;

use crate::{
    config::ShippingSettings,
    domain::{OutboundError, Policy, Shipment, ShipmentStatus, backoff, parse_uuid},
    infra::{
        db::{self, NewShipment},
        stock::StockCommitter,
        warehouse::{Warehouse, WarehouseError},
    },
};

mod metric_help;
mod paid_batch;
mod query;

pub use metric_help::describe as describe_metrics;
pub use paid_batch::{MAX_BATCH as PAID_MAX_BATCH, Paid, PaidBatcher, paid_batcher};

/// The shipment an `order.paid` asks for, checked.
fn new_shipment(ev: &OrderPaid) -> Result<NewShipment<'_>, OutboundError> {
    let order_id = parse_uuid("order_id", &ev.order_id)?;
    if ev.quantity < 1 || flashsale_contract::check_sku(&ev.sku).is_err() || ev.user_id.is_empty() {
        return Err(OutboundError::invalid(
            "order.paid",
            "needs a user, a valid sku and a quantity >= 1",
        ));
    }
    let policy = if ev.deduction_policy
        == flashsale_proto::product::v1::DeductionPolicy::CommitAtOrder as i32
    {
        Policy::CommitAtOrder
    } else {
        Policy::ReserveThenCommit
    };
    Ok(NewShipment {
        order_id,
        user_id: &ev.user_id,
        sku: &ev.sku,
        quantity: ev.quantity,
        policy,
        payment_id: &ev.payment_id,
    })
}

/// The name this service signs its events with.
pub const PRODUCER: &str = "outbound";
/// Failpoint reached once product-stock deducted the order's units, before the warehouse is
/// asked: a crash here leaves the shipment PICKING, to be taken up again (the commit answers
/// the second time as a replay).
pub const FP_AFTER_COMMIT_BEFORE_WAREHOUSE: &str = "outbound.after_commit_before_warehouse";
/// Failpoint reached inside the `order.paid` consumer before the shipment is written.
pub const FP_ORDER_PAID_BEFORE_COMMIT: &str = "outbound.order_paid.before_commit";
/// Shipments the sweeper attempts at once (each holds a database connection while it waits on
/// product-stock or the warehouse).
const SWEEP_CONCURRENCY: usize = 4;
/// Most shipments one sweep takes up.
const SWEEP_BATCH: i64 = 100;

/// How processing a shipment ended this time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Processed {
    Shipped,
    Failed,
    /// A dependency did not answer: the shipment waits for its next attempt.
    Delayed,
    /// Already terminal (a redelivery): nothing done.
    AlreadyDone,
    /// Another worker holds it right now.
    Busy,
}

/// Why a step of an attempt did not go through.
enum StepError {
    /// A refusal retrying cannot change: the shipment fails.
    Permanent(String),
    /// Try again later.
    Transient(String),
}

#[derive(Clone)]
pub struct Shipping {
    db: DatabaseConnection,
    stock: Arc<dyn StockCommitter>,
    warehouse: Arc<dyn Warehouse>,
    settings: ShippingSettings,
    failpoints: Failpoints,
}

impl Shipping {
    pub fn new(
        db: DatabaseConnection,
        stock: Arc<dyn StockCommitter>,
        warehouse: Arc<dyn Warehouse>,
        settings: ShippingSettings,
    ) -> Self {
        Self {
            db,
            stock,
            warehouse,
            settings,
            failpoints: Failpoints::default(),
        }
    }

    /// The same, reaching `failpoints` at its steps ([`FP_ORDER_PAID_BEFORE_COMMIT`],
    /// [`FP_AFTER_COMMIT_BEFORE_WAREHOUSE`]).
    pub fn with_failpoints(self, failpoints: Failpoints) -> Self {
        Self { failpoints, ..self }
    }

    /// When the sweeper takes up a shipment created or attempted now, should its worker die.
    fn lease_end(&self) -> chrono::DateTime<Utc> {
        Utc::now() + millis(self.settings.stuck_after_ms)
    }

    /// `order.paid`: create the shipment (once per order) and ship it.
    #[tracing::instrument(target = "flashsale::log_scope", skip_all, fields(order_id = %ev.order_id))]
    pub async fn on_order_paid(
        &self,
        env: &Envelope,
        ev: &OrderPaid,
    ) -> Result<Processed, OutboundError> {
        let new = new_shipment(ev)?;
        self.failpoints
            .hit(FP_ORDER_PAID_BEFORE_COMMIT)
            .await
            .map_err(|e| OutboundError::Internal(anyhow::Error::new(e)))?;
        let shipment_id = db::create(&self.db, &new, self.lease_end()).await?;
        self.process(shipment_id, Some(env)).await
    }

    /// One attempt at a shipment, under its row lock (other workers skip it meanwhile): the
    /// stock deducted on product-stock unless it was already, then the warehouse. A permanent
    /// refusal of either fails the shipment (`outbound.failed`: the order is cancelled and
    /// refunded, and its units go back to stock); a transient one records why and when the
    /// shipment is tried again, and keeps what this attempt did (a deduction is not repeated).
    pub async fn process(
        &self,
        shipment_id: Uuid,
        cause: Option<&Envelope>,
    ) -> Result<Processed, OutboundError> {
        let txn = self.db.begin().await?;
        let Some(s) = db::lock(&txn, shipment_id).await? else {
            return Ok(Processed::Busy);
        };
        if s.status.is_terminal() {
            return Ok(Processed::AlreadyDone);
        }
        let attempt = s.attempts + 1;
        db::set_attempts(&txn, s.shipment_id, attempt).await?;
        let (step, outcome) = self.deduct_then_ship(&txn, &s, attempt).await?;
        match outcome {
            Ok(()) => {
                self.finish(&txn, &s, ShipmentStatus::Shipped, None, cause)
                    .await?;
                txn.commit().await?;
                count(ShipmentStatus::Shipped, 1);
                Ok(Processed::Shipped)
            }
            Err(StepError::Permanent(reason)) => {
                db::attempt(&txn, s.shipment_id, attempt, step, "PERMANENT", &reason).await?;
                self.finish(&txn, &s, ShipmentStatus::Failed, Some(&reason), cause)
                    .await?;
                txn.commit().await?;
                count(ShipmentStatus::Failed, 1);
                Ok(Processed::Failed)
            }
            Err(StepError::Transient(reason)) => {
                db::attempt(&txn, s.shipment_id, attempt, step, "TRANSIENT", &reason).await?;
                let wait = backoff(
                    attempt,
                    Duration::from_millis(self.settings.retry_base_ms),
                    Duration::from_millis(self.settings.retry_max_ms),
                    flashsale_platform::backoff::random_unit(),
                );
                let retry_at = Utc::now() + chrono::Duration::from_std(wait).unwrap_or_default();
                db::delay(&txn, s.shipment_id, &reason, retry_at).await?;
                txn.commit().await?;
                tracing::info!(
                    order_id = %s.order_id, attempt, step, reason = %reason,
                    retry_in_ms = wait.as_millis() as u64, "shipment delayed"
                );
                metrics::counter!("flashsale_shipment_delays_total", "step" => step).increment(1);
                Ok(Processed::Delayed)
            }
        }
    }

    /// The steps of one attempt, in `txn` (the shipment's row locked): which step ended it and
    /// how. Every step that went through is recorded as it goes.
    async fn deduct_then_ship(
        &self,
        txn: &DatabaseTransaction,
        s: &Shipment,
        attempt: i32,
    ) -> Result<(&'static str, Result<(), StepError>), OutboundError> {
        // Ticketing (COMMIT_AT_ORDER): the units were deducted when the order was persisted.
        if s.policy == Policy::ReserveThenCommit && !s.stock_committed {
            match self.stock.commit(s.order_id).await {
                Ok(()) => {
                    db::attempt(txn, s.shipment_id, attempt, "commit", "OK", "").await?;
                    db::mark_committed(txn, s.shipment_id).await?;
                }
                Err(e) => return Ok(("commit", Err(e.into()))),
            }
        }
        if let Err(e) = self.failpoints.hit(FP_AFTER_COMMIT_BEFORE_WAREHOUSE).await {
            return Ok(("warehouse", Err(StepError::Transient(e.to_string()))));
        }
        match self.warehouse.ship(s).await {
            Ok(()) => {
                db::attempt(txn, s.shipment_id, attempt, "warehouse", "OK", "").await?;
                Ok(("warehouse", Ok(())))
            }
            Err(e) => Ok(("warehouse", Err(e.into()))),
        }
    }

    /// Ends a PICKING shipment in `txn` with its `outbound.completed` or `outbound.failed` in
    /// the outbox; the caller commits.
    async fn finish(
        &self,
        txn: &DatabaseTransaction,
        s: &Shipment,
        to: ShipmentStatus,
        reason: Option<&str>,
        cause: Option<&Envelope>,
    ) -> Result<(), OutboundError> {
        if !db::finish(txn, s.shipment_id, to, reason).await? {
            return Err(OutboundError::Internal(anyhow::anyhow!(
                "shipment changed under its row lock"
            )));
        }
        outbox::enqueue(txn, &outcome_event(s, to, reason, cause)).await?;
        Ok(())
    }

    /// Attempts every shipment due (delayed ones whose wait is over, and ones whose worker
    /// died), [`SWEEP_CONCURRENCY`] at a time; how many ended shipped or failed. Then reports
    /// the overdue ones.
    pub async fn sweep_due(&self) -> Result<u64, OutboundError> {
        let due = db::due(&self.db, Utc::now(), SWEEP_BATCH).await?;
        let permits = tokio::sync::Semaphore::new(SWEEP_CONCURRENCY);
        let runs = due.iter().map(|&id| {
            let permits = &permits;
            async move {
                // Never closed, so a permit always comes.
                let _permit = permits.acquire().await.ok();
                match self.process(id, None).await {
                    Ok(Processed::Shipped | Processed::Failed) => 1,
                    Ok(_) => 0,
                    Err(e) => {
                        tracing::warn!(error = %e, shipment_id = %id, "shipment attempt failed");
                        0
                    }
                }
            }
        });
        let done = futures_util::future::join_all(runs).await.into_iter().sum();
        self.report_overdue().await?;
        Ok(done)
    }

    /// Warns about shipments not shipped `shipping.alert_after_ms` after they were paid, and
    /// sets the `flashsale_shipments_overdue` gauge to their number.
    async fn report_overdue(&self) -> Result<(), OutboundError> {
        let before = Utc::now() - millis(self.settings.alert_after_ms);
        let (n, oldest) = db::overdue(&self.db, before).await?;
        metrics::gauge!("flashsale_shipments_overdue").set(n as f64);
        if let Some((order_id, since)) = oldest {
            tracing::warn!(
                overdue = n, oldest_order_id = %order_id, oldest_since = %since,
                "shipments delayed past shipping.alert_after_ms; ListShipments with older_than_ms lists them with their last error"
            );
        }
        Ok(())
    }

    /// Runs [`Self::sweep_due`] every `shipping.sweep_interval_ms` until `shutdown`.
    pub async fn run_sweeper(
        self,
        shutdown: flashsale_platform::shutdown::Shutdown,
    ) -> anyhow::Result<()> {
        let period = Duration::from_millis(self.settings.sweep_interval_ms);
        flashsale_platform::shutdown::every(period, shutdown, "shipment sweep", || self.sweep_due())
            .await
    }
}

impl From<crate::infra::stock::CommitError> for StepError {
    fn from(e: crate::infra::stock::CommitError) -> Self {
        match e {
            crate::infra::stock::CommitError::Permanent(r) => Self::Permanent(r),
            crate::infra::stock::CommitError::Transient(r) => Self::Transient(r),
        }
    }
}

impl From<WarehouseError> for StepError {
    fn from(e: WarehouseError) -> Self {
        match e {
            WarehouseError::Permanent(r) => Self::Permanent(r),
            WarehouseError::Transient(r) => Self::Transient(r),
        }
    }
}

/// How a shipment ended (`to`), for the order service: `outbound.completed`, or
/// `outbound.failed` with the refusal's `reason`; caused by its `order.paid` when there is one at
/// hand (the sweeper's attempts have none: the event is then correlated with the order).
fn outcome_event(
    s: &Shipment,
    to: ShipmentStatus,
    reason: Option<&str>,
    cause: Option<&Envelope>,
) -> Envelope {
    let (order_id, shipment_id) = (s.order_id.to_string(), s.shipment_id.to_string());
    let payload = match to {
        ShipmentStatus::Shipped => Payload::OutboundCompleted(OutboundCompleted {
            order_id: order_id.clone(),
            shipment_id,
            sku: s.sku.clone(),
            quantity: s.quantity,
        }),
        _ => Payload::OutboundFailed(OutboundFailed {
            order_id: order_id.clone(),
            shipment_id,
            sku: s.sku.clone(),
            quantity: s.quantity,
            reason: reason.unwrap_or_default().to_owned(),
        }),
    };
    match cause {
        Some(c) => envelope::caused_by(c, payload, PRODUCER),
        None => envelope::new(payload, order_id, "", PRODUCER),
    }
}

fn millis(ms: u64) -> chrono::Duration {
    chrono::Duration::milliseconds(i64::try_from(ms).unwrap_or(i64::MAX))
}

fn count(status: ShipmentStatus, n: u64) {
    metrics::counter!("flashsale_shipments_total", "status" => status.as_db()).increment(n);
}
