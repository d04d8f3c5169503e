//! Shipping paid orders (docs/architecture.md#the-order-saga): a shipment per `order.paid`, the
//! warehouse step, the commit of the reservation on product-stock, and `outbound.completed` or
//! `outbound.failed`. A shipment that keeps failing is failed for good after
//! `shipping.max_attempts`, so a paid order always ends shipped or refunded.

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
    domain::{OutboundError, Policy, Shipment, ShipmentStatus, parse_uuid},
    infra::{
        db::{self, NewShipment},
        stock::{CommitError, StockCommitter},
        warehouse::{Warehouse, WarehouseError},
    },
};

mod paid_batch;
mod query;

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
/// Commit retries inside one attempt.
const COMMIT_TRIES: u32 = 3;
/// Failpoint reached once the warehouse shipped, before the reservation is committed on
/// product-stock: a crash here leaves the shipment PICKING, to be taken up again.
pub const FP_AFTER_WAREHOUSE_BEFORE_COMMIT: &str = "outbound.after_warehouse_before_commit";
/// Failpoint reached inside the `order.paid` consumer before the shipment is written.
pub const FP_ORDER_PAID_BEFORE_COMMIT: &str = "outbound.order_paid.before_commit";

/// How processing a shipment ended this time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Processed {
    Shipped,
    Failed,
    /// Already terminal (a redelivery): nothing done.
    AlreadyDone,
    /// Another worker holds it right now.
    Busy,
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
    /// [`FP_AFTER_WAREHOUSE_BEFORE_COMMIT`]).
    pub fn with_failpoints(self, failpoints: Failpoints) -> Self {
        Self { failpoints, ..self }
    }

    /// `order.paid`: create the shipment (once per order) and ship it.
    #[tracing::instrument(skip_all, fields(order_id = %ev.order_id))]
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
        let shipment_id = db::create(&self.db, &new).await?;
        self.process(shipment_id, Some(env)).await
    }

    /// One attempt at a shipment, under its row lock (other workers skip it meanwhile).
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

        let mut step = "warehouse";
        let outcome = match self.warehouse.ship(&s).await {
            Err(WarehouseError::Permanent(r)) => Err(CommitError::Permanent(r)),
            Err(WarehouseError::Transient(r)) => Err(CommitError::Transient(r)),
            Ok(()) => {
                db::attempt(&txn, s.shipment_id, attempt, "warehouse", "OK", "").await?;
                match s.policy {
                    // Ticketing: the units were deducted when the order was persisted.
                    Policy::CommitAtOrder => Ok(()),
                    Policy::ReserveThenCommit => {
                        step = "commit";
                        match self.failpoints.hit(FP_AFTER_WAREHOUSE_BEFORE_COMMIT).await {
                            Ok(()) => self.commit_with_retries(s.order_id).await,
                            Err(e) => Err(CommitError::Transient(e.to_string())),
                        }
                    }
                }
            }
        };
        match outcome {
            Ok(()) => {
                db::attempt(&txn, s.shipment_id, attempt, step, "OK", "").await?;
                self.finish(txn, &s, ShipmentStatus::Shipped, None, cause)
                    .await?;
                Ok(Processed::Shipped)
            }
            Err(CommitError::Permanent(reason)) => {
                db::attempt(&txn, s.shipment_id, attempt, step, "PERMANENT", &reason).await?;
                self.finish(txn, &s, ShipmentStatus::Failed, Some(&reason), cause)
                    .await?;
                Ok(Processed::Failed)
            }
            Err(CommitError::Transient(reason)) if attempt >= self.settings.max_attempts => {
                db::attempt(&txn, s.shipment_id, attempt, step, "TRANSIENT", &reason).await?;
                let reason = format!("gave up after {attempt} attempts: {reason}");
                self.finish(txn, &s, ShipmentStatus::Failed, Some(&reason), cause)
                    .await?;
                Ok(Processed::Failed)
            }
            Err(CommitError::Transient(reason)) => {
                db::attempt(&txn, s.shipment_id, attempt, step, "TRANSIENT", &reason).await?;
                txn.commit().await?;
                Err(OutboundError::Transient(reason))
            }
        }
    }

    async fn commit_with_retries(&self, order_id: Uuid) -> Result<(), CommitError> {
        let mut delay = Duration::from_millis(self.settings.retry_base_ms);
        let mut last = None;
        for _ in 0..COMMIT_TRIES {
            match self.stock.commit(order_id).await {
                Err(CommitError::Transient(r)) => {
                    last = Some(r);
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
                other => return other,
            }
        }
        Err(CommitError::Transient(last.unwrap_or_default()))
    }

    async fn finish(
        &self,
        txn: DatabaseTransaction,
        s: &Shipment,
        to: ShipmentStatus,
        reason: Option<&str>,
        cause: Option<&Envelope>,
    ) -> Result<(), OutboundError> {
        if !db::finish(&txn, s.shipment_id, to, reason).await? {
            return Err(OutboundError::Internal(anyhow::anyhow!(
                "shipment changed under its row lock"
            )));
        }
        let payload = match to {
            ShipmentStatus::Shipped => Payload::OutboundCompleted(OutboundCompleted {
                order_id: s.order_id.to_string(),
                shipment_id: s.shipment_id.to_string(),
                sku: s.sku.clone(),
                quantity: s.quantity,
            }),
            _ => Payload::OutboundFailed(OutboundFailed {
                order_id: s.order_id.to_string(),
                shipment_id: s.shipment_id.to_string(),
                sku: s.sku.clone(),
                quantity: s.quantity,
                reason: reason.unwrap_or_default().to_owned(),
            }),
        };
        let env = match cause {
            Some(c) => envelope::caused_by(c, payload, PRODUCER),
            None => envelope::new(payload, s.order_id.to_string(), "", PRODUCER),
        };
        outbox::enqueue(&txn, &env).await?;
        txn.commit().await?;
        metrics::counter!("flashsale_shipments_total", "status" => to.as_db()).increment(1);
        Ok(())
    }

    /// Takes up shipments left PICKING (a crash, a message parked after its retries).
    pub async fn sweep_stuck(&self) -> Result<u64, OutboundError> {
        let age = chrono::Duration::milliseconds(
            i64::try_from(self.settings.stuck_after_ms).unwrap_or(i64::MAX),
        );
        let mut done = 0;
        for id in db::stuck(&self.db, Utc::now() - age, 100).await? {
            match self.process(id, None).await {
                Ok(Processed::Shipped | Processed::Failed) => done += 1,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, shipment_id = %id, "stuck shipment still failing")
                }
            }
        }
        Ok(done)
    }

    /// Runs [`Self::sweep_stuck`] every `shipping.sweep_interval_ms` until `shutdown`.
    pub async fn run_sweeper(
        self,
        shutdown: flashsale_platform::shutdown::Shutdown,
    ) -> anyhow::Result<()> {
        let period = Duration::from_millis(self.settings.sweep_interval_ms);
        flashsale_platform::shutdown::every(period, shutdown, "stuck-shipment sweep", || {
            self.sweep_stuck()
        })
        .await
    }
}
