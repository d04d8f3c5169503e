//! Input that cannot poison: a control character in any string field is INVALID_ARGUMENT naming
//! the field, numbers at the ends of their range are refused without overflowing, and a refusal
//! changes nothing.

use flashsale_contract::MAX_UNITS;
use flashsale_platform::error::violated_fields;
use flashsale_proto::product::v1::{
    AdjustStockRequest, CommitReservationRequest, CreateProductRequest, DeductionPolicy,
    GetGateBuyersRequest, GetProductRequest, ListProductsRequest, ReconcileStockRequest,
    ReserveStockBatchRequest, ReserveStockRequest,
};
use tonic::Code;

use crate::helpers::{TestApp, admin, service, spawn_app, user};

fn assert_invalid<T: std::fmt::Debug>(answer: Result<T, tonic::Status>, field: &str) {
    let status = answer.expect_err("accepted");
    assert_eq!(status.code(), Code::InvalidArgument, "{field}: {status:?}");
    assert_eq!(violated_fields(&status), [field], "{status:?}");
}

/// What a refusal must leave as it was: every table's rows and stock figures, and the gate's
/// keys and counter.
async fn state(app: &TestApp) -> Vec<i64> {
    let mut out = Vec::new();
    for sql in [
        "SELECT COUNT(*) AS n FROM products",
        "SELECT COALESCE(SUM(on_hand), 0)::int8 AS n FROM stock",
        "SELECT COALESCE(SUM(reserved), 0)::int8 AS n FROM stock",
        "SELECT COUNT(*) AS n FROM reservations",
        "SELECT COUNT(*) AS n FROM stock_ledger",
        "SELECT COUNT(*) AS n FROM stock_adjustments",
        "SELECT COUNT(*) AS n FROM outbox",
    ] {
        out.push(app.count(sql).await);
    }
    let snap = app.gate.snapshot("EDGE").await.unwrap().unwrap_or_default();
    out.extend([snap.available, snap.held]);
    out
}

#[tokio::test]
async fn a_control_character_in_any_string_field_is_invalid_argument_naming_it() {
    let app = spawn_app().await;
    app.create("EDGE", 10, 0, DeductionPolicy::ReserveThenCommit)
        .await;
    let before = state(&app).await;
    let c = app.client().await;
    let id = uuid::Uuid::new_v4().to_string();
    let product = |sku: &str, name: &str| CreateProductRequest {
        sku: sku.into(),
        name: name.into(),
        price_cents: 100,
        initial_stock: 1,
        per_user_limit: 0,
        deduction_policy: DeductionPolicy::ReserveThenCommit as i32,
        stock_buckets: 0,
        ..Default::default()
    };
    assert_invalid(
        c.clone()
            .create_product(admin(product("NEW", "Wine\0")))
            .await,
        "name",
    );
    assert_invalid(
        c.clone()
            .create_product(admin(product("NEW", "Wine\u{1b}")))
            .await,
        "name",
    );
    assert_invalid(
        c.clone()
            .create_product(admin(product("NEW\0", "Wine")))
            .await,
        "sku",
    );
    let get = GetProductRequest {
        sku: "EDGE\0".into(),
    };
    assert_invalid(c.clone().get_product(user(get)).await, "sku");
    let list = ListProductsRequest {
        page_token: "\0".into(),
        ..Default::default()
    };
    assert_invalid(c.clone().list_products(user(list)).await, "page_token");
    let adjust = |request_id: &str, reason: &str| AdjustStockRequest {
        request_id: request_id.into(),
        sku: "EDGE".into(),
        delta: 5,
        reason: reason.into(),
    };
    assert_invalid(
        c.clone()
            .adjust_stock(admin(adjust("r\0", "restock")))
            .await,
        "request_id",
    );
    assert_invalid(
        c.clone()
            .adjust_stock(admin(adjust("r1", "restock\n")))
            .await,
        "reason",
    );
    let reserve = |order_id: &str, user_id: &str| ReserveStockRequest {
        order_id: order_id.into(),
        user_id: user_id.into(),
        sku: "EDGE".into(),
        quantity: 1,
    };
    assert_invalid(
        c.clone().reserve_stock(service(reserve(&id, "u\0"))).await,
        "user_id",
    );
    assert_invalid(
        c.clone()
            .reserve_stock(service(reserve(&format!("{id}\0"), "u")))
            .await,
        "order_id",
    );
    let batch = ReserveStockBatchRequest {
        items: vec![reserve(&id, "a\u{7f}")],
    };
    let outcomes = c
        .clone()
        .reserve_stock_batch(service(batch))
        .await
        .unwrap()
        .into_inner()
        .outcomes;
    assert_eq!(outcomes[0].code, Code::InvalidArgument as i32);
    assert_eq!(outcomes[0].fields, ["user_id"]);
    let buyers = |sku: &str, known: &str| GetGateBuyersRequest {
        sku: sku.into(),
        max_buyers: 10,
        known_refills: known.into(),
    };
    assert_invalid(
        c.clone()
            .get_gate_buyers(service(buyers("EDGE\0", "")))
            .await,
        "sku",
    );
    assert_invalid(
        c.clone()
            .get_gate_buyers(service(buyers("EDGE", "1\0")))
            .await,
        "known_refills",
    );
    let commit = CommitReservationRequest {
        order_id: "\0".into(),
    };
    assert_invalid(
        c.clone().commit_reservation(service(commit)).await,
        "order_id",
    );
    let reconcile = ReconcileStockRequest {
        skus: vec!["EDGE".into(), "X\0".into()],
        repair: true,
    };
    assert_invalid(c.clone().reconcile_stock(admin(reconcile)).await, "skus[1]");

    assert_eq!(state(&app).await, before, "a refusal changed something");
}

