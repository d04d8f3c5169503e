//! `outbound.completed` in batches: the deliveries waiting at the same moment move their
//! orders PAID → SHIPPED in one transaction — one inbox insert, one update with its history
//! rows, one commit — instead of one transaction each. Anything unusual in a batch (a
//! redelivery, an order that is not PAID or unknown, any error) rolls it back, and each
//! delivery runs through [`Saga::on_outbound_completed`] on its own, which handles every case
//! (docs/architecture.md#batchers).

use flashsale_messaging::{inbox, outbox, trace};
use flashsale_platform::batch::{BatchMetrics, Batcher, together_or_each};
use flashsale_proto::events::v1::Envelope;
use sea_orm::TransactionTrait as _;
use tracing::Instrument as _;

use super::{Saga, saga_batch::GATHER};
use crate::{
    domain::{OrderError, parse_order_id},
    infra::db,
};

/// One `outbound.completed` delivery waiting for its batch.
#[derive(Clone, Debug)]
pub struct Completed {
    pub consumer: String,
    pub env: Envelope,
    pub order_id: String,
    /// The delivery's trace context: its one-by-one path continues it.
    pub trace: outbox::TraceHeaders,
    /// The delivery's attempt (1 = the first), for the inbox.
    pub attempt: u32,
}

/// Most deliveries applied in one transaction.
pub const MAX_BATCH: usize = 128;

/// The batching worker of `outbound.completed`; cheap to clone.
pub type CompletedBatcher = Batcher<Completed, Result<(), OrderError>>;

/// Starts the worker: one batch at a time, each of at most `max_batch` deliveries (at most
/// [`MAX_BATCH`]); as for `stock.reserved`, half the consumer's prefetch.
pub fn completed_batcher(saga: Saga, max_batch: usize) -> CompletedBatcher {
    Batcher::serving(
        "order_outbound_completed",
        max_batch.clamp(1, MAX_BATCH),
        GATHER,
        1,
        saga,
        |saga, items| async move { saga.ship_completed(items).await },
    )
}

impl Saga {
    /// Applies a batch of `outbound.completed`; one answer per delivery, in order.
    pub async fn ship_completed(&self, items: Vec<Completed>) -> Vec<Result<(), OrderError>> {
        together_or_each(
            &items,
            BatchMetrics {
                size: "flashsale_outbound_completed_batch_size",
                fallbacks: "flashsale_outbound_completed_batch_fallbacks_total",
            },
            |all| self.ship_together(all),
            |c| {
                inbox::with_attempt(
                    c.attempt,
                    self.on_outbound_completed(&c.consumer, &c.env, &c.order_id),
                )
                .instrument(trace::on_behalf_of(&c.trace))
            },
        )
        .await
    }

    /// The common case in one transaction; `Ok(false)` (nothing committed) when some delivery
    /// needs the one-by-one path.
    async fn ship_together(&self, items: &[Completed]) -> Result<bool, OrderError> {
        let Some(consumer) = items.first().map(|c| c.consumer.as_str()) else {
            return Ok(true);
        };
        let mut message_ids = Vec::with_capacity(items.len());
        let mut order_ids = Vec::with_capacity(items.len());
        for c in items {
            if c.consumer != consumer {
                return Ok(false);
            }
            let (Ok(m), Ok(o)) = (
                inbox::Claim::of(&c.env, c.attempt, &c.trace),
                parse_order_id(&c.order_id),
            ) else {
                return Ok(false);
            };
            message_ids.push(m);
            order_ids.push(o);
        }
        let mut distinct = order_ids.clone();
        distinct.sort_unstable();
        distinct.dedup();
        if distinct.len() != order_ids.len() {
            return Ok(false);
        }
        let n = items.len();
        let txn = self.db.begin().await?;
        if inbox::claim_many(&txn, consumer, &message_ids).await? != n {
            return Ok(false);
        }
        let moved = db::ship_many(&txn, &distinct, "outbound.completed").await?;
        if moved.len() != n {
            return Ok(false);
        }
        self.failpoint(super::saga::FP_OUTBOUND_RESULT_BEFORE_COMMIT)
            .await?;
        txn.commit().await?;
        super::saga::reached("shipped", moved.iter().map(|m| m.created_at));
        Ok(true)
    }
}
