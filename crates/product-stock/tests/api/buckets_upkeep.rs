//! Bucketed products kept right over time: reconciled and repaired per bucket, restocked and
//! written off in every bucket once, holds and releases settled by the sweeper in every bucket,
//! reservation batches borrowing for dry buckets, and units a transfer stranded returned.

use deadpool_redis::redis;
use flashsale_product_stock::infra::gate::At;
use flashsale_proto::{
    events::v1::envelope::Payload,
    product::v1::{
        AdjustStockRequest, GetGateBuyersRequest, ReconcileStockRequest, ReserveStockBatchRequest,
    },
};
use flashsale_test_support::TestDatabase;
use uuid::Uuid;

use crate::{
    buckets::{strand, user_in},
    helpers::{FakeStatus, admin, service, spawn_app, spawn_with, test_settings},
    reserve::reserve_req,
    saga::created,
};

#[tokio::test]
async fn reconcile_repairs_any_bucket_and_returns_units_a_transfer_stranded() {
    const BUCKETS: u32 = 3;
    let app = spawn_app().await;
    app.create_bucketed("DRIFT", 9, 0, BUCKETS).await;
    // Bucket 1 sells 4 units the database does not have.
    app.gate.repair(At::new("DRIFT", 1), 7).await.unwrap();
    assert_eq!(app.reconcile("DRIFT", false).await, (13, 0, 4));
    assert_eq!(app.reconcile("DRIFT", true).await.2, 4);
    assert_eq!(app.reconcile("DRIFT", false).await, (9, 0, 0));

    // A borrower took 2 units out of bucket 0 for bucket 2 and died before landing them.
    let (code, taken) = strand(
        &app,
        "DRIFT",
        0,
        2,
        2,
        chrono::Utc::now().timestamp_millis(),
    )
    .await;
    assert_eq!((code.as_str(), taken), ("T", 2));
    assert_eq!(app.gate_total("DRIFT", BUCKETS).await.0, 7);
    // Moving units are no drift, and are not sold meanwhile.
    assert_eq!(
        app.client()
            .await
            .reconcile_stock(admin(ReconcileStockRequest {
                skus: vec!["DRIFT".into()],
                repair: false,
            }))
            .await
            .unwrap()
            .into_inner()
            .reports[0]
            .drift,
        0
    );
    assert_eq!(
        app.gate_total("DRIFT", BUCKETS).await.0,
        9,
        "the reconciler returned them"
    );
    let told = app.outbox_of("stock.gate_refilled").await;
    let causes: Vec<String> = told
        .iter()
        .filter_map(|e| match &e.payload {
            Some(Payload::StockGateRefilled(ev)) => Some(ev.cause.clone()),
            _ => None,
        })
        .collect();
    assert!(causes.iter().any(|c| c == "REBALANCE"), "{causes:?}");
    assert!(
        app.buckets_of("DRIFT", BUCKETS)
            .await
            .iter()
            .all(|b| b.2 == 0)
    );
}

#[tokio::test]
async fn restock_and_write_off_reach_every_bucket_once() {
    const BUCKETS: u32 = 4;
    let app = spawn_app().await;
    app.create_bucketed("RESTOCK", 4, 0, BUCKETS).await;
    let mut c = app.client().await;
    let adjust = |request_id: &str, delta: i64| AdjustStockRequest {
        request_id: request_id.into(),
        sku: "RESTOCK".into(),
        delta,
        reason: "count".into(),
    };
    let p = c
        .adjust_stock(admin(adjust("r1", 10)))
        .await
        .unwrap()
        .into_inner()
        .product
        .unwrap();
    assert_eq!((p.on_hand, p.gate_available), (14, 14));
    assert_eq!(
        app.buckets_of("RESTOCK", BUCKETS)
            .await
            .iter()
            .map(|b| b.0)
            .collect::<Vec<_>>(),
        [4, 4, 3, 3]
    );
    // The stock.adjusted event that follows changes nothing more.
    let p = c
        .adjust_stock(admin(adjust("w1", -6)))
        .await
        .unwrap()
        .into_inner()
        .product
        .unwrap();
    assert_eq!((p.on_hand, p.gate_available), (8, 8));
    app.wait_count("SELECT COUNT(*) AS n FROM inbox", 2).await;
    assert_eq!(app.gate_total("RESTOCK", BUCKETS).await, (8, 0));
    assert_eq!(app.reconcile("RESTOCK", false).await, (8, 0, 0));
}

