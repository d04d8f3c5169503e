//! Keeping the gate and the database in agreement (docs/architecture.md#the-stock-model,
//! docs/architecture.md#operations, docs/invariants.md invariant 3): settle holds the database
//! already has, expire holds that never reached it, report the drift of `gate_available + held`
//! from the database's figure and, on request, repair it.

use std::time::Duration;

use flashsale_messaging::{envelope, outbox};
use flashsale_proto::events::v1::{
    Envelope, ReservationFailureReason, StockGateRefilled, StockReservationFailed,
    envelope::Payload,
};
use sea_orm::{DatabaseConnection, TransactionTrait as _};

use super::{Terms, gate::rebuild, gate_err, saga::HOLD_EXPIRED};
use crate::{
    config::StockSettings,
    domain::{Reservation, ReservationState, Sku, StockError},
    infra::{
        db,
        gate::{RedisGate, RepairOutcome},
    },
};

/// One product's comparison of the gate with the database.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriftReport {
    pub sku: Sku,
    /// The gate's counter (0 when the gate has not loaded the product).
    pub gate_available: i64,
    /// Σ units of holds not yet persisted.
    pub unpersisted_holds: i64,
    /// What the counter should be: the database's figure minus the unpersisted holds.
    pub expected_gate_available: i64,
    /// `gate_available - expected_gate_available`.
    pub drift: i64,
    pub repaired: bool,
}

const SETTLE_BATCH: usize = 500;

/// `stock.gate_refilled`: the gate of `sku` went from `before` to `after` units outside the saga
/// (`cause` "REPAIR" or "REBUILD").
pub(super) fn gate_refilled(sku: &Sku, before: i64, after: i64, cause: &str) -> Envelope {
    let event = StockGateRefilled {
        sku: sku.to_string(),
        available_before: before,
        available_after: after,
        cause: cause.to_owned(),
    };
    envelope::new(
        Payload::StockGateRefilled(event),
        sku.as_str(),
        "",
        super::PRODUCER,
    )
}

/// The reconciler's use cases: the gate against the database, and the sweeper of expired
/// holds. Cheap to clone.
#[derive(Clone)]
pub struct Reconciler {
    db: DatabaseConnection,
    gate: RedisGate,
    terms: Terms,
    hold_ttl_ms: u64,
    sweep_interval_ms: u64,
}

impl Reconciler {
    pub fn new(
        db: DatabaseConnection,
        gate: RedisGate,
        terms: Terms,
        settings: &StockSettings,
    ) -> Self {
        Self {
            db,
            gate,
            terms,
            hold_ttl_ms: settings.hold_ttl_ms,
            sweep_interval_ms: settings.sweep_interval_ms,
        }
    }

    /// Compares (and with `repair`, corrects) the gate of each sku (every product when empty).
    pub async fn reconcile(
        &self,
        skus: Vec<Sku>,
        repair: bool,
    ) -> Result<Vec<DriftReport>, StockError> {
        let skus = if skus.is_empty() {
            db::all_skus(&self.db).await?
        } else {
            skus
        };
        let mut reports = Vec::with_capacity(skus.len());
        for sku in skus {
            reports.push(self.reconcile_one(&sku, repair).await?);
        }
        Ok(reports)
    }

    async fn reconcile_one(&self, sku: &Sku, repair: bool) -> Result<DriftReport, StockError> {
        // The stock row lock keeps the database figure still while the gate is compared and
        // set, and every gate change that follows a database change happens under that lock
        // too; gate scripts are atomic and read `held` themselves, so reservations may flow.
        let txn = self.db.begin().await?;
        let product = db::product(&txn, sku, true)
            .await?
            .ok_or_else(|| StockError::UnknownProduct(sku.to_string()))?;
        self.settle_holds(sku, i64::MAX).await?;
        let target = product.gate_target();
        let mut repaired = false;
        let snapshot = match self.gate.snapshot(sku.as_str()).await.map_err(gate_err)? {
            Some(s) => s,
            None if repair => {
                drop(txn);
                rebuild(&self.db, &self.gate, sku).await?;
                return Box::pin(self.reconcile_one(sku, false))
                    .await
                    .map(|r| DriftReport {
                        repaired: true,
                        ..r
                    });
            }
            None => Default::default(),
        };
        let expected = target - snapshot.held;
        let drift = snapshot.available - expected;
        let mut refilled = None;
        if repair && drift != 0 {
            let outcome = self
                .gate
                .repair(sku.as_str(), target)
                .await
                .map_err(gate_err)?;
            if let RepairOutcome::Repaired { before, after, .. } = outcome
                && after > before
            {
                refilled = Some(gate_refilled(sku, before, after, "REPAIR"));
            }
            repaired = true;
            metrics::counter!("flashsale_gate_repairs_total").increment(1);
            tracing::warn!(%sku, drift, "repaired the stock gate");
        }
        txn.commit().await?;
        if let Some(event) = refilled {
            // Units are on sale again: the order service's sold-out memory should hear it.
            // Best effort, after the repair is done and reported (a retry would find no drift
            // to repair, so failing here would lose the report, not the event); the sold-out
            // memory's short life bounds a missed one.
            if let Err(e) = outbox::enqueue(&self.db, &event).await {
                tracing::warn!(%sku, error = %e, "stock.gate_refilled not recorded");
            }
        }
        Ok(DriftReport {
            sku: sku.clone(),
            gate_available: snapshot.available,
            unpersisted_holds: snapshot.held,
            expected_gate_available: expected,
            drift,
            repaired,
        })
    }

