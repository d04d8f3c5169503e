//! CreateOrder: the sold-out short-circuit, the stock gate, then one transaction writing the
//! order PENDING with `order.created` (docs/adr/0002-order-written-before-the-reply.md).

use std::{collections::HashSet, sync::Arc, time::Duration};

use flashsale_messaging::outbox;
use flashsale_platform::{
    batch::Batcher,
    failpoint::Failpoints,
    pressure::{Foreground, Yield},
};
use sea_orm::DatabaseConnection;
use tokio::time::Instant;

mod writes;

pub use writes::{
    FP_AFTER_BATCH_WRITE, PendingWrite, WRITE_FALLBACKS, WRITES_EXPIRED, Written, write_pending,
    write_pending_batch, write_pending_batch_or_each, write_pending_batch_with,
};
use writes::{QueuedWrite, write_queue};

use super::{
    Admission, GateClock, RefusalTally, SaleWindows, SoldOutCache, Verdict, WindowVerdict,
};
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

/// What ends the message of a refusal by the sale window that came from this replica's memory.
pub const REMEMBERED: &str = "(remembered by this replica)";

/// CreateOrder: the sold-out memory, the gate and the batched write of accepted orders
/// (docs/architecture.md#batchers). Cheap to clone.
#[derive(Clone)]
pub struct Intake {
    db: DatabaseConnection,
    stock: Arc<dyn StockPort>,
    max_quantity: i64,
    sold_out: SoldOutCache,
    /// Refuses products outside their sale window from memory, by the gate's clock.
    windows: SaleWindows,
    /// Every refusal, counted per product, second and reason for the sale report.
    tally: RefusalTally,
    /// Refuses new buyers while the platform's backlog is at its bound (`admission.*`).
    admission: Admission,
    /// Writes accepted orders, many per transaction (one commit for a batch), each on its own
    /// when the batch fails; none past its deadline. Built by [`write_queue`]; each batch is
    /// one `writes::write_queued`.
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

/// A refusal by the sale window that this replica answers from memory.
fn closed(refusal: Refusal, at_ms: i64, gate_ms: i64, source: &str) -> OrderError {
    let at = flashsale_contract::rfc3339_ms(at_ms);
    let message = if refusal == Refusal::SaleEnded {
        format!("the sale ended at {at} {source}")
    } else {
        format!(
            "the sale starts at {at} (in {} ms by the stock gate's clock) {source}",
            at_ms.saturating_sub(gate_ms)
        )
    };
    OrderError::Closed {
        refusal,
        at_ms,
        gate_ms,
        message,
    }
}

impl Intake {
    pub fn new(
        db: DatabaseConnection,
        stock: Arc<dyn StockPort>,
        settings: &SagaSettings,
        admission: Admission,
        failpoints: Failpoints,
    ) -> Self {
        let writes = write_queue(db.clone(), failpoints.clone());
        Self {
            db,
            stock,
            max_quantity: settings.max_quantity,
            sold_out: SoldOutCache::new(Duration::from_millis(settings.sold_out_cache_ms)),
            windows: SaleWindows::new(GateClock::new(failpoints.clone())),
            tally: RefusalTally::default(),
            admission,
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

    /// The refusals counted for the sale report (written by [`RefusalTally::run`]).
    pub fn refusals(&self) -> &RefusalTally {
        &self.tally
    }

    /// Counts a refusal of `sku` now, by the gate's clock as this replica knows it.
    fn count_refusal(&self, sku: &str, reason: &'static str) {
        let clock = self.windows.clock();
        let now = clock.gate_now().map_or_else(|| clock.local_ms(), |(g, _)| g);
        self.tally.count(sku, now, reason);
    }

    /// This replica's sale-window memory (forgotten per product when its window may have
    /// changed; docs/adr/0008-sale-window-on-the-product.md).
    pub fn windows(&self) -> &SaleWindows {
        &self.windows
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
    #[tracing::instrument(target = "flashsale::log_scope", skip_all, fields(user = %p.user_id, sku = %p.sku))]
    pub async fn place_by(
        &self,
        p: PlaceOrder,
        deadline: Option<Instant>,
    ) -> Result<(Order, bool), OrderError> {
        let latest = Instant::now() + self.write_deadline;
        let deadline = deadline.map_or(latest, |d| d.min(latest));
        if let WindowVerdict::Refuse {
            refusal,
            at_ms,
            gate_ms,
        } = self.windows.verdict(&p.sku, &p.user_id)
        {
            // Outside the window by the gate's clock, and this user has no order that this
            // could be a replay of.
            let reason = if refusal == Refusal::SaleEnded {
                "SALE_ENDED_CACHED"
            } else {
                "SALE_NOT_STARTED_CACHED"
            };
            metrics::counter!("flashsale_orders_refused_total", "reason" => reason).increment(1);
            self.count_refusal(&p.sku, refusal.reason());
            return Err(closed(refusal, at_ms, gate_ms, REMEMBERED));
        }
        if self.sold_out.verdict(&p.sku, &p.user_id) == Verdict::Refuse {
            // Sold out, and this user has no order that this could be a replay of.
            metrics::counter!("flashsale_orders_refused_total", "reason" => "SOLD_OUT_CACHED")
                .increment(1);
            self.count_refusal(&p.sku, Refusal::SoldOut.reason());
            return Err(OrderError::Refused(
                Refusal::SoldOut,
                SOLD_OUT_REMEMBERED.into(),
            ));
        }
        // Past capacity a new buyer is refused here, before the gate: nothing is taken or
        // written, and the orders already accepted drain the backlog.
        self.admission.admit()?;
        // Derived (a SHA-1 over the request) only past the refusals from memory.
        let order_id = p.order_id();
        let clock = self.windows.clock();
        let sent_ms = clock.local_ms();
        let answer = self
            .stock
            .reserve(order_id, &p.user_id, &p.sku, p.quantity)
            .await;
        let received_ms = clock.local_ms();
        let granted = match answer {
            Ok(g) => {
                if let Some(gate_ms) = g.gate_ms {
                    clock.observe(gate_ms, sent_ms, received_ms);
                }
                g
            }
            Err(OrderError::Closed {
                refusal,
                at_ms,
                gate_ms,
                message,
            }) => {
                clock.observe(gate_ms, sent_ms, received_ms);
                self.remember_closed(&p.sku, refusal, at_ms);
                // A replay of an accepted request whose record the gate has forgotten.
                if let Some(existing) = db::order(&self.db, order_id, false).await? {
                    return Ok((existing, true));
                }
                metrics::counter!("flashsale_orders_refused_total", "reason" => refusal.reason())
                    .increment(1);
                self.count_refusal(&p.sku, refusal.reason());
                return Err(OrderError::Closed {
                    refusal,
                    at_ms,
                    gate_ms,
                    message,
                });
            }
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
                self.count_refusal(&p.sku, refusal.reason());
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
        let _writing = (!granted.replayed).then(|| self.admission.granted(order_id));
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
                accepted_at: g.gate_ms.and_then(chrono::DateTime::from_timestamp_millis),
            },
            deadline,
            trace: flashsale_messaging::outbox::current_trace(),
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

    /// The gate refused `sku` by its sale window: read who may be replaying an accepted request
    /// for it, in the background, and refuse everyone else from memory once that is known.
    fn remember_closed(&self, sku: &str, refusal: Refusal, at_ms: i64) {
        let Some(generation) = self.windows.begin_load(sku, refusal, at_ms) else {
            return;
        };
        let (this, sku) = (self.clone(), sku.to_owned());
        tokio::spawn(async move {
            match this.window_replayers(&sku).await {
                Ok(Some(users)) => this.windows.install(&sku, generation, users),
                Ok(None) => this.windows.abandon(&sku, generation),
                Err(e) => {
                    tracing::warn!(error = %e, %sku, "could not read the buyers of a product outside its sale window; asking the gate meanwhile");
                    this.windows.abandon(&sku, generation);
                }
            }
        });
    }

    /// The gate's buyers of `sku` and every user with an order for it here; `None` when the
    /// gate has too many to list. Outside the window nobody new can buy, so the list holds.
    async fn window_replayers(&self, sku: &str) -> Result<Option<Arc<HashSet<String>>>, OrderError> {
        let gate = self.stock.buyers(sku, "").await?;
        let Some(users) = gate.users else {
            return Ok(None);
        };
        let mut all = db::users_with_orders(&self.db, sku).await?;
        all.extend(users);
        Ok(Some(Arc::new(all)))
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
