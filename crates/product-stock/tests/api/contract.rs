//! Event contract: every event product-stock consumes is accepted in its fixture's shape, every
//! event it publishes has its fixture's shape (`proto/fixtures/events/`).

use flashsale_proto::{
    events::v1::envelope::Payload,
    product::v1::{
        AdjustStockRequest, CommitReservationRequest, DeductionPolicy, ReconcileStockRequest,
    },
};
use flashsale_test_support::fixtures;
use uuid::Uuid;

use crate::{
    helpers::{admin, service, spawn_app},
    reserve::reserve_req,
    saga::{cancelled, created},
};

const SKU: &str = "WINE-2020-MAGNUM";

#[tokio::test]
async fn consumed_fixtures_are_accepted() {
    let app = spawn_app().await;
    app.create(SKU, 10, 0, DeductionPolicy::ReserveThenCommit)
        .await;
    let created_env = fixtures::envelope("order.created").unwrap();
    let Some(Payload::OrderCreated(ev)) = &created_env.payload else {
        panic!("fixture payload")
    };
    let order: Uuid = ev.order_id.parse().unwrap();
    app.client()
        .await
        .reserve_stock(service(reserve_req(order, &ev.user_id, SKU, ev.quantity)))
        .await
        .unwrap();
    app.publish_envelope(&created_env).await;
    app.wait_count(&format!("SELECT COUNT(*) AS n FROM reservations WHERE order_id = '{order}' AND state = 'RESERVED'"), 1)
        .await;
    app.publish_envelope(&fixtures::envelope("order.cancelled").unwrap())
        .await;
    app.wait_count(&format!("SELECT COUNT(*) AS n FROM reservations WHERE order_id = '{order}' AND state = 'RELEASED'"), 1)
        .await;
    // Committed in the gate's current generation (a gate rebuilt since would count it already).
    let mut adjusted = fixtures::envelope("stock.adjusted").unwrap();
    let Some(Payload::StockAdjusted(ev)) = &mut adjusted.payload else {
        panic!("fixture payload")
    };
    ev.gate_generation = app.gate.generation(SKU).await.unwrap();
    app.publish_envelope(&adjusted).await;
    app.wait_count("SELECT COUNT(*) AS n FROM inbox", 3).await;
    // The cancel's units and the restock, each once.
    app.wait_gate(SKU, (110, 0)).await;
}

#[tokio::test]
async fn published_events_match_their_fixtures() {
    let app = spawn_app().await;
    app.create(SKU, 3, 0, DeductionPolicy::ReserveThenCommit)
        .await;
    let mut c = app.client().await;
    let (kept, shipped) = (Uuid::new_v4(), Uuid::new_v4());
    for o in [kept, shipped] {
        c.reserve_stock(service(reserve_req(o, "alice", SKU, 1)))
            .await
            .unwrap();
        app.publish(created(o, "alice", SKU, 1), &o.to_string())
            .await;
    }
    app.publish(created(Uuid::new_v4(), "bob", SKU, 5), "x")
        .await; // more than the database has
    app.wait_count("SELECT COUNT(*) AS n FROM inbox", 3).await;
    c.commit_reservation(service(CommitReservationRequest {
        order_id: shipped.to_string(),
    }))
    .await
    .unwrap();
    app.publish(cancelled(kept, "alice", SKU, 1), &kept.to_string())
        .await;
    app.wait_count("SELECT COUNT(*) AS n FROM inbox", 4).await;
    let adj = AdjustStockRequest {
        request_id: "r1".into(),
        sku: SKU.into(),
        delta: 5,
        reason: "delivery".into(),
    };
    c.adjust_stock(admin(adj)).await.unwrap();
    // The gate lost a unit; the repair puts it back on sale.
    let snap = app.gate.snapshot(SKU).await.unwrap().unwrap();
    app.gate
        .repair(SKU, snap.available + snap.held - 1)
        .await
        .unwrap();
    c.reconcile_stock(admin(ReconcileStockRequest {
        skus: vec![SKU.into()],
        repair: true,
    }))
    .await
    .unwrap();

    let events = app.outbox().await;
    let kinds: std::collections::BTreeSet<_> = events.iter().map(|e| e.r#type.as_str()).collect();
    for kind in [
        "stock.reserved",
        "stock.reservation_failed",
        "stock.released",
        "stock.committed",
        "stock.adjusted",
        "stock.gate_refilled",
    ] {
        assert!(kinds.contains(kind), "{kind} was not emitted: {kinds:?}");
    }
    for env in &events {
        fixtures::assert_same_shape(env).unwrap();
    }
}
