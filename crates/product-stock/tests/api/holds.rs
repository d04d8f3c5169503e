//! Acknowledged orders keep their units: the hold sweeper asks the order service before it
//! gives a hold away, and a rebuilt gate holds the orders acknowledged but not yet persisted
//! (docs/architecture.md#operations, docs/architecture.md#the-stock-model).

use std::time::Duration;

use flashsale_proto::product::v1::DeductionPolicy;
use flashsale_test_support::{TestDatabase, grpc::http_get};
use tonic::Code;
use uuid::Uuid;

use crate::{
    helpers::{
        FakeStatus, TestApp, reason, service, spawn_with, spawn_with_order_client, test_settings,
    },
    reserve::reserve_req,
    saga::{cancelled, created},
};

const RTC: DeductionPolicy = DeductionPolicy::ReserveThenCommit;

/// An app whose holds expire after 300 ms, swept every 100 ms.
fn quick_sweep(db: &TestDatabase) -> flashsale_product_stock::config::Settings {
    let mut s = test_settings(db);
    s.stock.hold_ttl_ms = 300;
    s.stock.sweep_interval_ms = 100;
    s
}

async fn reserve(
    app: &TestApp,
    order: Uuid,
    user: &str,
    sku: &str,
    q: i64,
) -> Result<i64, tonic::Status> {
    app.client()
        .await
        .reserve_stock(service(reserve_req(order, user, sku, q)))
        .await
        .map(|r| r.into_inner().gate_available)
}

async fn gate(app: &TestApp, sku: &str) -> (i64, i64) {
    let s = app.gate.snapshot(sku).await.unwrap().unwrap();
    (s.available, s.held)
}

/// Several sweeps' time past the TTL.
async fn let_sweeps_run() {
    tokio::time::sleep(Duration::from_millis(1_200)).await;
}

