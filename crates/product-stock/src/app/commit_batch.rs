//! `CommitReservation` in batches. At shipment, outbound commits the reservations of a whole
//! batch of paid orders at once; each commit on its own would take the product's hot stock row,
//! write its ledger row and event and commit alone, so the commits of one product queue behind
//! each other's fsync. The calls waiting at the same moment are committed together instead:
//! one transaction locks their reservations, marks them committed, writes their ledger rows and
//! `stock.committed` events, moves each product's stock once by the sum, and commits once.
//!
//! Only the common case is batched: reservations that exist and are RESERVED or already
//! COMMITTED (a replay, answered as one). Anything else in a batch (an unknown order, a released
//! reservation, the same order twice, stock bounds that do not hold, any error) rolls the batch
//! back and every call of it runs through [`StockSaga::commit_reservation`] on its own, which
//! answers each case (docs/architecture.md#batchers).

use std::collections::{BTreeMap, HashSet};

use flashsale_messaging::{outbox, trace};
use flashsale_platform::batch::{BatchMetrics, Batcher, answered_together_or_each};
use sea_orm::TransactionTrait as _;
use tracing::Instrument as _;
use uuid::Uuid;

use super::{StockSaga, saga::committed_event};
use crate::{
    domain::{Reservation, ReservationState, Sku, StockError},
    infra::db,
};

/// Most commits in one transaction: outbound's shipping batch.
pub const MAX_BATCH: usize = 64;

/// Batches committed at once by one replica: one commits while the next forms.
const BATCHES_IN_FLIGHT: usize = 2;

/// One commit's answer: the reservation as it is now, and whether it had been committed
/// before (a replay).
pub type Committed = Result<(Reservation, bool), StockError>;

/// One `CommitReservation` waiting for its batch: the order, and the call's trace context,
/// which its `stock.committed` carries.
pub type Commit = (Uuid, outbox::TraceHeaders);

/// The batching worker of `CommitReservation`; cheap to clone.
pub type CommitBatcher = Batcher<Commit, Committed>;

/// Starts the worker. It waits for no one: the calls queued while the batch before ran form
/// the next one, so a lone call is not delayed and a burst shares transactions.
pub fn commit_batcher(saga: StockSaga) -> CommitBatcher {
    Batcher::serving(
        "stock_commit_reservation",
        MAX_BATCH,
        std::time::Duration::ZERO,
        BATCHES_IN_FLIGHT,
        saga,
        |saga, commits| async move { saga.commit_traced(commits).await },
    )
}

impl StockSaga {
    /// Commits the reservations of `ids`; one answer per id, in order, each the answer
    /// [`StockSaga::commit_reservation`] gives.
    pub async fn commit_reservations(&self, ids: Vec<Uuid>) -> Vec<Committed> {
        let trace = outbox::current_trace();
        let commits = ids.into_iter().map(|id| (id, trace.clone())).collect();
        self.commit_traced(commits).await
    }

    /// [`StockSaga::commit_reservations`], each commit with its own trace context.
    pub async fn commit_traced(&self, commits: Vec<Commit>) -> Vec<Committed> {
        answered_together_or_each(
            &commits,
            BatchMetrics {
                size: "flashsale_commit_reservation_batch_size",
                fallbacks: "flashsale_commit_reservation_batch_fallbacks_total",
            },
            |all| self.commit_together(all),
            |(id, trace)| {
                self.commit_reservation(*id)
                    .instrument(trace::on_behalf_of(trace))
            },
        )
        .await
    }

    /// The common case in one transaction; `Ok(None)` (nothing committed) when some call needs
    /// the one-by-one path.
    async fn commit_together(
        &self,
        commits: &[Commit],
    ) -> Result<Option<Vec<(Reservation, bool)>>, StockError> {
        let ids: Vec<Uuid> = commits.iter().map(|c| c.0).collect();
        let ids = ids.as_slice();
        let traces: std::collections::HashMap<Uuid, &outbox::TraceHeaders> =
            commits.iter().map(|(id, t)| (*id, t)).collect();
        if ids.iter().collect::<HashSet<_>>().len() != ids.len() {
            return Ok(None);
        }
        let txn = self.db.begin().await?;
        let found = db::reservations_locked(&txn, ids).await?;
        if found.len() != ids.len() {
            return Ok(None);
        }
        let mut to_commit = Vec::new();
        // Per product: (on_hand delta, reserved delta), in a fixed order so concurrent batches
        // take the stock rows in the same order.
        let mut moves: BTreeMap<&Sku, (i64, i64)> = BTreeMap::new();
        for r in &found {
            match r.state {
                ReservationState::Committed => {}
                ReservationState::Released => return Ok(None),
                ReservationState::Reserved => {
                    to_commit.push(r.order_id);
                    let (on_hand, reserved) = r.committing();
                    let m = moves.entry(&r.sku).or_insert((0, 0));
                    m.0 += on_hand;
                    m.1 += reserved;
                }
            }
        }
        if !to_commit.is_empty() {
            let moved = db::set_reservation_states(
                &txn,
                &to_commit,
                ReservationState::Reserved,
                ReservationState::Committed,
                "CommitReservation",
            )
            .await?;
            if moved != to_commit.len() {
                return Ok(None);
            }
            let causes: Vec<String> = to_commit.iter().map(Uuid::to_string).collect();
            let reserved = found
                .iter()
                .filter(|r| r.state == ReservationState::Reserved);
            let ledger: Vec<(&Sku, i64, i64, &str)> = reserved
                .clone()
                .zip(&causes)
                .map(|(r, cause)| {
                    let (on_hand, reserved) = r.committing();
                    (&r.sku, on_hand, reserved, cause.as_str())
                })
                .collect();
            db::ledger_many(&txn, "COMMIT", &ledger).await?;
            let events: Vec<_> = reserved
                .map(|r| {
                    let trace = traces.get(&r.order_id).map(|t| (*t).clone());
                    (committed_event(r), trace.unwrap_or_default())
                })
                .collect();
            outbox::enqueue_many_traced(&txn, &events, None).await?;
            // The hot rows last, so their locks are held only for the commit.
            for (sku, (on_hand, reserved)) in &moves {
                if !db::move_stock(&txn, sku, *on_hand, *reserved).await? {
                    return Ok(None);
                }
            }
        }
        txn.commit().await?;
        let by_id: std::collections::HashMap<Uuid, Reservation> =
            found.into_iter().map(|r| (r.order_id, r)).collect();
        let mut answers = Vec::with_capacity(ids.len());
        for id in ids {
            let Some(r) = by_id.get(id) else {
                return Err(StockError::Internal(anyhow::anyhow!(
                    "reservation {id} vanished from its own batch"
                )));
            };
            let replayed = r.state == ReservationState::Committed;
            answers.push((
                Reservation {
                    state: ReservationState::Committed,
                    ..r.clone()
                },
                replayed,
            ));
        }
        Ok(Some(answers))
    }
}
