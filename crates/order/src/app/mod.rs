//! Order use cases over the order database, the stock gate port and the outbox. The gRPC
//! adapter and the event consumers call these; nothing here knows about tonic or lapin.

use std::{collections::HashMap, sync::Arc, time::Duration};

use flashsale_messaging::{DelayQueue, envelope};
use flashsale_proto::{
    events::v1::{Envelope, OrderCancelled, envelope::Payload},
    order::v1 as pb,
};
use sea_orm::DatabaseConnection;
use tokio::time::Instant;

use crate::{
    adapters::stock::StockPort,
    config::SagaSettings,
    domain::{CancelReason, Order, Status},
};

mod pay;
mod place;
mod query;
mod saga;

pub use place::{PendingWrite, write_pending, write_pending_batch};
pub use query::WatchHub;

/// The name this service signs its events with.
pub const PRODUCER: &str = "order";

/// Everything the use cases need. Cheap to clone.
#[derive(Clone)]
pub struct Orders {
    db: DatabaseConnection,
    stock: Arc<dyn StockPort>,
    settings: SagaSettings,
    payment_timeout: DelayQueue,
    sold_out: Arc<std::sync::RwLock<HashMap<String, Instant>>>,
    /// Looks up orders by id for replays on the sold-out path, many per round trip.
    replays: flashsale_platform::batch::Batcher<uuid::Uuid, Option<Order>>,
    /// Writes accepted orders, many per transaction (one commit for a batch).
    writes: flashsale_platform::batch::Batcher<place::PendingWrite, crate::adapters::db::Inserted>,
    watch: WatchHub,
    failpoints: flashsale_platform::failpoint::Failpoints,
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
        let replays = {
            let db = db.clone();
            flashsale_platform::batch::Batcher::spawn(
                256,
                Duration::from_micros(500),
                4,
                move |ids| {
                    let db = db.clone();
                    async move { crate::adapters::db::orders(&db, &ids).await }
                },
            )
        };
        let writes = {
            let db = db.clone();
            flashsale_platform::batch::Batcher::spawn(128, Duration::ZERO, 2, move |w| {
                let db = db.clone();
                async move { place::write_pending_batch(&db, w).await }
            })
        };
        Self {
            db,
            stock,
            settings,
            payment_timeout,
            sold_out: Arc::default(),
            replays,
            writes,
            watch,
            failpoints,
        }
    }

    pub fn settings(&self) -> &SagaSettings {
        &self.settings
    }

    fn is_sold_out(&self, sku: &str) -> bool {
        self.sold_out
            .read()
            .ok()
            .and_then(|m| m.get(sku).copied())
            .is_some_and(|until| until > Instant::now())
    }

    fn remember_sold_out(&self, sku: &str) {
        if self.settings.sold_out_cache_ms == 0 {
            return;
        }
        if let Ok(mut m) = self.sold_out.write() {
            let until = Instant::now() + Duration::from_millis(self.settings.sold_out_cache_ms);
            m.insert(sku.to_owned(), until);
            if m.len() > 10_000 {
                let now = Instant::now();
                m.retain(|_, t| *t > now);
            }
        }
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
