//! `order.created` in batches: under load the consumer holds many deliveries at once, and each
//! one's own transaction would take the product's hot stock row, write and commit alone — the
//! naive design's bottleneck, moved behind the queue. Deliveries waiting at the same moment are
//! persisted together instead: one transaction claims every inbox row, inserts every
//! reservation, ledger row and `stock.reserved`, moves each product's stock once by the sum,
//! marks the holds persisted in the gate and commits once.
//!
//! Only the common case is batched: new messages for new orders of known products that the
//! database has units for. Anything else in a batch (a redelivery, a tombstone, an unknown
//! product, too few units, any error) rolls the batch back and every message of it runs
//! through [`StockSaga::on_order_created`] on its own, which handles all the cases.

use std::collections::BTreeMap;

use flashsale_messaging::{inbox, outbox, trace};
use flashsale_platform::batch::{BatchMetrics, Batcher, together_or_each};
use flashsale_proto::events::v1::{Envelope, OrderCreated};
use sea_orm::TransactionTrait as _;
use tracing::Instrument as _;
use uuid::Uuid;

use super::{
    StockSaga, failpoint, gate_err,
    saga::{parse_event_fields, reserved_event},
};
use crate::{
    domain::{Reservation, Sku, StockError},
    infra::{db, gate::At},
};

/// One `order.created` delivery waiting for its batch.
#[derive(Clone, Debug)]
pub struct Created {
    pub consumer: String,
    pub env: Envelope,
    pub ev: OrderCreated,
    /// The delivery's trace context, so its `stock.reserved` continues the order's trace.
    pub trace: outbox::TraceHeaders,
    /// The delivery's attempt (1 = the first), for the inbox.
    pub attempt: u32,
}

/// How long a batch waits for more deliveries once the first arrived: a few milliseconds more
/// on a saga step no buyer waits for, in exchange for fewer, larger transactions while a burst
/// of orders (and the CreateOrders behind it) competes for the same CPU.
pub const GATHER: std::time::Duration = std::time::Duration::from_millis(20);

/// Most deliveries persisted in one transaction.
pub const MAX_BATCH: usize = 128;

/// The batching worker of `order.created`; cheap to clone. It holds a clone of the saga's
/// handle until its last handle is dropped (when the consumer stops).
pub type CreatedBatcher = Batcher<Created, Result<(), StockError>>;

/// Batches applied at once by one replica. One: the next batch forms while it commits, and
/// as large batches as the consumer's prefetch allows cost PostgreSQL the least per event. A
/// second batch in flight does not speed the saga up; it only adds transactions competing
/// with the buyers for the cores (docs/benchmarks.md). Several replicas each apply their own
/// (docs/architecture.md#batchers).
const SAGA_BATCHES_IN_FLIGHT: usize = 1;

/// Starts the worker: one batch at a time (`SAGA_BATCHES_IN_FLIGHT`), each of at most
/// `max_batch` deliveries (at most [`MAX_BATCH`]). Size batches to what the consumer can hold: with a
/// prefetch of P, `P / 2`, so the next batch can fill while one is applied — a batch that
/// cannot fill up would wait the whole [`GATHER`] every time.
pub fn created_batcher(saga: StockSaga, max_batch: usize) -> CreatedBatcher {
    Batcher::serving(
        "stock_order_created",
        max_batch.clamp(1, MAX_BATCH),
        GATHER,
        SAGA_BATCHES_IN_FLIGHT,
        saga,
        |saga, items| async move { saga.persist_created(items).await },
    )
}

impl StockSaga {
    /// Persists a batch of `order.created`; one answer per delivery, in order.
    pub async fn persist_created(&self, items: Vec<Created>) -> Vec<Result<(), StockError>> {
        together_or_each(
            &items,
            BatchMetrics {
                size: "flashsale_order_created_batch_size",
                fallbacks: "flashsale_order_created_batch_fallbacks_total",
            },
            |all| self.persist_created_together(all),
            |c| {
                inbox::with_attempt(c.attempt, self.on_order_created(&c.consumer, &c.env, &c.ev))
                    .instrument(trace::on_behalf_of(&c.trace))
            },
        )
        .await
    }

