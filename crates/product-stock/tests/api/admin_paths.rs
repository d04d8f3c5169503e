//! The other admin paths that change stock or the gate keep the units of orders acknowledged
//! to their buyers whose `order.created` has not reached the database yet: a repair, a
//! restock while the gate is lost and rebuilt, and an attempt to give a product other stock
//! buckets.

use flashsale_product_stock::infra::gate::At;
use flashsale_proto::product::v1::{
    AdjustStockRequest, CreateProductRequest, DeductionPolicy, GetProductRequest,
};
use tonic::Code;
use uuid::Uuid;

use crate::{
    buckets::{try_reserve_with, user_in},
    helpers::{FakeStatus, TestApp, admin, reason, spawn_app, user},
    write_off::{Acked, persist_all},
};

const RTC: DeductionPolicy = DeductionPolicy::ReserveThenCommit;

impl TestApp {
    /// ReconcileStock of one product: (gate_available, unpersisted_holds, drift, repaired).
    async fn reconcile_one(&self, sku: &str, repair: bool) -> (i64, i64, i64, bool) {
        let r = self.reconcile_report(sku, repair).await;
        (r.gate_available, r.unpersisted_holds, r.drift, r.repaired)
    }

    async fn restock(&self, request_id: &str, sku: &str, units: i64) {
        self.client()
            .await
            .adjust_stock(admin(AdjustStockRequest {
                request_id: request_id.into(),
                sku: sku.into(),
                delta: units,
                reason: "delivery".into(),
            }))
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn a_repair_sets_the_gate_to_the_database_less_the_acknowledged_holds() {
    let app = spawn_app().await;
    app.create("RP", 10, 0, RTC).await;
    let mut acked = Vec::new();
    for i in 0..3 {
        acked.push(app.acknowledge(&format!("u{i}"), "RP", 1).await);
    }
    // Both ways of drifting: a gate selling 5 units too many, then 4 too few.
    for (figure, drift) in [(15, 5), (6, -4)] {
        app.gate.repair("RP", figure).await.unwrap();
        assert_eq!(
            app.reconcile_one("RP", true).await,
            (7 + drift, 3, drift, true)
        );
        assert_eq!(app.gate_of("RP", 1).await, (7, 3));
    }
    persist_all(&app, "RP", &acked).await;
    assert_eq!(app.gate_of("RP", 1).await, (7, 0));
}

#[tokio::test]
async fn a_repair_of_a_bucketed_product_keeps_every_buckets_holds() {
    const BUCKETS: u32 = 4;
    let app = spawn_app().await;
    app.create_bucketed("RPB", 12, 0, BUCKETS).await;
    let mut acked = Vec::new();
    for (tag, bucket) in [("a", 0), ("b", 0), ("c", 2)] {
        let buyer = user_in(tag, bucket, BUCKETS);
        acked.push(app.acknowledge(&buyer, "RPB", 1).await);
    }
    app.gate
        .adjust(At::new("RPB", 1), "stray", 6)
        .await
        .unwrap();
    assert_eq!(app.reconcile_one("RPB", true).await, (15, 3, 6, true));
    let states = app.buckets_of("RPB", BUCKETS).await;
    assert_eq!(states.iter().map(|s| s.1).collect::<Vec<_>>(), [2, 0, 1, 0]);
    assert_eq!(app.gate_of("RPB", BUCKETS).await, (9, 3));
    persist_all(&app, "RPB", &acked).await;
}

#[tokio::test]
async fn repairs_racing_reservations_never_take_an_acknowledged_orders_units() {
    const BUCKETS: u32 = 4;
    const STOCK: i64 = 40;
    let app = spawn_app().await;
    app.create_bucketed("RPR", STOCK, 0, BUCKETS).await;
    let client = app.client().await;
    let buyers = (0..30).map(|i| {
        let mut c = client.clone();
        let buyer = format!("rpr-{i}");
        async move {
            let order = Uuid::new_v4();
            try_reserve_with(&mut c, order, &buyer, "RPR", 1)
                .await
                .ok()
                .map(|()| Acked {
                    order,
                    user: buyer,
                    qty: 1,
                })
        }
    });
    // Every round drifts one bucket up by a unit, and the repair takes it back out.
    let gate = app.gate.clone();
    let repairs = async {
        for round in 0..8 {
            gate.adjust(
                At::new("RPR", round % BUCKETS),
                &format!("stray-{round}"),
                1,
            )
            .await
            .unwrap();
            app.reconcile_one("RPR", true).await;
        }
    };
    let (acked, ()) = tokio::join!(futures_util::future::join_all(buyers), repairs);
    let acked: Vec<Acked> = acked.into_iter().flatten().collect();
    let held = acked.len() as i64;
    assert_eq!(held, 30, "40 units are enough for every buyer");
    // Units still moving between buckets land in one.
    let mut settled = None;
    for _ in 0..100 {
        let states = app.buckets_of("RPR", BUCKETS).await;
        if states.iter().all(|s| s.2 == 0) {
            settled = Some(states);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let states = settled.expect("no transfer left in flight");
    let gate_held: i64 = states.iter().map(|s| s.1).sum();
    let available: i64 = states.iter().map(|s| s.0).sum();
    assert_eq!(gate_held, held, "every acknowledged order keeps its hold");
    assert!(
        available + gate_held <= STOCK,
        "never more on sale than the database has"
    );
    app.reconcile_one("RPR", true).await;
    assert_eq!(app.gate_of("RPR", BUCKETS).await, (STOCK - held, held));
    persist_all(&app, "RPR", &acked).await;
}

#[tokio::test]
async fn a_restock_while_the_gate_is_lost_and_the_rebuild_after_it_keep_the_acknowledged_holds() {
    let app = spawn_app().await;
    app.create("RB", 10, 0, RTC).await;
    let mut acked = Vec::new();
    for i in 0..3 {
        let a = app.acknowledge(&format!("u{i}"), "RB", 1).await;
        app.orders
            .put("RB", a.order, &a.user, 1, FakeStatus::Pending);
        acked.push(a);
    }
    // Redis loses the product; a restock lands before anything rebuilds it.
    app.gate.forget("RB").await.unwrap();
    app.restock("r5", "RB", 5).await;
    app.wait_count("SELECT COUNT(*) AS n FROM inbox", 1).await;
    assert!(app.gate.snapshot("RB").await.unwrap().is_none());
    // A write-off rebuilds the gate first, from the database and the order service's pending
    // orders, so the acknowledged orders hold their units again before it is checked.
    let err = app.write_off("w13", "RB", 13).await.unwrap_err();
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::FailedPrecondition, "INSUFFICIENT_STOCK")
    );
    assert!(
        err.message().contains("only 12 units are free"),
        "{}",
        err.message()
    );
    assert_eq!(app.gate_of("RB", 1).await, (12, 3));
    // A restock after the rebuild reaches the gate once.
    app.restock("r2", "RB", 2).await;
    app.wait_count("SELECT COUNT(*) AS n FROM inbox", 2).await;
    assert_eq!(app.gate_of("RB", 1).await, (14, 3));
    let p = app.write_off("w14", "RB", 14).await.unwrap();
    assert_eq!((p.on_hand, p.gate_available), (3, 0));
    persist_all(&app, "RB", &acked).await;
}

#[tokio::test]
async fn a_write_off_on_a_lost_gate_waits_while_the_order_service_cannot_list_pending_orders() {
    let app = spawn_app().await;
    app.create("RD", 10, 0, RTC).await;
    let a = app.acknowledge("u0", "RD", 4).await;
    app.orders
        .put("RD", a.order, &a.user, 4, FakeStatus::Pending);
    app.gate.forget("RD").await.unwrap();
    app.orders.set_down(true);
    let err = app.write_off("w", "RD", 10).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert_eq!(app.stock_rows("RD").await, (10, 0, 0, 0, 0));
    app.orders.set_down(false);
    let err = app.write_off("w", "RD", 10).await.unwrap_err();
    assert!(
        err.message().contains("only 6 units are free"),
        "{}",
        err.message()
    );
    // The refused request left nothing behind: the same request id is judged afresh.
    let p = app.write_off("w", "RD", 6).await.unwrap();
    assert_eq!((p.on_hand, p.gate_available), (4, 0));
    persist_all(&app, "RD", &[a]).await;
}

#[tokio::test]
async fn a_products_stock_buckets_cannot_be_changed_so_its_holds_stay_where_they_are() {
    let app = spawn_app().await;
    app.create("SB", 10, 0, RTC).await;
    let mut acked = Vec::new();
    for i in 0..3 {
        acked.push(app.acknowledge(&format!("u{i}"), "SB", 1).await);
    }
    // The only place stock buckets are set is CreateProduct; creating the product again with
    // other buckets is refused and touches nothing.
    let err = app
        .client()
        .await
        .create_product(admin(CreateProductRequest {
            sku: "SB".into(),
            name: "SB magnum".into(),
            price_cents: 1999,
            initial_stock: 10,
            per_user_limit: 0,
            deduction_policy: RTC as i32,
            stock_buckets: 4,
            ..Default::default()
        }))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);
    let p = app
        .client()
        .await
        .get_product(user(GetProductRequest { sku: "SB".into() }))
        .await
        .unwrap()
        .into_inner()
        .product
        .unwrap();
    assert_eq!((p.stock_buckets, p.on_hand, p.gate_available), (1, 10, 7));
    assert_eq!(app.gate_of("SB", 1).await, (7, 3));
    persist_all(&app, "SB", &acked).await;
}
