//! The intake's write path: accepted orders written PENDING with their `order.created`, many
//! per transaction (one commit for a batch), each on its own when the batch fails, and none
//! past its caller's deadline.

use std::time::Duration;

use flashsale_messaging::{envelope, outbox};
use flashsale_platform::{
    batch::{Batcher, EACH_CONCURRENCY},
    failpoint::Failpoints,
};
use flashsale_proto::events::v1::{OrderCreated, envelope::Payload};
use futures_util::StreamExt as _;
use sea_orm::{ConnectionTrait as _, DatabaseConnection, TransactionTrait as _};
use tokio::time::Instant;

use crate::{
    app::PRODUCER,
    domain::{Order, OrderError, PlaceOrder, Policy, Status, order_total},
    infra::db::{self, Inserted},
};

/// Transactions of accepted orders this replica writes at once. One: the CreateOrders that
/// arrive while it commits form the next, larger batch, and larger batches cost PostgreSQL
/// less per order (fewer commits, and no two transactions contending for the same index
/// pages; docs/benchmarks.md). Several replicas each write their own.
const WRITE_BATCHES_IN_FLIGHT: usize = 1;

/// Writes a PENDING order and its `order.created` in one transaction (what CreateOrder does once
/// the gate granted the units; public for the benchmark's raw-insert ceiling).
pub async fn write_pending(
    db: &sea_orm::DatabaseConnection,
    p: &PlaceOrder,
    unit_price_cents: i64,
    policy: Policy,
) -> Result<Inserted, OrderError> {
    let order_id = p.order_id();
    let txn = db.begin().await?;
    let inserted = db::insert_order(&txn, order_id, p, unit_price_cents, policy).await?;
    if matches!(inserted, Inserted::New) {
        let ev = OrderCreated {
            order_id: order_id.to_string(),
            user_id: p.user_id.clone(),
            sku: p.sku.clone(),
            quantity: p.quantity,
            unit_price_cents,
            total_cents: order_total(unit_price_cents, p.quantity)?,
            deduction_policy: policy.as_proto(),
        };
        let env = envelope::new(
            Payload::OrderCreated(ev),
            order_id.to_string(),
            "",
            PRODUCER,
        );
        outbox::enqueue(&txn, &env).await?;
    }
    txn.commit().await?;
    Ok(inserted)
}

