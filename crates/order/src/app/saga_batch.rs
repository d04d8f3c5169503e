//! `stock.reserved` in batches: the deliveries waiting at the same moment move their orders
//! PENDING → AWAITING_PAYMENT in one transaction — one inbox insert, one update, one history
//! insert, one outbox insert of their payment timers, one commit — instead of one transaction
//! each. Anything unusual in a batch (a redelivery, an order that is not PENDING or unknown,
//! any error) rolls it back, and each delivery runs through [`Saga::on_stock_reserved`] on
//! its own, which handles every case (docs/architecture.md#batchers).

use flashsale_messaging::{inbox, outbox, trace};
use flashsale_platform::batch::{BatchMetrics, Batcher, together_or_each};
use flashsale_proto::events::v1::Envelope;
use sea_orm::TransactionTrait as _;
use tracing::Instrument as _;

use super::{Saga, saga::payment_timer};
use crate::{
    domain::{OrderError, parse_order_id},
    infra::db,
};

/// One `stock.reserved` delivery waiting for its batch.
#[derive(Clone, Debug)]
pub struct Reserved {
    pub consumer: String,
    pub env: Envelope,
    pub order_id: String,
    /// The delivery's trace context, so its payment timer continues the order's trace.
    pub trace: outbox::TraceHeaders,
    /// The delivery's attempt (1 = the first), for the inbox.
    pub attempt: u32,
}

/// How long a batch waits for more deliveries once the first arrived: a few milliseconds more
/// on a saga step no buyer waits for, in exchange for fewer, larger transactions while a burst
/// of orders (and the CreateOrders behind it) competes for the same CPU.
pub const GATHER: std::time::Duration = std::time::Duration::from_millis(20);

/// Most deliveries confirmed in one transaction.
pub const MAX_BATCH: usize = 128;

/// The batching worker of `stock.reserved`; cheap to clone. It holds a clone of the saga's
/// handle until its last handle is dropped (when the consumer stops).
pub type ReservedBatcher = Batcher<Reserved, Result<(), OrderError>>;

/// Batches applied at once by one replica. One: the next batch forms while it commits, and
/// as large batches as the consumer's prefetch allows cost PostgreSQL the least per event. A
/// second batch in flight does not speed the saga up; it only adds transactions competing
/// with the buyers for the cores (docs/benchmarks.md). Several replicas each apply their own.
const SAGA_BATCHES_IN_FLIGHT: usize = 1;

/// Starts the worker: one batch at a time (`SAGA_BATCHES_IN_FLIGHT`), each of at most
/// `max_batch` deliveries (at most [`MAX_BATCH`]). Size batches to what the consumer can hold: with a
/// prefetch of P, `P / 2`, so the next batch can fill while one is applied — a batch that
/// cannot fill up would wait the whole [`GATHER`] every time.
pub fn reserved_batcher(saga: Saga, max_batch: usize) -> ReservedBatcher {
    Batcher::serving(
        "order_stock_reserved",
        max_batch.clamp(1, MAX_BATCH),
        GATHER,
        SAGA_BATCHES_IN_FLIGHT,
        saga,
        |saga, items| async move { saga.confirm_reserved(items).await },
    )
}

impl Saga {
    /// Applies a batch of `stock.reserved`; one answer per delivery, in order.
    pub async fn confirm_reserved(&self, items: Vec<Reserved>) -> Vec<Result<(), OrderError>> {
        together_or_each(
            &items,
            BatchMetrics {
                size: "flashsale_stock_reserved_batch_size",
                fallbacks: "flashsale_stock_reserved_batch_fallbacks_total",
            },
            |all| self.confirm_reserved_together(all),
            |r| {
                inbox::with_attempt(
                    r.attempt,
                    self.on_stock_reserved(&r.consumer, &r.env, &r.order_id),
                )
                .instrument(trace::on_behalf_of(&r.trace))
            },
        )
        .await
    }

    /// The common case in one transaction; `Ok(false)` (nothing committed) when some delivery
    /// needs the one-by-one path.
    async fn confirm_reserved_together(&self, items: &[Reserved]) -> Result<bool, OrderError> {
        let Some(consumer) = items.first().map(|r| r.consumer.as_str()) else {
            return Ok(true);
        };
        let mut message_ids = Vec::with_capacity(items.len());
        let mut order_ids = Vec::with_capacity(items.len());
        for r in items {
            if r.consumer != consumer {
                return Ok(false);
            }
            let (Ok(m), Ok(o)) = (
                inbox::Claim::of(&r.env, r.attempt, &r.trace),
                parse_order_id(&r.order_id),
            ) else {
                return Ok(false);
            };
            message_ids.push(m);
            order_ids.push(o);
        }
        let n = items.len();
        let deadline = self.payment_deadline();
        let txn = self.db.begin().await?;
        if inbox::claim_many(&txn, consumer, &message_ids).await? != n {
            return Ok(false);
        }
        let moved = db::await_payment_many(&txn, &order_ids, deadline, "stock.reserved").await?;
        if moved.len() != n {
            return Ok(false);
        }
        // The orders share the deadline: one delayed timer for those of the batch whose trace
        // is not recorded, caused by the first of them, and one of its own for each order whose
        // trace is (sampled), so that its timeout and cancellation stay in its trace. The
        // deadline sweeper stands behind every timer.
        let (traced, shared): (Vec<&Reserved>, Vec<&Reserved>) =
            items.iter().partition(|r| trace::is_sampled(&r.trace));
        let mut timers: Vec<_> = traced
            .into_iter()
            .map(|r| {
                let timer = payment_timer(&r.env, deadline, r.order_id.clone(), Vec::new());
                (timer, r.trace.clone())
            })
            .collect();
        if let Some((first, rest)) = shared.split_first() {
            let more = rest.iter().map(|r| r.order_id.clone()).collect();
            let timer = payment_timer(&first.env, deadline, first.order_id.clone(), more);
            timers.push((timer, first.trace.clone()));
        }
        outbox::enqueue_many_traced(&txn, &timers, Some(&self.payment_timeout)).await?;
        self.failpoint(super::saga::FP_RESERVED_BEFORE_COMMIT)
            .await?;
        txn.commit().await?;
        super::saga::reached("confirmed", moved.iter().map(|m| m.created_at));
        Ok(true)
    }
}
