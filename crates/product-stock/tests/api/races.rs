//! Races between the gate and the database that a review found: each test performs the steps
//! of one interleaving and checks the gate against the database afterwards
//! (`gate available + held = on_hand − reserved`, no units given back twice, no acknowledged
//! order losing its units).

use flashsale_messaging::envelope;
use flashsale_platform::failpoint::Action;
use flashsale_proto::product::v1::DeductionPolicy;
use uuid::Uuid;

use crate::{
    helpers::{FakeStatus, TestApp, service, spawn_app},
    reserve::reserve_req,
    saga::{cancelled, created},
    saga_batch::stock_saga,
};

const RTC: DeductionPolicy = DeductionPolicy::ReserveThenCommit;
const CONSUMER: &str = "product-stock.order-events";

/// The database's free units of `sku`: `on_hand − reserved`.
async fn db_free(app: &TestApp, sku: &str) -> i64 {
    app.count(&format!(
        "SELECT (on_hand - reserved)::bigint AS n FROM stock WHERE sku = '{sku}'"
    ))
    .await
}

/// `(available, held)` of a loaded single-bucket gate.
async fn gate(app: &TestApp, sku: &str) -> (i64, i64) {
    let s = app.gate.snapshot(sku).await.unwrap().expect("gate loaded");
    (s.available, s.held)
}

/// Asserts the gate's rule for `sku`: available + held = on_hand − reserved.
async fn assert_gate_matches_db(app: &TestApp, sku: &str) {
    let (available, held) = gate(app, sku).await;
    let free = db_free(app, sku).await;
    assert_eq!(
        available + held,
        free,
        "{sku}: gate available {available} + held {held} against the database's free {free}"
    );
}

async fn hold(app: &TestApp, order: Uuid, user: &str, sku: &str, q: i64) {
    app.client()
        .await
        .reserve_stock(service(reserve_req(order, user, sku, q)))
        .await
        .unwrap();
}

async fn reconcile_with_repair(app: &TestApp, sku: &str) {
    app.reconcile_report(sku, true).await;
}

/// The `order.created` of `order`, as the order service's outbox relay sends it.
fn created_env(
    order: Uuid,
    user: &str,
    sku: &str,
    q: i64,
) -> flashsale_proto::events::v1::Envelope {
    envelope::new(created(order, user, sku, q), order.to_string(), "", "order")
}

fn cancelled_env(
    order: Uuid,
    user: &str,
    sku: &str,
    q: i64,
) -> flashsale_proto::events::v1::Envelope {
    envelope::new(
        cancelled(order, user, sku, q),
        order.to_string(),
        "",
        "order",
    )
}

// === `order.created` whose commit fails after the gate was told the hold is persisted ===

#[tokio::test]
async fn a_repair_between_a_failed_create_commit_and_its_redelivery_leaves_no_drift() {
    let app = spawn_app().await;
    app.create("M1", 10, 0, RTC).await;
    let saga = stock_saga(&app);
    let order = Uuid::new_v4();
    hold(&app, order, "u1", "M1", 2).await;
    app.orders.put("M1", order, "u1", 2, FakeStatus::Pending);
    let env = created_env(order, "u1", "M1", 2);
    let Some(flashsale_proto::events::v1::envelope::Payload::OrderCreated(ev)) = &env.payload
    else {
        unreachable!()
    };
    app.failpoints
        .arm_n("stock.order_created.before_commit", Action::Error, Some(1));
    saga.on_order_created(CONSUMER, &env, ev)
        .await
        .expect_err("the commit fails");
    assert_eq!(app.count("SELECT COUNT(*) AS n FROM reservations").await, 0);
    assert_gate_matches_db(&app, "M1").await;

    // An admin repairs the product before the delivery comes back.
    reconcile_with_repair(&app, "M1").await;
    assert_gate_matches_db(&app, "M1").await;

    saga.on_order_created(CONSUMER, &env, ev).await.unwrap();
    assert_eq!(app.count("SELECT reserved AS n FROM stock").await, 2);
    assert_gate_matches_db(&app, "M1").await;
    assert_eq!(gate(&app, "M1").await, (8, 0));
}

