use std::time::Duration;

use flashsale_messaging::{
    AmqpConfig, Consumer, HandlerError, Incoming, OutgoingMessage, Publisher, QueueType, headers,
    keys,
};
use flashsale_test_support::eventually;
use lapin::types::AMQPValue;

use crate::helpers::{Amqp, Recorder, Running, WAIT, config, order_created};

fn header<'a>(msg: &'a lapin::message::BasicGetMessage, key: &str) -> Option<&'a AMQPValue> {
    msg.delivery.properties.headers().as_ref()?.inner().get(key)
}

fn header_string(msg: &lapin::message::BasicGetMessage, key: &str) -> String {
    match header(msg, key) {
        Some(AMQPValue::LongString(s)) => s.to_string(),
        other => panic!("header {key}: {other:?}"),
    }
}

#[tokio::test]
async fn undecodable_message_goes_straight_to_the_dlq() {
    let amqp = Amqp::new(config()).await;
    let t = amqp.topology("undecodable", &[keys::ORDER_CREATED]).await;
    let calls = Recorder::default();
    let seen = calls.clone();
    let consumer = Consumer::new(&amqp.broker, t.clone(), move |m: Incoming| {
        seen.push(m.attempt);
        async { Ok(()) }
    });
    let running = Running::spawn(|s| consumer.run(s));

    let garbage = OutgoingMessage {
        exchange: amqp.config.exchange.clone(),
        routing_key: keys::ORDER_CREATED.to_owned(),
        message_id: "not-a-uuid".to_owned(),
        payload: b"\xff\xfe definitely not protobuf".to_vec(),
        ..OutgoingMessage::default()
    };
    Publisher::new(&amqp.broker)
        .publish(&garbage)
        .await
        .unwrap();

    let dlq = t.dead_letter_queue();
    eventually(WAIT, "the garbage to be parked", || async {
        (amqp.count(&dlq).await == 1).then_some(())
    })
    .await
    .unwrap();
    running.stop().await;

    assert_eq!(calls.len(), 0, "the handler never sees undecodable bytes");
    for i in 1..=t.retries() {
        assert_eq!(
            amqp.count(&t.retry_queue(i)).await,
            0,
            "no retry for undecodable bytes"
        );
    }
    let parked = amqp.get(&dlq).await.unwrap();
    assert!(header_string(&parked, headers::ERROR).starts_with("undecodable"));
    assert_eq!(
        header(&parked, headers::ATTEMPT),
        Some(&AMQPValue::LongLongInt(1))
    );
    assert_eq!(parked.delivery.data, garbage.payload);
}

#[tokio::test]
async fn a_handler_whose_database_is_down_waits_it_out_without_spending_attempts() {
    let amqp = Amqp::new(AmqpConfig {
        max_attempts: 3,
        ..config()
    })
    .await;
    let t = amqp.topology("outage", &[keys::ORDER_CREATED]).await;
    let attempts = Recorder::default();
    let seen = attempts.clone();
    // Down for twice as many runs as the message has attempts, then back.
    let consumer = Consumer::new(&amqp.broker, t.clone(), move |m: Incoming| {
        seen.push(m.attempt);
        let down = seen.len() <= 6;
        async move {
            if down {
                Err(HandlerError::unavailable(anyhow::anyhow!(
                    "the database is out of reach"
                )))
            } else {
                Ok(())
            }
        }
    });
    let running = Running::spawn(|s| consumer.run(s));
    Publisher::new(&amqp.broker)
        .publish_envelope(&order_created("o-outage"))
        .await
        .unwrap();
    eventually(
        WAIT,
        "the message to be handled after the outage",
        || async { (attempts.len() == 7).then_some(()) },
    )
    .await
    .unwrap();
    // Quiet for a moment: no further run, nothing parked, nothing left in the queue.
    tokio::time::sleep(Duration::from_millis(500)).await;
    running.stop().await;
    assert_eq!(attempts.all(), vec![1; 7], "the outage spent no attempt");
    assert_eq!(
        amqp.count(&t.dead_letter_queue()).await,
        0,
        "nothing parked"
    );
    assert_eq!(amqp.count(t.queue()).await, 0);
}

#[tokio::test]
async fn failing_handler_is_retried_then_parked_with_its_error() {
    retried_then_parked(QueueType::Quorum).await;
}

#[tokio::test]
async fn failing_handler_is_retried_then_parked_on_classic_queues_too() {
    retried_then_parked(QueueType::Classic).await;
}

