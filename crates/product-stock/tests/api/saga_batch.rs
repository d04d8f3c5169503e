//! `order.created` persisted in batches: one transaction for the common case, and a batch with
//! anything unusual in it handled one by one with the same results as single deliveries.

use flashsale_messaging::envelope;
use flashsale_product_stock::app::{Created, StockSaga, Terms};
use flashsale_proto::{
    events::v1::{Envelope, ReservationFailureReason, envelope::Payload},
    product::v1::DeductionPolicy,
};
use uuid::Uuid;

use crate::{
    helpers::{TestApp, service, spawn_app},
    reserve::reserve_req,
    saga::{cancelled, created},
};

const RTC: DeductionPolicy = DeductionPolicy::ReserveThenCommit;
const CAO: DeductionPolicy = DeductionPolicy::CommitAtOrder;
const CONSUMER: &str = "product-stock.order-events";

pub fn stock_saga(app: &TestApp) -> StockSaga {
    StockSaga::new(
        app.conn.clone(),
        app.gate.clone(),
        Terms::new(app.conn.clone()),
        app.failpoints.clone(),
    )
}

pub fn item(env: &Envelope) -> Created {
    let Some(Payload::OrderCreated(ev)) = &env.payload else {
        panic!("not order.created")
    };
    Created {
        consumer: CONSUMER.into(),
        env: env.clone(),
        ev: ev.clone(),
        trace: Default::default(),
        attempt: 1,
    }
}

/// Holds `q` units of `sku` in the gate for a new order and returns its `order.created`.
pub async fn held(app: &TestApp, user: &str, sku: &str, q: i64) -> Envelope {
    let order = Uuid::new_v4();
    app.client()
        .await
        .reserve_stock(service(reserve_req(order, user, sku, q)))
        .await
        .unwrap();
    envelope::new(created(order, user, sku, q), order.to_string(), "", "order")
}

#[tokio::test]
async fn a_batch_of_new_orders_is_persisted_in_one_transaction() {
    let app = spawn_app().await;
    app.create("B1", 100, 0, RTC).await;
    app.create("B2", 50, 0, CAO).await;
    let mut batch = Vec::new();
    for i in 0..40 {
        batch.push(held(&app, &format!("u{i}"), "B1", 2).await);
    }
    for i in 0..10 {
        batch.push(held(&app, &format!("v{i}"), "B2", 1).await);
    }
    let svc = stock_saga(&app);
    let answers = svc.persist_created(batch.iter().map(item).collect()).await;
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    assert_eq!(
        app.count("SELECT COUNT(DISTINCT xmin::text) AS n FROM reservations")
            .await,
        1,
        "one transaction"
    );
    assert_eq!(
        app.count("SELECT COUNT(*) AS n FROM reservations WHERE state = 'RESERVED'")
            .await,
        40
    );
    assert_eq!(
        app.count("SELECT COUNT(*) AS n FROM reservations WHERE state = 'COMMITTED'")
            .await,
        10
    );
    assert_eq!(
        app.count("SELECT reserved AS n FROM stock WHERE sku = 'B1'")
            .await,
        80
    );
    assert_eq!(
        app.count("SELECT on_hand AS n FROM stock WHERE sku = 'B2'")
            .await,
        40
    );
    assert_eq!(
        app.count(
            "SELECT COUNT(*) AS n FROM stock_ledger WHERE kind = 'RESERVE' AND reserved_delta = 2"
        )
        .await,
        40
    );
    assert_eq!(
        app.count(
            "SELECT COUNT(*) AS n FROM stock_ledger WHERE kind = 'COMMIT' AND on_hand_delta = -1"
        )
        .await,
        10
    );
    assert_eq!(app.outbox_of("stock.reserved").await.len(), 50);
    for sku in ["B1", "B2"] {
        let snap = app.gate.snapshot(sku).await.unwrap().unwrap();
        assert_eq!(snap.held, 0, "{sku}: every hold marked persisted");
    }
    // Delivered again (a redelivery of the whole batch): no second effect.
    let again = svc.persist_created(batch.iter().map(item).collect()).await;
    assert!(again.iter().all(Result::is_ok));
    assert_eq!(
        app.count("SELECT reserved AS n FROM stock WHERE sku = 'B1'")
            .await,
        80
    );
    assert_eq!(app.outbox_of("stock.reserved").await.len(), 50);
}

