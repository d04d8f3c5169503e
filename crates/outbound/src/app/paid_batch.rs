//! `order.paid` in batches: the deliveries waiting at the same moment are shipped together —
//! one statement creating their shipments, one transaction locking them, their
//! `CommitReservation` calls on product-stock at once, then the warehouse step of each, one
//! statement shipping them with their attempt rows, one outbox insert of their
//! `outbound.completed`, one commit — instead of two transactions each. A shipment the
//! warehouse refuses fails in the same transaction; one the warehouse does not answer goes
//! through [`Shipping::on_order_paid`] on its own, which delays it. Anything else unusual (an
//! invalid event, a shipment another worker holds or already attempted, a commit that does not
//! answer OK, any error) rolls the batch back, and each delivery runs through the one-by-one
//! path, which handles every case (docs/architecture.md#batchers). product-stock's commit and
//! the warehouse are idempotent per order and per shipment, so a batch rolled back after
//! calling them costs only the calls.

use std::collections::{HashMap, HashSet};

use flashsale_messaging::{outbox, trace};
use flashsale_platform::batch::{Batcher, EACH_CONCURRENCY};
use flashsale_proto::events::v1::{Envelope, envelope::Payload};
use sea_orm::TransactionTrait as _;
use tokio::sync::Semaphore;
use tracing::Instrument as _;

use super::{
    FP_AFTER_COMMIT_BEFORE_WAREHOUSE, FP_ORDER_PAID_BEFORE_COMMIT, Shipping, count, new_shipment,
    outcome_event,
};
use crate::{
    domain::{OutboundError, Policy, ShipmentStatus},
    infra::{db, warehouse::WarehouseError},
};

/// One `order.paid` delivery waiting for its batch.
#[derive(Clone, Debug)]
pub struct Paid {
    pub env: Envelope,
    /// The delivery's trace context, so its `outbound.completed` continues the order's trace.
    pub trace: outbox::TraceHeaders,
}

/// How long a batch waits for more deliveries once the first arrived (as the order service's
/// saga batchers).
pub const GATHER: std::time::Duration = std::time::Duration::from_millis(20);

/// Most deliveries shipped in one transaction.
pub const MAX_BATCH: usize = 64;

/// Batches shipped at once by one replica: one waits on product-stock while the next forms
/// and another commits.
const BATCHES_IN_FLIGHT: usize = 2;

/// The batching worker of `order.paid`; cheap to clone.
pub type PaidBatcher = Batcher<Paid, Result<(), OutboundError>>;

/// Starts the worker: [`BATCHES_IN_FLIGHT`] batches at a time, each of at most `max_batch`
/// deliveries (at most [`MAX_BATCH`]); half the consumer's prefetch, so the next batch can
/// fill while one ships.
pub fn paid_batcher(shipping: Shipping, max_batch: usize) -> PaidBatcher {
    Batcher::serving(
        "outbound_order_paid",
        max_batch.clamp(1, MAX_BATCH),
        GATHER,
        BATCHES_IN_FLIGHT,
        shipping,
        |shipping, items| async move { shipping.ship_paid(items).await },
    )
}

