//! A parked message as the drainer stores it, read from a parking-lot delivery, and the
//! message a replay puts back on the work queue.
//!
//! Most parked messages carry the consumer's bookkeeping headers ([`crate::headers`]). Those the
//! broker parked itself (a quorum queue's delivery limit) carry only `x-death`; undecodable ones
//! may have no usable id. Nothing here fails: missing facts get a fallback, so every parked
//! message can be stored.

use chrono::{DateTime, Utc};
use flashsale_proto::events::v1::Envelope;
use lapin::{
    BasicProperties,
    types::{AMQPValue, FieldTable, ShortString},
};
use prost::Message as _;
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::{headers, publisher::OutgoingMessage, trace::header_str};

/// Headers that describe one parking (kept in columns instead) or the broker's dead-lettering
/// history; a replay starts without them, so the message gets a fresh attempt count.
const DROPPED: &[&str] = &[
    headers::ATTEMPT,
    headers::ERROR,
    headers::ORIGINAL_ROUTING_KEY,
    headers::ORIGINAL_QUEUE,
    headers::PARKED_AT_MS,
    "x-death",
    "x-delivery-count",
];
const DROPPED_PREFIXES: &[&str] = &["x-first-death-", "x-last-death-"];

/// One parked message, ready to insert.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Parked {
    /// The work queue it was parked from.
    pub(crate) queue: String,
    /// The envelope's id, else the AMQP `message_id` if it is a UUID; `None` lets the store
    /// derive one from the bytes.
    pub(crate) message_id: Option<Uuid>,
    pub(crate) routing_key: String,
    pub(crate) message_type: String,
    pub(crate) error: String,
    pub(crate) attempts: i32,
    pub(crate) parked_at: DateTime<Utc>,
    pub(crate) payload: Vec<u8>,
    /// Headers worth keeping for a replay (trace context …), as JSON.
    pub(crate) headers: Map<String, Value>,
}