/// One CreateOrder waiting to be written by [`write_pending_batch`].
#[derive(Clone, Debug)]
pub struct PendingWrite {
    pub place: PlaceOrder,
    pub unit_price_cents: i64,
    pub policy: Policy,
    /// When the stock gate accepted it, by the gate's clock (`None`: not known; the report
    /// then counts the order's creation).
    pub accepted_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// What [`write_pending_batch`] did with one write.
#[derive(Clone, Debug)]
pub struct Written {
    pub inserted: Inserted,
    /// The new order as written (for `Inserted::New`), so the caller need not read it back.
    pub order: Option<Order>,
}

/// Writes many PENDING orders, their history and their `order.created` events in one statement
/// (one round trip, one commit — one WAL flush — for the whole batch). Answers per write, in
/// order: the first write of an id that was inserted is the new order; a repeat of it, or a
/// write whose order already existed, is the same order; a write whose (user, request) key
/// belongs to another order is `KeyTaken`.
pub async fn write_pending_batch(
    db: &sea_orm::DatabaseConnection,
    writes: Vec<PendingWrite>,
) -> Result<Vec<Written>, OrderError> {
    write_pending_batch_with(db, writes, &Failpoints::default()).await
}

/// Failpoint reached after a write batch committed, before the orders it skipped are read back.
pub const FP_AFTER_BATCH_WRITE: &str = "order.create.after_batch_write";

/// [`write_pending_batch`] with failpoints ([`FP_AFTER_BATCH_WRITE`]).
pub async fn write_pending_batch_with(
    db: &sea_orm::DatabaseConnection,
    writes: Vec<PendingWrite>,
    failpoints: &Failpoints,
) -> Result<Vec<Written>, OrderError> {
    let traces = vec![outbox::current_trace(); writes.len()];
    write_batch(db, &writes, &traces, None, failpoints).await
}

/// Counter: write batches the database refused as a whole, written again one order at a time.
pub const WRITE_FALLBACKS: &str = "flashsale_order_write_batch_fallbacks_total";

/// [`write_pending_batch_with`]; when the batch fails, each write again in a statement (and a
/// transaction) of its own, at most [`EACH_CONCURRENCY`] at a time, so a write the database
/// refuses fails alone and never the orders batched with it. One answer per write, in order.
/// A failed batch wrote nothing; should its commit have landed unseen, the writes on their own
/// find their orders and answer them as the same order.
pub async fn write_pending_batch_or_each(
    db: &sea_orm::DatabaseConnection,
    writes: Vec<PendingWrite>,
    failpoints: &Failpoints,
) -> Vec<Result<Written, OrderError>> {
    let deadlines = vec![None; writes.len()];
    let traces = vec![outbox::current_trace(); writes.len()];
    write_batch_or_each(db, writes, traces, deadlines, failpoints).await
}

/// The intake's write queue: accepted orders gathered into write batches ([`write_queued`]),
/// [`WRITE_BATCHES_IN_FLIGHT`] at once, each batch one transaction and one commit.
pub(super) fn write_queue(
    db: DatabaseConnection,
    failpoints: Failpoints,
) -> Batcher<QueuedWrite, Result<Written, OrderError>> {
    Batcher::serving(
        "order_write",
        128,
        Duration::ZERO,
        WRITE_BATCHES_IN_FLIGHT,
        (db, failpoints),
        |(db, failpoints), queued| async move { write_queued(&db, queued, &failpoints).await },
    )
}

/// One CreateOrder in the intake's write queue: its write, the instant past which it must
/// not be written (its caller may have given up by then), and the CreateOrder's trace context,
/// which its `order.created` carries.
#[derive(Clone, Debug)]
pub(super) struct QueuedWrite {
    pub(super) write: PendingWrite,
    pub(super) deadline: Instant,
    pub(super) trace: outbox::TraceHeaders,
}

/// Counter: order writes dropped at their deadline, their holds kept for the buyers' retries;
/// label `stage`: `queued` (its batch began past the deadline, or within [`WRITE_MIN_LEFT`] of
/// it: no statement was sent for it) or `running` (the database cancelled it, or it was rolled
/// back, at the deadline).
pub const WRITES_EXPIRED: &str = "flashsale_order_writes_expired_total";

/// Least time a write must have left when its batch begins to be begun at all. One with less
/// would most likely reach its deadline under way, and since a batch is cut at its earliest
/// write's deadline, fail the writes beside it into one-by-one writes; it is dropped instead.
const WRITE_MIN_LEFT: Duration = Duration::from_millis(20);

/// The intake's batch: writes whose deadline has passed (or nearly, [`WRITE_MIN_LEFT`]) are
/// answered [`OrderError::WriteExpired`] at once and never begun; the others go to
/// [`write_batch_or_each`] under their deadlines.
async fn write_queued(
    db: &sea_orm::DatabaseConnection,
    queued: Vec<QueuedWrite>,
    failpoints: &Failpoints,
) -> Vec<Result<Written, OrderError>> {
    let cutoff = Instant::now() + WRITE_MIN_LEFT;
    let mut answers: Vec<Option<Result<Written, OrderError>>> = Vec::with_capacity(queued.len());
    let (mut writes, mut deadlines, mut slots) = (Vec::new(), Vec::new(), Vec::new());
    let mut traces = Vec::new();
    let mut dropped = Vec::new();
    for (i, q) in queued.into_iter().enumerate() {
        if q.deadline <= cutoff {
            dropped.push(q.write.place.order_id());
            answers.push(Some(Err(OrderError::WriteExpired)));
        } else {
            answers.push(None);
            slots.push(i);
            deadlines.push(Some(q.deadline));
            writes.push(q.write);
            traces.push(q.trace);
        }
    }
    expired("queued", &dropped);
    if !writes.is_empty() {
        let ids: Vec<uuid::Uuid> = writes.iter().map(|w| w.place.order_id()).collect();
        let written = write_batch_or_each(db, writes, traces, deadlines, failpoints).await;
        let mut cut = Vec::new();
        for ((i, id), w) in slots.into_iter().zip(ids).zip(written) {
            if matches!(w, Err(OrderError::WriteExpired)) {
                cut.push(id);
            }
            answers[i] = Some(w);
        }
        expired("running", &cut);
    }
    answers
        .into_iter()
        .map(|a| {
            a.unwrap_or_else(|| {
                Err(OrderError::Internal(anyhow::anyhow!(
                    "a write got no answer"
                )))
            })
        })
        .collect()
}

/// Counts and logs the writes of one batch dropped at their deadline at `stage`.
fn expired(stage: &'static str, orders: &[uuid::Uuid]) {
    let Some(first) = orders.first() else {
        return;
    };
    metrics::counter!(WRITES_EXPIRED, "stage" => stage).increment(orders.len() as u64);
    tracing::warn!(
        stage,
        count = orders.len(),
        %first,
        "order writes dropped at their deadline, nothing of them written; their holds are kept for the retries"
    );
}

/// [`write_pending_batch_or_each`] with a deadline per write (`None`: none): the batch is
/// written by the earliest of them, each write on its own by its own.
async fn write_batch_or_each(
    db: &sea_orm::DatabaseConnection,
    writes: Vec<PendingWrite>,
    traces: Vec<outbox::TraceHeaders>,
    deadlines: Vec<Option<Instant>>,
    failpoints: &Failpoints,
) -> Vec<Result<Written, OrderError>> {
    if writes.len() > 1 {
        let earliest = deadlines.iter().flatten().min().copied();
        match write_batch(db, &writes, &traces, earliest, failpoints).await {
            Ok(answers) => return answers.into_iter().map(Ok).collect(),
            Err(e) => {
                tracing::warn!(error = %e, size = writes.len(), "write batch failed; writing its orders one by one");
                metrics::counter!(WRITE_FALLBACKS).increment(1);
            }
        }
    }
    futures_util::stream::iter(writes.into_iter().zip(traces).zip(deadlines))
        .map(|((w, trace), deadline)| async move {
            let (w, trace) = (std::slice::from_ref(&w), std::slice::from_ref(&trace));
            let mut answer = write_batch(db, w, trace, deadline, failpoints).await?;
            answer
                .pop()
                .ok_or_else(|| OrderError::Internal(anyhow::anyhow!("a write got no answer")))
        })
        .buffered(EACH_CONCURRENCY)
        .collect()
        .await
}

/// [`db::insert_orders_with_events`] committed before `deadline` or not at all
/// ([`OrderError::WriteExpired`]): in a transaction whose statements the database cancels at
/// the deadline (`statement_timeout` covers the wait for a lock or for a conflicting insert),
/// committed only if the deadline has not passed once the insert is done. Only the `COMMIT`'s
/// own flight and flush can land past the deadline: milliseconds.
async fn insert_before(
    db: &sea_orm::DatabaseConnection,
    deadline: Instant,
    rows: &[db::NewOrderRow<'_>],
    event_orders: &[uuid::Uuid],
    columns: outbox::EventColumns,
) -> Result<Vec<(uuid::Uuid, chrono::DateTime<chrono::Utc>)>, OrderError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(OrderError::WriteExpired);
    }
    // Rounded up: the database's timer starts once the statement arrives, so it never fires
    // before the deadline, and a statement cancelled past the deadline was cancelled by it.
    let ms = left.as_micros().div_ceil(1000);
    let txn = db.begin().await?;
    let inserted = async {
        txn.execute_unprepared(&format!("SET LOCAL statement_timeout = {ms}"))
            .await?;
        db::insert_orders_with_events(&txn, rows, event_orders, columns).await
    }
    .await;
    let late = Instant::now() >= deadline;
    match inserted {
        Ok(inserted) if !late => {
            txn.commit().await?;
            Ok(inserted)
        }
        Ok(_) => {
            roll_back(txn).await;
            Err(OrderError::WriteExpired)
        }
        Err(e) => {
            roll_back(txn).await;
            Err(if late { OrderError::WriteExpired } else { e })
        }
    }
}

