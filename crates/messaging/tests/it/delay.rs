use std::time::{Duration, Instant};

use flashsale_messaging::{Consumer, DelayQueue, Incoming, OutboxRelay, Publisher, keys, outbox};
use flashsale_test_support::eventually;
use sea_orm::TransactionTrait as _;

use crate::helpers::{Amqp, Recorder, Running, WAIT, config, database};

#[tokio::test]
async fn delay_queue_delivers_to_its_routing_key_after_its_ttl() {
    let (_tdb, db) = database().await;
    let amqp = Amqp::new(config()).await;
    let delay = Duration::from_millis(400);
    let dq = DelayQueue::new(&amqp.config, keys::ORDER_PAYMENT_TIMEOUT, delay);
    amqp.forget_later(&dq);
    let t = amqp
        .topology("payment-timeouts", &[keys::ORDER_PAYMENT_TIMEOUT])
        .await;
    let arrivals = Recorder::default();
    let rec = arrivals.clone();
    let consumer = Consumer::new(&amqp.broker, t.clone(), move |m: Incoming| {
        rec.push((
            m.envelope.correlation_id.clone(),
            m.routing_key.clone(),
            Instant::now(),
        ));
        async { Ok(()) }
    });
    let consumer = Running::spawn(|s| consumer.run(s));
    let publisher = Publisher::with_delay_queues(&amqp.broker, vec![dq.clone()]);

    // Directly.
    let sent = Instant::now();
    publisher
        .publish_delayed(&dq, &payment_timeout("direct"))
        .await
        .unwrap();
    eventually(WAIT, "the delayed message", || async {
        (arrivals.len() == 1).then_some(())
    })
    .await
    .unwrap();
    let (id, rk, at) = arrivals.all().remove(0);
    assert_eq!(
        (id.as_str(), rk.as_str()),
        ("direct", keys::ORDER_PAYMENT_TIMEOUT)
    );
    assert!(
        at - sent >= delay,
        "arrived after {:?}, before its delay",
        at - sent
    );

    // Through the outbox.
    let relay = OutboxRelay::new(&db, publisher.clone()).unwrap();
    let relay = Running::spawn(|s| relay.run(s));
    let sent = Instant::now();
    let txn = db.begin().await.unwrap();
    outbox::enqueue_delayed(&txn, &payment_timeout("outbox"), &dq)
        .await
        .unwrap();
    txn.commit().await.unwrap();
    eventually(WAIT, "the delayed outbox message", || async {
        (arrivals.len() == 2).then_some(())
    })
    .await
    .unwrap();
    relay.stop().await;
    consumer.stop().await;
    let (id, _, at) = arrivals.all().remove(1);
    assert_eq!(id, "outbox");
    assert!(
        at - sent >= delay,
        "arrived after {:?}, before its delay",
        at - sent
    );
    assert_eq!(amqp.count(dq.name()).await, 0);
}

fn payment_timeout(order_id: &str) -> flashsale_proto::events::v1::Envelope {
    use flashsale_proto::events::v1::{PaymentTimeout, envelope::Payload};
    let payload = Payload::PaymentTimeout(PaymentTimeout {
        order_id: order_id.to_owned(),
        deadline: None,
        more_order_ids: Vec::new(),
    });
    flashsale_messaging::envelope::new(payload, order_id, "", "it")
}
