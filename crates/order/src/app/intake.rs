//! CreateOrder: the sold-out short-circuit, the stock gate, then one transaction writing the
//! order PENDING with `order.created` (docs/adr/0002-order-written-before-the-reply.md).

use std::{collections::HashSet, sync::Arc, time::Duration};

use flashsale_messaging::{envelope, outbox};
use flashsale_platform::{
    batch::{Batcher, EACH_CONCURRENCY},
    failpoint::Failpoints,
    pressure::{Foreground, Yield},
};
use flashsale_proto::events::v1::{OrderCreated, envelope::Payload};
use futures_util::StreamExt as _;
use sea_orm::{ConnectionTrait as _, DatabaseConnection, TransactionTrait as _};
use tokio::time::Instant;

use super::{PRODUCER, SoldOutCache, Verdict};
use crate::{
    config::SagaSettings,
    domain::{CancelReason, Order, OrderError, PlaceOrder, Policy, Refusal, Status, order_total},
    infra::{
        db::{self, Inserted},
        stock::{Granted, RESERVATION_RELEASED, StockPort},
    },
};

/// The message of a refusal from the sold-out memory (the reason is `SOLD_OUT`, as from the
/// gate): tells an operator reading a gateway's log where the answer came from.
pub const SOLD_OUT_REMEMBERED: &str = "sold out (remembered by this replica)";

/// Transactions of accepted orders this replica writes at once. One: the CreateOrders that
/// arrive while it commits form the next, larger batch, and larger batches cost PostgreSQL
/// less per order (fewer commits, and no two transactions contending for the same index
/// pages). Measured on a big sale (six alternating pairs of runs), one batch in flight took
/// 0.050–0.068 ms of PostgreSQL CPU per accepted order against 0.062–0.092 ms for two and
/// accepted ~12% more orders per second; four and eight were worse still. Several replicas
/// each write their own.
const WRITE_BATCHES_IN_FLIGHT: usize = 1;

/// CreateOrder: the sold-out memory, the gate and the batched write of accepted orders
/// (docs/architecture.md#batchers). Cheap to clone.
#[derive(Clone)]
pub struct Intake {
    db: DatabaseConnection,
    stock: Arc<dyn StockPort>,
    max_quantity: i64,
    sold_out: SoldOutCache,
    /// Writes accepted orders, many per transaction (one commit for a batch), each on its own
    /// when the batch fails; none past its deadline.
    writes: Batcher<QueuedWrite, Result<Written, OrderError>>,
    /// Longest an order's write may take from the call's arrival (`saga.intake_write_deadline_ms`,
    /// no longer than the server's request deadline).
    write_deadline: Duration,
    failpoints: Failpoints,
    /// Marked whenever the gate grants units: the outbox relay waits while orders pour in
    /// (docs/adr/0004-intake-first-relay.md).
    intake: Foreground,
    quiet: Duration,
    max_lag: Duration,
}

impl Intake {
    pub fn new(
        db: DatabaseConnection,
        stock: Arc<dyn StockPort>,
        settings: &SagaSettings,
        failpoints: Failpoints,
    ) -> Self {
        let writes = {
            let (db, failpoints) = (db.clone(), failpoints.clone());
            Batcher::spawn(
                "order_write",
                128,
                Duration::ZERO,
                WRITE_BATCHES_IN_FLIGHT,
                move |w| {
                    let (db, failpoints) = (db.clone(), failpoints.clone());
                    async move {
                        Ok::<_, std::convert::Infallible>(write_queued(&db, w, &failpoints).await)
                    }
                },
            )
        };
        Self {
            db,
            stock,
            max_quantity: settings.max_quantity,
            sold_out: SoldOutCache::new(Duration::from_millis(settings.sold_out_cache_ms)),
            writes,
            write_deadline: Duration::from_millis(settings.intake_write_deadline_ms),
            failpoints,
            intake: Foreground::new(),
            quiet: Duration::from_millis(settings.intake_quiet_ms),
            max_lag: Duration::from_millis(settings.intake_max_lag_ms),
        }
    }

