//! The inbox purger against PostgreSQL: old rows go in batches, young rows stay, a duplicate
//! inside the retention is still dropped; and the waiting messages of a saga found by its
//! correlation id.

use std::time::Duration;

use flashsale_messaging::{
    inbox::{self, PurgeOptions},
    migration::{AddDeadLetterCorrelation, CreateDeadLetters},
    outbox,
    waiting::{self, Place},
};
use flashsale_platform::shutdown::Shutdown;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};
use sea_orm_migration::{MigrationTrait, SchemaManager};
use uuid::Uuid;

use crate::helpers::{database, order_created};

const WEEK: Duration = Duration::from_secs(7 * 24 * 3_600);

async fn count(db: &DatabaseConnection, sql: &str) -> i64 {
    let row = db
        .query_one_raw(Statement::from_string(DbBackend::Postgres, sql))
        .await
        .unwrap()
        .unwrap();
    row.try_get::<i64>("", "n").unwrap()
}

/// `n` inbox rows of `consumer` processed `days` ago.
async fn aged_rows(db: &DatabaseConnection, consumer: &str, n: i64, days: i64) {
    db.execute_raw(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "INSERT INTO inbox (consumer, message_id, processed_at) \
         SELECT $1, gen_random_uuid(), now() - make_interval(days => $3::int) \
         FROM generate_series(1, $2)",
        [consumer.into(), n.into(), days.into()],
    ))
    .await
    .unwrap();
}

#[tokio::test]
async fn old_rows_are_purged_in_batches_and_young_rows_kept() {
    let (_tdb, db) = database().await;
    aged_rows(&db, "it.old", 2_500, 8).await;
    aged_rows(&db, "it.young", 10, 6).await;
    for _ in 0..5 {
        assert!(inbox::claim(&db, "it.fresh", Uuid::new_v4()).await.unwrap());
    }

    // One statement deletes one batch, no more.
    assert_eq!(inbox::purge_batch(&db, WEEK, 1_000).await.unwrap(), 1_000);
    assert_eq!(count(&db, "SELECT count(*) AS n FROM inbox").await, 1_515);

    // A pass works through the rest, batch after batch, and leaves the young rows.
    let options = PurgeOptions {
        retention: WEEK,
        batch: 600,
        pause: Duration::from_millis(1),
        ..PurgeOptions::default()
    };
    let purged = inbox::purge_pass(&db, &options, &Shutdown::new())
        .await
        .unwrap();
    assert_eq!(purged, 1_500);
    assert_eq!(
        count(
            &db,
            "SELECT count(*) AS n FROM inbox WHERE consumer = 'it.old'"
        )
        .await,
        0
    );
    assert_eq!(count(&db, "SELECT count(*) AS n FROM inbox").await, 15);
    assert_eq!(
        inbox::purge_pass(&db, &options, &Shutdown::new())
            .await
            .unwrap(),
        0
    );
}

#[tokio::test]
async fn a_pass_stops_between_batches_on_shutdown() {
    let (_tdb, db) = database().await;
    aged_rows(&db, "it.old", 300, 8).await;
    let stop = Shutdown::new();
    stop.trigger();
    let options = PurgeOptions {
        retention: WEEK,
        batch: 100,
        ..PurgeOptions::default()
    };
    assert_eq!(inbox::purge_pass(&db, &options, &stop).await.unwrap(), 100);
    assert_eq!(count(&db, "SELECT count(*) AS n FROM inbox").await, 200);
}

