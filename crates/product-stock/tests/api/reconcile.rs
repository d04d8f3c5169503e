//! ReconcileStock and the hold sweeper: drift is reported and repaired, holds that never reach
//! the database are released and their late order refused; a periodic check exports each
//! product's drift without repairing it.

use flashsale_proto::{
    events::v1::{ReservationFailureReason, envelope::Payload},
    product::v1::{DeductionPolicy, ReconcileStockRequest},
};
use flashsale_test_support::{TestDatabase, fixtures, grpc::http_get};
use tonic::Code;
use uuid::Uuid;

use crate::{
    helpers::{admin, service, spawn_app, spawn_with, test_settings, user},
    reserve::reserve_req,
    saga::created,
};

const RTC: DeductionPolicy = DeductionPolicy::ReserveThenCommit;

fn req(skus: &[&str], repair: bool) -> ReconcileStockRequest {
    ReconcileStockRequest {
        skus: skus.iter().map(|s| (*s).to_owned()).collect(),
        repair,
    }
}

#[tokio::test]
async fn reconcile_reports_drift_and_repairs_it() {
    let app = spawn_app().await;
    app.create("K1", 10, 0, RTC).await;
    app.create("K2", 5, 0, RTC).await;
    let mut c = app.client().await;
    c.reserve_stock(service(reserve_req(Uuid::new_v4(), "u1", "K1", 2)))
        .await
        .unwrap();
    let clean = c
        .reconcile_stock(admin(req(&[], false)))
        .await
        .unwrap()
        .into_inner()
        .reports;
    assert_eq!(clean.len(), 2);
    assert!(
        clean.iter().all(|r| r.drift == 0 && !r.repaired),
        "{clean:?}"
    );
    assert_eq!(clean[0].unpersisted_holds, 2);

    app.gate.repair("K1", 15).await.unwrap(); // the gate now sells 5 units too many
    let report = c
        .reconcile_stock(admin(req(&["K1"], false)))
        .await
        .unwrap()
        .into_inner()
        .reports;
    assert_eq!(
        (
            report[0].drift,
            report[0].expected_gate_available,
            report[0].repaired
        ),
        (5, 8, false)
    );
    let fixed = c
        .reconcile_stock(admin(req(&["K1"], true)))
        .await
        .unwrap()
        .into_inner()
        .reports;
    assert!(fixed[0].repaired);
    assert_eq!(app.gate.snapshot("K1").await.unwrap().unwrap().available, 8);
    assert!(
        app.outbox_of("stock.gate_refilled").await.is_empty(),
        "a repair downwards puts no units on sale"
    );
    let after = c
        .reconcile_stock(admin(req(&["K1"], false)))
        .await
        .unwrap()
        .into_inner()
        .reports;
    assert_eq!(after[0].drift, 0);
}