async fn retried_then_parked(queue_type: QueueType) {
    let amqp = Amqp::new(AmqpConfig {
        max_attempts: 4,
        queue_type,
        ..config()
    })
    .await;
    let t = amqp.topology("failing", &[keys::ORDER_CREATED]).await;
    let attempts = Recorder::default();
    let seen = attempts.clone();
    let consumer = Consumer::new(&amqp.broker, t.clone(), move |m: Incoming| {
        seen.push(m.attempt);
        async {
            Err(HandlerError::transient(anyhow::anyhow!(
                "database says boom"
            )))
        }
    });
    let running = Running::spawn(|s| consumer.run(s));

    Publisher::new(&amqp.broker)
        .publish_envelope(&order_created("o-fail"))
        .await
        .unwrap();
    let dlq = t.dead_letter_queue();
    eventually(WAIT, "the message to be parked", || async {
        (amqp.count(&dlq).await == 1).then_some(())
    })
    .await
    .unwrap();
    running.stop().await;

    assert_eq!(
        attempts.all(),
        vec![1, 2, 3, 4],
        "one run per attempt, then parked"
    );
    let parked = amqp.get(&dlq).await.unwrap();
    assert!(header_string(&parked, headers::ERROR).contains("database says boom"));
    assert_eq!(
        header(&parked, headers::ATTEMPT),
        Some(&AMQPValue::LongLongInt(4))
    );
    assert_eq!(
        header_string(&parked, headers::ORIGINAL_ROUTING_KEY),
        keys::ORDER_CREATED
    );
    assert_eq!(header_string(&parked, headers::ORIGINAL_QUEUE), t.queue());
    assert_eq!(amqp.count(t.queue()).await, 0);
}

#[tokio::test]
async fn permanent_error_parks_at_once() {
    let amqp = Amqp::new(config()).await;
    let t = amqp.topology("permanent", &[keys::ORDER_CREATED]).await;
    let attempts = Recorder::default();
    let seen = attempts.clone();
    let consumer = Consumer::new(&amqp.broker, t.clone(), move |m: Incoming| {
        seen.push(m.attempt);
        async { Err(HandlerError::permanent(anyhow::anyhow!("unknown sku"))) }
    });
    let running = Running::spawn(|s| consumer.run(s));
    Publisher::new(&amqp.broker)
        .publish_envelope(&order_created("o-perm"))
        .await
        .unwrap();
    let dlq = t.dead_letter_queue();
    eventually(WAIT, "the message to be parked", || async {
        (amqp.count(&dlq).await == 1).then_some(())
    })
    .await
    .unwrap();
    running.stop().await;
    assert_eq!(attempts.all(), vec![1]);
    let parked = amqp.get(&dlq).await.unwrap();
    assert!(header_string(&parked, headers::ERROR).contains("unknown sku"));
}

#[tokio::test]
async fn healthy_message_is_not_blocked_behind_a_poison_one() {
    // One delivery at a time, and a slow ladder (300 + 600 + 1200 ms): the healthy message can
    // only get through because the poison one left the work queue for a retry queue.
    let amqp = Amqp::new(AmqpConfig {
        prefetch: 1,
        max_attempts: 4,
        retry_base_ms: 300,
        ..config()
    })
    .await;
    let t = amqp.topology("poison", &[keys::ORDER_CREATED]).await;
    let poison_calls = Recorder::default();
    let healthy = Recorder::default();
    let (p, h) = (poison_calls.clone(), healthy.clone());
    let consumer = Consumer::new(&amqp.broker, t.clone(), move |m: Incoming| {
        let poisoned = m.envelope.correlation_id == "poison";
        if poisoned {
            p.push(m.attempt);
        } else {
            h.push(m.envelope.correlation_id.clone());
        }
        async move {
            if poisoned {
                return Err(HandlerError::transient(anyhow::anyhow!("poison")));
            }
            Ok(())
        }
    });
    let running = Running::spawn(|s| consumer.run(s));

    let publisher = Publisher::new(&amqp.broker);
    publisher
        .publish_envelope(&order_created("poison"))
        .await
        .unwrap();
    publisher
        .publish_envelope(&order_created("healthy"))
        .await
        .unwrap();

    eventually(WAIT, "the healthy message to be handled", || async {
        (healthy.len() == 1).then_some(())
    })
    .await
    .unwrap();
    let dlq = t.dead_letter_queue();
    assert!(
        poison_calls.len() < 4,
        "poison still retrying: {:?}",
        poison_calls.all()
    );
    assert_eq!(amqp.count(&dlq).await, 0, "poison not parked yet");

    eventually(
        Duration::from_secs(20),
        "the poison to be parked",
        || async { (amqp.count(&dlq).await == 1).then_some(()) },
    )
    .await
    .unwrap();
    running.stop().await;
    assert_eq!(poison_calls.all(), vec![1, 2, 3, 4]);
    assert_eq!(healthy.all(), vec!["healthy".to_owned()]);
}

#[tokio::test]
async fn panicking_handler_is_retried_then_parked_not_stuck() {
    let amqp = Amqp::new(config()).await;
    let t = amqp.topology("panicky", &[keys::ORDER_CREATED]).await;
    let attempts = Recorder::default();
    let seen = attempts.clone();
    let consumer = Consumer::new(&amqp.broker, t.clone(), move |m: Incoming| {
        seen.push(m.attempt);
        if m.attempt > 0 {
            panic!("handler bug");
        }
        async { Ok(()) }
    });
    let running = Running::spawn(|s| consumer.run(s));
    Publisher::new(&amqp.broker)
        .publish_envelope(&order_created("o-panic"))
        .await
        .unwrap();
    let dlq = t.dead_letter_queue();
    eventually(WAIT, "the message to be parked", || async {
        (amqp.count(&dlq).await == 1).then_some(())
    })
    .await
    .unwrap();
    running.stop().await;
    assert_eq!(attempts.all(), vec![1, 2, 3]);
    let parked = amqp.get(&dlq).await.unwrap();
    assert!(header_string(&parked, headers::ERROR).contains("handler panicked"));
}
