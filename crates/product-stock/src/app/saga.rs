//! product-stock's part of the order saga (docs/architecture.md#the-order-saga): persist reservations from
//! `order.created`, release them on `order.cancelled` (leaving a tombstone when the cancel comes
//! first), commit them at shipment, and follow `stock.adjusted` in the gate. Each handler runs in
//! one database transaction with its inbox row, so a redelivered message has no second effect;
//! the gate is told afterwards, with idempotent scripts, and the sweeper mends a lost update.

use flashsale_messaging::{envelope, inbox, outbox};
use flashsale_platform::failpoint::Failpoints;
use flashsale_proto::events::v1::{
    Envelope, OrderCancelled, OrderCreated, ReservationFailureReason, StockAdjusted,
    StockCommitted, StockReleased, StockReservationFailed, StockReserved, envelope::Payload,
};
use sea_orm::{DatabaseConnection, DatabaseTransaction, TransactionTrait as _};
use uuid::Uuid;

use super::{PRODUCER, Terms, failpoint, gate_err};
use crate::{
    domain::{
        DeductionPolicy, Refusal, Reservation, ReservationState, Sku, StockError, parse_order_id,
    },
    infra::{
        db,
        gate::{At, RedisGate},
    },
};

/// Tombstone causes: a later `order.created` for the order is refused.
pub const CANCELLED_BEFORE_CREATED: &str = "CANCELLED_BEFORE_CREATED";
pub const HOLD_EXPIRED: &str = "HOLD_EXPIRED";

pub(super) fn parse_event_fields(
    order_id: &str,
    sku: &str,
    quantity: i64,
) -> Result<(Uuid, Sku), StockError> {
    let id = parse_order_id(order_id)?;
    let sku = Sku::parse(sku)?;
    if quantity < 1 {
        return Err(StockError::invalid("quantity", "must be >= 1"));
    }
    Ok((id, sku))
}

/// `stock.reserved` for the reservation `order.created` (`cause`) took; `order_id` as the
/// event spelled it.
pub(super) fn reserved_event(cause: &Envelope, order_id: &str, r: &Reservation) -> Envelope {
    let ok = StockReserved {
        order_id: order_id.to_owned(),
        sku: r.sku.to_string(),
        quantity: r.quantity,
        deduction_policy: r.policy.as_proto(),
    };
    envelope::caused_by(cause, Payload::StockReserved(ok), PRODUCER)
}

/// `stock.committed` for a reservation committed at shipment.
pub(super) fn committed_event(r: &Reservation) -> Envelope {
    let order_id = r.order_id.to_string();
    let ev = StockCommitted {
        order_id: order_id.clone(),
        sku: r.sku.to_string(),
        quantity: r.quantity,
    };
    envelope::new(Payload::StockCommitted(ev), order_id, "", PRODUCER)
}

/// product-stock's steps of the order saga: the consumers of `order.created`,
/// `order.cancelled` and `stock.adjusted`, and `CommitReservation` at shipment. Cheap to clone.
#[derive(Clone)]
pub struct StockSaga {
    pub(super) db: DatabaseConnection,
    pub(super) gate: RedisGate,
    pub(super) terms: Terms,
    pub(super) failpoints: Failpoints,
}

impl StockSaga {
    pub fn new(
        db: DatabaseConnection,
        gate: RedisGate,
        terms: Terms,
        failpoints: Failpoints,
    ) -> Self {
        Self {
            db,
            gate,
            terms,
            failpoints,
        }
    }

    /// Opens the handler's transaction and claims the message; `None` when it was seen before.
    async fn claim(
        &self,
        consumer: &str,
        env: &Envelope,
    ) -> Result<Option<DatabaseTransaction>, StockError> {
        let claim = inbox::Claim::current(env)
            .map_err(|e| StockError::invalid("message_id", e.to_string()))?;
        let txn = self.db.begin().await?;
        if inbox::claim(&txn, consumer, claim).await? {
            Ok(Some(txn))
        } else {
            Ok(None)
        }
    }