impl Parked {
    /// Reads a delivery from the parking lot of work queue `queue`; `now` stands in for the
    /// parking time when the message carries none.
    pub(crate) fn read(
        queue: &str,
        properties: &BasicProperties,
        delivery_routing_key: &str,
        payload: &[u8],
        now: DateTime<Utc>,
    ) -> Self {
        let empty = FieldTable::default();
        let hdrs = properties.headers().as_ref().unwrap_or(&empty);
        let death = Death::of(hdrs, queue);
        // Not `envelope::decode`: an envelope whose payload this build does not know still has
        // a usable id and type.
        let env = Envelope::decode(payload).ok();
        let message_id = env
            .as_ref()
            .and_then(|e| Uuid::parse_str(&e.message_id).ok())
            .or_else(|| {
                properties
                    .message_id()
                    .as_ref()
                    .and_then(|id| Uuid::parse_str(id.as_str()).ok())
            });
        let message_type = properties
            .kind()
            .as_ref()
            .map(|k| k.as_str().to_owned())
            .or_else(|| env.as_ref().map(|e| e.r#type.clone()))
            .unwrap_or_default();
        let routing_key = header_str(hdrs, headers::ORIGINAL_ROUTING_KEY)
            .map(str::to_owned)
            .or_else(|| death.as_ref().and_then(|d| d.routing_key.clone()))
            .unwrap_or_else(|| delivery_routing_key.to_owned());
        let error = header_str(hdrs, headers::ERROR)
            .map(str::to_owned)
            .or_else(|| {
                death
                    .as_ref()
                    .map(|d| format!("dead-lettered by the broker: {}", d.reason))
            })
            .unwrap_or_else(|| "parked without an error".to_owned());
        let attempts = int(hdrs, headers::ATTEMPT)
            .and_then(|n| i32::try_from(n.max(1)).ok())
            .unwrap_or(1);
        let parked_at = int(hdrs, headers::PARKED_AT_MS)
            .and_then(DateTime::from_timestamp_millis)
            .or_else(|| {
                death
                    .as_ref()
                    .and_then(|d| d.time)
                    .and_then(|s| DateTime::from_timestamp(i64::try_from(s).ok()?, 0))
            })
            .unwrap_or(now);
        Self {
            queue: queue.to_owned(),
            message_id,
            routing_key: clean(&routing_key),
            message_type: clean(&message_type),
            error: clean(&error),
            attempts,
            parked_at,
            payload: payload.to_vec(),
            headers: kept_headers(hdrs),
        }
    }
}

/// What the broker recorded when it dead-lettered the message out of the work queue.
#[derive(Debug)]
struct Death {
    reason: String,
    time: Option<u64>,
    routing_key: Option<String>,
}

impl Death {
    /// The `x-death` entry of `queue`, if the broker dead-lettered the message from it.
    fn of(hdrs: &FieldTable, queue: &str) -> Option<Self> {
        let AMQPValue::FieldArray(entries) = hdrs.inner().get("x-death")? else {
            return None;
        };
        entries.as_slice().iter().find_map(|entry| {
            let AMQPValue::FieldTable(t) = entry else {
                return None;
            };
            if header_str(t, "queue") != Some(queue) {
                return None;
            }
            let routing_key = match t.inner().get("routing-keys") {
                Some(AMQPValue::FieldArray(keys)) => keys.as_slice().iter().find_map(|k| match k {
                    AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok(),
                    AMQPValue::ShortString(s) => Some(s.as_str()),
                    _ => None,
                }),
                _ => None,
            };
            Some(Self {
                reason: header_str(t, "reason").unwrap_or("unknown").to_owned(),
                time: match t.inner().get("time") {
                    Some(AMQPValue::Timestamp(s)) => Some(*s),
                    _ => None,
                },
                routing_key: routing_key.map(str::to_owned),
            })
        })
    }
}

/// An integer header of any width.
fn int(hdrs: &FieldTable, key: &str) -> Option<i64> {
    match hdrs.inner().get(key)? {
        AMQPValue::LongLongInt(n) => Some(*n),
        AMQPValue::LongInt(n) => Some(i64::from(*n)),
        AMQPValue::LongUInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortUInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortShortInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortShortUInt(n) => Some(i64::from(*n)),
        _ => None,
    }
}

/// PostgreSQL text (and jsonb) cannot hold NUL.
fn clean(s: &str) -> String {
    s.replace('\0', "")
}

/// String, integer and boolean headers other than the parking bookkeeping.
fn kept_headers(hdrs: &FieldTable) -> Map<String, Value> {
    hdrs.inner()
        .iter()
        .filter(|(k, _)| {
            let k = k.as_str();
            !DROPPED.contains(&k) && !DROPPED_PREFIXES.iter().any(|p| k.starts_with(p))
        })
        .filter_map(|(k, v)| {
            let value = match v {
                AMQPValue::LongString(s) => {
                    Value::String(clean(std::str::from_utf8(s.as_bytes()).ok()?))
                }
                AMQPValue::ShortString(s) => Value::String(clean(s.as_str())),
                AMQPValue::Boolean(b) => Value::Bool(*b),
                _ => Value::from(int(hdrs, k.as_str())?),
            };
            Some((clean(k.as_str()), value))
        })
        .collect()
}

/// What a replay publishes: the stored bytes, through the default exchange straight into
/// `queue`, with the stored id, type and headers, and the original routing key where the
/// consumer looks for it.
pub(crate) fn replay_message(
    queue: &str,
    message_id: Uuid,
    routing_key: &str,
    message_type: &str,
    headers: &Map<String, Value>,
    payload: Vec<u8>,
) -> OutgoingMessage {
    let mut table = FieldTable::default();
    for (k, v) in headers {
        let Ok(key) = ShortString::try_new(k.as_str()) else {
            continue;
        };
        let value = match v {
            Value::String(s) => AMQPValue::LongString(s.as_str().into()),
            Value::Bool(b) => AMQPValue::Boolean(*b),
            Value::Number(n) => match n.as_i64() {
                Some(n) => AMQPValue::LongLongInt(n),
                None => continue,
            },
            _ => continue,
        };
        table.insert(key, value);
    }
    table.insert(
        headers::ORIGINAL_ROUTING_KEY.into(),
        AMQPValue::LongString(routing_key.into()),
    );
    OutgoingMessage {
        exchange: String::new(),
        routing_key: queue.to_owned(),
        message_id: message_id.to_string(),
        kind: message_type.to_owned(),
        timestamp: u64::try_from(Utc::now().timestamp()).unwrap_or(0),
        headers: table,
        payload,
        content_type: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use lapin::types::FieldArray;

    use super::*;

    fn long(s: &str) -> AMQPValue {
        AMQPValue::LongString(s.into())
    }

    #[test]
    fn consumer_parked_message_keeps_its_bookkeeping_and_trace_context() {
        let env = crate::envelope::new(
            flashsale_proto::events::v1::envelope::Payload::OrderPaid(Default::default()),
            "o1",
            "",
            "it",
        );
        let mut h = FieldTable::default();
        h.insert(headers::ERROR.into(), long("transient: boom"));
        h.insert(headers::ATTEMPT.into(), AMQPValue::LongLongInt(3));
        h.insert(headers::ORIGINAL_ROUTING_KEY.into(), long("order.paid"));
        h.insert(headers::ORIGINAL_QUEUE.into(), long("q"));
        h.insert(
            headers::PARKED_AT_MS.into(),
            AMQPValue::LongLongInt(1_700_000_000_123),
        );
        h.insert("traceparent".into(), long("00-abc-def-01"));
        h.insert("x-first-death-queue".into(), long("q.retry.1"));
        let props = BasicProperties::default()
            .with_headers(h)
            .with_type("order.paid".into());
        let bytes = crate::envelope::encode(&env);
        let p = Parked::read("q", &props, "q.dlq", &bytes, Utc::now());
        assert_eq!(
            p.message_id,
            Some(Uuid::parse_str(&env.message_id).unwrap())
        );
        assert_eq!(p.routing_key, "order.paid");
        assert_eq!(p.message_type, "order.paid");
        assert_eq!(p.error, "transient: boom");
        assert_eq!(p.attempts, 3);
        assert_eq!(p.parked_at.timestamp_millis(), 1_700_000_000_123);
        assert_eq!(
            Value::Object(p.headers.clone()),
            serde_json::json!({"traceparent": "00-abc-def-01"})
        );

        let out = replay_message(
            "q",
            Uuid::nil(),
            &p.routing_key,
            "order.paid",
            &p.headers,
            bytes,
        );
        assert_eq!((out.exchange.as_str(), out.routing_key.as_str()), ("", "q"));
        assert_eq!(
            header_str(&out.headers, "traceparent"),
            Some("00-abc-def-01")
        );
        assert_eq!(
            header_str(&out.headers, headers::ORIGINAL_ROUTING_KEY),
            Some("order.paid")
        );
        assert!(!out.headers.inner().contains_key(headers::ATTEMPT));
        assert!(!out.headers.inner().contains_key(headers::ERROR));
    }

    #[test]
    fn broker_dead_lettered_message_falls_back_to_x_death() {
        let mut death = FieldTable::default();
        death.insert("queue".into(), long("q"));
        death.insert("reason".into(), long("delivery_limit"));
        death.insert("time".into(), AMQPValue::Timestamp(1_700_000_000));
        let mut keys = FieldArray::default();
        keys.push(long("stock.reserved"));
        death.insert("routing-keys".into(), AMQPValue::FieldArray(keys));
        let mut other = FieldTable::default();
        other.insert("queue".into(), long("q.retry.1"));
        let mut deaths = FieldArray::default();
        deaths.push(AMQPValue::FieldTable(other));
        deaths.push(AMQPValue::FieldTable(death));
        let mut h = FieldTable::default();
        h.insert("x-death".into(), AMQPValue::FieldArray(deaths));
        let props = BasicProperties::default().with_headers(h);
        let p = Parked::read("q", &props, "q.dlq", b"\x00junk", Utc::now());
        assert_eq!(p.message_id, None);
        assert_eq!(p.routing_key, "stock.reserved");
        assert_eq!(p.error, "dead-lettered by the broker: delivery_limit");
        assert_eq!(p.attempts, 1);
        assert_eq!(p.parked_at.timestamp(), 1_700_000_000);
        assert!(p.headers.is_empty());
    }

    #[test]
    fn bare_garbage_gets_fallbacks_and_no_nul_reaches_the_database() {
        let now = Utc::now();
        let props = BasicProperties::default()
            .with_message_id("not-a-uuid".into())
            .with_type("bad\0type".into());
        let p = Parked::read("q", &props, "q.dlq", b"\xff\xfe", now);
        assert_eq!(p.message_id, None);
        assert_eq!(p.message_type, "badtype");
        assert_eq!(p.routing_key, "q.dlq");
        assert_eq!(p.error, "parked without an error");
        assert_eq!(p.parked_at, now);
        assert_eq!(p.payload, b"\xff\xfe");
    }
}
