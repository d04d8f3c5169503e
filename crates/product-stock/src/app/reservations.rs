//! The hot path: one order takes units through the Redis gate. Nothing touches the database
//! unless the gate has lost the product's keys (then it is rebuilt from the database and the
//! order service's pending orders first).

use std::{collections::HashSet, sync::Arc};

use sea_orm::{DatabaseConnection, TransactionTrait as _};

use super::{Terms, gate_err};
use crate::{
    config::StockSettings,
    domain::{
        DeductionPolicy, GateBuyers, ProductTerms, Refusal, ReserveRequest, Sku, StockError,
        check_known_refills,
    },
    infra::{
        db,
        gate::{LoadOutcome, RebuiltHold, RedisGate, ReserveArgs, ReserveOutcome, SaleWindow},
        orders::OrderPort,
    },
};

/// A successful reservation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reserved {
    pub unit_price_cents: i64,
    pub policy: DeductionPolicy,
    pub gate_available: i64,
    pub replayed: bool,
    /// The gate's clock when it took the units (`None` on a replay).
    pub gate_ms: Option<i64>,
}

/// The gate's use cases: reservations and the gate's buyers. Cheap to clone.
#[derive(Clone)]
pub struct Reservations {
    db: DatabaseConnection,
    gate: RedisGate,
    orders: Arc<dyn OrderPort>,
    terms: Terms,
    max_quantity: i64,
    rebuild_settle_ms: u64,
}

impl Reservations {
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
            max_quantity: settings.max_quantity,
            rebuild_settle_ms: settings.rebuild_settle_ms,
        }
    }

    /// `sku`'s terms changed: this replica reads them again for its next reservation.
    pub async fn forget_terms(&self, sku: &str) {
        self.terms.forget(sku).await;
    }

    /// Most units one reservation may take.
    pub fn max_quantity(&self) -> i64 {
        self.max_quantity
    }

    /// Reserves through the gate; refusals are [`StockError::Refused`].
    pub async fn reserve(&self, req: ReserveRequest) -> Result<Reserved, StockError> {
        let terms = self.terms.get(&req.sku).await?;
        for _ in 0..2 {
            let outcome = self
                .gate
                .reserve_product_with(
                    terms.stock_buckets,
                    ReserveArgs {
                        sku: req.sku.as_str(),
                        bucket: 0,
                        order_id: req.order_id,
                        user_id: &req.user_id,
                        qty: req.quantity,
                        per_user_limit: terms.per_user_limit,
                        now_ms: chrono::Utc::now().timestamp_millis(),
                        window: window_of(&terms),
                    },
                )
                .await
                .map_err(gate_err)?;
            return match answer(outcome, &terms, &req) {
                Some(a) => a,
                None => {
                    self.rebuild_gate(&req.sku).await?;
                    continue;
                }
            };
        }
        Err(StockError::GateUnavailable(
            "the gate lost the product again while rebuilding".into(),
        ))
    }

    /// The gate's available counter and its buyers of `sku` (see [`GateBuyers`]), rebuilding
    /// the gate first if it lost the product; no list while the refills count is still
    /// `known_refills` (`""`: always a list).
    pub async fn gate_buyers(
        &self,
        sku: &Sku,
        max: u32,
        known_refills: &str,
    ) -> Result<GateBuyers, StockError> {
        check_known_refills(known_refills)?;
        // Unknown products are NOT_FOUND, not an empty list.
        let terms = self.terms.get(sku).await?;
        for _ in 0..2 {
            match self
                .gate
                .product_buyers(sku.as_str(), terms.stock_buckets, max, known_refills)
                .await
                .map_err(gate_err)?
            {
                GateBuyers::NotLoaded => {
                    self.rebuild_gate(sku).await?;
                }
                found => return Ok(found),
            }
        }
        Err(StockError::GateUnavailable(
            "the gate lost the product again while rebuilding".into(),
        ))
    }

    /// [`reserve`](Self::reserve) for many orders with one gate round trip; one answer per
    /// request, in order. `Err` only when the gate could not be asked at all.
    pub async fn reserve_many(
        &self,
        reqs: &[ReserveRequest],
    ) -> Result<Vec<Result<Reserved, StockError>>, StockError> {
        let mut terms = Vec::with_capacity(reqs.len());
        for r in reqs {
            terms.push(self.terms.get(&r.sku).await);
        }
        let now_ms = chrono::Utc::now().timestamp_millis();
        let args: Vec<ReserveArgs<'_>> = reqs
            .iter()
            .zip(&terms)
            .filter_map(|(r, t)| {
                let t = t.as_ref().ok()?;
                Some(ReserveArgs {
                    sku: r.sku.as_str(),
                    bucket: t.bucket_of(&r.user_id),
                    order_id: r.order_id,
                    user_id: &r.user_id,
                    qty: r.quantity,
                    per_user_limit: t.per_user_limit,
                    now_ms,
                    window: window_of(t),
                })
            })
            .collect();
        let mut outcomes = self
            .gate
            .reserve_many(&args)
            .await
            .map_err(gate_err)?
            .into_iter();
        let mut answers = Vec::with_capacity(reqs.len());
        // Products in stock buckets found sold out (every bucket empty at one instant) while
        // this batch was being answered: its other requests were already waiting then, so
        // `SOLD_OUT` is a true answer for them without asking every bucket again.
        let mut sold_out: HashSet<Sku> = HashSet::new();
        for (req, t) in reqs.iter().zip(terms) {
            let t = match t {
                Ok(t) => t,
                Err(e) => {
                    answers.push(Err(e));
                    continue;
                }
            };
            let a = match outcomes.next() {
                Some(Ok(ReserveOutcome::SoldOut)) if sold_out.contains(&req.sku) => {
                    refused(Refusal::SoldOut, 0)
                }
                // The buyer's bucket ran dry: the one-by-one path borrows from the others (the
                // refusal wrote nothing, so asking again is no replay).
                Some(Ok(ReserveOutcome::SoldOut | ReserveOutcome::InsufficientStock { .. }))
                    if t.stock_buckets > 1 =>
                {
                    let a = self.reserve(req.clone()).await;
                    if matches!(a, Err(StockError::Refused(Refusal::SoldOut, _))) {
                        sold_out.insert(req.sku.clone());
                    }
                    a
                }
                Some(Ok(outcome)) => match answer(outcome, &t, req) {
                    Some(a) => a,
                    // The gate lost the product: the one-by-one path rebuilds it.
                    None => self.reserve(req.clone()).await,
                },
                Some(Err(e)) => Err(gate_err(e)),
                None => Err(StockError::Internal(anyhow::anyhow!(
                    "the gate answered fewer reservations than asked"
                ))),
            };
            answers.push(a);
        }
        Ok(answers)
    }

    /// Loads a product's gate keys from the database and the order service's pending orders
    /// (docs/architecture.md#operations, cold start). Safe to run on several replicas at once:
    /// the gate loads only if the keys are still missing.
    pub async fn rebuild_gate(&self, sku: &Sku) -> Result<bool, StockError> {
        rebuild(
            &self.db,
            &self.gate,
            self.orders.as_ref(),
            sku,
            self.rebuild_settle_ms,
        )
        .await
    }
}

