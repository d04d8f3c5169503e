use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use flashsale_messaging::{
    Consumer, HandlerError, Incoming, Publisher, dead_letter::count_parked, envelope, headers, keys,
};
use flashsale_platform::error::violated_fields;
use flashsale_proto::admin::v1::{
    DiscardDeadLettersRequest, ListDeadLettersRequest, ReplayDeadLettersRequest,
    dead_letter_service_server::DeadLetterService as _,
};
use flashsale_test_support::eventually;
use lapin::types::AMQPValue;

use super::{Env, TRACEPARENT, as_admin, at};
use crate::helpers::{Recorder, Running, WAIT, order_created};

fn list(queue: &str, page_size: i32, page_token: &str) -> ListDeadLettersRequest {
    ListDeadLettersRequest {
        queue: queue.to_owned(),
        page_size,
        page_token: page_token.to_owned(),
    }
}

#[tokio::test]
async fn list_pages_oldest_first_and_filters_by_queue() {
    let env = Env::new(&["la", "lb"]).await;
    let draining = env.drainer();
    // Parked out of order: the list follows the parking time, not the arrival.
    let (a30, a10, a20, b15) = (
        order_created("a30"),
        order_created("a10"),
        order_created("a20"),
        order_created("b15"),
    );
    env.park(0, &a30, at(30), "e30").await;
    env.park(0, &a10, at(10), "e10").await;
    env.park(0, &a20, at(20), "e20").await;
    env.park(1, &b15, at(15), "e15").await;
    env.wait_parked(0, 3).await;
    env.wait_parked(1, 1).await;
    draining.stop().await;
    let admin = env.admin();

    let first = admin
        .list_dead_letters(as_admin(list("", 2, "")))
        .await
        .unwrap()
        .into_inner();
    let ids = |p: &[flashsale_proto::admin::v1::DeadLetter]| {
        p.iter().map(|d| d.message_id.clone()).collect::<Vec<_>>()
    };
    assert_eq!(
        ids(&first.dead_letters),
        vec![a10.message_id.clone(), b15.message_id.clone()]
    );
    assert!(!first.next_page_token.is_empty());
    let dl = &first.dead_letters[0];
    assert_eq!(dl.queue, env.queue(0));
    assert_eq!(
        (dl.routing_key.as_str(), dl.r#type.as_str()),
        (keys::ORDER_CREATED, keys::ORDER_CREATED)
    );
    assert_eq!((dl.error.as_str(), dl.attempts), ("e10", 5));
    let parked = dl.parked_time.unwrap();
    assert_eq!(
        parked.seconds * 1000 + i64::from(parked.nanos / 1_000_000),
        at(10)
    );
    assert_eq!(dl.payload, envelope::encode(&a10));

    let second = admin
        .list_dead_letters(as_admin(list("", 2, &first.next_page_token)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        ids(&second.dead_letters),
        vec![a20.message_id.clone(), a30.message_id.clone()]
    );
    assert_eq!(second.next_page_token, "", "that was the last page");

    let only_a = admin
        .list_dead_letters(as_admin(list(&env.queue(0), 0, "")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        ids(&only_a.dead_letters),
        vec![
            a10.message_id.clone(),
            a20.message_id.clone(),
            a30.message_id.clone()
        ]
    );
    assert_eq!(only_a.next_page_token, "");

    // A token is only good for the filter it was issued for.
    let err = admin
        .list_dead_letters(as_admin(list(&env.queue(0), 2, &first.next_page_token)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert_eq!(violated_fields(&err), vec!["page_token"]);
}

#[tokio::test]
async fn replay_runs_the_message_through_the_handler_again_and_marks_it_replayed() {
    let env = Env::new(&["replay"]).await;
    let broken = Arc::new(AtomicBool::new(true));
    let handled = Recorder::default();
    let (b, h) = (broken.clone(), handled.clone());
    let consumer = Consumer::new(
        &env.amqp.broker,
        env.topology(0).clone(),
        move |m: Incoming| {
            let fail = b.load(Ordering::SeqCst);
            if !fail {
                h.push((m.message_id.to_string(), m.attempt, m.routing_key.clone()));
            }
            async move {
                if fail {
                    return Err(HandlerError::permanent(anyhow::anyhow!("unknown sku")));
                }
                Ok(())
            }
        },
    );
    let consuming = Running::spawn(|s| consumer.run(s));
    let draining = env.drainer();
    let event = order_created("o-replay");
    Publisher::new(&env.amqp.broker)
        .publish_envelope(&event)
        .await
        .unwrap();
    env.wait_parked(0, 1).await;
    assert_eq!(handled.len(), 0);

    // The bug is fixed; put the message back.
    broken.store(false, Ordering::SeqCst);
    let admin = env.admin();
    let replay = |ids: Vec<String>, all: bool| {
        admin.replay_dead_letters(as_admin(ReplayDeadLettersRequest {
            queue: env.queue(0),
            message_ids: ids,
            all,
        }))
    };
    let n = replay(vec![event.message_id.clone()], false)
        .await
        .unwrap()
        .into_inner()
        .replayed;
    assert_eq!(n, 1);
    eventually(WAIT, "the replayed message to be handled", || async {
        (handled.len() == 1).then_some(())
    })
    .await
    .unwrap();
    assert_eq!(
        handled.all(),
        vec![(event.message_id.clone(), 1, keys::ORDER_CREATED.to_owned())],
        "a fresh attempt, under its original routing key"
    );
    let row = env.row(0, &event.message_id).await;
    assert_eq!(row.state, "REPLAYED");
    assert_eq!(row.resolved_by.as_deref(), Some("it-admin"));

    // Nothing is parked any more: replaying again is a no-op.
    let again = replay(vec![event.message_id.clone()], false)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.replayed, 0);
    assert_eq!(replay(vec![], true).await.unwrap().into_inner().replayed, 0);
    let listed = admin
        .list_dead_letters(as_admin(list("", 0, "")))
        .await
        .unwrap()
        .into_inner();
    assert!(listed.dead_letters.is_empty());
    consuming.stop().await;
    draining.stop().await;
    assert_eq!(handled.len(), 1);
}

#[tokio::test]
async fn replay_all_sends_back_only_that_queue_with_id_type_and_trace_context_and_a_fresh_attempt()
{
    let env = Env::new(&["ra", "rb"]).await;
    let draining = env.drainer();
    let (first, second, other) = (
        order_created("r1"),
        order_created("r2"),
        order_created("r3"),
    );
    env.park(0, &first, at(1), "e1").await;
    env.park(0, &second, at(2), "e2").await;
    env.park(1, &other, at(3), "e3").await;
    env.wait_parked(0, 2).await;
    env.wait_parked(1, 1).await;
    draining.stop().await;

    let n = env
        .admin()
        .replay_dead_letters(as_admin(ReplayDeadLettersRequest {
            queue: env.queue(0),
            message_ids: vec![],
            all: true,
        }))
        .await
        .unwrap()
        .into_inner()
        .replayed;
    assert_eq!(n, 2);
    assert_eq!(count_parked(&env.db, &env.queue(0)).await.unwrap(), 0);
    assert_eq!(
        count_parked(&env.db, &env.queue(1)).await.unwrap(),
        1,
        "other queue untouched"
    );
    assert_eq!(env.amqp.count(&env.queue(1)).await, 0);

    // Nobody consumes the work queue: look at what was put back, oldest first.
    for event in [&first, &second] {
        let msg = env
            .amqp
            .get(&env.queue(0))
            .await
            .expect("a replayed message");
        let p = &msg.delivery.properties;
        assert_eq!(msg.delivery.data, envelope::encode(event));
        assert_eq!(p.message_id().as_ref().unwrap().as_str(), event.message_id);
        assert_eq!(p.kind().as_ref().unwrap().as_str(), keys::ORDER_CREATED);
        let h = p.headers().as_ref().unwrap().inner();
        let s = |k: &str| match h.get(k) {
            Some(AMQPValue::LongString(v)) => v.to_string(),
            other => panic!("header {k}: {other:?}"),
        };
        assert_eq!(s("traceparent"), TRACEPARENT);
        assert_eq!(s(headers::ORIGINAL_ROUTING_KEY), keys::ORDER_CREATED);
        for gone in [
            headers::ATTEMPT,
            headers::ERROR,
            headers::PARKED_AT_MS,
            headers::ORIGINAL_QUEUE,
        ] {
            assert!(!h.contains_key(gone), "{gone} must not survive a replay");
        }
    }
    assert!(env.amqp.get(&env.queue(0)).await.is_none());
}

#[tokio::test]
async fn discard_needs_a_reason_then_marks_the_message_discarded_and_unlists_it() {
    let env = Env::new(&["discard"]).await;
    let draining = env.drainer();
    let (bad, also_bad) = (order_created("d1"), order_created("d2"));
    env.park(0, &bad, at(1), "e1").await;
    env.park(0, &also_bad, at(2), "e2").await;
    env.wait_parked(0, 2).await;
    draining.stop().await;
    let admin = env.admin();
    let discard = |ids: Vec<String>, all: bool, reason: &str| {
        admin.discard_dead_letters(as_admin(DiscardDeadLettersRequest {
            queue: env.queue(0),
            message_ids: ids,
            all,
            reason: reason.to_owned(),
        }))
    };

    let err = discard(vec![bad.message_id.clone()], false, " ")
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert_eq!(violated_fields(&err), vec!["reason"]);
    let err = discard(vec![bad.message_id.clone()], false, &"x".repeat(501))
        .await
        .unwrap_err();
    assert_eq!(violated_fields(&err), vec!["reason"]);
    assert_eq!(env.row(0, &bad.message_id).await.state, "PARKED");

    let n = discard(vec![bad.message_id.clone()], false, "sku was deleted")
        .await
        .unwrap();
    assert_eq!(n.into_inner().discarded, 1);
    let row = env.row(0, &bad.message_id).await;
    assert_eq!(row.state, "DISCARDED");
    assert_eq!(row.resolved_reason.as_deref(), Some("sku was deleted"));
    assert_eq!(row.resolved_by.as_deref(), Some("it-admin"));
    assert_eq!(row.headers["traceparent"], TRACEPARENT);
    let listed = admin
        .list_dead_letters(as_admin(list("", 0, "")))
        .await
        .unwrap()
        .into_inner()
        .dead_letters;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].message_id, also_bad.message_id);

    let again = discard(vec![bad.message_id.clone()], false, "again")
        .await
        .unwrap();
    assert_eq!(again.into_inner().discarded, 0, "no longer parked: skipped");
    let rest = discard(vec![], true, "cleanup").await.unwrap();
    assert_eq!(rest.into_inner().discarded, 1);
    assert_eq!(count_parked(&env.db, &env.queue(0)).await.unwrap(), 0);
    // Discarded, not replayed: nothing went back to the work queue.
    assert_eq!(env.amqp.count(&env.queue(0)).await, 0);
}
