//! The event the outbound service consumes: `order.paid`.

use flashsale_messaging::{AmqpConfig, HandlerError, Incoming, QueueTopology};
use flashsale_proto::events::v1::envelope::Payload;

use crate::{
    app::{Paid, PaidBatcher},
    domain::OutboundError,
};

/// The outbound service's consumer queue (competing consumers across replicas).
pub const PAID_ORDERS_QUEUE: &str = flashsale_contract::queues::OUTBOUND_PAID_ORDERS;

pub fn topology(config: &AmqpConfig) -> QueueTopology {
    QueueTopology::new(config, PAID_ORDERS_QUEUE, &["order.paid"])
}

/// Handles one delivery, through `paid`, which ships the deliveries waiting at the same moment
/// together.
pub async fn handle(paid: PaidBatcher, msg: Incoming) -> Result<(), HandlerError> {
    let Some(Payload::OrderPaid(_)) = &msg.envelope.payload else {
        let kind = msg
            .envelope
            .payload
            .as_ref()
            .map_or("none", flashsale_messaging::envelope::routing_key);
        return Err(HandlerError::permanent(anyhow::anyhow!(
            "the outbound service does not handle `{kind}`"
        )));
    };
    let answer = match paid
        .call(Paid {
            env: msg.envelope.clone(),
            trace: flashsale_messaging::trace::current_headers(),
        })
        .await
    {
        Ok(answer) => answer,
        Err(e) => Err(OutboundError::Internal(anyhow::Error::new(e))),
    };
    match answer {
        Ok(()) => Ok(()),
        Err(OutboundError::Invalid(v)) => Err(HandlerError::permanent(anyhow::anyhow!(
            "invalid event: {v:?}"
        ))),
        Err(e @ OutboundError::DatabaseUnavailable(_)) => {
            Err(HandlerError::unavailable(anyhow::Error::new(e)))
        }
        Err(e) => Err(HandlerError::transient(anyhow::Error::new(e))),
    }
}