#[tokio::test]
async fn reconcile_settles_releases_their_consumers_left_prepared() {
    let app = spawn_app().await;
    app.create("K9", 10, 0, RTC).await;
    let mut c = app.client().await;
    let (done, undone) = (Uuid::new_v4(), Uuid::new_v4());
    for (order, user) in [(done, "u1"), (undone, "u2")] {
        c.reserve_stock(service(reserve_req(order, user, "K9", 2)))
            .await
            .unwrap();
        app.publish(created(order, user, "K9", 2), &order.to_string())
            .await;
    }
    app.wait_count(
        "SELECT COUNT(*) AS n FROM reservations WHERE state = 'RESERVED'",
        2,
    )
    .await;
    // Two releases were prepared in the gate: one committed in the database and its consumer
    // died before finishing it, the other rolled back and was never retried.
    app.gate.prepare_release("K9", done, "u1", 2).await.unwrap();
    app.gate
        .prepare_release("K9", undone, "u2", 2)
        .await
        .unwrap();
    app.exec(&format!(
        "UPDATE reservations SET state = 'RELEASED' WHERE order_id = '{done}'"
    ))
    .await;
    app.exec("UPDATE stock SET reserved = reserved - 2 WHERE sku = 'K9'")
        .await;
    let gate = app.gate.snapshot("K9").await.unwrap().unwrap();
    assert_eq!(gate.available, 6, "prepared releases move nothing");

    let report = c
        .reconcile_stock(admin(req(&["K9"], false)))
        .await
        .unwrap()
        .into_inner()
        .reports;
    assert_eq!(
        (report[0].gate_available, report[0].drift),
        (8, 0),
        "the committed release is finished, the other reverted: {report:?}"
    );
    assert!(
        app.gate
            .releasing_older_than("K9", i64::MAX, 10)
            .await
            .unwrap()
            .is_empty()
    );
    // The reverted order is still persisted: its real cancel gives its units back once.
    app.publish(
        crate::saga::cancelled(undone, "u2", "K9", 2),
        &undone.to_string(),
    )
    .await;
    app.wait_count(
        "SELECT COUNT(*) AS n FROM reservations WHERE state = 'RELEASED'",
        2,
    )
    .await;
    flashsale_test_support::eventually(
        std::time::Duration::from_secs(10),
        "every unit back",
        || async {
            let s = app.gate.snapshot("K9").await.unwrap().unwrap();
            (s.available == 10).then_some(())
        },
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn reconcile_with_repair_reloads_a_lost_gate() {
    let app = spawn_app().await;
    app.create("K3", 7, 0, RTC).await;
    app.gate.forget("K3").await.unwrap();
    let mut c = app.client().await;
    let r = c
        .reconcile_stock(admin(req(&["K3"], true)))
        .await
        .unwrap()
        .into_inner()
        .reports;
    assert!(r[0].repaired);
    assert_eq!((r[0].gate_available, r[0].drift), (7, 0));
    let told = app.outbox_of("stock.gate_refilled").await;
    assert_eq!(told.len(), 1, "{told:?}");
    let Some(Payload::StockGateRefilled(ev)) = &told[0].payload else {
        panic!("wrong payload: {told:?}")
    };
    assert_eq!(
        (
            ev.sku.as_str(),
            ev.available_before,
            ev.available_after,
            ev.cause.as_str()
        ),
        ("K3", 0, 7, "REBUILD")
    );
}

#[tokio::test]
async fn a_repair_upwards_tells_every_order_replica_the_units_are_back() {
    let app = spawn_app().await;
    app.create("K4", 10, 0, RTC).await;
    let mut c = app.client().await;
    c.reserve_stock(service(reserve_req(Uuid::new_v4(), "u1", "K4", 2)))
        .await
        .unwrap();
    app.gate.repair("K4", 5).await.unwrap(); // the gate sells 5 units too few (3 instead of 8)
    let fixed = c
        .reconcile_stock(admin(req(&["K4"], true)))
        .await
        .unwrap()
        .into_inner()
        .reports;
    assert_eq!((fixed[0].drift, fixed[0].repaired), (-5, true));
    assert_eq!(app.gate.snapshot("K4").await.unwrap().unwrap().available, 8);
    let told = app.outbox_of("stock.gate_refilled").await;
    assert_eq!(told.len(), 1, "{told:?}");
    fixtures::assert_same_shape(&told[0]).unwrap();
    assert_eq!(told[0].correlation_id, "K4");
    let Some(Payload::StockGateRefilled(ev)) = &told[0].payload else {
        panic!("wrong payload: {told:?}")
    };
    assert_eq!(
        (ev.available_before, ev.available_after, ev.cause.as_str()),
        (3, 8, "REPAIR")
    );
    // Reporting without repairing, and a repair with nothing to do, tell nobody.
    for repair in [false, true] {
        c.reconcile_stock(admin(req(&["K4"], repair)))
            .await
            .unwrap();
    }
    assert_eq!(app.outbox_of("stock.gate_refilled").await.len(), 1);
}

#[tokio::test]
async fn reconcile_refuses_bad_input_and_non_admins() {
    let app = spawn_app().await;
    let mut c = app.client().await;
    let err = c
        .reconcile_stock(admin(req(&["NOPE"], false)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let err = c
        .reconcile_stock(admin(req(&["no pe"], true)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = c.reconcile_stock(user(req(&[], false))).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
}

#[tokio::test]
async fn holds_that_never_reach_the_database_are_released_and_counted() {
    let db = TestDatabase::create().await.unwrap();
    let mut settings = test_settings(&db);
    settings.stock.hold_ttl_ms = 300;
    settings.stock.sweep_interval_ms = 100;
    let app = spawn_with(settings, db).await;
    app.create("H1", 4, 0, RTC).await;
    let order = Uuid::new_v4();
    app.client()
        .await
        .reserve_stock(service(reserve_req(order, "u1", "H1", 3)))
        .await
        .unwrap();
    app.wait_count(
        &format!("SELECT COUNT(*) AS n FROM reservations WHERE order_id = '{order}' AND cause = 'HOLD_EXPIRED'"),
        1,
    )
    .await;
    let snap = app.gate.snapshot("H1").await.unwrap().unwrap();
    assert_eq!((snap.available, snap.held), (4, 0));
    let told = app.outbox_of("stock.reservation_failed").await;
    assert_eq!(told.len(), 1, "the order service is told the hold expired");
    assert_eq!(told[0].correlation_id, order.to_string());
    let (_, metrics) = http_get(app.metrics_port, "/metrics").await.unwrap();
    assert!(
        metrics.contains("flashsale_holds_expired_total"),
        "metric missing"
    );

    // The crashed caller's order.created arrives late: refused, nothing reserved.
    app.publish(created(order, "u1", "H1", 3), &order.to_string())
        .await;
    app.wait_count("SELECT COUNT(*) AS n FROM inbox", 1).await;
    let failed = app.outbox_of("stock.reservation_failed").await;
    assert_eq!(
        failed.len(),
        2,
        "the expiry, then the refusal of the late create"
    );
    let Some(Payload::StockReservationFailed(f)) = &failed[1].payload else {
        panic!("wrong payload")
    };
    assert_eq!(f.reason, ReservationFailureReason::OrderCancelled as i32);
    assert_eq!(app.count("SELECT reserved AS n FROM stock").await, 0);
}

#[tokio::test]
async fn a_periodic_check_exports_each_products_drift_and_repairs_nothing() {
    let db = TestDatabase::create().await.unwrap();
    let mut settings = test_settings(&db);
    settings.stock.drift_check_interval_ms = 1_000;
    let app = spawn_with(settings, db).await;
    app.create("DRIFT", 10, 0, RTC).await;
    app.create("TRUE", 5, 0, RTC).await;
    app.gate.repair("DRIFT", 15).await.unwrap(); // the gate now sells 5 units too many
    let gauge = |metrics: &str, sku: &str| -> Option<f64> {
        let line = format!("flashsale_gate_drift_units{{sku=\"{sku}\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&line)?.trim().parse().ok())
    };
    let metrics = flashsale_test_support::eventually(
        std::time::Duration::from_secs(30),
        "a check that saw the drift",
        || async {
            let (_, m) = http_get(app.metrics_port, "/metrics").await.ok()?;
            (gauge(&m, "DRIFT") == Some(5.0)).then_some(m)
        },
    )
    .await
    .unwrap();
    assert_eq!(gauge(&metrics, "TRUE"), Some(0.0), "{metrics}");
    // Report only: the gate still sells the 5 units too many until an admin repairs it.
    let report = app
        .client()
        .await
        .reconcile_stock(admin(req(&["DRIFT"], false)))
        .await
        .unwrap()
        .into_inner()
        .reports;
    assert_eq!((report[0].drift, report[0].repaired), (5, false));
}