    /// Bounds every order write by the server's deadline of a request (`grpc.request_timeout_ms`)
    /// too: past it the server has dropped the call unanswered, so its order must not be
    /// written any more.
    #[must_use]
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.write_deadline = self.write_deadline.min(timeout);
        self
    }

    /// Most units one CreateOrder may ask for.
    pub fn max_quantity(&self) -> i64 {
        self.max_quantity
    }

    /// How the outbox relay gives way to this replica's intake (`None`: it never waits).
    pub fn relay_yield(&self) -> Option<Yield> {
        (!self.quiet.is_zero()).then(|| Yield {
            foreground: self.intake.clone(),
            quiet: self.quiet,
            max_lag: self.max_lag,
        })
    }

    /// This replica's sold-out memory (the broadcast listener forgets products whose units
    /// came back; docs/adr/0005-sold-out-memory.md).
    pub fn sold_out(&self) -> &SoldOutCache {
        &self.sold_out
    }

    /// Places an order; `(order, replayed)`. Refusals write nothing. The order's write is
    /// bounded by `saga.intake_write_deadline_ms` from now ([`Self::place_by`]).
    pub async fn place(&self, p: PlaceOrder) -> Result<(Order, bool), OrderError> {
        self.place_by(p, None).await
    }

    /// [`Self::place`] for a call whose caller gives up at `deadline`: its order is written by
    /// then (and by `saga.intake_write_deadline_ms` from now) or never. A write that missed its
    /// deadline keeps the gate's hold and answers `DatabaseUnavailable`, as a write the
    /// database gave up for a passing reason: the buyer's retry writes it under that hold, and
    /// product-stock's hold sweeper, asking only after `stock.hold_ttl_ms` (longer than any
    /// write deadline), finds it written or never to be written.
    #[tracing::instrument(skip_all, fields(user = %p.user_id, sku = %p.sku))]
    pub async fn place_by(
        &self,
        p: PlaceOrder,
        deadline: Option<Instant>,
    ) -> Result<(Order, bool), OrderError> {
        let latest = Instant::now() + self.write_deadline;
        let deadline = deadline.map_or(latest, |d| d.min(latest));
        if self.sold_out.verdict(&p.sku, &p.user_id) == Verdict::Refuse {
            // Sold out, and this user has no order that this could be a replay of.
            metrics::counter!("flashsale_orders_refused_total", "reason" => "SOLD_OUT_CACHED")
                .increment(1);
            return Err(OrderError::Refused(
                Refusal::SoldOut,
                SOLD_OUT_REMEMBERED.into(),
            ));
        }
        // Derived (a SHA-1 over the request) only past the refusal from memory.
        let order_id = p.order_id();
        let granted = match self
            .stock
            .reserve(order_id, &p.user_id, &p.sku, p.quantity)
            .await
        {
            Ok(g) => g,
            Err(OrderError::Refused(refusal, message)) => {
                if refusal == Refusal::SoldOut {
                    self.remember_sold_out(&p.sku);
                }
                // A replay of a request whose order the gate has forgotten (its record
                // expired: a week after a live order, minutes after a cancelled one) is judged
                // afresh and may be refused; the database still answers it. Asked only for a
                // buyer the sold-out memory does not already know to have no order here.
                if self.sold_out.verdict(&p.sku, &p.user_id) != Verdict::Refuse
                    && let Some(existing) = db::order(&self.db, order_id, false).await?
                {
                    return Ok((existing, true));
                }
                metrics::counter!("flashsale_orders_refused_total", "reason" => refusal.reason())
                    .increment(1);
                return Err(OrderError::Refused(refusal, message));
            }
            Err(OrderError::ReservationReleased(message)) => {
                if let Some(existing) = db::order(&self.db, order_id, false).await? {
                    return Ok((existing, true));
                }
                metrics::counter!("flashsale_orders_refused_total", "reason" => RESERVATION_RELEASED)
                    .increment(1);
                return Err(OrderError::ReservationReleased(message));
            }
            Err(e) => return Err(e),
        };
        self.intake.mark();
        match self.persist(&p, order_id, &granted, deadline).await {
            Ok(Written {
                inserted: Inserted::New,
                order,
            }) => {
                metrics::counter!("flashsale_orders_accepted_total").increment(1);
                let order = match order {
                    Some(o) => o,
                    None => super::load(&self.db, order_id).await?,
                };
                Ok((order, false))
            }
            Ok(Written {
                inserted: Inserted::SameOrder,
                ..
            }) => {
                let order = super::load(&self.db, order_id).await?;
                // A replay of a cancelled order's request after the gate forgot the order
                // (product-stock's `stock.released_record_ttl_ms`): the gate took units again
                // for it. The database answers the replay; the units go back now.
                if !granted.replayed && order.status == Status::Cancelled {
                    self.release_hold(&p, order_id).await;
                }
                Ok((order, true))
            }
            Ok(Written {
                inserted: Inserted::KeyTaken,
                ..
            }) => {
                self.release_hold(&p, order_id).await;
                Err(OrderError::IdempotencyKeyReused("request_id"))
            }
            // Whether it was written is unknown: release nothing (a hold nobody wrote is freed
            // by product-stock's hold sweeper); the buyer's retry with the same request id
            // gets the order or the refusal.
            Ok(Written {
                inserted: Inserted::Unknown,
                ..
            }) => Err(OrderError::Unavailable(
                "the order could not be confirmed; retry with the same request_id".into(),
            )),
            // The database dropped the connection or could not be reached, or gave the write
            // up for a passing reason (a cancelled statement, a lock timeout, a deadlock, a
            // serialization failure, a full disk: see `persist`): the write may have committed
            // unseen, or will succeed when tried again, and the buyer retries with the same
            // request id, which the gate answers with this very grant. Releasing the hold now
            // would race that retry (the retry's order written, then its units released under
            // it), so the hold is kept for the retry; a hold nobody writes is freed by
            // product-stock's hold sweeper, which first asks whether the order exists.
            // So is a write dropped at its deadline (nothing of it was written, nor ever will be).
            Err(e @ (OrderError::DatabaseUnavailable(_) | OrderError::WriteExpired)) => Err(e),
            Err(e) => {
                // Nothing of this batch was written. A replayed grant's units belong to an
                // order that may exist from the first request: never release those.
                if !granted.replayed {
                    self.release_hold(&p, order_id).await;
                }
                Err(e)
            }
        }
    }

    async fn persist(
        &self,
        p: &PlaceOrder,
        order_id: uuid::Uuid,
        g: &Granted,
        deadline: Instant,
    ) -> Result<Written, OrderError> {
        self.failpoints
            .hit("order.create.before_write")
            .await
            .map_err(|e| OrderError::Internal(anyhow::Error::new(e)))?;
        debug_assert_eq!(order_id, p.order_id());
        order_total(g.unit_price_cents, p.quantity)?;
        let write = QueuedWrite {
            write: PendingWrite {
                place: p.clone(),
                unit_price_cents: g.unit_price_cents,
                policy: g.policy,
            },
            deadline,
        };
        self.writes
            .call(write)
            .await
            .map_err(|e| OrderError::Internal(anyhow::Error::new(e)))?
            .map_err(|e| match db::passing_failure(&e) {
                Some(sqlstate) => {
                    tracing::warn!(error = %e, sqlstate, %order_id, "the order write failed for a passing reason; the hold is kept for the retry");
                    OrderError::DatabaseUnavailable(
                        "the order could not be written now; retry with the same request_id"
                            .into(),
                    )
                }
                None => e,
            })
    }

    /// The gate took units for an order that will not be written: give them back now through
    /// an `order.cancelled` (product-stock releases a hold it never persisted and leaves a
    /// tombstone). Should even that fail, product-stock's hold sweeper releases it later.
    async fn release_hold(&self, p: &PlaceOrder, order_id: uuid::Uuid) {
        let ghost = Order {
            order_id,
            user_id: p.user_id.clone(),
            request_id: p.request_id.clone(),
            sku: p.sku.clone(),
            quantity: p.quantity,
            unit_price_cents: 0,
            total_cents: 0,
            policy: Policy::ReserveThenCommit,
            status: Status::Pending,
            cancel_reason: None,
            payment_deadline: None,
            payment_id: None,
            refund: None,
            created_at: chrono::Utc::now(),
            updated_at: chrono::Utc::now(),
        };
        let env =
            super::cancelled_event(&ghost, Status::Pending, CancelReason::UserCancelled, None);
        if let Err(e) = outbox::enqueue(&self.db, &env).await {
            tracing::warn!(error = %e, %order_id, "could not queue the release of an unwritten order's hold; the hold sweeper will release it");
        }
    }

    /// The gate answered SOLD_OUT for `sku`: read who may still be replaying an accepted request
    /// for it, in the background, and refuse everyone else from memory once that is known.
    fn remember_sold_out(&self, sku: &str) {
        let Some(load) = self.sold_out.begin_load(sku) else {
            return;
        };
        let (this, sku, generation) = (self.clone(), sku.to_owned(), load.generation);
        tokio::spawn(async move {
            match this.possible_replayers(&sku, load.previous).await {
                Ok(Some((users, refills))) => {
                    this.sold_out.install(&sku, generation, users, &refills);
                }
                Ok(None) => this.sold_out.abandon(&sku, generation),
                Err(e) => {
                    tracing::warn!(error = %e, %sku, "could not read a sold-out product's buyers; asking the gate meanwhile");
                    this.sold_out.abandon(&sku, generation);
                }
            }
        });
    }

    /// The gate's buyers (read with the counter, so orders still being written anywhere are in)
    /// plus every user with an order here (cancelled ones left the gate's count), with the
    /// gate's refills count; `None` when the product is not sold out after all or has too many
    /// buyers to list. With `previous` (the list that just expired and its refills count) the
    /// gate first checks the count: if no units came back since, `previous` still holds and
    /// nothing else is read.
    async fn possible_replayers(
        &self,
        sku: &str,
        previous: Option<(Arc<HashSet<String>>, String)>,
    ) -> Result<Option<(Arc<HashSet<String>>, String)>, OrderError> {
        let known = previous.as_ref().map_or("", |(_, r)| r.as_str());
        let gate = self.stock.buyers(sku, known).await?;
        if gate.available > 0 {
            return Ok(None);
        }
        if gate.unchanged {
            let Some((list, _)) = previous else {
                return Ok(None);
            };
            metrics::counter!("flashsale_sold_out_list_reads_total", "read" => "kept").increment(1);
            return Ok(Some((list, gate.refills)));
        }
        let Some(users) = gate.users else {
            return Ok(None);
        };
        let mut all = db::users_with_orders(&self.db, sku).await?;
        all.extend(users);
        metrics::counter!("flashsale_sold_out_list_reads_total", "read" => "full").increment(1);
        Ok(Some((Arc::new(all), gate.refills)))
    }
}

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
    write_batch(db, &writes, None, failpoints).await
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
    write_batch_or_each(db, writes, deadlines, failpoints).await
}