#[tokio::test]
async fn a_cancel_between_a_failed_create_commit_and_its_redelivery_gives_the_units_back_once() {
    let app = spawn_app().await;
    app.create("M2", 10, 0, RTC).await;
    let saga = stock_saga(&app);
    let order = Uuid::new_v4();
    hold(&app, order, "u1", "M2", 2).await;
    let env = created_env(order, "u1", "M2", 2);
    let Some(flashsale_proto::events::v1::envelope::Payload::OrderCreated(ev)) = &env.payload
    else {
        unreachable!()
    };
    app.failpoints
        .arm_n("stock.order_created.before_commit", Action::Error, Some(1));
    saga.on_order_created(CONSUMER, &env, ev)
        .await
        .expect_err("the commit fails");

    // The order is cancelled before the delivery comes back.
    let cancel = cancelled_env(order, "u1", "M2", 2);
    let Some(flashsale_proto::events::v1::envelope::Payload::OrderCancelled(cev)) = &cancel.payload
    else {
        unreachable!()
    };
    saga.on_order_cancelled(CONSUMER, &cancel, cev)
        .await
        .unwrap();
    saga.on_order_created(CONSUMER, &env, ev).await.unwrap();
    assert_eq!(app.count("SELECT reserved AS n FROM stock").await, 0);
    assert_gate_matches_db(&app, "M2").await;
    assert_eq!(
        gate(&app, "M2").await,
        (10, 0),
        "the cancelled order's units are back"
    );
}

// === a rebuild around an order cancelled before its `order.created` was applied ===

#[tokio::test]
async fn a_rebuild_between_a_tombstone_and_its_release_gives_the_units_back_once() {
    let app = spawn_app().await;
    app.create("T1", 10, 0, RTC).await;
    let saga = stock_saga(&app);
    let order = Uuid::new_v4();
    hold(&app, order, "u1", "T1", 2).await;
    // The cancel's first attempt commits its tombstone and dies before the gate's finish.
    app.failpoints
        .arm_n("stock.order_cancelled.after_commit", Action::Error, Some(1));
    let cancel = cancelled_env(order, "u1", "T1", 2);
    let Some(flashsale_proto::events::v1::envelope::Payload::OrderCancelled(cev)) = &cancel.payload
    else {
        unreachable!()
    };
    let first = saga.on_order_cancelled(CONSUMER, &cancel, cev).await;
    assert_eq!(
        app.count("SELECT COUNT(*) AS n FROM reservations WHERE quantity = 0")
            .await,
        1,
        "the tombstone is written ({first:?})"
    );
    // The product's counters are lost (the order's record survives) and the gate is rebuilt.
    drop_counters(&app, "T1").await;
    assert!(app.gate.snapshot("T1").await.unwrap().is_none());
    hold(&app, Uuid::new_v4(), "u9", "T1", 1).await;
    assert_gate_matches_db_less_holds(&app, "T1", 1).await;

    // The redelivered cancel, then the late order.created, then the cancel once more.
    saga.on_order_cancelled(CONSUMER, &cancel, cev)
        .await
        .unwrap();
    let env = created_env(order, "u1", "T1", 2);
    let Some(flashsale_proto::events::v1::envelope::Payload::OrderCreated(ev)) = &env.payload
    else {
        unreachable!()
    };
    saga.on_order_created(CONSUMER, &env, ev).await.unwrap();
    let again = cancelled_env(order, "u1", "T1", 2);
    let Some(flashsale_proto::events::v1::envelope::Payload::OrderCancelled(cev2)) = &again.payload
    else {
        unreachable!()
    };
    saga.on_order_cancelled(CONSUMER, &again, cev2)
        .await
        .unwrap();
    assert_eq!(gate(&app, "T1").await, (9, 1));
    assert_gate_matches_db(&app, "T1").await;
}