impl Shipping {
    /// Ships a batch of `order.paid`; one answer per delivery, in order. The deliveries the
    /// batch leaves out (a shipment the warehouse did not answer) and every delivery of a batch that
    /// falls back go through [`Shipping::on_order_paid`], [`EACH_CONCURRENCY`] at a time.
    pub async fn ship_paid(&self, items: Vec<Paid>) -> Vec<Result<(), OutboundError>> {
        let everyone = || (0..items.len()).collect::<Vec<_>>();
        let rest = if items.len() > 1 {
            match self.ship_together(&items).await {
                Ok(Some(rest)) => {
                    metrics::histogram!("flashsale_order_paid_batch_size")
                        .record((items.len() - rest.len()) as f64);
                    rest
                }
                Ok(None) => {
                    metrics::counter!("flashsale_order_paid_batch_fallbacks_total").increment(1);
                    everyone()
                }
                Err(e) => {
                    tracing::debug!(error = %e, size = items.len(), "order.paid batch failed; one by one");
                    metrics::counter!("flashsale_order_paid_batch_fallbacks_total").increment(1);
                    everyone()
                }
            }
        } else {
            everyone()
        };
        let permits = Semaphore::new(EACH_CONCURRENCY);
        let (permits, items) = (&permits, &items);
        let runs = rest.iter().map(|&i| async move {
            // Never closed, so a permit always comes.
            let _permit = permits.acquire().await.ok();
            let p = &items[i];
            let answer = match &p.env.payload {
                Some(Payload::OrderPaid(ev)) => self
                    .on_order_paid(&p.env, ev)
                    .instrument(trace::on_behalf_of(&p.trace))
                    .await
                    .map(drop),
                _ => Err(OutboundError::invalid("payload", "not order.paid")),
            };
            (i, answer)
        });
        let mut answers: Vec<Result<(), OutboundError>> = items.iter().map(|_| Ok(())).collect();
        for (i, answer) in futures_util::future::join_all(runs).await {
            answers[i] = answer;
        }
        answers
    }