    /// Looks at holds reserved before `cutoff_ms` that the gate still counts as unpersisted:
    /// those the database has are marked persisted; the others are released and tombstoned so
    /// their late `order.created` is refused. Returns how many were expired.
    pub async fn settle_holds(&self, sku: &Sku, cutoff_ms: i64) -> Result<u64, StockError> {
        let mut expired = 0;
        let holds = self
            .gate
            .pending_older_than(sku.as_str(), cutoff_ms, SETTLE_BATCH)
            .await
            .map_err(gate_err)?;
        for hold in holds {
            let txn = self.db.begin().await?;
            match db::reservation(&txn, hold.order_id, true).await? {
                Some(r) if r.state != ReservationState::Released => {
                    txn.commit().await?;
                    self.gate
                        .mark_persisted(sku.as_str(), hold.order_id)
                        .await
                        .map_err(gate_err)?;
                }
                Some(_) => {
                    txn.commit().await?;
                    self.gate
                        .release_unpersisted(sku.as_str(), hold.order_id)
                        .await
                        .map_err(gate_err)?;
                }
                None if cutoff_ms == i64::MAX => txn.commit().await?, // young hold: leave it be
                None => {
                    let policy = self.terms.get(sku).await?.policy;
                    let tombstone = Reservation {
                        order_id: hold.order_id,
                        sku: sku.clone(),
                        user_id: hold.user_id.clone(),
                        quantity: 0,
                        state: ReservationState::Released,
                        policy,
                    };
                    if !db::insert_reservation(&txn, &tombstone, HOLD_EXPIRED).await? {
                        // order.created persisted it at this very moment.
                        txn.commit().await?;
                        self.gate
                            .mark_persisted(sku.as_str(), hold.order_id)
                            .await
                            .map_err(gate_err)?;
                        continue;
                    }
                    // Tell the order service, whose order (if it was ever written) is still
                    // PENDING: it cancels it with HOLD_EXPIRED.
                    let failed = StockReservationFailed {
                        order_id: hold.order_id.to_string(),
                        sku: sku.to_string(),
                        quantity: hold.qty,
                        reason: ReservationFailureReason::OrderCancelled as i32,
                        detail: "the stock hold expired before the order reached the database"
                            .into(),
                    };
                    let env = envelope::new(
                        Payload::StockReservationFailed(failed),
                        hold.order_id.to_string(),
                        "",
                        super::PRODUCER,
                    );
                    outbox::enqueue(&txn, &env).await?;
                    self.gate
                        .release_unpersisted(sku.as_str(), hold.order_id)
                        .await
                        .map_err(gate_err)?;
                    txn.commit().await?;
                    expired += 1;
                }
            }
        }
        if expired > 0 {
            metrics::counter!("flashsale_holds_expired_total").increment(expired);
            tracing::warn!(%sku, expired, "released gate holds that never reached the database");
        }
        Ok(expired)
    }

    /// One sweep over every product: expire holds older than `stock.hold_ttl_ms`.
    pub async fn sweep_expired_holds(&self) -> Result<u64, StockError> {
        let ttl = i64::try_from(self.hold_ttl_ms).unwrap_or(i64::MAX);
        let cutoff = chrono::Utc::now().timestamp_millis().saturating_sub(ttl);
        let mut total = 0;
        for sku in db::all_skus(&self.db).await? {
            total += self.settle_holds(&sku, cutoff).await?;
        }
        Ok(total)
    }

    /// Runs [`Self::sweep_expired_holds`] every `stock.sweep_interval_ms` until `shutdown`.
    pub async fn run_sweeper(
        self,
        shutdown: flashsale_platform::shutdown::Shutdown,
    ) -> anyhow::Result<()> {
        let period = Duration::from_millis(self.sweep_interval_ms);
        flashsale_platform::shutdown::every(period, shutdown, "hold sweep", || {
            self.sweep_expired_holds()
        })
        .await
    }
}
