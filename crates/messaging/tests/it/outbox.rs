use std::{collections::BTreeSet, time::Duration};

use flashsale_messaging::{
    Consumer, HandlerError, Incoming, OutboxRelay, Publisher, RelayOptions,
    consumer::FP_AFTER_HANDLE_BEFORE_ACK, inbox, keys, outbox, outbox::FP_AFTER_PUBLISH,
};
use flashsale_platform::failpoint::{Action, Failpoints};
use flashsale_test_support::eventually;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement, TransactionTrait};
use uuid::Uuid;

use crate::helpers::{Amqp, Recorder, Running, WAIT, config, database, order_created};

pub(crate) async fn scalar(db: &DatabaseConnection, sql: &str) -> i64 {
    let row = db
        .query_one_raw(Statement::from_string(DbBackend::Postgres, sql))
        .await
        .unwrap()
        .unwrap();
    row.try_get::<i64>("", "n").unwrap()
}

async fn uuids(db: &DatabaseConnection, sql: &str) -> BTreeSet<Uuid> {
    db.query_all_raw(Statement::from_string(DbBackend::Postgres, sql))
        .await
        .unwrap()
        .iter()
        .map(|r| r.try_get::<Uuid>("", "id").unwrap())
        .collect()
}

/// Applies each message as one `effects` row, deduplicated by the inbox in the same
/// transaction; records every call and every duplicate.
fn effect_handler(
    db: DatabaseConnection,
    calls: Recorder<Uuid>,
    duplicates: Recorder<Uuid>,
) -> impl Fn(Incoming) -> futures_util::future::BoxFuture<'static, Result<(), HandlerError>>
+ Send
+ Sync
+ 'static {
    move |m: Incoming| {
        let (db, calls, duplicates) = (db.clone(), calls.clone(), duplicates.clone());
        Box::pin(async move {
            calls.push(m.message_id);
            let txn = db.begin().await?;
            if !inbox::claim(&txn, "it.effects", m.message_id).await? {
                duplicates.push(m.message_id);
                return Ok(());
            }
            txn.execute_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                "INSERT INTO effects (message_id) VALUES ($1)",
                [m.message_id.into()],
            ))
            .await?;
            txn.commit().await?;
            Ok(())
        })
    }
}

#[tokio::test]
async fn relay_dying_between_publish_and_mark_still_applies_each_row_once() {
    let (_tdb, db) = database().await;
    let amqp = Amqp::new(config()).await;
    let t = amqp.topology("effects", &[keys::ORDER_CREATED]).await;

    let txn = db.begin().await.unwrap();
    let envs: Vec<_> = (0..3).map(|i| order_created(&format!("o-{i}"))).collect();
    outbox::enqueue_many(&txn, &envs).await.unwrap();
    txn.commit().await.unwrap();

    let (calls, duplicates) = (Recorder::default(), Recorder::default());
    let consumer = Consumer::new(
        &amqp.broker,
        t.clone(),
        effect_handler(db.clone(), calls.clone(), duplicates.clone()),
    );
    let consumer = Running::spawn(|s| consumer.run(s));

    // First relay: publishes the batch, then "dies" before marking the rows.
    let fp = Failpoints::default();
    fp.arm(FP_AFTER_PUBLISH, Action::Error);
    let relay1 = OutboxRelay::new(&db, Publisher::new(&amqp.broker))
        .unwrap()
        .with_failpoints(fp);
    let err = relay1.relay_batch().await.unwrap_err();
    assert!(err.to_string().contains(FP_AFTER_PUBLISH), "{err:#}");
    eventually(
        WAIT,
        "every row applied from the first relay's publish",
        || async { (scalar(&db, "SELECT count(*) AS n FROM effects").await == 3).then_some(()) },
    )
    .await
    .unwrap();
    assert_eq!(
        scalar(
            &db,
            "SELECT count(*) AS n FROM outbox WHERE published_at IS NULL"
        )
        .await,
        3,
        "the failed relay marked nothing"
    );

    // Second relay: publishes the same rows again and marks them.
    let relay = OutboxRelay::new(&db, Publisher::new(&amqp.broker)).unwrap();
    let relay2 = Running::spawn(|s| relay.run(s));
    eventually(
        WAIT,
        "rows marked and every second copy dropped",
        || async {
            let unpublished = scalar(
                &db,
                "SELECT count(*) AS n FROM outbox WHERE published_at IS NULL",
            )
            .await;
            (unpublished == 0 && duplicates.len() == 3).then_some(())
        },
    )
    .await
    .unwrap();
    relay2.stop().await;
    consumer.stop().await;

    let outbox_ids = uuids(&db, "SELECT message_id AS id FROM outbox").await;
    let effect_ids = uuids(&db, "SELECT message_id AS id FROM effects").await;
    assert_eq!(outbox_ids.len(), 3);
    assert_eq!(effect_ids, outbox_ids, "one effect per outbox row");
    assert_eq!(
        scalar(&db, "SELECT count(*) AS n FROM effects").await,
        3,
        "no effect applied twice"
    );
    assert_eq!(scalar(&db, "SELECT count(*) AS n FROM inbox").await, 3);
    assert_eq!(calls.len(), 6, "each message was delivered exactly twice");
    let dup_ids: BTreeSet<_> = duplicates.all().into_iter().collect();
    assert_eq!(
        dup_ids, outbox_ids,
        "the inbox dropped the second copy of each"
    );
}