/// A replay of an order's CreateOrder after the gate's record of it expired
/// (`stock.order_record_ttl_secs`, a week by default) is judged afresh and takes the order's
/// units a second time; the order service answers the existing order. The sweeper finds the
/// database reserved that order long before the hold, and puts the units back on sale.
#[tokio::test]
async fn a_hold_retaken_by_a_replay_long_after_its_order_was_reserved_goes_back_on_sale() {
    let db = TestDatabase::create().await.unwrap();
    let app = spawn_with(quick_sweep(&db), db).await;
    app.create("HR", 10, 0, RTC).await;
    let order = Uuid::new_v4();
    app.orders.put("HR", order, "u1", 2, FakeStatus::Pending);
    reserve(&app, order, "u1", "HR", 2).await.unwrap();
    app.publish(created(order, "u1", "HR", 2), &order.to_string())
        .await;
    app.wait_count("SELECT reserved AS n FROM stock", 2).await;
    app.wait_gate("HR", (8, 0)).await;

    // A week on: the gate's record of the order is gone, the reservation is that old.
    let record = app.gate.keys("HR").unwrap().order(order);
    let mut conn = deadpool_redis::redis::Client::open(flashsale_test_support::redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let deleted: i64 = deadpool_redis::redis::cmd("DEL")
        .arg(&record)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(deleted, 1, "the order's record {record}");
    app.exec("UPDATE reservations SET created_at = now() - interval '8 days'")
        .await;

    // The replay takes the units again.
    assert_eq!(reserve(&app, order, "u1", "HR", 2).await.unwrap(), 6);
    // Once the hold is older than the TTL, the sweeper gives it back: the order's units are
    // counted once, by its reservation.
    app.wait_gate("HR", (8, 0)).await;
    assert_eq!(
        app.count("SELECT (on_hand - reserved)::bigint AS n FROM stock")
            .await,
        8
    );
    assert_eq!(
        app.count("SELECT COUNT(*) AS n FROM reservations WHERE state = 'RESERVED'")
            .await,
        1,
        "the order's reservation is untouched"
    );
    assert!(app.outbox_of("stock.reservation_failed").await.is_empty());
}

#[tokio::test]
async fn the_sweeper_keeps_an_expired_hold_whose_order_exists() {
    let db = TestDatabase::create().await.unwrap();
    let app = spawn_with(quick_sweep(&db), db).await;
    app.create("HK", 4, 0, RTC).await;
    let order = Uuid::new_v4();
    app.orders.put("HK", order, "u1", 3, FakeStatus::Pending);
    reserve(&app, order, "u1", "HK", 3).await.unwrap();
    let_sweeps_run().await;

    assert_eq!(gate(&app, "HK").await, (1, 3), "the hold is still there");
    assert_eq!(app.count("SELECT COUNT(*) AS n FROM reservations").await, 0);
    assert!(app.outbox_of("stock.reservation_failed").await.is_empty());
    // Kept holds go to the back of the sweep's queue (asked about again one TTL later).
    let hold = app
        .gate
        .pending_older_than("HK", i64::MAX, 10)
        .await
        .unwrap();
    assert_eq!(hold.len(), 1);
    assert!(hold[0].reserved_at_ms > chrono::Utc::now().timestamp_millis() - 1_000);

    // Its order.created arrives after the outage: persisted, the hold marked.
    app.publish(created(order, "u1", "HK", 3), &order.to_string())
        .await;
    app.wait_count("SELECT reserved AS n FROM stock", 3).await;
    assert_eq!(gate(&app, "HK").await, (1, 0));
    let (_, metrics) = http_get(app.metrics_port, "/metrics").await.unwrap();
    assert!(
        metrics.contains("flashsale_holds_kept_total"),
        "metric missing"
    );
}

#[tokio::test]
async fn the_sweeper_releases_a_hold_whose_order_was_cancelled_and_the_cancel_then_changes_nothing()
{
    let db = TestDatabase::create().await.unwrap();
    let app = spawn_with(quick_sweep(&db), db).await;
    app.create("HC", 4, 0, RTC).await;
    let order = Uuid::new_v4();
    app.orders.put("HC", order, "u1", 3, FakeStatus::Cancelled);
    reserve(&app, order, "u1", "HC", 3).await.unwrap();
    app.wait_count(
        &format!("SELECT COUNT(*) AS n FROM reservations WHERE order_id = '{order}' AND state = 'RELEASED'"),
        1,
    )
    .await;
    // The gate gets the units back just after that commit: wait for it to settle.
    app.wait_gate("HC", (4, 0)).await;
    assert!(
        app.outbox_of("stock.reservation_failed").await.is_empty(),
        "the order ended already: nobody to tell"
    );

    // The order's own cancel arrives: the reservation is released already, nothing moves.
    app.publish(cancelled(order, "u1", "HC", 3), &order.to_string())
        .await;
    app.wait_count("SELECT COUNT(*) AS n FROM inbox", 1).await;
    assert_eq!(gate(&app, "HC").await, (4, 0));
    assert_eq!(app.count("SELECT reserved AS n FROM stock").await, 0);
    assert_eq!(app.count("SELECT on_hand AS n FROM stock").await, 4);
}

#[tokio::test]
async fn the_sweeper_gives_nothing_away_while_the_order_service_is_down() {
    let db = TestDatabase::create().await.unwrap();
    let app = spawn_with(quick_sweep(&db), db).await;
    app.create("HD", 4, 0, RTC).await;
    app.orders.set_down(true);
    let order = Uuid::new_v4();
    reserve(&app, order, "u1", "HD", 3).await.unwrap();
    let_sweeps_run().await;
    assert_eq!(gate(&app, "HD").await, (1, 3));
    assert_eq!(app.count("SELECT COUNT(*) AS n FROM reservations").await, 0);
    let (_, metrics) = http_get(app.metrics_port, "/metrics").await.unwrap();
    assert!(
        metrics.contains("flashsale_hold_sweeps_deferred_total"),
        "metric missing"
    );

    // Back up, and the order was never written: now the hold is given away.
    app.orders.set_down(false);
    app.wait_count(
        &format!("SELECT COUNT(*) AS n FROM reservations WHERE order_id = '{order}' AND cause = 'HOLD_EXPIRED'"),
        1,
    )
    .await;
    app.wait_gate("HD", (4, 0)).await;
}

#[tokio::test]
async fn the_sweeper_defers_when_the_order_service_address_answers_nothing() {
    let db = TestDatabase::create().await.unwrap();
    let mut settings = quick_sweep(&db);
    // Nothing listens on port 1: the real client fails to connect.
    settings.order_service.url = "http://127.0.0.1:1".into();
    settings.order_service.timeout_ms = 200;
    let app = spawn_with_order_client(settings, db).await;
    app.create("HU", 4, 0, RTC).await;
    reserve(&app, Uuid::new_v4(), "u1", "HU", 3).await.unwrap();
    let_sweeps_run().await;
    assert_eq!(gate(&app, "HU").await, (1, 3));
    assert_eq!(app.count("SELECT COUNT(*) AS n FROM reservations").await, 0);
    assert!(app.outbox_of("stock.reservation_failed").await.is_empty());

    // And a lost gate stays closed rather than opening on a guess.
    app.gate.forget("HU").await.unwrap();
    let err = reserve(&app, Uuid::new_v4(), "u2", "HU", 1)
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::Unavailable, "STOCK_GATE_UNAVAILABLE")
    );
    assert!(
        err.message().contains("gate rebuilding"),
        "{}",
        err.message()
    );
    assert!(app.gate.snapshot("HU").await.unwrap().is_none());
}