#[tokio::test]
async fn a_batch_with_unusual_deliveries_gives_each_its_own_answer() {
    let app = spawn_app().await;
    app.create("M1", 10, 0, RTC).await;
    let svc = stock_saga(&app);
    let good: Vec<Envelope> = [
        held(&app, "a", "M1", 1).await,
        held(&app, "b", "M1", 1).await,
    ]
    .into();
    // Already persisted before (a redelivery mixed into a new batch).
    let seen = held(&app, "c", "M1", 1).await;
    assert!(svc.persist_created(vec![item(&seen)]).await[0].is_ok());
    // Cancelled before it was created: a tombstone refuses it.
    let ghost = held(&app, "d", "M1", 1).await;
    let Some(Payload::OrderCreated(g)) = &ghost.payload else {
        panic!()
    };
    let cancel = envelope::new(
        cancelled(g.order_id.parse().unwrap(), "d", "M1", 1),
        g.order_id.clone(),
        "",
        "order",
    );
    svc.on_order_cancelled(
        CONSUMER,
        &cancel,
        match &cancel.payload {
            Some(Payload::OrderCancelled(c)) => c,
            _ => panic!(),
        },
    )
    .await
    .unwrap();
    // A product nobody created.
    let unknown_order = Uuid::new_v4();
    let unknown = envelope::new(
        created(unknown_order, "e", "NOPE", 1),
        unknown_order.to_string(),
        "",
        "order",
    );
    let batch = vec![
        item(&good[0]),
        item(&seen),
        item(&ghost),
        item(&unknown),
        item(&good[1]),
    ];
    let answers = svc.persist_created(batch).await;
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    assert_eq!(
        app.count("SELECT COUNT(*) AS n FROM reservations WHERE state = 'RESERVED'")
            .await,
        3,
        "a, b and c"
    );
    assert_eq!(
        app.count("SELECT reserved AS n FROM stock WHERE sku = 'M1'")
            .await,
        3
    );
    assert_eq!(app.outbox_of("stock.reserved").await.len(), 3);
    let failed = app.outbox_of("stock.reservation_failed").await;
    let reasons: std::collections::BTreeSet<i32> = failed
        .iter()
        .filter_map(|e| match &e.payload {
            Some(Payload::StockReservationFailed(f)) => Some(f.reason),
            _ => None,
        })
        .collect();
    assert_eq!(
        reasons,
        [
            ReservationFailureReason::OrderCancelled as i32,
            ReservationFailureReason::UnknownProduct as i32
        ]
        .into_iter()
        .collect(),
        "{failed:?}"
    );
    let snap = app.gate.snapshot("M1").await.unwrap().unwrap();
    assert_eq!(
        (snap.available, snap.held),
        (7, 0),
        "the ghost's unit went back to the gate"
    );
}

#[tokio::test]
async fn a_batch_the_database_cannot_cover_never_oversells() {
    let app = spawn_app().await;
    app.create("SHORT", 3, 0, RTC).await;
    let batch: Vec<Envelope> = [
        held(&app, "a", "SHORT", 1).await,
        held(&app, "b", "SHORT", 1).await,
        held(&app, "c", "SHORT", 1).await,
    ]
    .into();
    // The database has fewer units than the gate handed out (a write-off the gate missed).
    app.exec("UPDATE stock SET on_hand = 2 WHERE sku = 'SHORT'")
        .await;
    let answers = stock_saga(&app)
        .persist_created(batch.iter().map(item).collect())
        .await;
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    assert_eq!(
        app.count("SELECT reserved AS n FROM stock WHERE sku = 'SHORT'")
            .await,
        2,
        "never more than on hand"
    );
    assert_eq!(
        app.count("SELECT COUNT(*) AS n FROM reservations WHERE state = 'RESERVED'")
            .await,
        2
    );
    assert_eq!(app.outbox_of("stock.reserved").await.len(), 2);
    let failed = app.outbox_of("stock.reservation_failed").await;
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(matches!(
        &failed[0].payload,
        Some(Payload::StockReservationFailed(f))
            if f.reason == ReservationFailureReason::InsufficientStock as i32
    ));
}