#[tokio::test]
async fn relay_publishes_committed_rows_and_never_rolled_back_ones() {
    let (_tdb, db) = database().await;
    let amqp = Amqp::new(config()).await;
    let t = amqp.topology("committed", &[keys::ORDER_CREATED]).await;
    let received = Recorder::default();
    let seen = received.clone();
    let consumer = Consumer::new(&amqp.broker, t.clone(), move |m: Incoming| {
        seen.push(m.envelope.correlation_id.clone());
        async { Ok(()) }
    });
    let consumer = Running::spawn(|s| consumer.run(s));

    let committed = order_created("committed");
    let txn = db.begin().await.unwrap();
    outbox::enqueue(&txn, &committed).await.unwrap();
    txn.commit().await.unwrap();
    let txn = db.begin().await.unwrap();
    outbox::enqueue(&txn, &order_created("rolled-back"))
        .await
        .unwrap();
    txn.rollback().await.unwrap();

    // A long poll interval: only the first drain and NOTIFY can make the relay publish in time.
    let options = RelayOptions {
        poll_interval: Duration::from_secs(600),
        ..RelayOptions::default()
    };
    let relay = OutboxRelay::new(&db, Publisher::new(&amqp.broker))
        .unwrap()
        .with_options(options);
    let relay = Running::spawn(|s| relay.run(s));
    eventually(WAIT, "the committed row to arrive", || async {
        (received.len() == 1).then_some(())
    })
    .await
    .unwrap();

    // Inserted while the relay sleeps: NOTIFY (sent at commit) wakes it.
    let txn = db.begin().await.unwrap();
    outbox::enqueue(&txn, &order_created("later"))
        .await
        .unwrap();
    txn.commit().await.unwrap();
    eventually(WAIT, "the later row to arrive", || async {
        (received.len() == 2).then_some(())
    })
    .await
    .unwrap();
    relay.stop().await;
    consumer.stop().await;

    assert_eq!(
        received.all(),
        vec!["committed".to_owned(), "later".to_owned()]
    );
    assert_eq!(scalar(&db, "SELECT count(*) AS n FROM outbox").await, 2);
    assert_eq!(
        scalar(
            &db,
            "SELECT count(*) AS n FROM outbox WHERE published_at IS NULL"
        )
        .await,
        0
    );
    assert_eq!(outbox::pending(&db).await.unwrap(), 0);
    assert_eq!(amqp.count(t.queue()).await, 0);
}

