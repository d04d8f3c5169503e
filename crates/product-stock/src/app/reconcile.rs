//! Keeping the gate and the database in agreement (docs/architecture.md#the-stock-model,
//! docs/architecture.md#operations, docs/invariants.md invariant 3): settle holds the database
//! already has, expire holds that never reached it (after asking the order service whether
//! their order was written), report the drift of `gate_available + held` from the database's
//! figure and, on request, repair it.

use std::{collections::HashMap, sync::Arc, time::Duration};

use flashsale_messaging::{envelope, outbox};
use flashsale_platform::lease::Singleton;
use flashsale_proto::events::v1::{
    Envelope, ReservationFailureReason, StockGateRefilled, StockReservationFailed,
    envelope::Payload,
};
use sea_orm::{DatabaseConnection, TransactionTrait as _};

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

/// What the sweeper does with an expired hold the database does not have, given what the order
/// service said about its order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HoldVerdict {
    /// The order exists and is not cancelled: it was acknowledged, and its `order.created` is
    /// on its way (a broker outage, a backlog). Keep the hold; it is asked about again later.
    Keep,
    /// The order was cancelled: give the units back (its `order.cancelled` then finds the
    /// reservation released and changes nothing).
    Release,
    /// No such order: its CreateOrder failed before writing it, and nobody was acknowledged.
    /// Release the hold, tombstone the reservation and tell the order service.
    Expire,
    /// The order service could not be asked: give nothing away this round.
    Defer,
}