#[tokio::test]
async fn a_rebuilt_gate_holds_the_orders_acknowledged_but_not_yet_persisted() {
    let db = TestDatabase::create().await.unwrap();
    let app = spawn_with(test_settings(&db), db).await;
    app.create("HR", 10, 1, RTC).await;
    // Four orders acknowledged (gate hold + order written), their order.created not yet here.
    let acked: Vec<Uuid> = (0..4).map(|_| Uuid::new_v4()).collect();
    for (i, id) in acked.iter().enumerate() {
        let user = format!("a{i}");
        reserve(&app, *id, &user, "HR", 1).await.unwrap();
        app.orders.put("HR", *id, &user, 1, FakeStatus::Pending);
    }
    // One more, persisted already: counted by the database, not held again.
    let persisted = Uuid::new_v4();
    reserve(&app, persisted, "p0", "HR", 1).await.unwrap();
    app.orders
        .put("HR", persisted, "p0", 1, FakeStatus::Pending);
    app.publish(created(persisted, "p0", "HR", 1), &persisted.to_string())
        .await;
    app.wait_count("SELECT reserved AS n FROM stock", 1).await;
    // An order of another product and a paid one are not this product's pending orders.
    app.orders
        .put("OTHER", Uuid::new_v4(), "x", 1, FakeStatus::Pending);
    app.orders
        .put("HR", Uuid::new_v4(), "y", 1, FakeStatus::Paid);

    app.gate.forget("HR").await.unwrap();
    let mut sold = 0;
    for i in 0..10 {
        if reserve(&app, Uuid::new_v4(), &format!("b{i}"), "HR", 1)
            .await
            .is_ok()
        {
            sold += 1;
        }
    }
    assert_eq!(sold, 5, "10 units − 1 persisted − 4 acknowledged");
    assert_eq!(gate(&app, "HR").await, (0, 4 + 5));

    // The acknowledged buyers keep their per-user count, and a replay answers with its order.
    let limit = reserve(&app, Uuid::new_v4(), "a0", "HR", 1)
        .await
        .unwrap_err();
    assert_eq!(reason(&limit), "SOLD_OUT");
    let replay = app
        .client()
        .await
        .reserve_stock(service(reserve_req(acked[0], "a0", "HR", 1)))
        .await
        .unwrap()
        .into_inner();
    assert!(replay.replayed);

    // Their order.created marks the rebuilt holds persisted.
    for (i, id) in acked.iter().enumerate() {
        app.publish(created(*id, &format!("a{i}"), "HR", 1), &id.to_string())
            .await;
    }
    app.wait_count("SELECT reserved AS n FROM stock", 5).await;
    assert_eq!(gate(&app, "HR").await, (0, 5));
}

#[tokio::test]
async fn a_rebuilt_gate_keeps_the_per_user_limit_of_acknowledged_orders() {
    let db = TestDatabase::create().await.unwrap();
    let app = spawn_with(test_settings(&db), db).await;
    app.create("HL", 10, 1, RTC).await;
    let order = Uuid::new_v4();
    reserve(&app, order, "a0", "HL", 1).await.unwrap();
    app.orders.put("HL", order, "a0", 1, FakeStatus::Pending);
    app.gate.forget("HL").await.unwrap();
    let limit = reserve(&app, Uuid::new_v4(), "a0", "HL", 1)
        .await
        .unwrap_err();
    assert_eq!(reason(&limit), "USER_LIMIT_EXCEEDED");
    assert_eq!(gate(&app, "HL").await, (9, 1));
}

