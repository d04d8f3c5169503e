use flashsale_messaging::{
    Consumer, HandlerError, Incoming, OutgoingMessage, Publisher, envelope, keys,
};
use flashsale_proto::admin::v1::{
    ListDeadLettersRequest, ReplayDeadLettersRequest,
    dead_letter_service_server::DeadLetterService as _,
};
use flashsale_test_support::eventually;

use super::{Env, as_admin, at};
use crate::helpers::{Running, WAIT, order_created};

#[tokio::test]
async fn message_a_handler_keeps_failing_is_stored_with_its_error_attempts_and_routing_key() {
    let env = Env::new(&["failing"]).await;
    let consumer = Consumer::new(
        &env.amqp.broker,
        env.topology(0).clone(),
        |_m: Incoming| async { Err(HandlerError::transient(anyhow::anyhow!("ledger is locked"))) },
    );
    let consuming = Running::spawn(|s| consumer.run(s));
    let draining = env.drainer();

    let event = order_created("o-dl-1");
    Publisher::new(&env.amqp.broker)
        .publish_envelope(&event)
        .await
        .unwrap();
    env.wait_parked(0, 1).await;
    let dlq = env.topology(0).dead_letter_queue();
    eventually(WAIT, "the parking lot to be drained", || async {
        (env.amqp.count(&dlq).await == 0).then_some(())
    })
    .await
    .unwrap();
    consuming.stop().await;
    draining.stop().await;

    let row = env.row(0, &event.message_id).await;
    assert_eq!(row.message_id, event.message_id);
    assert_eq!(row.state, "PARKED");
    assert!(row.error.contains("ledger is locked"), "{}", row.error);
    assert_eq!(row.attempts, 3, "config() allows 3 attempts");
    assert_eq!(row.routing_key, keys::ORDER_CREATED);
    assert_eq!(row.message_type, keys::ORDER_CREATED);
    assert_eq!(row.payload, envelope::encode(&event));
    assert_eq!(env.row_count(0).await, 1);
}

#[tokio::test]
async fn undecodable_message_is_stored_with_its_raw_bytes() {
    let env = Env::new(&["garbage"]).await;
    let consumer = Consumer::new(
        &env.amqp.broker,
        env.topology(0).clone(),
        |_m: Incoming| async { Ok(()) },
    );
    let consuming = Running::spawn(|s| consumer.run(s));
    let draining = env.drainer();

    let garbage = OutgoingMessage {
        exchange: env.amqp.config.exchange.clone(),
        routing_key: keys::ORDER_CREATED.to_owned(),
        message_id: "not-a-uuid".to_owned(),
        payload: b"\xff\xfe not protobuf at all".to_vec(),
        ..OutgoingMessage::default()
    };
    Publisher::new(&env.amqp.broker)
        .publish(&garbage)
        .await
        .unwrap();
    env.wait_parked(0, 1).await;
    consuming.stop().await;
    draining.stop().await;

    // Its id is derived from the bytes; the admin lists it like any other.
    let listed = env
        .admin()
        .list_dead_letters(as_admin(ListDeadLettersRequest::default()))
        .await
        .unwrap()
        .into_inner()
        .dead_letters;
    assert_eq!(listed.len(), 1);
    let dl = &listed[0];
    assert!(uuid::Uuid::parse_str(&dl.message_id).is_ok());
    assert_eq!(dl.payload, garbage.payload);
    assert!(dl.error.starts_with("undecodable"), "{}", dl.error);
    assert_eq!(dl.routing_key, keys::ORDER_CREATED);
    assert_eq!(dl.attempts, 1);
    let row = env.row(0, &dl.message_id).await;
    assert_eq!(row.payload, garbage.payload);
}

#[tokio::test]
async fn duplicate_parkings_are_stored_once_but_a_parking_after_a_replay_is_kept() {
    let env = Env::new(&["twice"]).await;
    let draining = env.drainer();
    let event = order_created("o-twice");
    // The same parked message twice (a redelivery to the drainer looks just like this).
    env.park(0, &event, at(1), "boom").await;
    env.park(0, &event, at(1), "boom").await;
    // A second copy of the message (at-least-once publishing), parked on its own while the
    // first is still parked: one parked row per message id is enough to replay it.
    env.park(0, &event, at(4), "boom").await;
    // A later message on the same lot: once it is stored, both copies have been handled.
    let sentinel = order_created("o-sentinel");
    env.park(0, &sentinel, at(2), "boom").await;
    env.wait_parked(0, 2).await;
    env.row(0, &sentinel.message_id).await;
    assert_eq!(
        env.row_count(0).await,
        2,
        "the duplicate parking is not stored"
    );

    // Replayed (nobody consumes, it just waits in the work queue), then parked again with a
    // new error: the new parking gets a row of its own instead of being swallowed.
    let replayed = env
        .admin()
        .replay_dead_letters(as_admin(ReplayDeadLettersRequest {
            queue: env.queue(0),
            message_ids: vec![event.message_id.clone()],
            all: false,
        }))
        .await
        .unwrap()
        .into_inner()
        .replayed;
    assert_eq!(replayed, 1);
    env.wait_parked(0, 1).await;
    env.park(0, &event, at(3), "boom again").await;
    env.wait_parked(0, 2).await;
    draining.stop().await;

    let row = env.row(0, &event.message_id).await;
    assert_eq!(
        (row.state.as_str(), row.error.as_str()),
        ("PARKED", "boom again")
    );
    assert_eq!(env.row_count(0).await, 3);
    let dlq = env.topology(0).dead_letter_queue();
    assert_eq!(
        env.amqp.count(&dlq).await,
        0,
        "nothing left in the parking lot"
    );
}