#[tokio::test]
async fn batches_in_flight_together_publish_every_row_exactly_once() {
    // 0 counts as 1 (one batch at a time); 4 runs four transactions over disjoint rows.
    for in_flight in [4, 0] {
        let (_tdb, db) = database().await;
        let amqp = Amqp::new(config()).await;
        let t = amqp
            .topology(&format!("in-flight-{in_flight}"), &[keys::ORDER_CREATED])
            .await;
        let received = Recorder::default();
        let seen = received.clone();
        let consumer = Consumer::new(&amqp.broker, t.clone(), move |m: Incoming| {
            seen.push(m.envelope.correlation_id.clone());
            async { Ok(()) }
        });
        let consumer = Running::spawn(|s| consumer.run(s));

        // 95 rows: nine full batches of 10 and a short one, over rounds of four batches.
        let expected: BTreeSet<String> = (0..95).map(|i| format!("row-{i:03}")).collect();
        let txn = db.begin().await.unwrap();
        for id in &expected {
            outbox::enqueue(&txn, &order_created(id)).await.unwrap();
        }
        txn.commit().await.unwrap();

        let options = RelayOptions {
            batch_size: 10,
            batches_in_flight: in_flight,
            poll_interval: Duration::from_secs(600),
            ..RelayOptions::default()
        };
        let relay = OutboxRelay::new(&db, Publisher::new(&amqp.broker))
            .unwrap()
            .with_options(options);
        let relay = Running::spawn(|s| relay.run(s));
        eventually(WAIT, "every row to arrive", || async {
            (received.len() >= expected.len()).then_some(())
        })
        .await
        .unwrap();
        // Time for a duplicate to show up, were one published.
        tokio::time::sleep(Duration::from_millis(300)).await;
        relay.stop().await;
        consumer.stop().await;

        let got = received.all();
        assert_eq!(
            got.len(),
            expected.len(),
            "in flight {in_flight}: a row twice"
        );
        assert_eq!(got.into_iter().collect::<BTreeSet<_>>(), expected);
        assert_eq!(outbox::pending(&db).await.unwrap(), 0);
        assert_eq!(
            scalar(
                &db,
                "SELECT count(*) AS n FROM outbox WHERE published_at IS NOT NULL AND attempts = 1"
            )
            .await,
            95
        );
    }
}

#[tokio::test]
async fn consumer_dying_after_commit_before_ack_applies_the_message_once() {
    let (_tdb, db) = database().await;
    let amqp = Amqp::new(config()).await;
    let t = amqp.topology("crashy", &[keys::ORDER_CREATED]).await;
    let (calls, duplicates) = (Recorder::default(), Recorder::default());
    let fp = Failpoints::default();
    fp.arm_n(FP_AFTER_HANDLE_BEFORE_ACK, Action::Error, Some(1));
    let consumer = Consumer::new(
        &amqp.broker,
        t.clone(),
        effect_handler(db.clone(), calls.clone(), duplicates.clone()),
    )
    .with_failpoints(fp);
    let consumer = Running::spawn(|s| consumer.run(s));

    let env = order_created("o-crash");
    Publisher::new(&amqp.broker)
        .publish_envelope(&env)
        .await
        .unwrap();
    eventually(
        WAIT,
        "the redelivery to be dropped by the inbox",
        || async { (duplicates.len() == 1).then_some(()) },
    )
    .await
    .unwrap();
    consumer.stop().await;

    let id = Uuid::parse_str(&env.message_id).unwrap();
    assert_eq!(calls.all(), vec![id, id], "handled, not acked, redelivered");
    assert_eq!(
        uuids(&db, "SELECT message_id AS id FROM effects").await,
        BTreeSet::from([id])
    );
    assert_eq!(scalar(&db, "SELECT count(*) AS n FROM effects").await, 1);
    assert_eq!(amqp.count(t.queue()).await, 0, "acked in the end");
}