/// [`Reservations::rebuild_gate`], for the reconciler too.
///
/// The gate's rule is `available = on_hand − reserved − Σ acknowledged-but-unpersisted`
/// (docs/architecture.md#the-stock-model): the database knows the first two; the orders
/// acknowledged to buyers whose `order.created` has not been persisted yet are known only to
/// the order service, so it is asked for the product's PENDING orders, and those without a
/// reservation row here are held again. If it cannot be asked, the gate stays closed for the
/// product (`GateUnavailable`) rather than opening on a guess that would sell their units twice.
///
/// Atomicity: everything runs under the product's stock row lock. Persisting a reservation
/// (`order.created`) and releasing one both update that row, so none commits while the rebuild
/// reads `reserved`, asks the order service and checks the reservation rows: an order is either
/// persisted (counted in `reserved`, not held again) or not (held again, and its
/// `order.created`, waiting for the lock, marks the new hold persisted). The gate itself is
/// missing meanwhile, so reservations answer `NotLoaded` and change nothing, and the load is one
/// script that does nothing if another replica loaded first.
///
/// Orders in flight: an order whose gate hold was taken before the loss may still be writing
/// when the loss is found; were the pending list read then, its units would be on sale twice.
/// So the first rebuild attempt after a loss only starts a wait of `settle_ms` (the
/// `stock.rebuild_settle_ms` setting, longer than the order service's request deadline) and
/// answers `GateUnavailable`; buyers retry. Once it is over, every such order has been written
/// (it is in the pending list) or its request has failed (it was never acknowledged), since no
/// new hold can be taken while the gate is missing. With a wait of 0 the window is the order
/// write's own duration overlapping the rebuild; the database still never oversells (its CHECK
/// refuses the excess reservation and that order is cancelled OUT_OF_STOCK).
pub(super) async fn rebuild(
    db: &DatabaseConnection,
    gate: &RedisGate,
    orders: &dyn OrderPort,
    sku: &Sku,
    settle_ms: u64,
) -> Result<bool, StockError> {
    let txn = db.begin().await?;
    let product = db::product(&txn, sku, true)
        .await?
        .ok_or_else(|| StockError::UnknownProduct(sku.to_string()))?;
    // Replicas that found the gate missing at once queue on the lock; the first loads it.
    let buckets = product.stock_buckets;
    let states = gate
        .bucket_states(sku.as_str(), buckets)
        .await
        .map_err(gate_err)?;
    if states.iter().all(Option::is_some) {
        return Ok(false);
    }
    if states.iter().any(Option::is_some) {
        // Some buckets were lost, others not (a cluster node's slots): close them all and
        // rebuild the product whole, so the wait below covers every bucket's orders in flight
        // and no transfer or release from before counts twice.
        tracing::warn!(%sku, buckets, "some of the product's stock buckets were lost; rebuilding all");
        gate.unload_product(sku.as_str(), buckets)
            .await
            .map_err(gate_err)?;
    }
    if settle_ms > 0 {
        let wait = gate
            .rebuild_not_before(
                sku.as_str(),
                chrono::Utc::now().timestamp_millis(),
                i64::try_from(settle_ms).unwrap_or(i64::MAX),
            )
            .await
            .map_err(gate_err)?;
        if wait > 0 {
            metrics::counter!("flashsale_gate_rebuilds_waiting_total").increment(1);
            return Err(StockError::GateUnavailable(format!(
                "gate rebuilding: waiting {wait} ms for orders in flight to be written"
            )));
        }
    }
    let pending = orders.pending(sku.as_str()).await.map_err(|e| {
        metrics::counter!("flashsale_gate_rebuilds_refused_total").increment(1);
        tracing::warn!(%sku, error = %e, "the stock gate stays closed: the order service cannot list its pending orders");
        StockError::GateUnavailable(format!(
            "gate rebuilding: the order service cannot list the product's pending orders ({e})"
        ))
    })?;
    let ids: Vec<uuid::Uuid> = pending.iter().map(|o| o.order_id).collect();
    let known = db::reservations_known(&txn, &ids).await?;
    let holds: Vec<RebuiltHold> = pending
        .into_iter()
        .filter(|o| !known.contains(&o.order_id))
        .map(|o| RebuiltHold {
            order_id: o.order_id,
            user_id: o.user_id,
            qty: o.quantity,
        })
        .collect();
    let users = db::units_by_user(&txn, sku).await?;
    let target = product.gate_target();
    let outcome = gate
        .load_product(
            sku.as_str(),
            buckets,
            target,
            &users,
            &holds,
            chrono::Utc::now().timestamp_millis(),
        )
        .await
        .map_err(gate_err)?;
    txn.commit().await?;
    let LoadOutcome::Loaded {
        available,
        held,
        clamped,
    } = outcome
    else {
        return Ok(false);
    };
    metrics::counter!("flashsale_gate_rebuilds_total").increment(1);
    if let Err(e) = gate.rebuild_done(sku.as_str()).await {
        // The marker expires by itself a minute after its wait.
        tracing::warn!(%sku, error = %e, "rebuild wait marker not cleared");
    }
    tracing::warn!(%sku, available, held, clamped, "rebuilt the stock gate from the database and the pending orders");
    if available > 0 {
        // A replica that remembered the product as sold out before Redis lost it should ask
        // the gate again. Best effort: the gate is already loaded, and the sold-out memory's
        // short life bounds a missed event (docs/adr/0005-sold-out-memory.md).
        let event = super::reconcile::gate_refilled(sku, 0, available, "REBUILD");
        if let Err(e) = flashsale_messaging::outbox::enqueue(db, &event).await {
            tracing::warn!(%sku, error = %e, "stock.gate_refilled not recorded");
        }
    }
    Ok(true)
}

