//! Keeping the gate and the database in agreement (docs/architecture.md#the-stock-model,
//! docs/architecture.md#operations, docs/invariants.md invariant 3): settle holds the database
//! already has, expire holds that never reached it (after asking the order service whether
//! their order was written), report the drift of `gate_available + held` from the database's
//! figure and, on request, repair it.

use std::sync::Arc;

use flashsale_messaging::{envelope, outbox};
use flashsale_platform::lease::Singleton;
use flashsale_proto::events::v1::{
    Envelope, ReservationFailureReason, StockGateRefilled, StockReservationFailed,
    envelope::Payload,
};
use sea_orm::{DatabaseConnection, TransactionTrait as _};

mod holds;

use super::{
    Terms, gate_err,
    reservations::rebuild,
    saga::{CANCELLED_BEFORE_CREATED, HOLD_EXPIRED},
};
use crate::{
    config::StockSettings,
    domain::{Reservation, ReservationState, Sku, StockError},
    infra::{
        db,
        gate::{At, PendingHold, RedisGate, RepairOutcome, SettleOutcome},
        orders::{OrderPort, OrderState, OrdersUnavailable},
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

/// The hold sweep's [`Singleton`] name.
pub const HOLD_SWEEP: &str = "product-stock/hold-sweep";

/// A product's gate counters summed over its stock buckets.
#[derive(Clone, Copy, Debug, Default)]
struct StockSnapshot {
    available: i64,
    held: i64,
    /// Units taken out of one bucket for another, not landed yet.
    moving: i64,
}

/// How old a prepared release must be before the sweeper settles it: its own consumer finishes
/// it within milliseconds of the commit.
const RELEASE_GRACE_MS: i64 = 5_000;

/// Settles the releases of `sku` prepared before `cutoff_ms` and not finished, by what the
/// database says: a released reservation (or tombstone) is finished, anything else (the
/// transaction rolled back and no retry came) is reverted. `txn` must hold the product's stock
/// row lock: every release prepares under it and keeps it until its commit, so none of those
/// seen here is still in flight. Returns how many were settled.
pub(super) async fn settle_releases(
    txn: &sea_orm::DatabaseTransaction,
    gate: &RedisGate,
    sku: &Sku,
    buckets: u32,
    cutoff_ms: i64,
) -> Result<u64, StockError> {
    let mut settled = 0;
    for bucket in 0..buckets {
        settled +=
            settle_bucket_releases(txn, gate, At::new(sku.as_str(), bucket), cutoff_ms).await?;
    }
    if settled > 0 {
        metrics::counter!("flashsale_releases_settled_total").increment(settled);
    }
    Ok(settled)
}

/// [`settle_releases`] in one stock bucket.
async fn settle_bucket_releases(
    txn: &sea_orm::DatabaseTransaction,
    gate: &RedisGate,
    at: At<'_>,
    cutoff_ms: i64,
) -> Result<u64, StockError> {
    let sku = at.sku;
    let ids = gate
        .releasing_older_than(at, cutoff_ms, SETTLE_BATCH)
        .await
        .map_err(gate_err)?;
    let mut settled = 0;
    for order_id in ids {
        let released = db::reservation(txn, order_id, false)
            .await?
            .is_some_and(|r| r.state == ReservationState::Released);
        let outcome = if released {
            gate.finish_release(at, order_id).await
        } else {
            gate.revert_release(at, order_id).await
        }
        .map_err(gate_err)?;
        if outcome != SettleOutcome::NothingPrepared {
            settled += 1;
            tracing::warn!(sku, bucket = at.bucket, %order_id, ?outcome, "settled a release its consumer left prepared");
        }
    }
    Ok(settled)
}

/// What one [`Reconciler::settle_holds`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Settled {
    /// Holds released because their order does not exist (or was cancelled).
    pub expired: u64,
    /// Expired holds kept because their order exists.
    pub kept: u64,
    /// Whether holds were left alone because the order service could not be asked.
    pub deferred: bool,
}

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
    orders: Arc<dyn OrderPort>,
    terms: Terms,
    hold_ttl_ms: u64,
    sweep_interval_ms: u64,
    drift_check_interval_ms: u64,
    rebuild_settle_ms: u64,
}

/// Gauge: the gate's counter minus what the database says it should be, units, by `sku`, as the
/// last periodic comparison found it (every `stock.drift_check_interval_ms`, on each replica):
/// positive, the gate would sell units the database does not have; negative, it holds some back.
pub const GATE_DRIFT: &str = "flashsale_gate_drift_units";

impl Reconciler {
    pub fn new(
        db: DatabaseConnection,
        gate: RedisGate,
        orders: Arc<dyn OrderPort>,
        terms: Terms,
        settings: &StockSettings,
    ) -> Self {
        Self {
            db,
            gate,
            orders,
            terms,
            hold_ttl_ms: settings.hold_ttl_ms,
            sweep_interval_ms: settings.sweep_interval_ms,
            drift_check_interval_ms: settings.drift_check_interval_ms,
            rebuild_settle_ms: settings.rebuild_settle_ms,
        }
    }

