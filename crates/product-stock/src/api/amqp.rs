//! The events product-stock consumes: `order.created` and `order.cancelled` (the saga) on one
//! queue, `stock.adjusted` (its own restocks, to update the gate) on another.

use flashsale_messaging::{
    AmqpConfig,
    consumer::{HandlerError, Incoming},
    topology::QueueTopology,
};
use flashsale_proto::events::v1::envelope::Payload;

use crate::{
    app::{Created, CreatedBatcher, StockSaga},
    domain::StockError,
};

/// Queue of the saga events (competing consumers across replicas).
pub const ORDER_EVENTS_QUEUE: &str = flashsale_contract::queues::PRODUCT_STOCK_ORDER_EVENTS;
/// Queue of `stock.adjusted`.
pub const STOCK_EVENTS_QUEUE: &str = flashsale_contract::queues::PRODUCT_STOCK_STOCK_ADJUSTED;

pub fn order_events_topology(config: &AmqpConfig) -> QueueTopology {
    QueueTopology::new(
        config,
        ORDER_EVENTS_QUEUE,
        &["order.created", "order.cancelled"],
    )
}

pub fn stock_events_topology(config: &AmqpConfig) -> QueueTopology {
    QueueTopology::new(config, STOCK_EVENTS_QUEUE, &["stock.adjusted"])
}

/// The event every replica hears (a broadcast subscription of its own) to forget the terms it
/// cached of a product.
pub const PRODUCT_UPDATED: &str = flashsale_messaging::envelope::keys::PRODUCT_UPDATED;

/// The product a `product.updated` names.
pub fn updated_sku(env: &flashsale_proto::events::v1::Envelope) -> Option<&str> {
    match &env.payload {
        Some(Payload::ProductUpdated(ev)) => Some(&ev.sku),
        _ => None,
    }
}

fn classify(e: StockError) -> HandlerError {
    match e {
        StockError::Invalid(v) => HandlerError::permanent(anyhow::anyhow!("invalid event: {v:?}")),
        e @ (StockError::DatabaseUnavailable(_) | StockError::GateUnavailable(_)) => {
            HandlerError::unavailable(e)
        }
        other => HandlerError::transient(other),
    }
}

/// Handles one delivery of either queue; `order.created` goes through `created`, which
/// persists the deliveries waiting at the same moment together.
pub async fn handle(
    saga: StockSaga,
    created: CreatedBatcher,
    msg: Incoming,
) -> Result<(), HandlerError> {
    let consumer = msg.queue.as_str();
    match &msg.envelope.payload {
        Some(Payload::OrderCreated(ev)) => {
            let item = Created {
                consumer: consumer.to_owned(),
                env: msg.envelope.clone(),
                ev: ev.clone(),
                trace: flashsale_messaging::trace::current_headers(),
                attempt: msg.attempt,
            };
            match created.call(item).await {
                Ok(answer) => answer,
                Err(e) => Err(StockError::Internal(anyhow::Error::new(e))),
            }
        }
        Some(Payload::OrderCancelled(ev)) => {
            saga.on_order_cancelled(consumer, &msg.envelope, ev).await
        }
        Some(Payload::StockAdjusted(ev)) => {
            saga.on_stock_adjusted(consumer, &msg.envelope, ev).await
        }
        other => {
            let kind = other
                .as_ref()
                .map_or("none", flashsale_messaging::envelope::routing_key);
            return Err(HandlerError::permanent(anyhow::anyhow!(
                "product-stock does not handle `{kind}`"
            )));
        }
    }
    .map_err(classify)
}
