//! Order use cases over the order database, the stock gate port and the outbox. The gRPC
//! adapter and the event consumers call these; nothing here knows about tonic or lapin.

use std::{collections::HashSet, sync::Arc, time::Duration};

use flashsale_messaging::{DelayQueue, envelope};
use flashsale_proto::{
    events::v1::{Envelope, OrderCancelled, envelope::Payload},
    order::v1 as pb,
};
use sea_orm::DatabaseConnection;

use crate::{
    adapters::stock::StockPort,
    config::SagaSettings,
    domain::{CancelReason, Order, Status},
};

mod pay;
mod place;
mod query;
mod saga;
mod saga_batch;
mod sold_out;

pub use place::{
    FP_AFTER_BATCH_WRITE, PendingWrite, SOLD_OUT_REMEMBERED, Written, write_pending,
    write_pending_batch, write_pending_batch_with,
};
pub use query::WatchHub;
pub use saga_batch::{Reserved, ReservedBatcher, reserved_batcher};
pub use sold_out::{Load, SoldOutCache, Verdict};

/// The name this service signs its events with.
pub const PRODUCER: &str = "order";

/// Transactions of accepted orders this replica writes at once. One: the CreateOrders that
/// arrive while it commits form the next, larger batch, and larger batches cost PostgreSQL
/// less per order (fewer commits, and no two transactions contending for the same index
/// pages). In session 8's A/B (big sale, platform mode, six alternating pairs), one batch in
/// flight took 0.050–0.068 ms of PostgreSQL CPU per accepted order against 0.062–0.092 ms for
/// two and accepted ~12% more orders per second; four and eight were worse still. Several
/// replicas each write their own.
const WRITE_BATCHES_IN_FLIGHT: usize = 1;

/// Everything the use cases need. Cheap to clone.
#[derive(Clone)]
pub struct Orders {
    db: DatabaseConnection,
    stock: Arc<dyn StockPort>,
    settings: SagaSettings,
    payment_timeout: DelayQueue,
    sold_out: SoldOutCache,
    /// Writes accepted orders, many per transaction (one commit for a batch).
    writes: flashsale_platform::batch::Batcher<place::PendingWrite, place::Written>,
    watch: WatchHub,
    failpoints: flashsale_platform::failpoint::Failpoints,
    /// Marked whenever the gate grants units: the outbox relay waits while orders pour in.
    intake: flashsale_platform::pressure::Foreground,
}

impl Orders {
    pub fn new(
        db: DatabaseConnection,
        stock: Arc<dyn StockPort>,
        settings: SagaSettings,
        payment_timeout: DelayQueue,
        watch: WatchHub,
        failpoints: flashsale_platform::failpoint::Failpoints,
    ) -> Self {
        let writes = {
            let (db, failpoints) = (db.clone(), failpoints.clone());
            flashsale_platform::batch::Batcher::spawn(
                "order_write",
                128,
                Duration::ZERO,
                WRITE_BATCHES_IN_FLIGHT,
                move |w| {
                    let (db, failpoints) = (db.clone(), failpoints.clone());
                    async move { place::write_pending_batch_with(&db, w, &failpoints).await }
                },
            )
        };
        Self {
            db,
            stock,
            sold_out: SoldOutCache::new(Duration::from_millis(settings.sold_out_cache_ms)),
            settings,
            payment_timeout,
            writes,
            watch,
            failpoints,
            intake: flashsale_platform::pressure::Foreground::new(),
        }
    }

    /// How the outbox relay gives way to this replica's intake (`None`: it never waits).
    pub fn relay_yield(&self) -> Option<flashsale_platform::pressure::Yield> {
        (self.settings.intake_quiet_ms > 0).then(|| flashsale_platform::pressure::Yield {
            foreground: self.intake.clone(),
            quiet: Duration::from_millis(self.settings.intake_quiet_ms),
            max_lag: Duration::from_millis(self.settings.intake_max_lag_ms),
        })
    }

    pub fn settings(&self) -> &SagaSettings {
        &self.settings
    }

    /// This replica's sold-out memory (the broadcast listener forgets products whose units
    /// came back).
    pub fn sold_out(&self) -> &SoldOutCache {
        &self.sold_out
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
    ) -> Result<Option<(Arc<HashSet<String>>, String)>, crate::domain::OrderError> {
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
        let mut all = crate::adapters::db::users_with_orders(&self.db, sku).await?;
        all.extend(users);
        metrics::counter!("flashsale_sold_out_list_reads_total", "read" => "full").increment(1);
        Ok(Some((Arc::new(all), gate.refills)))
    }

    async fn failpoint(&self, name: &str) -> Result<(), crate::domain::OrderError> {
        self.failpoints
            .hit(name)
            .await
            .map_err(|e| crate::domain::OrderError::Internal(anyhow::Error::new(e)))
    }
}

pub(crate) fn status_to_proto(s: Status) -> pb::OrderStatus {
    match s {
        Status::Pending => pb::OrderStatus::Pending,
        Status::AwaitingPayment => pb::OrderStatus::AwaitingPayment,
        Status::Paid => pb::OrderStatus::Paid,
        Status::Shipped => pb::OrderStatus::Shipped,
        Status::Cancelled => pb::OrderStatus::Cancelled,
    }
}

pub(crate) fn reason_to_proto(r: CancelReason) -> pb::CancelReason {
    match r {
        CancelReason::OutOfStock => pb::CancelReason::OutOfStock,
        CancelReason::PaymentTimeout => pb::CancelReason::PaymentTimeout,
        CancelReason::UserCancelled => pb::CancelReason::UserCancelled,
        CancelReason::OutboundFailed => pb::CancelReason::OutboundFailed,
        CancelReason::HoldExpired => pb::CancelReason::HoldExpired,
    }
}

/// `order.cancelled` for `order`, which was in `previous` (caused by `cause` when an event).
fn cancelled_event(
    order: &Order,
    previous: Status,
    reason: CancelReason,
    cause: Option<&Envelope>,
) -> Envelope {
    let payload = Payload::OrderCancelled(OrderCancelled {
        order_id: order.order_id.to_string(),
        user_id: order.user_id.clone(),
        sku: order.sku.clone(),
        quantity: order.quantity,
        reason: reason_to_proto(reason) as i32,
        previous_status: status_to_proto(previous) as i32,
    });
    match cause {
        Some(c) => envelope::caused_by(c, payload, PRODUCER),
        None => envelope::new(payload, order.order_id.to_string(), "", PRODUCER),
    }
}

pub(crate) fn policy_to_proto(p: crate::domain::Policy) -> i32 {
    use flashsale_proto::product::v1::DeductionPolicy;
    match p {
        crate::domain::Policy::ReserveThenCommit => DeductionPolicy::ReserveThenCommit as i32,
        crate::domain::Policy::CommitAtOrder => DeductionPolicy::CommitAtOrder as i32,
    }
}