/// A product's sale window as the gate judges it.
fn window_of(terms: &ProductTerms) -> SaleWindow {
    let (start_ms, end_ms) = terms.sale.gate_args();
    SaleWindow { start_ms, end_ms }
}

/// A refusal, counted.
fn refused(r: Refusal, available: i64) -> Result<Reserved, StockError> {
    metrics::counter!("flashsale_reserve_refused_total", "reason" => r.reason()).increment(1);
    Err(StockError::Refused(r, available))
}

/// A refusal by the sale window, counted.
fn closed(refusal: Refusal, at_ms: i64, gate_ms: i64) -> Result<Reserved, StockError> {
    metrics::counter!("flashsale_reserve_refused_total", "reason" => refusal.reason()).increment(1);
    Err(StockError::Closed {
        refusal,
        at_ms,
        gate_ms,
    })
}

/// What the gate's outcome means for the caller; `None` when the gate lost the product.
fn answer(
    outcome: ReserveOutcome,
    terms: &ProductTerms,
    req: &ReserveRequest,
) -> Option<Result<Reserved, StockError>> {
    Some(match outcome {
        ReserveOutcome::Reserved {
            remaining,
            replayed,
            gate_ms,
        } => {
            metrics::counter!("flashsale_reserve_accepted_total").increment(1);
            Ok(Reserved {
                unit_price_cents: terms.unit_price(),
                policy: terms.policy,
                gate_available: remaining,
                replayed,
                gate_ms,
            })
        }
        ReserveOutcome::NotStarted { gate_ms, start_ms } => {
            closed(Refusal::SaleNotStarted, start_ms, gate_ms)
        }
        ReserveOutcome::Ended { gate_ms, end_ms } => closed(Refusal::SaleEnded, end_ms, gate_ms),
        ReserveOutcome::SoldOut => refused(Refusal::SoldOut, 0),
        ReserveOutcome::InsufficientStock { available } => {
            refused(Refusal::InsufficientStock, available)
        }
        ReserveOutcome::UserLimitExceeded { .. } => refused(Refusal::UserLimitExceeded, 0),
        ReserveOutcome::Mismatch => Err(StockError::IdempotencyKeyReused("order_id")),
        ReserveOutcome::Released => Err(StockError::ReservationReleased(req.order_id)),
        ReserveOutcome::NotLoaded => return None,
    })
}