    /// The common case in one transaction: `Ok(Some(rest))` when the batch shipped every
    /// delivery but those at the indices `rest` (the warehouse did not answer them; they take
    /// the one-by-one path, which delays them), failing those the warehouse refused; `Ok(None)` (nothing committed) when
    /// the whole batch needs the one-by-one path.
    async fn ship_together(&self, items: &[Paid]) -> Result<Option<Vec<usize>>, OutboundError> {
        let mut new = Vec::with_capacity(items.len());
        for p in items {
            let Some(Payload::OrderPaid(ev)) = &p.env.payload else {
                return Ok(None);
            };
            let Ok(s) = new_shipment(ev) else {
                return Ok(None);
            };
            new.push(s);
        }
        let orders: HashSet<uuid::Uuid> = new.iter().map(|s| s.order_id).collect();
        if orders.len() != new.len() {
            return Ok(None);
        }
        for _ in &new {
            self.failpoints
                .hit(FP_ORDER_PAID_BEFORE_COMMIT)
                .await
                .map_err(|e| OutboundError::Internal(anyhow::Error::new(e)))?;
        }
        let created = db::create_many(&self.db, &new, self.lease_end()).await?;
        let fresh = created.len() == new.len()
            && created
                .iter()
                .all(|s| s.status == ShipmentStatus::Picking && s.attempts == 0);
        if !fresh {
            return Ok(None);
        }
        let ids: Vec<uuid::Uuid> = created.iter().map(|s| s.shipment_id).collect();
        let index: HashMap<uuid::Uuid, usize> = new
            .iter()
            .enumerate()
            .map(|(i, s)| (s.order_id, i))
            .collect();
        let txn = self.db.begin().await?;
        let locked = db::lock_many(&txn, &ids).await?;
        if locked.len() != ids.len() || locked.iter().any(|s| s.attempts != 0) {
            return Ok(None);
        }
        // Deduct first: every RESERVE_THEN_COMMIT order's units on product-stock, at once. One
        // try each: a commit that does not answer OK sends the batch down the one-by-one path,
        // where a commit that went through answers as a replay and the rest are retried.
        let to_commit: Vec<uuid::Uuid> = locked
            .iter()
            .filter(|s| s.policy == Policy::ReserveThenCommit)
            .map(|s| s.order_id)
            .collect();
        // Each call on behalf of its order: product-stock's commit continues the order's trace.
        let traces: HashMap<String, &outbox::TraceHeaders> = items
            .iter()
            .filter_map(|p| match &p.env.payload {
                Some(Payload::OrderPaid(ev)) => Some((ev.order_id.clone(), &p.trace)),
                _ => None,
            })
            .collect();
        let no_trace = outbox::TraceHeaders::new();
        let commits = to_commit.iter().map(|id| {
            let trace = traces.get(&id.to_string()).copied().unwrap_or(&no_trace);
            self.stock.commit(*id).instrument(trace::on_behalf_of(trace))
        });
        if futures_util::future::join_all(commits)
            .await
            .iter()
            .any(Result::is_err)
        {
            return Ok(None);
        }
        for _ in &to_commit {
            if self
                .failpoints
                .hit(FP_AFTER_COMMIT_BEFORE_WAREHOUSE)
                .await
                .is_err()
            {
                return Ok(None);
            }
        }
        // Then ship. A refusal fails its shipment in this transaction; a warehouse that does not
        // answer leaves the shipment to the one-by-one path, which delays it.
        let causes: HashMap<String, &Paid> = items
            .iter()
            .filter_map(|p| match &p.env.payload {
                Some(Payload::OrderPaid(ev)) => Some((ev.order_id.clone(), p)),
                _ => None,
            })
            .collect();
        let (mut good, mut refused, mut rest) = (Vec::with_capacity(locked.len()), 0, Vec::new());
        for s in locked {
            match self.warehouse.ship(&s).await {
                Ok(()) => good.push(s),
                Err(WarehouseError::Permanent(reason)) => {
                    let cause = causes.get(&s.order_id.to_string()).map(|p| &p.env);
                    self.fail_first_attempt(&txn, &s, &reason, cause).await?;
                    refused += 1;
                }
                Err(WarehouseError::Transient(_)) => rest.extend(index.get(&s.order_id).copied()),
            }
        }
        if good.is_empty() && refused == 0 {
            return Ok(None);
        }
        let locked = good;
        let ids: Vec<uuid::Uuid> = locked.iter().map(|s| s.shipment_id).collect();
        let steps: Vec<(uuid::Uuid, &str)> = locked
            .iter()
            .flat_map(|s| {
                let deduct = (s.policy == Policy::ReserveThenCommit).then_some("commit");
                deduct
                    .into_iter()
                    .chain(["warehouse"])
                    .map(|step| (s.shipment_id, step))
            })
            .collect();
        if db::ship_first_attempts(&txn, &ids, &steps).await? != ids.len() as u64 {
            return Ok(None);
        }
        let envs: Vec<(Envelope, outbox::TraceHeaders)> = locked
            .iter()
            .map(|s| {
                let cause = causes.get(&s.order_id.to_string());
                let env = outcome_event(s, ShipmentStatus::Shipped, None, cause.map(|p| &p.env));
                (env, cause.map(|p| p.trace.clone()).unwrap_or_default())
            })
            .collect();
        outbox::enqueue_many_traced(&txn, &envs, None).await?;
        txn.commit().await?;
        count(ShipmentStatus::Shipped, envs.len() as u64);
        count(ShipmentStatus::Failed, refused);
        Ok(Some(rest))
    }

    /// A batch's shipment the warehouse refused at its first attempt, its stock deducted
    /// (RESERVE_THEN_COMMIT): failed in `txn` with its `outbound.failed`, whose cancel gives the
    /// units back.
    async fn fail_first_attempt(
        &self,
        txn: &sea_orm::DatabaseTransaction,
        s: &crate::domain::Shipment,
        reason: &str,
        cause: Option<&Envelope>,
    ) -> Result<(), OutboundError> {
        db::set_attempts(txn, s.shipment_id, 1).await?;
        if s.policy == Policy::ReserveThenCommit {
            db::attempt(txn, s.shipment_id, 1, "commit", "OK", "").await?;
            db::mark_committed(txn, s.shipment_id).await?;
        }
        db::attempt(txn, s.shipment_id, 1, "warehouse", "PERMANENT", reason).await?;
        self.finish(txn, s, ShipmentStatus::Failed, Some(reason), cause)
            .await
    }
}