/// Rolls a failed write's transaction back now, rather than when its pooled connection is next
/// used (a connection that cannot roll back is closed, which rolls it back as well).
async fn roll_back(txn: sea_orm::DatabaseTransaction) {
    if let Err(e) = txn.rollback().await {
        tracing::debug!(error = %e, "could not roll back an order write that failed");
    }
}

/// `traces[i]` is the trace context `writes[i]`'s event carries.
async fn write_batch(
    db: &sea_orm::DatabaseConnection,
    writes: &[PendingWrite],
    traces: &[outbox::TraceHeaders],
    deadline: Option<Instant>,
    failpoints: &Failpoints,
) -> Result<Vec<Written>, OrderError> {
    let ids: Vec<uuid::Uuid> = writes.iter().map(|w| w.place.order_id()).collect();
    let rows: Vec<_> = writes
        .iter()
        .zip(&ids)
        .map(|(w, id)| (*id, &w.place, w.unit_price_cents, w.policy, w.accepted_at))
        .collect();
    // One event per distinct order, written only if that order is.
    let mut seen = std::collections::HashSet::new();
    let (mut event_orders, mut events) = (Vec::new(), Vec::new());
    let no_trace = outbox::TraceHeaders::new();
    let traces = traces.iter().chain(std::iter::repeat(&no_trace));
    for ((w, id), trace) in writes.iter().zip(&ids).zip(traces) {
        if !seen.insert(*id) {
            continue;
        }
        let p = &w.place;
        let ev = OrderCreated {
            order_id: id.to_string(),
            user_id: p.user_id.clone(),
            sku: p.sku.clone(),
            quantity: p.quantity,
            unit_price_cents: w.unit_price_cents,
            total_cents: order_total(w.unit_price_cents, p.quantity)?,
            deduction_policy: w.policy.as_proto(),
        };
        event_orders.push(*id);
        let env = envelope::new(Payload::OrderCreated(ev), id.to_string(), "", PRODUCER);
        events.push((env, trace));
    }
    let columns = outbox::EventColumns::of(events)?;
    let inserted = match deadline {
        Some(deadline) => insert_before(db, deadline, &rows, &event_orders, columns).await?,
        None => db::insert_orders_with_events(db, &rows, &event_orders, columns).await?,
    };
    let mut inserted: std::collections::HashMap<uuid::Uuid, chrono::DateTime<chrono::Utc>> =
        inserted.into_iter().collect();
    let mut answers = Vec::with_capacity(writes.len());
    let mut missing = Vec::new();
    for (i, (w, id)) in writes.iter().zip(&ids).enumerate() {
        if let Some(created_at) = inserted.remove(id) {
            let p = &w.place;
            answers.push(Some(Written {
                inserted: Inserted::New,
                order: Some(Order {
                    order_id: *id,
                    user_id: p.user_id.clone(),
                    request_id: p.request_id.clone(),
                    sku: p.sku.clone(),
                    quantity: p.quantity,
                    unit_price_cents: w.unit_price_cents,
                    total_cents: order_total(w.unit_price_cents, p.quantity)?,
                    policy: w.policy,
                    status: Status::Pending,
                    cancel_reason: None,
                    payment_deadline: None,
                    payment_id: None,
                    refund: None,
                    created_at,
                    updated_at: created_at,
                }),
            }));
        } else {
            missing.push(i);
            answers.push(None);
        }
    }
    if !missing.is_empty() {
        // Committed by whoever wrote them (ON CONFLICT waited for them), so visible now. The
        // batch itself is committed already: should this read fail, the new orders are still
        // answered as new, and only the skipped ones are unknown.
        let probe: Vec<uuid::Uuid> = missing.iter().map(|&i| ids[i]).collect();
        let read_back = async {
            failpoints
                .hit(FP_AFTER_BATCH_WRITE)
                .await
                .map_err(|e| OrderError::Internal(anyhow::Error::new(e)))?;
            db::orders(db, &probe).await
        };
        match read_back.await {
            Ok(found) => {
                for (&i, f) in missing.iter().zip(found) {
                    let inserted = if f.is_some() {
                        Inserted::SameOrder
                    } else {
                        Inserted::KeyTaken
                    };
                    answers[i] = Some(Written {
                        inserted,
                        order: None,
                    });
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, skipped = missing.len(), "could not read back the orders a write batch skipped");
                for &i in &missing {
                    answers[i] = Some(Written {
                        inserted: Inserted::Unknown,
                        order: None,
                    });
                }
            }
        }
    }
    Ok(answers
        .into_iter()
        .map(|a| {
            a.unwrap_or(Written {
                inserted: Inserted::KeyTaken,
                order: None,
            })
        })
        .collect())
}