/// One CreateOrder in the intake's write queue: its write and the instant past which it must
/// not be written (its caller may have given up by then).
#[derive(Clone, Debug)]
struct QueuedWrite {
    write: PendingWrite,
    deadline: Instant,
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
        }
    }
    expired("queued", &dropped);
    if !writes.is_empty() {
        let ids: Vec<uuid::Uuid> = writes.iter().map(|w| w.place.order_id()).collect();
        let written = write_batch_or_each(db, writes, deadlines, failpoints).await;
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
    deadlines: Vec<Option<Instant>>,
    failpoints: &Failpoints,
) -> Vec<Result<Written, OrderError>> {
    if writes.len() > 1 {
        let earliest = deadlines.iter().flatten().min().copied();
        match write_batch(db, &writes, earliest, failpoints).await {
            Ok(answers) => return answers.into_iter().map(Ok).collect(),
            Err(e) => {
                tracing::warn!(error = %e, size = writes.len(), "write batch failed; writing its orders one by one");
                metrics::counter!(WRITE_FALLBACKS).increment(1);
            }
        }
    }
    futures_util::stream::iter(writes.into_iter().zip(deadlines))
        .map(|(w, deadline)| async move {
            let mut answer =
                write_batch(db, std::slice::from_ref(&w), deadline, failpoints).await?;
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
    rows: &[(uuid::Uuid, &PlaceOrder, i64, Policy)],
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

async fn write_batch(
    db: &sea_orm::DatabaseConnection,
    writes: &[PendingWrite],
    deadline: Option<Instant>,
    failpoints: &Failpoints,
) -> Result<Vec<Written>, OrderError> {
    let ids: Vec<uuid::Uuid> = writes.iter().map(|w| w.place.order_id()).collect();
    let rows: Vec<_> = writes
        .iter()
        .zip(&ids)
        .map(|(w, id)| (*id, &w.place, w.unit_price_cents, w.policy))
        .collect();
    // One event per distinct order, written only if that order is.
    let mut seen = std::collections::HashSet::new();
    let (mut event_orders, mut events) = (Vec::new(), Vec::new());
    for (w, id) in writes.iter().zip(&ids) {
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
        events.push(envelope::new(
            Payload::OrderCreated(ev),
            id.to_string(),
            "",
            PRODUCER,
        ));
    }
    let columns = outbox::EventColumns::of(&events)?;
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