    /// Compares every product's gate with the database every `stock.drift_check_interval_ms`
    /// until `shutdown`, report only, and exports each product's drift ([`GATE_DRIFT`]).
    /// Every replica checks on its own, so each one's gauge is its own latest view; a dashboard
    /// takes the largest. Repairing stays an admin action (`ReconcileStock` with `repair`).
    pub async fn run_drift_check(
        self,
        shutdown: flashsale_platform::shutdown::Shutdown,
    ) -> anyhow::Result<()> {
        let period = std::time::Duration::from_millis(self.drift_check_interval_ms);
        flashsale_platform::shutdown::every(period, shutdown, "gate drift check", || async {
            let reports = self.reconcile(Vec::new(), false).await?;
            for r in &reports {
                metrics::gauge!(GATE_DRIFT, "sku" => r.sku.to_string()).set(r.drift as f64);
                if r.drift != 0 {
                    tracing::warn!(sku = %r.sku, drift = r.drift, gate = r.gate_available, expected = r.expected_gate_available, "the gate and the database disagree");
                }
            }
            Ok::<_, StockError>(())
        })
        .await
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
        let buckets = product.stock_buckets;
        self.settle_holds(sku, i64::MAX).await?;
        settle_releases(&txn, &self.gate, sku, buckets, i64::MAX).await?;
        let mut refilled = self.settle_transfers(sku, buckets, i64::MAX).await?;
        let target = product.gate_target();
        let mut repaired = false;
        let snapshot = match self.stock_snapshot(sku, buckets).await? {
            Some(s) => s,
            None if repair => {
                drop(txn);
                rebuild(
                    &self.db,
                    &self.gate,
                    self.orders.as_ref(),
                    sku,
                    self.rebuild_settle_ms,
                )
                .await?;
                return Box::pin(self.reconcile_one(sku, false))
                    .await
                    .map(|r| DriftReport {
                        repaired: true,
                        ..r
                    });
            }
            None => Default::default(),
        };
        // `held` is the gate's own record of the orders acknowledged but not persisted: while
        // Redis keeps the product's keys it is exactly what the database misses. A gate that
        // lost them is not repaired but rebuilt (above), which asks the order service instead.
        // Units moving between buckets are in no counter yet; they land in one.
        let expected = target - snapshot.held - snapshot.moving;
        let drift = snapshot.available - expected;
        if repair && drift != 0 {
            let outcome = self
                .gate
                .repair_product(sku.as_str(), buckets, target)
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

    /// The product's counters summed over its buckets, `None` when any is not loaded.
    async fn stock_snapshot(
        &self,
        sku: &Sku,
        buckets: u32,
    ) -> Result<Option<StockSnapshot>, StockError> {
        let mut sum = StockSnapshot::default();
        for state in self
            .gate
            .bucket_states(sku.as_str(), buckets)
            .await
            .map_err(gate_err)?
        {
            let Some(s) = state else {
                return Ok(None);
            };
            sum.available += s.available;
            sum.held += s.held;
            sum.moving += s.moving;
        }
        Ok(Some(sum))
    }

    /// Settles the transfers between the buckets of `sku` taken before `cutoff_ms` that their
    /// borrower left (see [`RedisGate::settle_transfers`]); when stranded units went back on
    /// sale, the `stock.gate_refilled` to send.
    async fn settle_transfers(
        &self,
        sku: &Sku,
        buckets: u32,
        cutoff_ms: i64,
    ) -> Result<Option<Envelope>, StockError> {
        let (settled, returned) = self
            .gate
            .settle_transfers(sku.as_str(), buckets, cutoff_ms)
            .await
            .map_err(gate_err)?;
        if settled == 0 {
            return Ok(None);
        }
        metrics::counter!("flashsale_gate_transfers_settled_total").increment(settled);
        tracing::warn!(%sku, settled, returned, "settled transfers between stock buckets that their borrower left");
        if returned == 0 {
            return Ok(None);
        }
        let after = self
            .stock_snapshot(sku, buckets)
            .await?
            .map_or(returned, |s| s.available);
        Ok(Some(gate_refilled(
            sku,
            (after - returned).max(0),
            after,
            "REBALANCE",
        )))
    }

    /// Settles, for every product, the releases prepared more than [`RELEASE_GRACE_MS`] ago
    /// and not finished (their consumer died between its commit and the finish, or Redis
    /// refused the finish and no redelivery came). Returns how many were settled.
    pub async fn settle_stale_releases(&self) -> Result<u64, StockError> {
        let cutoff = chrono::Utc::now()
            .timestamp_millis()
            .saturating_sub(RELEASE_GRACE_MS);
        let mut total = 0;
        for sku in db::all_skus(&self.db).await? {
            let buckets = self.terms.get(&sku).await?.stock_buckets;
            let mut waiting = false;
            for bucket in 0..buckets {
                waiting |= !self
                    .gate
                    .releasing_older_than(At::new(sku.as_str(), bucket), cutoff, 1)
                    .await
                    .map_err(gate_err)?
                    .is_empty();
            }
            if !waiting {
                continue;
            }
            let txn = self.db.begin().await?;
            if db::product(&txn, &sku, true).await?.is_none() {
                continue;
            }
            total += settle_releases(&txn, &self.gate, &sku, buckets, cutoff).await?;
            txn.commit().await?;
        }
        Ok(total)
    }

    /// Settles, for every product in stock buckets, the transfers between its buckets taken more
    /// than 5 s ago and not settled (their borrower died between the steps):
    /// stranded units go back on sale well within the life of the landing markers. Returns how
    /// many units were returned.
    pub async fn settle_stale_transfers(&self) -> Result<i64, StockError> {
        let cutoff = chrono::Utc::now()
            .timestamp_millis()
            .saturating_sub(RELEASE_GRACE_MS);
        let mut returned = 0;
        for sku in db::all_skus(&self.db).await? {
            let buckets = self.terms.get(&sku).await?.stock_buckets;
            if buckets < 2 {
                continue;
            }
            if let Some(event) = self.settle_transfers(&sku, buckets, cutoff).await? {
                if let Some(Payload::StockGateRefilled(ev)) = &event.payload {
                    returned += ev.available_after - ev.available_before;
                }
                if let Err(e) = outbox::enqueue(&self.db, &event).await {
                    tracing::warn!(%sku, error = %e, "stock.gate_refilled not recorded");
                }
            }
        }
        Ok(returned)
    }
}