/// The sweeper's decision table.
pub(crate) fn verdict(
    answer: &Result<HashMap<uuid::Uuid, OrderState>, OrdersUnavailable>,
    order_id: uuid::Uuid,
) -> HoldVerdict {
    match answer {
        Err(_) => HoldVerdict::Defer,
        Ok(found) => match found.get(&order_id) {
            Some(OrderState::Live) => HoldVerdict::Keep,
            Some(OrderState::Cancelled) => HoldVerdict::Release,
            None => HoldVerdict::Expire,
        },
    }
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
    rebuild_settle_ms: u64,
}

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
            rebuild_settle_ms: settings.rebuild_settle_ms,
        }
    }

    fn hold_ttl_ms_i64(&self) -> i64 {
        i64::try_from(self.hold_ttl_ms).unwrap_or(i64::MAX)
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

    /// Looks at holds reserved before `cutoff_ms` that the gate still counts as unpersisted:
    /// those the database has are marked persisted (or released, if it released them). For the
    /// others the order service is asked (docs/architecture.md#operations): a hold whose order
    /// exists is kept, one whose order was cancelled is released, one whose order does not
    /// exist is released and tombstoned so its late `order.created` is refused; if the order
    /// service cannot answer, none of them is touched. `cutoff_ms == i64::MAX` (the
    /// reconciler) only settles what the database has.
    ///
    /// Why "missing" is safe to give away: CreateOrder reserves at the gate, then writes the
    /// order and its `order.created` in one transaction, then answers the buyer. The write is
    /// bounded by its own timeout (seconds), the TTL is minutes: by the time a hold is old
    /// enough to be asked about, its order's write has committed (the order service finds it)
    /// or failed (no buyer was acknowledged). A write still in flight when the sweeper asks
    /// would need to outlive the TTL, which its timeout does not allow; and were it to commit
    /// anyway, the tombstone makes its `order.created` fail and the order is cancelled, never
    /// left PENDING.
    pub async fn settle_holds(&self, sku: &Sku, cutoff_ms: i64) -> Result<Settled, StockError> {
        let buckets = match self.terms.get(sku).await {
            Ok(t) => t.stock_buckets,
            Err(StockError::UnknownProduct(_)) => 1,
            Err(e) => return Err(e),
        };
        let mut all = Settled::default();
        for bucket in 0..buckets {
            let one = self
                .settle_bucket_holds(At::new(sku.as_str(), bucket), sku, cutoff_ms)
                .await?;
            all.expired += one.expired;
            all.kept += one.kept;
            all.deferred |= one.deferred;
        }
        Ok(all)
    }

    /// [`Self::settle_holds`] in one stock bucket.
    async fn settle_bucket_holds(
        &self,
        at: At<'_>,
        sku: &Sku,
        cutoff_ms: i64,
    ) -> Result<Settled, StockError> {
        let mut settled = Settled::default();
        let holds = self
            .gate
            .pending_older_than(at, cutoff_ms, SETTLE_BATCH)
            .await
            .map_err(gate_err)?;
        if holds.is_empty() {
            return Ok(settled);
        }
        let sweeping = cutoff_ms != i64::MAX;
        let answer = if sweeping {
            let ids: Vec<uuid::Uuid> = holds.iter().map(|h| h.order_id).collect();
            let known = db::reservations_known(&self.db, &ids).await?;
            let unknown: Vec<uuid::Uuid> =
                ids.into_iter().filter(|id| !known.contains(id)).collect();
            if unknown.is_empty() {
                Ok(HashMap::new())
            } else {
                self.orders.lookup(&unknown).await
            }
        } else {
            Ok(HashMap::new())
        };
        let mut keep = Vec::new();
        for hold in holds {
            let txn = self.db.begin().await?;
            match db::reservation(&txn, hold.order_id, true).await? {
                Some(r) if r.state != ReservationState::Released => {
                    // A hold taken for an order the database had reserved long before: a
                    // replay of its CreateOrder after the gate's record of it expired
                    // (`stock.order_record_ttl_secs`), judged afresh. Its units were already
                    // counted by the reservation: they go back on sale.
                    let retaken = sweeping
                        && db::reservation_written_ms(&txn, hold.order_id)
                            .await?
                            .is_some_and(|written| {
                                written.saturating_add(self.hold_ttl_ms_i64()) < hold.reserved_at_ms
                            });
                    txn.commit().await?;
                    if retaken {
                        self.gate
                            .release_unpersisted(at, hold.order_id)
                            .await
                            .map_err(gate_err)?;
                        metrics::counter!("flashsale_holds_retaken_released_total").increment(1);
                        tracing::info!(%sku, order_id = %hold.order_id, "gave back a hold retaken by a late replay of an order reserved long before");
                    } else {
                        self.gate
                            .mark_persisted(at, hold.order_id)
                            .await
                            .map_err(gate_err)?;
                    }
                }
                Some(_) => {
                    txn.commit().await?;
                    self.gate
                        .release_unpersisted(at, hold.order_id)
                        .await
                        .map_err(gate_err)?;
                }
                None if !sweeping => txn.commit().await?, // young hold: leave it be
                None => match verdict(&answer, hold.order_id) {
                    HoldVerdict::Defer => {
                        txn.commit().await?;
                        settled.deferred = true;
                    }
                    HoldVerdict::Keep => {
                        txn.commit().await?;
                        keep.push(hold.order_id);
                    }
                    HoldVerdict::Release => {
                        if self
                            .give_back(txn, at, sku, &hold, CANCELLED_BEFORE_CREATED, false)
                            .await?
                        {
                            settled.expired += 1;
                        }
                    }
                    HoldVerdict::Expire => {
                        if self
                            .give_back(txn, at, sku, &hold, HOLD_EXPIRED, true)
                            .await?
                        {
                            settled.expired += 1;
                        }
                    }
                },
            }
        }
        if !keep.is_empty() {
            settled.kept = keep.len() as u64;
            // To the back of the queue: asked about again one TTL from now, and the holds
            // behind them are reached meanwhile.
            self.gate
                .touch_holds(at, &keep, chrono::Utc::now().timestamp_millis())
                .await
                .map_err(gate_err)?;
            metrics::counter!("flashsale_holds_kept_total").increment(settled.kept);
            tracing::info!(%sku, kept = settled.kept, "kept expired gate holds whose orders exist (their order.created is late)");
        }
        if settled.expired > 0 {
            metrics::counter!("flashsale_holds_expired_total").increment(settled.expired);
            tracing::warn!(%sku, expired = settled.expired, "released gate holds whose orders were never written or were cancelled");
        }
        Ok(settled)
    }

    /// Releases an unpersisted hold and tombstones its reservation (`cause`) in `txn`, telling
    /// the order service with `stock.reservation_failed` when `tell`. `false` when
    /// `order.created` persisted it at this very moment (then it is marked persisted instead).
    async fn give_back(
        &self,
        txn: sea_orm::DatabaseTransaction,
        at: At<'_>,
        sku: &Sku,
        hold: &PendingHold,
        cause: &str,
        tell: bool,
    ) -> Result<bool, StockError> {
        let policy = self.terms.get(sku).await?.policy;
        let tombstone = Reservation {
            order_id: hold.order_id,
            sku: sku.clone(),
            user_id: hold.user_id.clone(),
            quantity: 0,
            state: ReservationState::Released,
            policy,
        };
        if !db::insert_reservation(&txn, &tombstone, cause).await? {
            txn.commit().await?;
            self.gate
                .mark_persisted(at, hold.order_id)
                .await
                .map_err(gate_err)?;
            return Ok(false);
        }
        if tell {
            // The order was never written, so nobody is waiting for it; were it written after
            // all, the order service cancels it with HOLD_EXPIRED.
            let failed = StockReservationFailed {
                order_id: hold.order_id.to_string(),
                sku: sku.to_string(),
                quantity: hold.qty,
                reason: ReservationFailureReason::OrderCancelled as i32,
                detail: "the stock hold expired before the order reached the database".into(),
            };
            let env = envelope::new(
                Payload::StockReservationFailed(failed),
                hold.order_id.to_string(),
                "",
                super::PRODUCER,
            );
            outbox::enqueue(&txn, &env).await?;
        }
        // Units go back once the tombstone is committed (see `StockSaga`'s release); the stock
        // row lock, taken after the insert as `order.created` does, serialises this with the
        // settling of prepared releases.
        db::product(&txn, sku, true).await?;
        self.gate
            .prepare_release_unpersisted(at, hold.order_id)
            .await
            .map_err(gate_err)?;
        txn.commit().await?;
        self.gate
            .finish_release(at, hold.order_id)
            .await
            .map_err(gate_err)?;
        Ok(true)
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

    /// One sweep over every product: settle holds older than `stock.hold_ttl_ms`. Returns how
    /// many were released. When the order service cannot be asked, nothing that needed its
    /// answer is released this round; that is logged once and counted in
    /// `flashsale_hold_sweeps_deferred_total`.
    pub async fn sweep_expired_holds(&self) -> Result<u64, StockError> {
        let ttl = i64::try_from(self.hold_ttl_ms).unwrap_or(i64::MAX);
        let cutoff = chrono::Utc::now().timestamp_millis().saturating_sub(ttl);
        let (mut total, mut deferred) = (0, Vec::new());
        self.settle_stale_releases().await?;
        self.settle_stale_transfers().await?;
        for sku in db::all_skus(&self.db).await? {
            let settled = self.settle_holds(&sku, cutoff).await?;
            total += settled.expired;
            if settled.deferred {
                deferred.push(sku);
            }
        }
        if !deferred.is_empty() {
            metrics::counter!("flashsale_hold_sweeps_deferred_total").increment(1);
            tracing::warn!(
                products = deferred.len(),
                first = %deferred[0],
                "hold sweep deferred: the order service cannot say whether expired holds' orders exist; none given away"
            );
        }
        Ok(total)
    }

    /// Runs [`Self::sweep_expired_holds`] every `stock.sweep_interval_ms` until `shutdown`, on
    /// one replica at a time: a sweep asks the order service about holds and changes the gate
    /// outside any row lock, so two replicas sweeping the same holds at once would ask twice and
    /// race each other's gate changes. A replica whose tick finds another sweeping skips it.
    pub async fn run_sweeper(
        self,
        shutdown: flashsale_platform::shutdown::Shutdown,
    ) -> anyhow::Result<()> {
        let period = Duration::from_millis(self.sweep_interval_ms);
        let singleton = Singleton::new(self.db.clone(), HOLD_SWEEP);
        flashsale_platform::shutdown::every(period, shutdown, "hold sweep", || async {
            singleton
                .run(|| self.sweep_expired_holds())
                .await
                .map_err(StockError::from)?
                .transpose()
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sweeper_gives_away_only_holds_whose_order_is_missing_or_cancelled() {
        let (live, cancelled, missing) = (
            uuid::Uuid::new_v4(),
            uuid::Uuid::new_v4(),
            uuid::Uuid::new_v4(),
        );
        let answer = Ok(HashMap::from([
            (live, OrderState::Live),
            (cancelled, OrderState::Cancelled),
        ]));
        assert_eq!(verdict(&answer, live), HoldVerdict::Keep);
        assert_eq!(verdict(&answer, cancelled), HoldVerdict::Release);
        assert_eq!(verdict(&answer, missing), HoldVerdict::Expire);
        let down = Err(OrdersUnavailable("connection refused".into()));
        for id in [live, cancelled, missing] {
            assert_eq!(verdict(&down, id), HoldVerdict::Defer);
        }
    }
}