    /// `order.created`: `reserved += q WHERE on_hand - reserved >= q` (COMMIT_AT_ORDER:
    /// `on_hand -= q`), reservation row, ledger, then `stock.reserved` or
    /// `stock.reservation_failed`.
    #[tracing::instrument(target = "flashsale::log_scope", skip_all, fields(order_id = %ev.order_id, sku = %ev.sku))]
    pub async fn on_order_created(
        &self,
        consumer: &str,
        env: &Envelope,
        ev: &OrderCreated,
    ) -> Result<(), StockError> {
        let (order_id, sku) = parse_event_fields(&ev.order_id, &ev.sku, ev.quantity)?;
        let Some(txn) = self.claim(consumer, env).await? else {
            return Ok(());
        };
        let q = ev.quantity;
        let fail = |reason: ReservationFailureReason, detail: &str| {
            envelope::caused_by(
                env,
                Payload::StockReservationFailed(StockReservationFailed {
                    order_id: ev.order_id.clone(),
                    sku: ev.sku.clone(),
                    quantity: q,
                    reason: reason as i32,
                    detail: detail.to_owned(),
                }),
                PRODUCER,
            )
        };
        match db::reservation(&txn, order_id, true).await? {
            Some(r) if r.state == ReservationState::Released => {
                outbox::enqueue(
                    &txn,
                    &fail(
                        ReservationFailureReason::OrderCancelled,
                        "the order was cancelled",
                    ),
                )
                .await?;
                self.gate_step(OrderStep::ReleaseUnpersisted, &sku, &ev.user_id, order_id)
                    .await?;
                txn.commit().await?;
                return Ok(());
            }
            Some(_) => {
                // Persisted before under another message id: nothing more to do.
                self.gate_step(OrderStep::MarkPersisted, &sku, &ev.user_id, order_id)
                    .await?;
                txn.commit().await?;
                return Ok(());
            }
            None => {}
        }
        let terms = match self.terms.get(&sku).await {
            Ok(t) => t,
            Err(StockError::UnknownProduct(_)) => {
                outbox::enqueue(
                    &txn,
                    &fail(ReservationFailureReason::UnknownProduct, "no such product"),
                )
                .await?;
                txn.commit().await?;
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        let row = Reservation::taken(order_id, sku.clone(), &ev.user_id, q, terms.policy);
        let (on_hand_delta, reserved_delta, kind) = row.taking();
        // The row first: a tombstone written at the same moment (sweeper, early cancel) makes
        // this insert wait and then find the conflict, so units are never moved for it.
        if !db::insert_reservation(&txn, &row, "order.created").await? {
            drop(txn);
            return Err(StockError::Internal(anyhow::anyhow!(
                "reservation of order {order_id} written concurrently; retrying"
            )));
        }
        if db::move_stock(&txn, &sku, on_hand_delta, reserved_delta).await? {
            db::ledger(
                &txn,
                &sku,
                kind,
                on_hand_delta,
                reserved_delta,
                &ev.order_id,
            )
            .await?;
            outbox::enqueue(&txn, &reserved_event(env, &ev.order_id, &row)).await?;
            // Gate changes that follow the database happen before the commit, under the stock
            // row lock (see `release_persisted`). A commit that fails takes the mark back, so
            // until the retry the gate holds the units again, as the database does not count
            // them: a repair or a cancel meanwhile then sees the hold the retry will persist.
            self.gate_step(OrderStep::MarkPersisted, &sku, &ev.user_id, order_id)
                .await?;
            let committed = async {
                failpoint(&self.failpoints, "stock.order_created.before_commit").await?;
                txn.commit().await?;
                Ok::<(), StockError>(())
            }
            .await;
            if let Err(e) = committed {
                self.unmark_if_unwritten(&sku, &ev.user_id, order_id).await;
                return Err(e);
            }
        } else {
            db::set_reservation_state(
                &txn,
                order_id,
                row.state,
                ReservationState::Released,
                Refusal::InsufficientStock.reason(),
            )
            .await?;
            let detail = "the database has fewer units than the gate admitted";
            outbox::enqueue(
                &txn,
                &fail(ReservationFailureReason::InsufficientStock, detail),
            )
            .await?;
            // The gate admitted what the database does not have: drop the hold without giving
            // the units back, which moves the gate towards the database.
            self.gate_step(OrderStep::DropHold, &sku, &ev.user_id, order_id)
                .await?;
            txn.commit().await?;
            metrics::counter!("flashsale_reservation_failed_in_db_total").increment(1);
        }
        Ok(())
    }

    /// `order.cancelled`: release the reservation once and give the units back to the gate; a
    /// cancel that arrives before its `order.created` leaves a tombstone.
    #[tracing::instrument(target = "flashsale::log_scope", skip_all, fields(order_id = %ev.order_id, sku = %ev.sku))]
    pub async fn on_order_cancelled(
        &self,
        consumer: &str,
        env: &Envelope,
        ev: &OrderCancelled,
    ) -> Result<(), StockError> {
        let (order_id, sku) = parse_event_fields(&ev.order_id, &ev.sku, ev.quantity)?;
        let Some(txn) = self.claim(consumer, env).await? else {
            // Handled before: if that attempt committed and died before giving the units back
            // (or Redis refused it then), this delivery finishes it; otherwise nothing happens.
            return self
                .gate_step(OrderStep::FinishRelease, &sku, &ev.user_id, order_id)
                .await;
        };
        let Some(r) = db::reservation(&txn, order_id, true).await? else {
            let policy = self
                .terms
                .get(&sku)
                .await
                .map(|t| t.policy)
                .unwrap_or(DeductionPolicy::ReserveThenCommit);
            let tombstone = Reservation {
                order_id,
                sku: sku.clone(),
                user_id: ev.user_id.clone(),
                quantity: 0,
                state: ReservationState::Released,
                policy,
            };
            if !db::insert_reservation(&txn, &tombstone, CANCELLED_BEFORE_CREATED).await? {
                // The order's `order.created` wrote its reservation while this transaction
                // looked: the insert waited for that transaction and met its row. Release that
                // reservation instead; committing here would leave its units reserved for good.
                let Some(r) = db::reservation(&txn, order_id, true).await? else {
                    return Err(StockError::Internal(anyhow::anyhow!(
                        "the reservation of order {order_id} conflicted but cannot be read"
                    )));
                };
                return self
                    .release_persisted(txn, env, &r, "order.cancelled")
                    .await;
            }
            // Units held in the gate for an order the database never saw go back once the
            // tombstone is committed (see `release_persisted`); the stock row lock, taken after
            // the insert as `order.created` does, lets the reconciler settle a release whose
            // consumer died.
            db::product(&txn, &sku, true).await?;
            let bucket = self.bucket(&sku, &ev.user_id).await?;
            self.gate
                .prepare_release_unpersisted(At::new(sku.as_str(), bucket), order_id)
                .await
                .map_err(gate_err)?;
            txn.commit().await?;
            failpoint(&self.failpoints, "stock.order_cancelled.after_commit").await?;
            return self
                .gate_step(OrderStep::FinishRelease, &sku, &ev.user_id, order_id)
                .await;
        };
        self.release_persisted(txn, env, &r, "order.cancelled")
            .await
    }

    /// Releases a RESERVED or COMMITTED reservation in `txn` and the gate. A committed one
    /// gives its deducted units back to on_hand: a COMMIT_AT_ORDER order cancelled, or a
    /// RESERVE_THEN_COMMIT order whose shipment the warehouse refused after outbound deducted
    /// it (outbound deducts before it ships, and a shipped order is never cancelled).
    async fn release_persisted(
        &self,
        txn: DatabaseTransaction,
        env: &Envelope,
        r: &Reservation,
        cause: &str,
    ) -> Result<(), StockError> {
        let (on_hand_delta, reserved_delta) = match r.state {
            ReservationState::Reserved => (0, -r.quantity),
            ReservationState::Committed => (r.quantity, 0),
            ReservationState::Released => {
                txn.commit().await?;
                self.gate_step(OrderStep::FinishRelease, &r.sku, &r.user_id, r.order_id)
                    .await?;
                // A hold taken again after the gate forgot the released order (a late replay
                // of its CreateOrder, see `stock.released_record_ttl_ms`): the order service
                // cancels it at once, and the database released the order, so it goes.
                return self
                    .gate_step(
                        OrderStep::ReleaseUnpersisted,
                        &r.sku,
                        &r.user_id,
                        r.order_id,
                    )
                    .await;
            }
        };
        if !db::move_stock(&txn, &r.sku, on_hand_delta, reserved_delta).await? {
            return Err(StockError::Internal(anyhow::anyhow!(
                "release of order {} broke the stock bounds",
                r.order_id
            )));
        }
        db::set_reservation_state(&txn, r.order_id, r.state, ReservationState::Released, cause)
            .await?;
        db::ledger(
            &txn,
            &r.sku,
            "RELEASE",
            on_hand_delta,
            reserved_delta,
            &r.order_id.to_string(),
        )
        .await?;
        let released = StockReleased {
            order_id: r.order_id.to_string(),
            sku: r.sku.to_string(),
            quantity: r.quantity,
            cause: cause.to_owned(),
        };
        outbox::enqueue(
            &txn,
            &envelope::caused_by(env, Payload::StockReleased(released), PRODUCER),
        )
        .await?;
        // The gate gives the units back only once the database has released them: prepared
        // here, under the stock row lock, and finished after the commit. Were they given back
        // before the commit and the commit failed (a lost connection, a crash), the gate would
        // sell units the database still counts as reserved, and the buyer who took them would
        // be cancelled OUT_OF_STOCK when their `order.created` met the database's CHECK. A
        // consumer that dies between the commit and the finish is finished by the redelivery
        // (see `on_order_cancelled`) or by the reconciler, which settles prepared releases
        // under the same lock.
        let bucket = self.bucket(&r.sku, &r.user_id).await?;
        self.gate
            .prepare_release(
                At::new(r.sku.as_str(), bucket),
                r.order_id,
                &r.user_id,
                r.quantity,
            )
            .await
            .map_err(gate_err)?;
        failpoint(&self.failpoints, "stock.order_cancelled.before_commit").await?;
        txn.commit().await?;
        failpoint(&self.failpoints, "stock.order_cancelled.after_commit").await?;
        self.gate_step(OrderStep::FinishRelease, &r.sku, &r.user_id, r.order_id)
            .await
    }

    /// `CommitReservation`: at shipment, `on_hand -= q, reserved -= q`. Idempotent.
    #[tracing::instrument(target = "flashsale::log_scope", skip_all, fields(order_id = %order_id))]
    pub async fn commit_reservation(
        &self,
        order_id: Uuid,
    ) -> Result<(Reservation, bool), StockError> {
        let txn = self.db.begin().await?;
        let r = db::reservation(&txn, order_id, true)
            .await?
            .ok_or(StockError::UnknownReservation(order_id))?;
        match r.state {
            ReservationState::Committed => return Ok((r, true)),
            ReservationState::Released => return Err(StockError::ReservationReleased(order_id)),
            ReservationState::Reserved => {}
        }
        let (on_hand_delta, reserved_delta) = r.committing();
        if !db::move_stock(&txn, &r.sku, on_hand_delta, reserved_delta).await? {
            return Err(StockError::Internal(anyhow::anyhow!(
                "commit of order {order_id} broke the stock bounds"
            )));
        }
        db::set_reservation_state(
            &txn,
            order_id,
            ReservationState::Reserved,
            ReservationState::Committed,
            "CommitReservation",
        )
        .await?;
        let cause = order_id.to_string();
        db::ledger(&txn, &r.sku, "COMMIT", on_hand_delta, reserved_delta, &cause).await?;
        outbox::enqueue(&txn, &committed_event(&r)).await?;
        txn.commit().await?;
        Ok((
            Reservation {
                state: ReservationState::Committed,
                ..r
            },
            false,
        ))
    }

    /// `stock.adjusted`: apply the adjustment to the gate, once per request id (the RPC usually
    /// did already; then the gate answers duplicate). Under the stock row lock, like every gate
    /// change that follows the database.
    pub async fn on_stock_adjusted(
        &self,
        consumer: &str,
        env: &Envelope,
        ev: &StockAdjusted,
    ) -> Result<(), StockError> {
        let sku = Sku::parse(&ev.sku)?;
        if ev.request_id.is_empty() || ev.delta == 0 {
            return Err(StockError::invalid(
                "request_id",
                "stock.adjusted needs a request id and a delta",
            ));
        }
        let Some(txn) = self.claim(consumer, env).await? else {
            return Ok(());
        };
        let product = db::product(&txn, &sku, true)
            .await?
            .ok_or_else(|| StockError::invalid("sku", "stock.adjusted for an unknown product"))?;
        self.gate
            .adjust_product(
                sku.as_str(),
                product.stock_buckets,
                &ev.request_id,
                ev.delta,
                &ev.gate_generation,
            )
            .await
            .map_err(gate_err)?;
        txn.commit().await?;
        Ok(())
    }

    /// The stock bucket holding `user_id`'s orders of `sku` (0 for a product this service does
    /// not know: its gate, if any, has one bucket).
    pub(super) async fn bucket(&self, sku: &Sku, user_id: &str) -> Result<u32, StockError> {
        match self.terms.get(sku).await {
            Ok(t) => Ok(t.bucket_of(user_id)),
            Err(StockError::UnknownProduct(_)) => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// One gate step on an order's record, in the bucket its user's orders live in.
    async fn gate_step(
        &self,
        step: OrderStep,
        sku: &Sku,
        user_id: &str,
        order_id: Uuid,
    ) -> Result<(), StockError> {
        let at = At::new(sku.as_str(), self.bucket(sku, user_id).await?);
        match step {
            OrderStep::MarkPersisted => self.gate.mark_persisted(at, order_id).await.map(drop),
            OrderStep::DropHold => self.gate.drop_hold(at, order_id).await.map(drop),
            OrderStep::FinishRelease => self.gate.finish_release(at, order_id).await.map(drop),
            OrderStep::ReleaseUnpersisted => {
                self.gate.release_unpersisted(at, order_id).await.map(drop)
            }
        }
        .map_err(gate_err)
    }

    /// Takes back the gate's mark of an order whose `order.created` transaction failed, if the
    /// database (read under the stock row lock, so after that transaction ended) has no
    /// reservation for it. Best effort: if it cannot run, the retry of the delivery persists
    /// the reservation and the mark stands, as it would have.
    async fn unmark_if_unwritten(&self, sku: &Sku, user_id: &str, order_id: Uuid) {
        let undo = async {
            let txn = self.db.begin().await?;
            db::product(&txn, sku, true).await?;
            if db::reservation(&txn, order_id, false).await?.is_none() {
                let bucket = self.bucket(sku, user_id).await?;
                self.gate
                    .unmark_persisted(
                        At::new(sku.as_str(), bucket),
                        order_id,
                        chrono::Utc::now().timestamp_millis(),
                    )
                    .await
                    .map_err(gate_err)?;
            }
            txn.commit().await?;
            Ok::<(), StockError>(())
        };
        if let Err(e) = undo.await {
            tracing::warn!(%sku, %order_id, error = %e, "the gate's mark of an uncommitted reservation was not taken back");
        }
    }
}

/// The gate's steps on one order's record that follow a database change ([`StockSaga::gate_step`]).
#[derive(Clone, Copy, Debug)]
enum OrderStep {
    /// The database has the reservation: the hold is persisted.
    MarkPersisted,
    /// The database refused the reservation for lack of stock: the hold is forgotten and its
    /// units do not come back (the gate had admitted units that do not exist).
    DropHold,
    /// The database released the reservation: its units go back.
    FinishRelease,
    /// The database never had the order: the hold's units go back.
    ReleaseUnpersisted,
}