#[tokio::test]
async fn the_purger_runs_on_its_interval_and_stops_on_shutdown() {
    let (_tdb, db) = database().await;
    aged_rows(&db, "it.old", 50, 8).await;
    let stop = Shutdown::new();
    let options = PurgeOptions {
        retention: WEEK,
        batch: 20,
        interval: Duration::from_millis(50),
        pause: Duration::from_millis(1),
    };
    let task = tokio::spawn(inbox::run_purger(db.clone(), options, stop.clone()));
    flashsale_test_support::eventually(Duration::from_secs(10), "inbox purged", || async {
        (count(&db, "SELECT count(*) AS n FROM inbox").await == 0).then_some(())
    })
    .await
    .unwrap();
    stop.trigger();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the purger stops on shutdown")
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn a_duplicate_inside_the_retention_is_still_dropped() {
    let (_tdb, db) = database().await;
    let id = Uuid::new_v4();
    assert!(inbox::claim(&db, "it.effects", id).await.unwrap());
    let age = |days: i64| {
        Statement::from_sql_and_values(
            DbBackend::Postgres,
            "UPDATE inbox SET processed_at = now() - make_interval(days => $1::int)",
            [days.into()],
        )
    };
    let options = PurgeOptions {
        retention: WEEK,
        ..PurgeOptions::default()
    };

    db.execute_raw(age(6)).await.unwrap();
    inbox::purge_pass(&db, &options, &Shutdown::new())
        .await
        .unwrap();
    assert!(
        !inbox::claim(&db, "it.effects", id).await.unwrap(),
        "a redelivery within the retention is a duplicate"
    );

    // Past the retention the row is gone: this is why the retention must exceed every
    // redelivery window.
    db.execute_raw(age(8)).await.unwrap();
    assert_eq!(
        inbox::purge_pass(&db, &options, &Shutdown::new())
            .await
            .unwrap(),
        1
    );
    assert!(inbox::claim(&db, "it.effects", id).await.unwrap());
}

#[tokio::test]
async fn waiting_messages_are_found_by_their_correlation_id() {
    let (_tdb, db) = database().await;
    CreateDeadLetters
        .up(&SchemaManager::new(&db))
        .await
        .unwrap();
    AddDeadLetterCorrelation
        .up(&SchemaManager::new(&db))
        .await
        .unwrap();
    let (a, b) = (Uuid::new_v4().to_string(), Uuid::new_v4().to_string());
    // `o-1` is a prefix of `o-10`: its bytes are found in the other's row, the decode says no.
    let envs = [
        order_created(&a),
        order_created(&b),
        order_created("o-1"),
        order_created("o-10"),
    ];
    outbox::enqueue_many(&db, &envs).await.unwrap();
    let published = order_created(&a);
    outbox::enqueue(&db, &published).await.unwrap();
    db.execute_raw(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "UPDATE outbox SET published_at = now() WHERE message_id = $1",
        [Uuid::parse_str(&published.message_id).unwrap().into()],
    ))
    .await
    .unwrap();
    let parked = order_created(&a);
    let discarded = order_created(&a);
    for (env, state) in [(&parked, "PARKED"), (&discarded, "DISCARDED")] {
        db.execute_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "INSERT INTO dead_letters (queue, message_id, routing_key, message_type, error, \
             attempts, parked_at, payload, state, resolved_at) \
             VALUES ('it.q', $1, 'order.created', 'order.created', 'boom', 3, now(), $2, $3, \
             CASE WHEN $3 = 'PARKED' THEN NULL ELSE now() END)",
            [
                Uuid::parse_str(&env.message_id).unwrap().into(),
                flashsale_messaging::envelope::encode(env).into(),
                state.into(),
            ],
        ))
        .await
        .unwrap();
    }

    let found = waiting::for_correlations(&db, &[a.clone(), "o-1".to_owned()])
        .await
        .unwrap();
    let seen: Vec<_> = found
        .iter()
        .map(|w| (w.correlation_id.as_str(), w.place, w.message_id.to_string()))
        .collect();
    assert_eq!(
        seen,
        [
            (a.as_str(), Place::Outbox, envs[0].message_id.clone()),
            ("o-1", Place::Outbox, envs[2].message_id.clone()),
            (a.as_str(), Place::DeadLetter, parked.message_id.clone()),
        ]
    );
    let dead = &found[2];
    assert_eq!(
        (dead.queue.as_str(), dead.error.as_str(), dead.attempts),
        ("it.q", "boom", 3)
    );
    assert!(
        waiting::for_correlations(&db, &[])
            .await
            .unwrap()
            .is_empty()
    );
}