#[tokio::test]
async fn a_delta_at_the_ends_of_its_range_is_refused_without_overflowing() {
    let app = spawn_app().await;
    app.create("EDGE", MAX_UNITS - 5, 0, DeductionPolicy::ReserveThenCommit)
        .await;
    let before = state(&app).await;
    let c = app.client().await;
    let adjust = |request_id: &str, delta: i64| {
        admin(AdjustStockRequest {
            request_id: request_id.into(),
            sku: "EDGE".into(),
            delta,
            reason: "count".into(),
        })
    };
    for (i, delta) in [i64::MIN, i64::MIN + 1, i64::MAX, MAX_UNITS + 1]
        .into_iter()
        .enumerate()
    {
        assert_invalid(
            c.clone()
                .adjust_stock(adjust(&format!("r{i}"), delta))
                .await,
            "delta",
        );
    }
    // Within its range, but on_hand would pass the largest stock figure.
    assert_invalid(c.clone().adjust_stock(adjust("r9", 6)).await, "delta");
    assert_eq!(state(&app).await, before);
    // Up to the largest figure is fine.
    let p = c
        .clone()
        .adjust_stock(adjust("r10", 5))
        .await
        .unwrap()
        .into_inner()
        .product
        .unwrap();
    assert_eq!(p.on_hand, MAX_UNITS);
}

#[tokio::test]
async fn quantities_and_prices_at_the_ends_of_their_range_are_refused() {
    let app = spawn_app().await;
    app.create("EDGE", 10, 0, DeductionPolicy::ReserveThenCommit)
        .await;
    let before = state(&app).await;
    let c = app.client().await;
    let id = uuid::Uuid::new_v4().to_string();
    for quantity in [i64::MIN, -1, 0, i64::MAX] {
        let req = ReserveStockRequest {
            order_id: id.clone(),
            user_id: "u".into(),
            sku: "EDGE".into(),
            quantity,
        };
        assert_invalid(c.clone().reserve_stock(service(req)).await, "quantity");
    }
    for (price_cents, initial_stock, field) in [
        (i64::MIN, 1, "price_cents"),
        (i64::MAX, 1, "price_cents"),
        (1, i64::MIN, "initial_stock"),
        (1, i64::MAX, "initial_stock"),
    ] {
        let req = CreateProductRequest {
            sku: "BIG".into(),
            name: "Big".into(),
            price_cents,
            initial_stock,
            per_user_limit: u32::MAX,
            deduction_policy: DeductionPolicy::ReserveThenCommit as i32,
            stock_buckets: 0,
            ..Default::default()
        };
        let status = c.clone().create_product(admin(req)).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        let fields = violated_fields(&status);
        assert!(fields.iter().any(|f| f == field), "{fields:?}");
        assert!(fields.iter().any(|f| f == "per_user_limit"), "{fields:?}");
    }
    assert_eq!(state(&app).await, before);
}