#[tokio::test]
async fn a_rebuild_after_a_tombstone_keeps_a_surviving_hold_record_from_giving_units_back() {
    let app = spawn_app().await;
    app.create("T2", 10, 0, RTC).await;
    let saga = stock_saga(&app);
    let order = Uuid::new_v4();
    hold(&app, order, "u1", "T2", 2).await;
    // The product's counters are lost while the order's hold record survives.
    drop_counters(&app, "T2").await;
    // The cancel arrives while the gate is missing: tombstone, nothing to release in the gate.
    let cancel = cancelled_env(order, "u1", "T2", 2);
    let Some(flashsale_proto::events::v1::envelope::Payload::OrderCancelled(cev)) = &cancel.payload
    else {
        unreachable!()
    };
    saga.on_order_cancelled(CONSUMER, &cancel, cev)
        .await
        .unwrap();
    // The rebuild counts the order's units as free (it is cancelled and tombstoned).
    hold(&app, Uuid::new_v4(), "u9", "T2", 1).await;
    assert_eq!(gate(&app, "T2").await, (9, 1));

    // The late order.created must not give the units back a second time.
    let env = created_env(order, "u1", "T2", 2);
    let Some(flashsale_proto::events::v1::envelope::Payload::OrderCreated(ev)) = &env.payload
    else {
        unreachable!()
    };
    saga.on_order_created(CONSUMER, &env, ev).await.unwrap();
    saga.on_order_cancelled(CONSUMER, &cancel, cev)
        .await
        .unwrap();
    assert_eq!(gate(&app, "T2").await, (9, 1), "the units came back once");
    assert_gate_matches_db_less_holds(&app, "T2", 1).await;
}

#[tokio::test]
async fn a_retried_hold_that_a_rebuild_did_not_count_takes_its_units_again() {
    let app = spawn_app().await;
    app.create("T3", 10, 0, RTC).await;
    let order = Uuid::new_v4();
    hold(&app, order, "u1", "T3", 2).await;
    // The counters are lost while the order's hold record survives; its write never happened,
    // so the order service does not list it as pending and the rebuild does not hold it.
    drop_counters(&app, "T3").await;
    hold(&app, Uuid::new_v4(), "u9", "T3", 1).await;
    assert_eq!(gate(&app, "T3").await, (9, 1));

    // The buyer retries the same request: the order's units are taken again, not replayed
    // from a record the gate no longer counts.
    hold(&app, order, "u1", "T3", 2).await;
    assert_eq!(gate(&app, "T3").await, (7, 3));
    assert_gate_matches_db_less_holds(&app, "T3", 3).await;

    // A second retry is a plain replay of that hold.
    hold(&app, order, "u1", "T3", 2).await;
    assert_eq!(gate(&app, "T3").await, (7, 3));
}

/// Deletes the product's counters (available, held, pending) but not its order records, as
/// an eviction or a partial loss would.
async fn drop_counters(app: &TestApp, sku: &str) {
    let k = app.gate.keys(sku).unwrap();
    let mut conn = deadpool_redis::redis::Client::open(flashsale_test_support::redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: i64 = deadpool_redis::redis::cmd("DEL")
        .arg(k.avail())
        .arg(k.held())
        .arg(k.pending())
        .query_async(&mut conn)
        .await
        .unwrap();
}

/// Like [`assert_gate_matches_db`] with `unpersisted` units held for orders the database has
/// not seen yet (they are in `held` but not in `reserved`).
async fn assert_gate_matches_db_less_holds(app: &TestApp, sku: &str, unpersisted: i64) {
    let (_, held) = gate(app, sku).await;
    assert_eq!(held, unpersisted, "{sku}: held");
    assert_gate_matches_db(app, sku).await;
}