    /// The common case in one transaction; `Ok(false)` (nothing committed) when some delivery
    /// needs the one-by-one path.
    async fn persist_created_together(&self, items: &[Created]) -> Result<bool, StockError> {
        let Some(consumer) = items.first().map(|c| c.consumer.as_str()) else {
            return Ok(true);
        };
        let mut message_ids = Vec::with_capacity(items.len());
        let mut rows = Vec::with_capacity(items.len());
        let mut buckets = Vec::with_capacity(items.len());
        // Per product: (on_hand delta, reserved delta), in a fixed order so concurrent batches
        // take the stock rows in the same order.
        let mut moves: BTreeMap<Sku, (i64, i64)> = BTreeMap::new();
        for c in items {
            if c.consumer != consumer {
                return Ok(false);
            }
            let Ok(message_id) = inbox::Claim::of(&c.env, c.attempt, &c.trace) else {
                return Ok(false);
            };
            let Ok((order_id, sku)) = parse_event_fields(&c.ev.order_id, &c.ev.sku, c.ev.quantity)
            else {
                return Ok(false);
            };
            let (policy, bucket) = match self.terms.get(&sku).await {
                Ok(t) => (t.policy, t.bucket_of(&c.ev.user_id)),
                Err(StockError::UnknownProduct(_)) => return Ok(false),
                Err(e) => return Err(e),
            };
            buckets.push(bucket);
            let row = Reservation::taken(order_id, sku, &c.ev.user_id, c.ev.quantity, policy);
            let (on_hand, reserved, _) = row.taking();
            let m = moves.entry(row.sku.clone()).or_insert((0, 0));
            m.0 += on_hand;
            m.1 += reserved;
            message_ids.push(message_id);
            rows.push(row);
        }
        let n = items.len();
        let txn = self.db.begin().await?;
        if inbox::claim_many(&txn, consumer, &message_ids).await? != n {
            return Ok(false);
        }
        // The rows first (as one by one): a tombstone or an earlier reservation of any order
        // shows as a conflict, and nothing of the batch is kept.
        if db::insert_reservations(&txn, &rows, "order.created").await? != n {
            return Ok(false);
        }
        for kind in ["RESERVE", "COMMIT"] {
            let of_kind: Vec<(&Sku, i64, i64, &str)> = rows
                .iter()
                .zip(items)
                .filter_map(|(r, c)| {
                    let (on_hand, reserved, k) = r.taking();
                    (k == kind).then_some((&r.sku, on_hand, reserved, c.ev.order_id.as_str()))
                })
                .collect();
            db::ledger_many(&txn, kind, &of_kind).await?;
        }
        let events: Vec<(Envelope, outbox::TraceHeaders)> = rows
            .iter()
            .zip(items)
            .map(|(r, c)| (reserved_event(&c.env, &c.ev.order_id, r), c.trace.clone()))
            .collect();
        outbox::enqueue_many_traced(&txn, &events, None).await?;
        // The hot rows last, so their locks are held only for the gate marks and the commit.
        for (sku, (on_hand, reserved)) in &moves {
            if !db::move_stock(&txn, sku, *on_hand, *reserved).await? {
                return Ok(false);
            }
        }
        // Gate changes that follow the database happen before the commit (as one by one), in
        // one pipeline: one round trip while the hot rows are locked, not one per order.
        let marks: Vec<(At<'_>, Uuid)> = rows
            .iter()
            .zip(&buckets)
            .map(|(r, b)| (At::new(r.sku.as_str(), *b), r.order_id))
            .collect();
        for mark in self
            .gate
            .mark_persisted_many_at(&marks)
            .await
            .map_err(gate_err)?
        {
            mark.map_err(gate_err)?;
        }
        failpoint(&self.failpoints, "stock.order_created.before_commit").await?;
        txn.commit().await?;
        Ok(true)
    }
}