/// A bundle handled, then not acked (the consumer "died"), is delivered again whole: every
/// event of it is dropped by the inbox the second time, so each is applied once.
#[tokio::test]
async fn a_bundle_redelivered_after_a_crash_applies_each_event_once() {
    let (_tdb, db) = database().await;
    let amqp = Amqp::new(config()).await;
    let t = amqp.topology("crashy-bundle", &[keys::ORDER_CREATED]).await;
    let (calls, duplicates) = (Recorder::default(), Recorder::default());
    let fp = Failpoints::default();
    fp.arm_n(FP_AFTER_HANDLE_BEFORE_ACK, Action::Error, Some(1));
    let consumer = Consumer::new(
        &amqp.broker,
        t.clone(),
        effect_handler(db.clone(), calls.clone(), duplicates.clone()),
    )
    .with_failpoints(fp);
    let consumer = Running::spawn(|s| consumer.run(s));

    let envs: Vec<_> = (0..5).map(|i| order_created(&format!("b-{i}"))).collect();
    let txn = db.begin().await.unwrap();
    outbox::enqueue_many(&txn, &envs).await.unwrap();
    txn.commit().await.unwrap();
    let relay = OutboxRelay::new(&db, Publisher::new(&amqp.broker)).unwrap();
    assert_eq!(relay.relay_batch().await.unwrap(), 5);
    eventually(
        WAIT,
        "the redelivered bundle to be dropped by the inbox",
        || async { (duplicates.len() == 5).then_some(()) },
    )
    .await
    .unwrap();
    consumer.stop().await;

    let ids: BTreeSet<Uuid> = envs
        .iter()
        .map(|e| Uuid::parse_str(&e.message_id).unwrap())
        .collect();
    assert_eq!(calls.len(), 10, "each handled, not acked, redelivered");
    assert_eq!(
        uuids(&db, "SELECT message_id AS id FROM effects").await,
        ids
    );
    assert_eq!(scalar(&db, "SELECT count(*) AS n FROM effects").await, 5);
    assert_eq!(amqp.count(t.queue()).await, 0, "acked in the end");
}

#[tokio::test]
async fn refused_outbox_row_is_recorded_and_does_not_hold_up_the_others() {
    let (_tdb, db) = database().await;
    let amqp = Amqp::new(config()).await;
    let t = amqp.topology("refused", &[keys::ORDER_CREATED]).await;

    let txn = db.begin().await.unwrap();
    let nowhere = order_created("nowhere");
    outbox::enqueue_to(
        &txn,
        &nowhere,
        "",
        &format!("{}missing", amqp.config.queue_prefix),
    )
    .await
    .unwrap();
    outbox::enqueue(&txn, &order_created("fine")).await.unwrap();
    txn.commit().await.unwrap();

    let relay = OutboxRelay::new(&db, Publisher::new(&amqp.broker)).unwrap();
    assert_eq!(relay.relay_batch().await.unwrap(), 2);
    assert_eq!(amqp.count(t.queue()).await, 1, "the routable row went out");
    let row = db
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "SELECT attempts, last_error, published_at IS NULL AS pending, \
                    next_attempt_at > now() AS backing_off \
             FROM outbox WHERE message_id = $1",
            [Uuid::parse_str(&nowhere.message_id).unwrap().into()],
        ))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.try_get::<i32>("", "attempts").unwrap(), 1);
    assert!(
        row.try_get::<String>("", "last_error")
            .unwrap()
            .contains("unroutable")
    );
    assert!(row.try_get::<bool>("", "pending").unwrap());
    assert!(row.try_get::<bool>("", "backing_off").unwrap());
    // Backing off: the next batch does not even pick it up.
    assert_eq!(relay.relay_batch().await.unwrap(), 0);
    assert_eq!(outbox::pending(&db).await.unwrap(), 1);
}

#[tokio::test]
async fn relays_of_two_replicas_over_one_outbox_publish_every_row_exactly_once() {
    let (tdb, db) = database().await;
    let amqp = Amqp::new(config()).await;
    let t = amqp.topology("two-relays", &[keys::ORDER_CREATED]).await;
    let received = Recorder::default();
    let seen = received.clone();
    let consumer = Consumer::new(&amqp.broker, t.clone(), move |m: Incoming| {
        seen.push(m.envelope.correlation_id.clone());
        async { Ok(()) }
    });
    let consumer = Running::spawn(|s| consumer.run(s));

    // Two replicas: each its own pool and its own relay, both woken by every commit.
    let options = RelayOptions {
        batch_size: 7,
        batches_in_flight: 2,
        ..RelayOptions::default()
    };
    let mut relays = Vec::new();
    for pool in [db.clone(), tdb.connect().await.unwrap()] {
        let relay = OutboxRelay::new(&pool, Publisher::new(&amqp.broker))
            .unwrap()
            .with_options(options.clone());
        relays.push(Running::spawn(|s| relay.run(s)));
    }
    // Rows committed while both relays run, in small transactions, as the services write them.
    let expected: BTreeSet<String> = (0..200).map(|i| format!("row-{i:03}")).collect();
    let ids: Vec<&String> = expected.iter().collect();
    for chunk in ids.chunks(5) {
        let txn = db.begin().await.unwrap();
        for id in chunk {
            outbox::enqueue(&txn, &order_created(id)).await.unwrap();
        }
        txn.commit().await.unwrap();
    }
    eventually(WAIT, "every row to arrive", || async {
        (received.len() >= expected.len()).then_some(())
    })
    .await
    .unwrap();
    // Time for a duplicate to show up, were one published.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for relay in relays {
        relay.stop().await;
    }
    consumer.stop().await;

    let got = received.all();
    assert_eq!(got.len(), expected.len(), "a row was published twice");
    assert_eq!(got.into_iter().collect::<BTreeSet<_>>(), expected);
    assert_eq!(
        scalar(
            &db,
            "SELECT count(*) AS n FROM outbox WHERE published_at IS NOT NULL AND attempts = 1"
        )
        .await,
        200
    );
}

