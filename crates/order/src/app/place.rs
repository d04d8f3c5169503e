//! CreateOrder: the sold-out short-circuit, the stock gate, then one transaction writing the
//! order PENDING with `order.created`.

use flashsale_messaging::{envelope, outbox};
use flashsale_platform::failpoint::Failpoints;
use flashsale_proto::events::v1::{OrderCreated, envelope::Payload};
use sea_orm::TransactionTrait as _;

use super::{Orders, PRODUCER, policy_to_proto};
use crate::{
    adapters::db::{self, Inserted},
    domain::{Order, OrderError, PlaceOrder},
};

/// The message of a refusal from the sold-out memory (the reason is `SOLD_OUT`, as from the
/// gate): tells an operator reading a gateway's log where the answer came from.
pub const SOLD_OUT_REMEMBERED: &str = "sold out (remembered by this replica)";

impl Orders {
    /// Places an order; `(order, replayed)`. Refusals write nothing.
    #[tracing::instrument(skip_all, fields(user = %p.user_id, sku = %p.sku))]
    pub async fn place(&self, p: PlaceOrder) -> Result<(Order, bool), OrderError> {
        if self.sold_out.verdict(&p.sku, &p.user_id) == super::Verdict::Refuse {
            // Sold out, and this user has no order that this could be a replay of.
            metrics::counter!("flashsale_orders_refused_total", "reason" => "SOLD_OUT_CACHED")
                .increment(1);
            return Err(OrderError::Refused(
                "SOLD_OUT".into(),
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
            Err(OrderError::Refused(reason, message)) => {
                if reason == "SOLD_OUT" {
                    self.remember_sold_out(&p.sku);
                }
                if reason == "RESERVATION_RELEASED"
                    && let Some(existing) = db::order(&self.db, order_id, false).await?
                {
                    return Ok((existing, true));
                }
                metrics::counter!("flashsale_orders_refused_total", "reason" => reason.clone())
                    .increment(1);
                return Err(OrderError::Refused(reason, message));
            }
            Err(e) => return Err(e),
        };
        self.intake.mark();
        match self.persist(&p, order_id, &granted).await {
            Ok(Written {
                inserted: Inserted::New,
                order,
            }) => {
                metrics::counter!("flashsale_orders_accepted_total").increment(1);
                let order = match order {
                    Some(o) => o,
                    None => self.load(order_id).await?,
                };
                Ok((order, false))
            }
            Ok(Written {
                inserted: Inserted::SameOrder,
                ..
            }) => Ok((self.load(order_id).await?, true)),
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
        g: &crate::adapters::stock::Granted,
    ) -> Result<Written, OrderError> {
        self.failpoint("order.create.before_write").await?;
        debug_assert_eq!(order_id, p.order_id());
        let write = PendingWrite {
            place: p.clone(),
            unit_price_cents: g.unit_price_cents,
            policy: g.policy,
        };
        self.writes
            .call(write)
            .await
            .map_err(|e| OrderError::Internal(anyhow::Error::new(e)))
    }

    pub(super) async fn load(&self, order_id: uuid::Uuid) -> Result<Order, OrderError> {
        db::order(&self.db, order_id, false)
            .await?
            .ok_or(OrderError::NotFound(order_id))
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
            policy: crate::domain::Policy::ReserveThenCommit,
            status: crate::domain::Status::Pending,
            cancel_reason: None,
            payment_deadline: None,
            payment_id: None,
            refund: None,
            created_at: chrono::Utc::now(),
            updated_at: chrono::Utc::now(),
        };
        let env = super::cancelled_event(
            &ghost,
            crate::domain::Status::Pending,
            crate::domain::CancelReason::UserCancelled,
            None,
        );
        if let Err(e) = outbox::enqueue(&self.db, &env).await {
            tracing::warn!(error = %e, %order_id, "could not queue the release of an unwritten order's hold; the hold sweeper will release it");
        }
    }
}

/// Writes a PENDING order and its `order.created` in one transaction (what CreateOrder does once
/// the gate granted the units; public for the benchmark's raw-insert ceiling).
pub async fn write_pending(
    db: &sea_orm::DatabaseConnection,
    p: &PlaceOrder,
    unit_price_cents: i64,
    policy: crate::domain::Policy,
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
            total_cents: unit_price_cents * p.quantity,
            deduction_policy: policy_to_proto(policy),
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
    pub policy: crate::domain::Policy,
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
            total_cents: w.unit_price_cents * p.quantity,
            deduction_policy: policy_to_proto(w.policy),
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
    let mut inserted: std::collections::HashMap<uuid::Uuid, chrono::DateTime<chrono::Utc>> =
        db::insert_orders_with_events(db, &rows, &event_orders, columns)
            .await?
            .into_iter()
            .collect();
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
                    total_cents: w.unit_price_cents * p.quantity,
                    policy: w.policy,
                    status: crate::domain::Status::Pending,
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
