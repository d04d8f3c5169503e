//! Bundles (docs/architecture.md#messaging): the relay sends rows of one routing key together, each
//! event keeps its own envelope and trace headers, and a consumer settles each on its own.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use flashsale_messaging::{
    AmqpConfig, Consumer, HandlerError, Incoming, OutboxRelay, OutgoingMessage, Publisher,
    broadcast, bundle, envelope, headers, keys, outbox,
};
use flashsale_proto::events::v1::{OrderCancelled, envelope::Payload};
use flashsale_test_support::eventually;
use lapin::types::AMQPValue;
use sea_orm::TransactionTrait as _;

use crate::helpers::{Amqp, Recorder, Running, WAIT, config, database, order_created};

fn traceparent(i: usize) -> BTreeMap<String, String> {
    BTreeMap::from([(
        "traceparent".to_owned(),
        format!("00-{:032x}-{:016x}-01", i + 1, i + 1),
    )])
}

/// Publishes `parts` (without trace headers) as one bundle.
async fn publish_bundle(publisher: &Publisher, parts: &[OutgoingMessage]) {
    let no_headers = BTreeMap::new();
    let packed = bundle::pack(&parts.iter().map(|m| (m, &no_headers)).collect::<Vec<_>>());
    publisher.publish(&packed).await.unwrap();
}

fn content_type(msg: &lapin::message::BasicGetMessage) -> String {
    msg.delivery
        .properties
        .content_type()
        .as_ref()
        .map(|c| c.to_string())
        .unwrap_or_default()
}