#[tokio::test]
async fn the_sweeper_and_the_reconciler_settle_holds_and_releases_in_every_bucket() {
    const BUCKETS: u32 = 4;
    let db = TestDatabase::create().await.unwrap();
    let mut settings = test_settings(&db);
    settings.stock.hold_ttl_ms = 300;
    settings.stock.sweep_interval_ms = 100;
    let app = spawn_with(settings, db).await;
    app.create_bucketed("SWEEP", 8, 0, BUCKETS).await;
    // A hold in bucket 3 whose order was never written: the sweeper gives it back there.
    let (ghost, ghost_order) = (user_in("g", 3, BUCKETS), Uuid::new_v4());
    app.try_reserve(ghost_order, &ghost, "SWEEP", 2)
        .await
        .unwrap();
    assert_eq!(app.buckets_of("SWEEP", BUCKETS).await[3].1, 2);
    app.wait_count(
        &format!(
            "SELECT COUNT(*) AS n FROM reservations WHERE order_id = '{ghost_order}' AND cause = 'HOLD_EXPIRED'"
        ),
        1,
    )
    .await;
    let mut waited = 0;
    while app.gate_total("SWEEP", BUCKETS).await != (8, 0) && waited < 100 {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        waited += 1;
    }
    assert_eq!(app.gate_total("SWEEP", BUCKETS).await, (8, 0));

    // A release prepared in bucket 1 whose consumer died after the database committed it.
    let (buyer, order) = (user_in("r", 1, BUCKETS), Uuid::new_v4());
    app.orders
        .put("SWEEP", order, &buyer, 3, FakeStatus::Pending);
    app.try_reserve(order, &buyer, "SWEEP", 3).await.unwrap();
    app.publish(created(order, &buyer, "SWEEP", 3), &order.to_string())
        .await;
    app.wait_count("SELECT reserved AS n FROM stock", 3).await;
    app.gate
        .prepare_release(At::new("SWEEP", 1), order, &buyer, 3)
        .await
        .unwrap();
    app.exec(&format!(
        "UPDATE reservations SET state = 'RELEASED' WHERE order_id = '{order}'"
    ))
    .await;
    app.exec("UPDATE stock SET reserved = reserved - 3 WHERE sku = 'SWEEP'")
        .await;
    assert_eq!(
        app.gate_total("SWEEP", BUCKETS).await.0,
        5,
        "prepared moves nothing"
    );
    assert_eq!(app.reconcile("SWEEP", false).await, (8, 0, 0));
    let buyers: Vec<(String, i64)> = {
        let pool = flashsale_platform::redis::pool(&app.settings.redis).unwrap();
        let mut conn = pool.get().await.unwrap();
        redis::cmd("HGETALL")
            .arg(app.gate.keys_at(At::new("SWEEP", 1)).unwrap().users())
            .query_async(&mut *conn)
            .await
            .unwrap()
    };
    assert!(buyers.is_empty(), "{buyers:?}");
}

#[tokio::test]
async fn a_batch_of_reservations_borrows_for_dry_buckets_and_the_gate_buyers_span_them_all() {
    const BUCKETS: u32 = 4;
    let app = spawn_app().await;
    app.create_bucketed("BATCH", 6, 1, BUCKETS).await;
    // Ten buyers of bucket 0, which holds 2 of the 6 units, and one buying twice.
    let buyers: Vec<String> = (0..10)
        .map(|i| user_in(&format!("q{i}"), 0, BUCKETS))
        .collect();
    let mut items: Vec<_> = buyers
        .iter()
        .map(|b| reserve_req(Uuid::new_v4(), b, "BATCH", 1))
        .collect();
    items.push(reserve_req(Uuid::new_v4(), &buyers[0], "BATCH", 1));
    let outcomes = app
        .client()
        .await
        .reserve_stock_batch(service(ReserveStockBatchRequest { items }))
        .await
        .unwrap()
        .into_inner()
        .outcomes;
    let reserved = outcomes.iter().filter(|o| o.reserved.is_some()).count();
    assert_eq!(reserved, 6, "{outcomes:?}");
    assert!(
        outcomes[..6].iter().all(|o| o.reserved.is_some()),
        "{outcomes:?}"
    );
    // Sold out comes before the limit: the buyer asking twice is refused SOLD_OUT too.
    assert!(
        outcomes[6..].iter().all(|o| o.reason == "SOLD_OUT"),
        "{outcomes:?}"
    );
    assert_eq!(app.gate_total("BATCH", BUCKETS).await, (0, 6));

    let got = app
        .client()
        .await
        .get_gate_buyers(service(GetGateBuyersRequest {
            sku: "BATCH".into(),
            max_buyers: 100,
            known_refills: String::new(),
        }))
        .await
        .unwrap()
        .into_inner();
    let mut listed = got.user_ids.clone();
    listed.sort();
    let mut want: Vec<String> = buyers[..6].to_vec();
    want.sort();
    assert_eq!((got.gate_available, listed), (0, want));
    let again = app
        .client()
        .await
        .get_gate_buyers(service(GetGateBuyersRequest {
            sku: "BATCH".into(),
            max_buyers: 100,
            known_refills: got.refills.clone(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert!(again.user_ids.is_empty() && again.unchanged, "{again:?}");
}

#[tokio::test]
async fn the_sweeper_returns_units_a_transfer_stranded() {
    const BUCKETS: u32 = 2;
    let db = TestDatabase::create().await.unwrap();
    let mut settings = test_settings(&db);
    settings.stock.sweep_interval_ms = 100;
    let app = spawn_with(settings, db).await;
    app.create_bucketed("STRAND", 6, 0, BUCKETS).await;
    // A minute ago a borrower took units out of bucket 1 and never landed them.
    let minute_ago = chrono::Utc::now().timestamp_millis() - 60_000;
    let (code, taken) = strand(&app, "STRAND", 1, 0, 1, minute_ago).await;
    assert_eq!(code, "T");
    // One just taken is left to its borrower for a few seconds.
    let (_, young) = strand(
        &app,
        "STRAND",
        0,
        1,
        1,
        chrono::Utc::now().timestamp_millis(),
    )
    .await;
    assert_eq!(app.gate_total("STRAND", BUCKETS).await.0, 6 - taken - young);
    let mut waited = 0;
    while app.gate_total("STRAND", BUCKETS).await.0 != 6 - young && waited < 100 {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        waited += 1;
    }
    assert_eq!(app.gate_total("STRAND", BUCKETS).await.0, 6 - young);
    let told = app.outbox_of("stock.gate_refilled").await;
    assert!(
        told.iter().any(|e| matches!(
            &e.payload,
            Some(Payload::StockGateRefilled(ev)) if ev.cause == "REBALANCE"
        )),
        "{told:?}"
    );
}
