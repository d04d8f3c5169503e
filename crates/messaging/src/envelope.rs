//! The [`Envelope`] every event travels in: building one, the payload ↔ routing key mapping,
//! and protobuf encoding.

use flashsale_proto::events::v1::{Envelope, envelope::Payload};
use prost::Message as _;
use uuid::Uuid;

/// Routing keys of every event (`Envelope.type`).
pub mod keys {
    pub const ORDER_CREATED: &str = "order.created";
    pub const ORDER_PAID: &str = "order.paid";
    pub const ORDER_CANCELLED: &str = "order.cancelled";
    pub const ORDER_REFUNDED: &str = "order.refunded";
    pub const STOCK_RESERVED: &str = "stock.reserved";
    pub const STOCK_RESERVATION_FAILED: &str = "stock.reservation_failed";
    pub const STOCK_RELEASED: &str = "stock.released";
    pub const STOCK_COMMITTED: &str = "stock.committed";
    pub const STOCK_ADJUSTED: &str = "stock.adjusted";
    pub const STOCK_GATE_REFILLED: &str = "stock.gate_refilled";
    pub const PRODUCT_UPDATED: &str = "product.updated";
    pub const OUTBOUND_COMPLETED: &str = "outbound.completed";
    pub const OUTBOUND_FAILED: &str = "outbound.failed";
    pub const ORDER_PAYMENT_TIMEOUT: &str = "order.payment_timeout";

    /// Events published for whoever may listen (audit, analytics, later features): no service
    /// of the saga needs them, so "no queue bound" is not an error for these. Every other key
    /// has a consumer in the design, and an unroutable message for it is retried until that
    /// consumer's queue exists (never dropped).
    /// (The order service's replicas listen to `stock.released`, `stock.gate_refilled` and
    /// `product.updated`, and product-stock's to `product.updated`, on queues of their own
    /// while they run; with none running nothing needs them.)
    pub const NOTIFICATIONS: &[&str] = &[
        ORDER_REFUNDED,
        STOCK_RELEASED,
        STOCK_COMMITTED,
        STOCK_GATE_REFILLED,
        PRODUCT_UPDATED,
    ];

    /// Every routing key, in the order of the payload's field numbers.
    pub const ALL: &[&str] = &[
        ORDER_CREATED,
        ORDER_PAID,
        ORDER_CANCELLED,
        ORDER_REFUNDED,
        STOCK_RESERVED,
        STOCK_RESERVATION_FAILED,
        STOCK_RELEASED,
        STOCK_COMMITTED,
        STOCK_ADJUSTED,
        STOCK_GATE_REFILLED,
        PRODUCT_UPDATED,
        OUTBOUND_COMPLETED,
        OUTBOUND_FAILED,
        ORDER_PAYMENT_TIMEOUT,
    ];
}

/// Why bytes are not a usable envelope; such a message goes straight to the parking lot.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// Not a protobuf `Envelope`.
    #[error("not an envelope: {0}")]
    Protobuf(#[from] prost::DecodeError),
    /// No payload set (or one this build does not know).
    #[error("envelope {message_id:?} has no payload")]
    MissingPayload {
        /// The envelope's id.
        message_id: String,
    },
    /// `type` is not the routing key of the payload that is set.
    #[error("envelope type {declared:?} does not match its {actual} payload")]
    TypeMismatch {
        /// `Envelope.type`.
        declared: String,
        /// The routing key of the payload actually set.
        actual: &'static str,
    },
    /// `message_id` is not a UUID.
    #[error("envelope message_id {0:?} is not a UUID")]
    BadMessageId(String),
}

/// The routing key (and `Envelope.type`) of a payload.
pub fn routing_key(payload: &Payload) -> &'static str {
    match payload {
        Payload::OrderCreated(_) => keys::ORDER_CREATED,
        Payload::OrderPaid(_) => keys::ORDER_PAID,
        Payload::OrderCancelled(_) => keys::ORDER_CANCELLED,
        Payload::OrderRefunded(_) => keys::ORDER_REFUNDED,
        Payload::StockReserved(_) => keys::STOCK_RESERVED,
        Payload::StockReservationFailed(_) => keys::STOCK_RESERVATION_FAILED,
        Payload::StockReleased(_) => keys::STOCK_RELEASED,
        Payload::StockCommitted(_) => keys::STOCK_COMMITTED,
        Payload::StockAdjusted(_) => keys::STOCK_ADJUSTED,
        Payload::StockGateRefilled(_) => keys::STOCK_GATE_REFILLED,
        Payload::ProductUpdated(_) => keys::PRODUCT_UPDATED,
        Payload::OutboundCompleted(_) => keys::OUTBOUND_COMPLETED,
        Payload::OutboundFailed(_) => keys::OUTBOUND_FAILED,
        Payload::PaymentTimeout(_) => keys::ORDER_PAYMENT_TIMEOUT,
    }
}

