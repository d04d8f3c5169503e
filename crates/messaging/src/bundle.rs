//! Bundles: several events of one routing key in one AMQP message (`events.proto`, "Bundles").
//!
//! The broker's work per message — routing, the quorum queue's log, the publisher confirm, the
//! delivery and its ack — does not depend on how small the message is; in the saga it was
//! about a third of the machine. A relay that found many rows of one routing key in a batch
//! sends them as one [`EventBundle`]; each bundled event keeps its own encoded envelope (its
//! `message_id` stays the inbox key) and its own trace headers, and the consumer settles each
//! on its own (see `consumer::dispatch`).

use std::collections::BTreeMap;

use flashsale_proto::events::v1::{BundledEvent, EventBundle};
use lapin::BasicProperties;
use prost::Message as _;

use crate::{publisher::OutgoingMessage, trace};

/// AMQP `content_type` of a bundle (a plain event's is
/// [`CONTENT_TYPE`](crate::publisher::CONTENT_TYPE)).
pub const CONTENT_TYPE: &str = "application/vnd.flashsale.bundle+protobuf";

/// Most events one bundle may carry (the upper bound of `amqp.bundle_max_events`).
pub const MAX_EVENTS: u16 = 1_000;

/// One event taken out of a bundle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unbundled {
    /// The encoded envelope.
    pub envelope: Vec<u8>,
    /// Its own headers (trace context).
    pub headers: BTreeMap<String, String>,
}

/// Whether a delivery with these properties is a bundle.
pub fn is_bundle(props: &BasicProperties) -> bool {
    props
        .content_type()
        .as_ref()
        .is_some_and(|c| c.as_str() == CONTENT_TYPE)
}

/// The events of a bundle body, in order.
pub fn unpack(body: &[u8]) -> Result<Vec<Unbundled>, prost::DecodeError> {
    let bundle = EventBundle::decode(body)?;
    Ok(bundle
        .events
        .into_iter()
        .map(|e| Unbundled {
            envelope: e.envelope,
            headers: e.headers.into_iter().collect(),
        })
        .collect())
}

/// One message for `events` (with their own trace headers), all bound for the same exchange
/// and routing key as the first: its `message_id` is a fresh UUID (no inbox ever sees it), its
/// `type` the events' routing key.
pub fn pack(events: &[(&OutgoingMessage, &BTreeMap<String, String>)]) -> OutgoingMessage {
    let first = events.first().map(|(m, _)| *m);
    let body = EventBundle {
        events: events
            .iter()
            .map(|(m, h)| BundledEvent {
                envelope: m.payload.clone(),
                headers: h.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            })
            .collect(),
    };
    let mut headers = lapin::types::FieldTable::default();
    let count = events.len().to_string();
    trace::insert_strings(
        &mut headers,
        [(&crate::headers::BUNDLE_SIZE.to_owned(), &count)],
    );
    OutgoingMessage {
        exchange: first.map(|m| m.exchange.clone()).unwrap_or_default(),
        routing_key: first.map(|m| m.routing_key.clone()).unwrap_or_default(),
        message_id: uuid::Uuid::new_v4().to_string(),
        kind: first.map(|m| m.kind.clone()).unwrap_or_default(),
        timestamp: events.iter().map(|(m, _)| m.timestamp).min().unwrap_or(0),
        headers,
        payload: body.encode_to_vec(),
        content_type: CONTENT_TYPE.to_owned(),
    }
}

/// Groups messages into what to send: runs of up to `max` messages bound for the same exchange
/// and routing key become one bundle; the rest go alone. Returns, per message to send, the
/// indexes of the input messages it carries (every input index exactly once).
pub fn plan(msgs: &[OutgoingMessage], max: usize) -> Vec<Vec<usize>> {
    let max = max.max(1);
    let mut groups: Vec<Vec<usize>> = Vec::new();
    // Open group per (exchange, routing key), by position in `groups`.
    let mut open: std::collections::HashMap<(&str, &str), usize> = std::collections::HashMap::new();
    for (i, m) in msgs.iter().enumerate() {
        let key = (m.exchange.as_str(), m.routing_key.as_str());
        match open.get(&key) {
            Some(&g) if groups[g].len() < max => groups[g].push(i),
            _ => {
                open.insert(key, groups.len());
                groups.push(vec![i]);
            }
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(exchange: &str, key: &str, body: &[u8]) -> OutgoingMessage {
        OutgoingMessage {
            exchange: exchange.into(),
            routing_key: key.into(),
            message_id: uuid::Uuid::new_v4().to_string(),
            kind: key.into(),
            timestamp: 7,
            payload: body.to_vec(),
            ..OutgoingMessage::default()
        }
    }

    #[test]
    fn plan_groups_by_target_up_to_max_and_keeps_every_message_once() {
        let msgs = vec![
            msg("x", "a", b"1"),
            msg("x", "b", b"2"),
            msg("x", "a", b"3"),
            msg("", "a", b"4"),
            msg("x", "a", b"5"),
            msg("x", "a", b"6"),
        ];
        let p = plan(&msgs, 3);
        assert_eq!(p, vec![vec![0, 2, 4], vec![1], vec![3], vec![5]]);
        let mut all: Vec<usize> = p.concat();
        all.sort_unstable();
        assert_eq!(all, (0..msgs.len()).collect::<Vec<_>>());
        // max 1 (or 0): every message alone.
        assert_eq!(plan(&msgs, 1).len(), msgs.len());
        assert_eq!(plan(&msgs, 0).len(), msgs.len());
        assert!(plan(&[], 64).is_empty());
    }

    #[test]
    fn pack_then_unpack_gives_back_each_event_with_its_own_headers() {
        let (a, b) = (msg("x", "k", b"first"), msg("x", "k", b"second"));
        let ha = BTreeMap::from([("traceparent".to_owned(), "00-a".to_owned())]);
        let hb = BTreeMap::new();
        let out = pack(&[(&a, &ha), (&b, &hb)]);
        assert_eq!(out.content_type, CONTENT_TYPE);
        assert_eq!(
            (out.exchange.as_str(), out.routing_key.as_str()),
            ("x", "k")
        );
        assert_ne!(out.message_id, a.message_id);
        assert_eq!(
            trace::header_str(&out.headers, crate::headers::BUNDLE_SIZE),
            Some("2")
        );
        let back = unpack(&out.payload).unwrap();
        assert_eq!(
            back,
            vec![
                Unbundled {
                    envelope: b"first".to_vec(),
                    headers: ha
                },
                Unbundled {
                    envelope: b"second".to_vec(),
                    headers: hb
                },
            ]
        );
        let props = BasicProperties::default().with_content_type(CONTENT_TYPE.into());
        assert!(is_bundle(&props));
        assert!(!is_bundle(&BasicProperties::default()));
        assert!(unpack(b"\xff\xff\xff").is_err());
    }
}
