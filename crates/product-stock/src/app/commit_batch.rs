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

use flashsale_messaging::{envelope, outbox};
use flashsale_platform::batch::{Batcher, EACH_CONCURRENCY};
use flashsale_proto::events::v1::{StockCommitted, envelope::Payload};
use sea_orm::TransactionTrait as _;
use tokio::sync::Semaphore;
use uuid::Uuid;

use super::{PRODUCER, StockSaga};
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

/// The batching worker of `CommitReservation`; cheap to clone.
pub type CommitBatcher = Batcher<Uuid, Committed>;

/// Starts the worker. It waits for no one: the calls queued while the batch before ran form
/// the next one, so a lone call is not delayed and a burst shares transactions.
pub fn commit_batcher(saga: StockSaga) -> CommitBatcher {
    Batcher::serving(
        "stock_commit_reservation",
        MAX_BATCH,
        std::time::Duration::ZERO,
        BATCHES_IN_FLIGHT,
        saga,
        |saga, ids| async move { saga.commit_reservations(ids).await },
    )
}

impl StockSaga {
    /// Commits the reservations of `ids`; one answer per id, in order, each the answer
    /// [`StockSaga::commit_reservation`] gives.
    pub async fn commit_reservations(&self, ids: Vec<Uuid>) -> Vec<Committed> {
        if ids.len() > 1 {
            match self.commit_together(&ids).await {
                Ok(Some(answers)) => {
                    metrics::histogram!("flashsale_commit_reservation_batch_size")
                        .record(ids.len() as f64);
                    return answers.into_iter().map(Ok).collect();
                }
                Ok(None) => {
                    metrics::counter!("flashsale_commit_reservation_batch_fallbacks_total")
                        .increment(1);
                }
                Err(e) => {
                    tracing::debug!(error = %e, size = ids.len(), "commit batch failed; one by one");
                    metrics::counter!("flashsale_commit_reservation_batch_fallbacks_total")
                        .increment(1);
                }
            }
        }
        let permits = Semaphore::new(EACH_CONCURRENCY);
        let permits = &permits;
        let runs = ids.iter().map(|&id| async move {
            // Never closed, so a permit always comes.
            let _permit = permits.acquire().await.ok();
            self.commit_reservation(id).await
        });
        futures_util::future::join_all(runs).await
    }

    /// The common case in one transaction; `Ok(None)` (nothing committed) when some call needs
    /// the one-by-one path.
    async fn commit_together(
        &self,
        ids: &[Uuid],
    ) -> Result<Option<Vec<(Reservation, bool)>>, StockError> {
        if ids.iter().collect::<HashSet<_>>().len() != ids.len() {
            return Ok(None);
        }
        let txn = self.db.begin().await?;
        let found = db::reservations_locked(&txn, ids).await?;
        if found.len() != ids.len() {
            return Ok(None);
        }
        let mut to_commit = Vec::new();
        // Per product: the units leaving it, in a fixed order so concurrent batches take the
        // stock rows in the same order.
        let mut moves: BTreeMap<&Sku, i64> = BTreeMap::new();
        for r in &found {
            match r.state {
                ReservationState::Committed => {}
                ReservationState::Released => return Ok(None),
                ReservationState::Reserved => {
                    to_commit.push(r.order_id);
                    *moves.entry(&r.sku).or_insert(0) += r.quantity;
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
                .map(|(r, cause)| (&r.sku, -r.quantity, -r.quantity, cause.as_str()))
                .collect();
            db::ledger_many(&txn, "COMMIT", &ledger).await?;
            let events: Vec<_> = reserved
                .zip(&causes)
                .map(|(r, cause)| {
                    envelope::new(
                        Payload::StockCommitted(StockCommitted {
                            order_id: cause.clone(),
                            sku: r.sku.to_string(),
                            quantity: r.quantity,
                        }),
                        cause.clone(),
                        "",
                        PRODUCER,
                    )
                })
                .collect();
            outbox::enqueue_many(&txn, &events).await?;
            // The hot rows last, so their locks are held only for the commit.
            for (sku, units) in &moves {
                if !db::move_stock(&txn, sku, -units, -units).await? {
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