#[tokio::test]
async fn a_relay_keeping_no_published_row_deletes_each_in_the_transaction_that_publishes_it() {
    let (_tdb, db) = database().await;
    let amqp = Amqp::new(config()).await;
    let t = amqp.topology("deleting", &[keys::ORDER_CREATED]).await;
    let received = Recorder::default();
    let seen = received.clone();
    let consumer = Consumer::new(&amqp.broker, t.clone(), move |m: Incoming| {
        seen.push(m.envelope.correlation_id.clone());
        async { Ok(()) }
    });
    let consumer = Running::spawn(|s| consumer.run(s));
    let mut expected = BTreeSet::new();
    for i in 0..30 {
        let txn = db.begin().await.unwrap();
        outbox::enqueue(&txn, &order_created(&format!("d{i}")))
            .await
            .unwrap();
        txn.commit().await.unwrap();
        expected.insert(format!("d{i}"));
    }
    let options = RelayOptions {
        batch_size: 8,
        retention: Duration::ZERO,
        ..RelayOptions::default()
    };
    let relay = OutboxRelay::new(&db, Publisher::new(&amqp.broker))
        .unwrap()
        .with_options(options);
    let relay = Running::spawn(|s| relay.run(s));
    eventually(WAIT, "every row to arrive", || async {
        (received.len() >= expected.len()).then_some(())
    })
    .await
    .unwrap();
    relay.stop().await;
    consumer.stop().await;
    let got = received.all();
    assert_eq!(got.len(), expected.len(), "a row twice: {got:?}");
    assert_eq!(got.into_iter().collect::<BTreeSet<_>>(), expected);
    assert_eq!(
        scalar(&db, "SELECT count(*) AS n FROM outbox").await,
        0,
        "published rows are gone"
    );
}

#[tokio::test]
async fn the_backlog_counts_the_unpublished_rows_and_the_oldest_ones_wait() {
    let (_tdb, db) = database().await;
    let amqp = Amqp::new(config()).await;
    // A queue bound to the rows' key, so that the broker routes them.
    let _t = amqp.topology("backlog", &[keys::ORDER_CREATED]).await;
    let relay = OutboxRelay::new(&db, Publisher::new(&amqp.broker)).unwrap();
    let (rows, age) = relay.backlog().await.unwrap();
    assert_eq!(
        (rows, age),
        (0, Duration::ZERO),
        "an empty outbox waits for nothing"
    );
    let txn = db.begin().await.unwrap();
    let envs: Vec<_> = (0..3).map(|i| order_created(&format!("b-{i}"))).collect();
    outbox::enqueue_many(&txn, &envs).await.unwrap();
    txn.commit().await.unwrap();
    // The oldest row is made to have waited a minute.
    db.execute_unprepared(
        "UPDATE outbox SET created_at = now() - interval '60 seconds' \
         WHERE id = (SELECT MIN(id) FROM outbox)",
    )
    .await
    .unwrap();
    let (rows, age) = relay.backlog().await.unwrap();
    assert_eq!(rows, 3);
    assert!(
        (Duration::from_secs(59)..Duration::from_secs(120)).contains(&age),
        "{age:?}"
    );
    // Published, the rows are no longer waiting.
    assert_eq!(relay.relay_batch().await.unwrap(), 3);
    assert_eq!(relay.backlog().await.unwrap(), (0, Duration::ZERO));
}