#[tokio::test]
async fn a_lost_gate_stays_closed_while_the_order_service_is_down() {
    let db = TestDatabase::create().await.unwrap();
    let app = spawn_with(test_settings(&db), db).await;
    app.create("HX", 10, 0, RTC).await;
    let order = Uuid::new_v4();
    reserve(&app, order, "a0", "HX", 4).await.unwrap();
    app.orders.put("HX", order, "a0", 4, FakeStatus::Pending);
    app.orders.set_down(true);
    app.gate.forget("HX").await.unwrap();
    let err = reserve(&app, Uuid::new_v4(), "u1", "HX", 1)
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::Unavailable, "STOCK_GATE_UNAVAILABLE")
    );
    assert!(
        app.gate.snapshot("HX").await.unwrap().is_none(),
        "not opened on a guess"
    );

    app.orders.set_down(false);
    assert_eq!(
        reserve(&app, Uuid::new_v4(), "u1", "HX", 1).await.unwrap(),
        5
    );
}

#[tokio::test]
async fn a_lost_gate_waits_for_orders_in_flight_before_it_is_rebuilt() {
    let db = TestDatabase::create().await.unwrap();
    let mut settings = test_settings(&db);
    settings.stock.rebuild_settle_ms = 1_500;
    let app = spawn_with(settings, db).await;
    app.create("HW", 10, 1, RTC).await;
    // A hold taken before the loss whose order is still being written: the order service does
    // not list it yet.
    let late = Uuid::new_v4();
    reserve(&app, late, "late", "HW", 1).await.unwrap();
    app.gate.forget("HW").await.unwrap();

    let err = reserve(&app, Uuid::new_v4(), "b0", "HW", 1)
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{}", err.message());
    assert!(err.message().contains("waiting"), "{}", err.message());
    assert!(app.gate.snapshot("HW").await.unwrap().is_none());

    // Its write commits during the wait; once the wait is over the rebuild holds it.
    app.orders.put("HW", late, "late", 1, FakeStatus::Pending);
    tokio::time::sleep(std::time::Duration::from_millis(1_600)).await;
    let mut sold = 0;
    for i in 0..10 {
        if reserve(&app, Uuid::new_v4(), &format!("b{i}"), "HW", 1)
            .await
            .is_ok()
        {
            sold += 1;
        }
    }
    assert_eq!(sold, 9, "10 units − the order written during the wait");
    assert_eq!(gate(&app, "HW").await, (0, 10));
}

#[tokio::test]
async fn the_sweeper_skips_its_rounds_while_another_replica_is_sweeping() {
    use flashsale_platform::lease::Singleton;
    use flashsale_product_stock::app::HOLD_SWEEP;
    let db = TestDatabase::create().await.unwrap();
    let app = spawn_with(quick_sweep(&db), db).await;
    app.create("HS", 4, 0, RTC).await;
    // The order was never written: a sweep that runs gives the hold away.
    let order = Uuid::new_v4();
    reserve(&app, order, "u1", "HS", 3).await.unwrap();

    // Another replica's sweep holds the lease, on a pool of its own, for several rounds.
    let other = Singleton::new(app.db.connect().await.unwrap(), HOLD_SWEEP);
    let (entered_tx, entered_rx) = tokio::sync::oneshot::channel();
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    let holder = tokio::spawn(async move {
        // This app's own sweeper may hold the lease at that moment: try until it is ours.
        let (mut entered_tx, mut release_rx) = (Some(entered_tx), Some(release_rx));
        for _ in 0..500 {
            let ran = other
                .run(|| {
                    let (tx, rx) = (entered_tx.take(), release_rx.take());
                    async move {
                        if let (Some(tx), Some(rx)) = (tx, rx) {
                            tx.send(()).unwrap();
                            rx.await.ok();
                        }
                    }
                })
                .await?;
            if ran.is_some() {
                return Ok(ran);
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        Ok::<_, sea_orm::DbErr>(None)
    });
    entered_rx.await.unwrap();
    let_sweeps_run().await;
    assert_eq!(gate(&app, "HS").await, (1, 3), "this replica did not sweep");
    assert_eq!(app.count("SELECT COUNT(*) AS n FROM reservations").await, 0);
    let (_, metrics) = http_get(app.metrics_port, "/metrics").await.unwrap();
    assert!(
        metrics.contains("flashsale_singleton_skips_total"),
        "metric missing"
    );

    // The other replica's sweep ends: this one's next round gives the hold away.
    release_tx.send(()).unwrap();
    assert_eq!(holder.await.unwrap().unwrap(), Some(()));
    app.wait_count(
        &format!("SELECT COUNT(*) AS n FROM reservations WHERE order_id = '{order}' AND cause = 'HOLD_EXPIRED'"),
        1,
    )
    .await;
    // The gate gets the units back just after that commit: wait for it to settle.
    app.wait_gate("HS", (4, 0)).await;
}
