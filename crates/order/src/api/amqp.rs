//! The events the order service consumes, on one queue: the stock outcome, the delayed payment
//! timeout and the shipment outcome.

use flashsale_messaging::{AmqpConfig, DelayQueue, HandlerError, Incoming, QueueTopology};
use flashsale_proto::events::v1::envelope::Payload;

use crate::{
    app::{Completed, CompletedBatcher, Reserved, ReservedBatcher, Saga},
    domain::OrderError,
};

/// The order service's consumer queue (competing consumers across replicas).
pub const ORDER_EVENTS_QUEUE: &str = flashsale_contract::queues::ORDER_SAGA_EVENTS;
/// The routing key the payment-timeout holding queue releases to.
pub const PAYMENT_TIMEOUT_KEY: &str = "order.payment_timeout";

pub fn topology(config: &AmqpConfig) -> QueueTopology {
    QueueTopology::new(
        config,
        ORDER_EVENTS_QUEUE,
        &[
            "stock.reserved",
            "stock.reservation_failed",
            PAYMENT_TIMEOUT_KEY,
            "outbound.completed",
            "outbound.failed",
        ],
    )
}

/// The holding queue that turns a message into a payment timeout after `timeout`.
pub fn payment_timeout_queue(config: &AmqpConfig, timeout: std::time::Duration) -> DelayQueue {
    DelayQueue::new(config, PAYMENT_TIMEOUT_KEY, timeout)
}

/// Events after which units of a product may be back in the gate: a released reservation or
/// hold (`stock.released`; an expired hold comes as `stock.reservation_failed`), a restock
/// (`stock.adjusted`) or a gate that product-stock repaired or rebuilt upwards
/// (`stock.gate_refilled`). Each replica hears them all (a broadcast subscription).
pub const UNITS_BACK_KEYS: [&str; 4] = [
    "stock.released",
    "stock.reservation_failed",
    "stock.adjusted",
    "stock.gate_refilled",
];

/// The product whose units may be back, for the events of [`UNITS_BACK_KEYS`].
pub fn sku_with_units_back(env: &flashsale_proto::events::v1::Envelope) -> Option<&str> {
    match &env.payload {
        Some(Payload::StockReleased(ev)) => Some(&ev.sku),
        Some(Payload::StockReservationFailed(ev)) => Some(&ev.sku),
        Some(Payload::StockAdjusted(ev)) => Some(&ev.sku),
        Some(Payload::StockGateRefilled(ev)) => Some(&ev.sku),
        _ => None,
    }
}

/// The event after which a product's terms (its sale window above all) may have changed: every
/// replica forgets what it remembered of the product (a broadcast subscription).
pub const PRODUCT_UPDATED: &str = "product.updated";

/// The product a `product.updated` names.
pub fn updated_sku(env: &flashsale_proto::events::v1::Envelope) -> Option<&str> {
    match &env.payload {
        Some(Payload::ProductUpdated(ev)) => Some(&ev.sku),
        _ => None,
    }
}

fn classify(e: OrderError) -> HandlerError {
    match e {
        OrderError::Invalid(v) => HandlerError::permanent(anyhow::anyhow!("invalid event: {v:?}")),
        e @ (OrderError::DatabaseUnavailable(_) | OrderError::WriteExpired) => {
            HandlerError::unavailable(anyhow::Error::new(e))
        }
        other => HandlerError::transient(anyhow::Error::new(other)),
    }
}

/// The batchers the consumer hands deliveries to.
#[derive(Clone)]
pub struct Batchers {
    /// `stock.reserved`: confirms the deliveries waiting at the same moment together.
    pub reserved: ReservedBatcher,
    /// `outbound.completed`: ships the deliveries waiting at the same moment together.
    pub completed: CompletedBatcher,
}

/// Handles one delivery; `stock.reserved` and `outbound.completed` go through their
/// [`Batchers`].
pub async fn handle(saga: Saga, batchers: Batchers, msg: Incoming) -> Result<(), HandlerError> {
    let q = msg.queue.as_str();
    let env = &msg.envelope;
    match &env.payload {
        Some(Payload::StockReserved(ev)) => {
            let item = Reserved {
                consumer: q.to_owned(),
                env: env.clone(),
                order_id: ev.order_id.clone(),
                trace: flashsale_messaging::trace::current_headers(),
                attempt: msg.attempt,
            };
            match batchers.reserved.call(item).await {
                Ok(answer) => answer,
                Err(e) => Err(OrderError::Internal(anyhow::Error::new(e))),
            }
        }
        Some(Payload::StockReservationFailed(ev)) => saga.on_reservation_failed(q, env, ev).await,
        Some(Payload::PaymentTimeout(ev)) => {
            let ids: Vec<&str> = std::iter::once(ev.order_id.as_str())
                .chain(ev.more_order_ids.iter().map(String::as_str))
                .collect();
            saga.on_payment_timeout(q, env, &ids).await
        }
        Some(Payload::OutboundCompleted(ev)) => {
            let item = Completed {
                consumer: q.to_owned(),
                env: env.clone(),
                order_id: ev.order_id.clone(),
                trace: flashsale_messaging::trace::current_headers(),
                attempt: msg.attempt,
            };
            match batchers.completed.call(item).await {
                Ok(answer) => answer,
                Err(e) => Err(OrderError::Internal(anyhow::Error::new(e))),
            }
        }
        Some(Payload::OutboundFailed(ev)) => saga.on_outbound_failed(q, env, ev).await,
        other => {
            let kind = other
                .as_ref()
                .map_or("none", flashsale_messaging::envelope::routing_key);
            return Err(HandlerError::permanent(anyhow::anyhow!(
                "the order service does not handle `{kind}`"
            )));
        }
    }
    .map_err(classify)
}