/// 10 `order.created` and 2 `order.cancelled` rows, each with a trace context of its own, then
/// one relay batch; what lands on a queue bound to both keys.
#[tokio::test]
async fn relay_sends_one_routing_key_s_rows_together_each_event_intact() {
    for max in [4u16, 1] {
        let (_tdb, db) = database().await;
        let amqp = Amqp::new(AmqpConfig {
            bundle_max_events: max,
            ..config()
        })
        .await;
        let t = amqp
            .topology(
                &format!("bundled-{max}"),
                &[keys::ORDER_CREATED, keys::ORDER_CANCELLED],
            )
            .await;
        let mut events = Vec::new();
        for i in 0..10 {
            events.push(order_created(&format!("o-{i}")));
        }
        for i in 0..2 {
            let p = Payload::OrderCancelled(OrderCancelled {
                order_id: format!("c-{i}"),
                ..OrderCancelled::default()
            });
            events.push(envelope::new(p, format!("c-{i}"), "", "it"));
        }
        let rows: Vec<_> = events
            .iter()
            .enumerate()
            .map(|(i, e)| (e.clone(), traceparent(i)))
            .collect();
        let txn = db.begin().await.unwrap();
        outbox::enqueue_many_traced(&txn, &rows, None)
            .await
            .unwrap();
        txn.commit().await.unwrap();

        let relay = OutboxRelay::new(&db, Publisher::new(&amqp.broker)).unwrap();
        assert_eq!(relay.relay_batch().await.unwrap(), 12);
        assert_eq!(outbox::pending(&db).await.unwrap(), 0);

        // max 4: order.created in bundles of 4, 4 and 2, order.cancelled in one of 2.
        let expected_messages = if max == 4 { 4 } else { 12 };
        eventually(WAIT, "the messages to be queued", || async {
            (amqp.count(t.queue()).await == expected_messages).then_some(())
        })
        .await
        .unwrap();
        let mut seen: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        let mut sizes = Vec::new();
        while let Some(msg) = amqp.get(t.queue()).await {
            if max == 1 {
                assert_eq!(content_type(&msg), "application/x-protobuf");
                let env = envelope::decode(&msg.delivery.data).unwrap();
                let h = msg
                    .delivery
                    .properties
                    .headers()
                    .clone()
                    .unwrap_or_default();
                let tp = match h.inner().get("traceparent") {
                    Some(AMQPValue::LongString(s)) => s.to_string(),
                    other => panic!("traceparent: {other:?}"),
                };
                seen.insert(env.message_id, BTreeMap::from([("traceparent".into(), tp)]));
                sizes.push(1);
                continue;
            }
            assert_eq!(content_type(&msg), bundle::CONTENT_TYPE);
            let inner = bundle::unpack(&msg.delivery.data).unwrap();
            let routing_key = msg.delivery.routing_key.to_string();
            sizes.push(inner.len());
            for e in inner {
                let env = envelope::decode(&e.envelope).unwrap();
                assert_eq!(env.r#type, routing_key, "a bundle holds one routing key");
                assert!(seen.insert(env.message_id, e.headers).is_none(), "twice");
            }
        }
        sizes.sort_unstable();
        let want_sizes = if max == 4 {
            vec![2, 2, 4, 4]
        } else {
            vec![1; 12]
        };
        assert_eq!(sizes, want_sizes, "max {max}");
        // Every event exactly once, each with its own trace context.
        let want: BTreeMap<String, BTreeMap<String, String>> = events
            .iter()
            .enumerate()
            .map(|(i, e)| (e.message_id.clone(), traceparent(i)))
            .collect();
        assert_eq!(seen, want, "max {max}");
    }
}

/// What the handler of [`each_event_of_a_bundle_is_handled_retried_or_parked_on_its_own`] saw:
/// (correlation id, attempt).
type Seen = Recorder<(String, u32)>;

#[tokio::test]
async fn each_event_of_a_bundle_is_handled_retried_or_parked_on_its_own() {
    let amqp = Amqp::new(config()).await;
    let t = amqp.topology("settle", &[keys::ORDER_CREATED]).await;
    let seen = Seen::default();
    let s = seen.clone();
    let consumer = Consumer::new(&amqp.broker, t.clone(), move |m: Incoming| {
        let id = m.envelope.correlation_id.clone();
        s.push((id.clone(), m.attempt));
        async move {
            match id.as_str() {
                "poison" => Err(HandlerError::permanent(anyhow::anyhow!("poison order"))),
                "flaky" if m.attempt == 1 => Err(HandlerError::transient(anyhow::anyhow!("busy"))),
                _ => Ok(()),
            }
        }
    });
    let running = Running::spawn(|s| consumer.run(s));

    let exchange = amqp.config.exchange.clone();
    let mut parts: Vec<OutgoingMessage> = ["ok-1", "poison", "flaky", "ok-2"]
        .iter()
        .map(|id| OutgoingMessage::for_envelope(&order_created(id), &exchange, keys::ORDER_CREATED))
        .collect();
    parts.push(OutgoingMessage {
        exchange: exchange.clone(),
        routing_key: keys::ORDER_CREATED.to_owned(),
        payload: b"\xff\xfe not an envelope".to_vec(),
        ..OutgoingMessage::default()
    });
    publish_bundle(&Publisher::new(&amqp.broker), &parts).await;

    let dlq = t.dead_letter_queue();
    eventually(WAIT, "every event to be settled", || async {
        let all = seen.all();
        let flaky_retried = all.contains(&("flaky".to_owned(), 2));
        (flaky_retried && amqp.count(&dlq).await == 2).then_some(())
    })
    .await
    .unwrap();
    // Time for a redelivery to show up, were the bundle not acked.
    tokio::time::sleep(Duration::from_millis(300)).await;
    running.stop().await;

    let mut all = seen.all();
    all.sort();
    assert_eq!(
        all,
        vec![
            ("flaky".into(), 1),
            ("flaky".into(), 2),
            ("ok-1".into(), 1),
            ("ok-2".into(), 1),
            ("poison".into(), 1),
        ],
        "each good event once, the flaky one retried alone, the undecodable one never handled"
    );
    assert_eq!(amqp.count(t.queue()).await, 0, "the bundle was acked");
    for i in 1..=t.retries() {
        assert_eq!(amqp.count(&t.retry_queue(i)).await, 0);
    }
    // Parked one by one, as plain messages with their own error.
    let mut errors = BTreeSet::new();
    while let Some(parked) = amqp.get(&dlq).await {
        assert_eq!(content_type(&parked), "application/x-protobuf");
        let h = parked
            .delivery
            .properties
            .headers()
            .clone()
            .unwrap_or_default();
        let err = match h.inner().get(headers::ERROR) {
            Some(AMQPValue::LongString(s)) => s.to_string(),
            other => panic!("error header: {other:?}"),
        };
        match envelope::decode(&parked.delivery.data) {
            Ok(env) => {
                assert_eq!(env.correlation_id, "poison");
                assert_eq!(
                    parked
                        .delivery
                        .properties
                        .message_id()
                        .as_ref()
                        .map(|m| m.to_string()),
                    Some(env.message_id.clone()),
                    "parked under the event's own id"
                );
            }
            Err(_) => assert_eq!(parked.delivery.data, b"\xff\xfe not an envelope".to_vec()),
        }
        errors.insert(err.split(':').next().unwrap_or_default().to_owned());
    }
    assert_eq!(
        errors,
        BTreeSet::from(["permanent".to_owned(), "undecodable".to_owned()])
    );
}

#[tokio::test]
async fn an_undecodable_bundle_is_parked_whole() {
    let amqp = Amqp::new(config()).await;
    let t = amqp.topology("bad-bundle", &[keys::ORDER_CREATED]).await;
    let calls = Recorder::<String>::default();
    let c = calls.clone();
    let consumer = Consumer::new(&amqp.broker, t.clone(), move |m: Incoming| {
        c.push(m.envelope.correlation_id);
        async { Ok(()) }
    });
    let running = Running::spawn(|s| consumer.run(s));
    let garbage = OutgoingMessage {
        exchange: amqp.config.exchange.clone(),
        routing_key: keys::ORDER_CREATED.to_owned(),
        payload: b"\xff\xff\xff\xff".to_vec(),
        content_type: bundle::CONTENT_TYPE.to_owned(),
        ..OutgoingMessage::default()
    };
    Publisher::new(&amqp.broker)
        .publish(&garbage)
        .await
        .unwrap();
    let dlq = t.dead_letter_queue();
    eventually(WAIT, "the bundle to be parked", || async {
        (amqp.count(&dlq).await == 1).then_some(())
    })
    .await
    .unwrap();
    running.stop().await;
    assert_eq!(calls.len(), 0);
    assert_eq!(amqp.count(t.queue()).await, 0);
    let parked = amqp.get(&dlq).await.unwrap();
    assert_eq!(parked.delivery.data, garbage.payload);
    let h = parked
        .delivery
        .properties
        .headers()
        .clone()
        .unwrap_or_default();
    assert!(matches!(
        h.inner().get(headers::ERROR),
        Some(AMQPValue::LongString(s)) if s.to_string().starts_with("undecodable bundle")
    ));
}

#[tokio::test]
async fn a_broadcast_subscriber_hears_every_event_of_a_bundle() {
    let amqp = Amqp::new(config()).await;
    let heard = Arc::new(Mutex::new(Vec::<String>::new()));
    let (h, ready) = (
        heard.clone(),
        Arc::new(std::sync::atomic::AtomicBool::new(false)),
    );
    let r = ready.clone();
    let broker = amqp.broker.clone();
    let running = Running::spawn(move |s| {
        broadcast::run(
            broker,
            vec![keys::STOCK_RELEASED.to_owned()],
            move |env| h.lock().unwrap().push(env.correlation_id),
            move || r.store(true, std::sync::atomic::Ordering::SeqCst),
            s,
        )
    });
    eventually(WAIT, "the subscription", || async {
        ready
            .load(std::sync::atomic::Ordering::SeqCst)
            .then_some(())
    })
    .await
    .unwrap();
    let exchange = amqp.config.exchange.clone();
    let parts: Vec<OutgoingMessage> = (0..3)
        .map(|i| {
            let p = Payload::StockReleased(flashsale_proto::events::v1::StockReleased {
                order_id: format!("r-{i}"),
                ..Default::default()
            });
            let env = envelope::new(p, format!("r-{i}"), "", "it");
            OutgoingMessage::for_envelope(&env, &exchange, keys::STOCK_RELEASED)
        })
        .collect();
    publish_bundle(&Publisher::new(&amqp.broker), &parts).await;
    eventually(WAIT, "the three events", || async {
        (heard.lock().unwrap().len() >= 3).then_some(())
    })
    .await
    .unwrap();
    running.stop().await;
    let mut got = heard.lock().unwrap().clone();
    got.sort();
    assert_eq!(got, vec!["r-0", "r-1", "r-2"]);
}

/// Handler concurrency is counted in events: a consumer with a prefetch of 4 never runs more
/// than 4 handlers at once, however many events its bundles carry.
#[tokio::test]
async fn a_bundle_s_events_run_at_most_prefetch_at_once() {
    let amqp = Amqp::new(AmqpConfig {
        prefetch: 4,
        ..config()
    })
    .await;
    let t = amqp.topology("slots", &[keys::ORDER_CREATED]).await;
    let (running, peak, done) = (
        Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        Recorder::<String>::default(),
    );
    let (r, p, d) = (running.clone(), peak.clone(), done.clone());
    let consumer = Consumer::new(&amqp.broker, t.clone(), move |m: Incoming| {
        let (r, p, d) = (r.clone(), p.clone(), d.clone());
        async move {
            let now = r.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            p.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(5)).await;
            r.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            d.push(m.envelope.correlation_id);
            Ok(())
        }
    });
    let consumer = Running::spawn(|s| consumer.run(s));
    let exchange = amqp.config.exchange.clone();
    let publisher = Publisher::new(&amqp.broker);
    for b in 0..3 {
        let parts: Vec<OutgoingMessage> = (0..40)
            .map(|i| {
                let env = order_created(&format!("s-{b}-{i}"));
                OutgoingMessage::for_envelope(&env, &exchange, keys::ORDER_CREATED)
            })
            .collect();
        publish_bundle(&publisher, &parts).await;
    }
    eventually(WAIT, "all 120 events", || async {
        (done.len() >= 120).then_some(())
    })
    .await
    .unwrap();
    consumer.stop().await;
    let max = peak.load(std::sync::atomic::Ordering::SeqCst);
    assert!(max <= 4, "{max} handlers ran at once with a prefetch of 4");
    assert!(max >= 2, "the events of a bundle run concurrently ({max})");
    assert_eq!(done.all().into_iter().collect::<BTreeSet<_>>().len(), 120);
    assert_eq!(amqp.count(t.queue()).await, 0);
}