/// A new envelope: fresh UUID v7 id, `type` from the payload, `occurred_at` now.
///
/// `correlation_id` is the order id (the sku for `stock.adjusted`); `causation_id` the
/// `message_id` of the event that caused this one, or empty when an RPC did.
pub fn new(
    payload: Payload,
    correlation_id: impl Into<String>,
    causation_id: impl Into<String>,
    producer: &str,
) -> Envelope {
    let now = chrono::Utc::now();
    Envelope {
        message_id: Uuid::now_v7().to_string(),
        r#type: routing_key(&payload).to_owned(),
        occurred_at: Some(flashsale_contract::to_timestamp(now)),
        correlation_id: correlation_id.into(),
        causation_id: causation_id.into(),
        producer: producer.to_owned(),
        payload: Some(payload),
    }
}

/// A new envelope caused by handling `cause`: same correlation id, `causation_id` =
/// `cause.message_id`.
pub fn caused_by(cause: &Envelope, payload: Payload, producer: &str) -> Envelope {
    new(
        payload,
        cause.correlation_id.clone(),
        cause.message_id.clone(),
        producer,
    )
}

/// Protobuf bytes of `env`.
pub fn encode(env: &Envelope) -> Vec<u8> {
    env.encode_to_vec()
}

/// Decodes and checks an envelope: a payload is set, `type` matches it, `message_id` is a
/// UUID.
pub fn decode(bytes: &[u8]) -> Result<Envelope, DecodeError> {
    let env = Envelope::decode(bytes)?;
    check(&env)?;
    Ok(env)
}

/// The checks [`decode`] makes, for an envelope built in memory; returns its message id.
pub fn check(env: &Envelope) -> Result<Uuid, DecodeError> {
    let payload = env
        .payload
        .as_ref()
        .ok_or_else(|| DecodeError::MissingPayload {
            message_id: env.message_id.clone(),
        })?;
    let actual = routing_key(payload);
    if env.r#type != actual {
        return Err(DecodeError::TypeMismatch {
            declared: env.r#type.clone(),
            actual,
        });
    }
    message_id(env)
}

/// `env.message_id` as a UUID.
pub fn message_id(env: &Envelope) -> Result<Uuid, DecodeError> {
    Uuid::parse_str(&env.message_id).map_err(|_| DecodeError::BadMessageId(env.message_id.clone()))
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use flashsale_proto::events::v1::*;

    use super::*;

    fn every_payload() -> Vec<Payload> {
        vec![
            Payload::OrderCreated(OrderCreated::default()),
            Payload::OrderPaid(OrderPaid::default()),
            Payload::OrderCancelled(OrderCancelled::default()),
            Payload::OrderRefunded(OrderRefunded::default()),
            Payload::StockReserved(StockReserved::default()),
            Payload::StockReservationFailed(StockReservationFailed::default()),
            Payload::StockReleased(StockReleased::default()),
            Payload::StockCommitted(StockCommitted::default()),
            Payload::StockAdjusted(StockAdjusted::default()),
            Payload::StockGateRefilled(StockGateRefilled::default()),
            Payload::ProductUpdated(ProductUpdated::default()),
            Payload::OutboundCompleted(OutboundCompleted::default()),
            Payload::OutboundFailed(OutboundFailed::default()),
            Payload::PaymentTimeout(PaymentTimeout::default()),
        ]
    }

    #[test]
    fn every_payload_has_its_own_routing_key() {
        let got: Vec<&str> = every_payload().iter().map(routing_key).collect();
        assert_eq!(got, keys::ALL);
        assert_eq!(got.iter().collect::<HashSet<_>>().len(), got.len());
    }

    #[test]
    fn new_envelope_round_trips() {
        for p in every_payload() {
            let env = new(p, "order-1", "", "order");
            assert_eq!(env.r#type, routing_key(env.payload.as_ref().unwrap()));
            let back = decode(&encode(&env)).unwrap();
            assert_eq!(back, env);
            assert_eq!(message_id(&back).unwrap().get_version_num(), 7);
        }
    }

    #[test]
    fn caused_by_links_the_cause() {
        let cause = new(
            Payload::OrderCreated(OrderCreated::default()),
            "o1",
            "",
            "order",
        );
        let effect = caused_by(
            &cause,
            Payload::StockReserved(StockReserved::default()),
            "product-stock",
        );
        assert_eq!(effect.correlation_id, "o1");
        assert_eq!(effect.causation_id, cause.message_id);
        assert_eq!(effect.r#type, keys::STOCK_RESERVED);
    }

    #[test]
    fn mismatched_missing_or_garbage_is_undecodable() {
        let mut env = new(Payload::OrderPaid(OrderPaid::default()), "o1", "", "order");
        env.r#type = keys::ORDER_CREATED.to_owned();
        assert!(matches!(
            decode(&encode(&env)),
            Err(DecodeError::TypeMismatch { .. })
        ));
        env.payload = None;
        assert!(matches!(
            decode(&encode(&env)),
            Err(DecodeError::MissingPayload { .. })
        ));
        let mut env = new(Payload::OrderPaid(OrderPaid::default()), "o1", "", "order");
        env.message_id = "nope".into();
        assert!(matches!(
            decode(&encode(&env)),
            Err(DecodeError::BadMessageId(_))
        ));
        assert!(matches!(
            decode(b"\xff\xff\xff garbage"),
            Err(DecodeError::Protobuf(_))
        ));
    }
}
