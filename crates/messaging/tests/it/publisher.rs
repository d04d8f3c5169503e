use flashsale_messaging::{OutgoingMessage, PublishError, Publisher, keys};

use crate::helpers::{Amqp, config, order_created};

#[tokio::test]
async fn unroutable_publish_with_mandatory_is_an_error() {
    let amqp = Amqp::new(config()).await;
    let publisher = Publisher::new(&amqp.broker);

    // The exchange exists (the publisher declares it) but no queue is bound yet.
    let err = publisher
        .publish_envelope(&order_created("o-1"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, PublishError::Unroutable { routing_key, .. } if routing_key == keys::ORDER_CREATED),
        "{err:?}"
    );

    // Default exchange, no such queue.
    let msg = OutgoingMessage {
        routing_key: format!("{}missing", amqp.config.queue_prefix),
        payload: b"x".to_vec(),
        ..OutgoingMessage::default()
    };
    let err = publisher.publish(&msg).await.unwrap_err();
    assert!(matches!(err, PublishError::Unroutable { .. }), "{err:?}");

    // Once a queue is bound the same publish is confirmed and lands in it.
    let t = amqp.topology("sink", &[keys::ORDER_CREATED]).await;
    publisher
        .publish_envelope(&order_created("o-1"))
        .await
        .unwrap();
    assert_eq!(amqp.count(t.queue()).await, 1);

    // A batch reports each message on its own.
    let good = OutgoingMessage::for_envelope(
        &order_created("o-2"),
        publisher.exchange(),
        keys::ORDER_CREATED,
    );
    let bad = OutgoingMessage::for_envelope(
        &order_created("o-3"),
        publisher.exchange(),
        keys::ORDER_PAID,
    );
    let results = publisher.publish_batch(&[good.clone(), bad, good]).await;
    assert!(results[0].is_ok() && results[2].is_ok(), "{results:?}");
    assert!(
        matches!(results[1], Err(PublishError::Unroutable { .. })),
        "{results:?}"
    );
}
