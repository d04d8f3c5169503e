//! The provider's notifications in batches: the SUCCEEDED notifications arriving at the same
//! moment pay their orders in one transaction — one locking read of the payments, one of the
//! orders, one update of each, one history insert, one outbox insert of their `order.paid`,
//! one commit — instead of one transaction each. Anything unusual in a batch (a signature or
//! payload that does not check, an ATTEMPT_FAILED, a duplicate, a mismatch, an order no longer
//! awaiting payment or past its deadline, any error) rolls it back, and each notification runs
//! through [`Payments::notify`] on its own, which answers every case
//! (docs/architecture.md#batchers).

use std::collections::{HashMap, HashSet};

use chrono::Utc;
use flashsale_contract::payment::verify;
use flashsale_messaging::{outbox, trace};
use flashsale_platform::batch::{BatchMetrics, Batcher, answered_together_or_each};
use sea_orm::TransactionTrait as _;
use tracing::Instrument as _;

use super::{
    checkout::paid_event,
    payments::{Applied, Payments, SignedNotice, decode},
};
use crate::{
    domain::{Notice, OrderError, Status},
    infra::{db, payment_store},
};

/// No gathering delay: the notifications that arrive while a batch commits form the next one,
/// so batches grow with the load and a lone notification is applied at once.
pub const GATHER: std::time::Duration = std::time::Duration::ZERO;

/// Most notifications applied in one transaction.
pub const MAX_BATCH: usize = 128;

/// Batches applied at once by one replica: the next one forms while one commits.
const BATCHES_IN_FLIGHT: usize = 2;

/// The batching worker of the notifications; cheap to clone.
pub type NotifyBatcher = Batcher<SignedNotice, Result<Applied, OrderError>>;

/// Starts the worker: [`BATCHES_IN_FLIGHT`] batches at a time, each of at most
/// `max_batch` notifications (at most [`MAX_BATCH`]).
pub fn notify_batcher(payments: Payments, max_batch: usize) -> NotifyBatcher {
    Batcher::serving(
        "order_payment_notifications",
        max_batch.clamp(1, MAX_BATCH),
        GATHER,
        BATCHES_IN_FLIGHT,
        payments,
        |payments, items| async move { payments.notify_many(items).await },
    )
}

impl Payments {
    /// Applies a batch of notifications; one answer per notification, in order.
    pub async fn notify_many(&self, items: Vec<SignedNotice>) -> Vec<Result<Applied, OrderError>> {
        answered_together_or_each(
            &items,
            BatchMetrics {
                size: "flashsale_payment_notifications_batch_size",
                fallbacks: "flashsale_payment_notifications_batch_fallbacks_total",
            },
            |all| self.paid_together(all),
            |n| self.notify(n).instrument(trace::on_behalf_of(&n.trace)),
        )
        .await
    }

    /// The common case — every notification a genuine first SUCCEEDED of a distinct payment,
    /// matching what was started, for an order awaiting payment within its deadline — in one
    /// transaction; `Ok(None)` (nothing committed) when some notification needs the
    /// one-by-one path.
    async fn paid_together(
        &self,
        items: &[SignedNotice],
    ) -> Result<Option<Vec<Applied>>, OrderError> {
        let now = Utc::now();
        let mut events = Vec::with_capacity(items.len());
        for n in items {
            let checked = verify(
                &self.secret,
                n.timestamp,
                &n.payload,
                &n.signature,
                now.timestamp(),
                self.tolerance_secs,
            );
            let Ok(()) = checked else { return Ok(None) };
            match decode(&n.payload) {
                Ok((ev, Notice::Succeeded)) => events.push(ev),
                _ => return Ok(None),
            }
        }
        let ids: Vec<String> = events.iter().map(|e| e.payment_id.clone()).collect();
        if ids.iter().collect::<HashSet<_>>().len() != ids.len() {
            return Ok(None);
        }
        let txn = self.db.begin().await?;
        let stored: HashMap<String, payment_store::StoredPayment> =
            payment_store::payments_locked(&txn, &ids)
                .await?
                .into_iter()
                .map(|s| (s.payment.provider_payment_id.clone(), s))
                .collect();
        let mut order_ids = Vec::with_capacity(events.len());
        for ev in &events {
            let Some(s) = stored.get(&ev.payment_id) else {
                return Ok(None);
            };
            let p = &s.payment;
            if s.succeeded
                || ev.merchant_reference != s.order_id.to_string()
                || ev.amount_cents != p.amount_cents
                || ev.currency != p.currency
            {
                return Ok(None);
            }
            order_ids.push(s.order_id);
        }
        let orders = db::orders_locked(&txn, &order_ids).await?;
        let now = Utc::now();
        let payable = orders.len() == order_ids.len()
            && orders.iter().all(|o| {
                o.status == Status::AwaitingPayment && o.payment_deadline.is_some_and(|d| d > now)
            });
        if !payable {
            return Ok(None);
        }
        let by_id: HashMap<uuid::Uuid, &crate::domain::Order> =
            orders.iter().map(|o| (o.order_id, o)).collect();
        let paid: Vec<(uuid::Uuid, String)> = events
            .iter()
            .zip(&order_ids)
            .map(|(ev, id)| (*id, ev.payment_id.clone()))
            .collect();
        if payment_store::mark_succeeded_many(&txn, &ids).await? != ids.len() as u64 {
            return Ok(None);
        }
        if db::pay_many(&txn, &paid, "payment.succeeded").await?.len() != paid.len() {
            return Ok(None);
        }
        let mut envs = Vec::with_capacity(paid.len());
        for ((order_id, payment_id), n) in paid.iter().zip(items) {
            let (Some(order), Some(s)) = (by_id.get(order_id), stored.get(payment_id)) else {
                return Ok(None);
            };
            let env = paid_event(order, payment_id, s.payment.amount_cents);
            envs.push((env, n.trace.clone()));
        }
        outbox::enqueue_many_traced(&txn, &envs, None).await?;
        txn.commit().await?;
        let n = paid.len() as u64;
        metrics::counter!("flashsale_orders_paid_total").increment(n);
        super::saga::reached("paid", orders.iter().map(|o| o.created_at));
        metrics::counter!("flashsale_payment_notifications_total", "result" => "paid").increment(n);
        tracing::debug!(orders = n, "payment notifications applied together");
        Ok(Some(
            order_ids
                .into_iter()
                .map(|order_id| Applied {
                    order_id,
                    duplicate: false,
                })
                .collect(),
        ))
    }
}
