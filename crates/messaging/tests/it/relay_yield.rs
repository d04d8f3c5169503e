//! A relay that yields to the foreground: it waits for a quiet moment, and still publishes
//! within its maximum lag during a burst that never ends.

use std::time::Duration;

use flashsale_messaging::{Consumer, Incoming, OutboxRelay, Publisher, RelayOptions, keys, outbox};
use flashsale_test_support::eventually;
use sea_orm::DatabaseConnection;

use crate::{
    helpers::{Amqp, Recorder, Running, WAIT, config, database, order_created},
    outbox::scalar,
};

/// A relay yielding to a foreground kept busy (marked every 10 ms, for 30 s at most) from the
/// start, and a consumer recording the correlation ids it receives.
struct Yielding {
    received: Recorder<String>,
    foreground: flashsale_platform::pressure::Foreground,
    burst: tokio::task::JoinHandle<()>,
    stop_burst: tokio::sync::oneshot::Sender<()>,
    relay: Running,
    consumer: Running,
}

async fn yielding(
    db: &DatabaseConnection,
    amqp: &Amqp,
    queue: &str,
    quiet: Duration,
    max_lag: Duration,
) -> Yielding {
    use flashsale_platform::pressure::{Foreground, Yield};
    let t = amqp.topology(queue, &[keys::ORDER_CREATED]).await;
    let received = Recorder::default();
    let seen = received.clone();
    let consumer = Consumer::new(&amqp.broker, t.clone(), move |m: Incoming| {
        seen.push(m.envelope.correlation_id.clone());
        async { Ok(()) }
    });
    let consumer = Running::spawn(|s| consumer.run(s));
    let foreground = Foreground::new();
    let (stop_burst, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let fg = foreground.clone();
    let burst = tokio::spawn(async move {
        for _ in 0..3_000 {
            fg.mark();
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(10)) => {}
                _ = &mut stopped => return,
            }
        }
    });
    let options = RelayOptions {
        yield_to: Some(Yield {
            foreground: foreground.clone(),
            quiet,
            max_lag,
        }),
        ..RelayOptions::default()
    };
    let relay = OutboxRelay::new(db, Publisher::new(&amqp.broker))
        .unwrap()
        .with_options(options);
    let relay = Running::spawn(|s| relay.run(s));
    Yielding {
        received,
        foreground,
        burst,
        stop_burst,
        relay,
        consumer,
    }
}

#[tokio::test]
async fn a_relay_that_yields_waits_for_the_foreground_to_be_quiet() {
    let (_tdb, db) = database().await;
    let amqp = Amqp::new(config()).await;
    let y = yielding(
        &db,
        &amqp,
        "yielding",
        Duration::from_millis(200),
        Duration::from_secs(60),
    )
    .await;
    let received = y.received.clone();
    outbox::enqueue(&db, &order_created("during-the-burst"))
        .await
        .unwrap();
    // A relay that did not yield publishes within milliseconds; this one holds the row while
    // the foreground is busy.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(received.len(), 0, "published during the burst");
    assert_eq!(
        scalar(
            &db,
            "SELECT count(*) AS n FROM outbox WHERE published_at IS NULL"
        )
        .await,
        1
    );
    let _ = y.stop_burst.send(());
    y.burst.await.unwrap();
    eventually(WAIT, "the row to go out once the burst ended", || async {
        (received.len() == 1).then_some(())
    })
    .await
    .unwrap();
    y.relay.stop().await;
    y.consumer.stop().await;
    assert_eq!(received.all(), vec!["during-the-burst".to_owned()]);
}

#[tokio::test]
async fn a_relay_that_yields_still_publishes_within_its_max_lag_during_an_endless_burst() {
    let (_tdb, db) = database().await;
    let amqp = Amqp::new(config()).await;
    let y = yielding(
        &db,
        &amqp,
        "lagging",
        Duration::from_secs(10),
        Duration::from_millis(300),
    )
    .await;
    let received = y.received.clone();
    outbox::enqueue(&db, &order_created("despite-the-burst"))
        .await
        .unwrap();
    eventually(
        WAIT,
        "the row to go out although the burst goes on",
        || async { (received.len() == 1).then_some(()) },
    )
    .await
    .unwrap();
    // The foreground never went quiet for the 10 s the relay would have waited for.
    assert!(
        y.foreground
            .quiet_for()
            .is_some_and(|q| q < Duration::from_secs(1)),
        "the burst stopped"
    );
    assert!(!y.burst.is_finished(), "the burst stopped");
    let _ = y.stop_burst.send(());
    y.burst.await.unwrap();
    y.relay.stop().await;
    y.consumer.stop().await;
    assert_eq!(received.all(), vec!["despite-the-burst".to_owned()]);
}

#[tokio::test]
async fn a_relay_stopped_while_it_holds_rows_back_publishes_them_before_it_returns() {
    let (_tdb, db) = database().await;
    let amqp = Amqp::new(config()).await;
    let y = yielding(
        &db,
        &amqp,
        "flushing",
        Duration::from_millis(200),
        Duration::from_secs(60),
    )
    .await;
    let received = y.received.clone();
    outbox::enqueue(&db, &order_created("held-at-stop"))
        .await
        .unwrap();
    // The burst goes on: the relay holds the row back until it is told to stop.
    y.relay.stop().await;
    assert_eq!(
        scalar(
            &db,
            "SELECT count(*) AS n FROM outbox WHERE published_at IS NULL"
        )
        .await,
        0,
        "the row was left unpublished"
    );
    eventually(WAIT, "the flushed row to arrive", || async {
        (received.len() == 1).then_some(())
    })
    .await
    .unwrap();
    let _ = y.stop_burst.send(());
    y.burst.await.unwrap();
    y.consumer.stop().await;
    assert_eq!(received.all(), vec!["held-at-stop".to_owned()]);
}
