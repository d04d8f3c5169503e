//! CreateProduct, GetProduct, ListProducts and AdjustStock: happy paths, every refusal, and that
//! a refusal changes nothing.

use flashsale_proto::product::v1::{
    AdjustStockRequest, CreateProductRequest, DeductionPolicy, GetProductRequest,
    ListProductsRequest,
};
use flashsale_test_support::unique_name;
use tonic::Code;

use crate::helpers::{admin, reason, spawn_app, user};

const RTC: DeductionPolicy = DeductionPolicy::ReserveThenCommit;

fn draft(sku: &str) -> CreateProductRequest {
    CreateProductRequest {
        sku: sku.into(),
        name: "Château Flash 2020".into(),
        price_cents: 4_500,
        initial_stock: 10,
        per_user_limit: 2,
        deduction_policy: RTC as i32,
        stock_buckets: 0,
        ..Default::default()
    }
}

#[tokio::test]
async fn create_product_stores_it_and_seeds_the_gate() {
    let app = spawn_app().await;
    let p = app.create("WINE-1", 10, 2, RTC).await;
    assert_eq!(
        (p.on_hand, p.reserved, p.available, p.gate_available),
        (10, 0, 10, 10)
    );
    assert_eq!((p.price_cents, p.per_user_limit), (1999, 2));
    let got = app
        .client()
        .await
        .get_product(user(GetProductRequest {
            sku: "WINE-1".into(),
        }))
        .await
        .unwrap()
        .into_inner()
        .product
        .unwrap();
    assert_eq!(got, p);
    assert_eq!(
        app.count("SELECT SUM(on_hand_delta)::bigint AS n FROM stock_ledger")
            .await,
        10
    );
}

#[tokio::test]
async fn duplicate_sku_is_already_exists() {
    let app = spawn_app().await;
    app.create("DUP", 1, 0, RTC).await;
    let err = app
        .client()
        .await
        .create_product(admin(draft("DUP")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);
    assert_eq!(app.count("SELECT COUNT(*) AS n FROM products").await, 1);
}

#[tokio::test]
async fn bad_product_fields_are_invalid_argument_and_create_nothing() {
    let app = spawn_app().await;
    let mut client = app.client().await;
    type Mutation = Box<dyn Fn(&mut CreateProductRequest)>;
    let cases: Vec<(&str, Mutation)> = vec![
        ("sku", Box::new(|r| r.sku = String::new())),
        ("sku", Box::new(|r| r.sku = "a".repeat(65))),
        ("sku", Box::new(|r| r.sku = "bad sku{x}".into())),
        ("name", Box::new(|r| r.name = " ".into())),
        ("name", Box::new(|r| r.name = "n".repeat(201))),
        ("price_cents", Box::new(|r| r.price_cents = -1)),
        ("initial_stock", Box::new(|r| r.initial_stock = -1)),
        ("deduction_policy", Box::new(|r| r.deduction_policy = 0)),
        ("deduction_policy", Box::new(|r| r.deduction_policy = 42)),
        ("stock_buckets", Box::new(|r| r.stock_buckets = 65)),
        ("stock_buckets", Box::new(|r| r.stock_buckets = u32::MAX)),
    ];
    for (field, mutate) in cases {
        let mut req = draft("OK-SKU");
        mutate(&mut req);
        let err = client.create_product(admin(req)).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{field}");
        let fields = flashsale_platform::error::violated_fields(&err);
        assert!(
            fields.iter().any(|f| f == field),
            "{field} not in {fields:?}"
        );
    }
    assert_eq!(app.count("SELECT COUNT(*) AS n FROM products").await, 0);
}

#[tokio::test]
async fn only_admins_create_and_adjust() {
    let app = spawn_app().await;
    let mut client = app.client().await;
    let err = client.create_product(user(draft("X"))).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    let err = client.create_product(draft("X")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    let adj = AdjustStockRequest {
        request_id: "r".into(),
        sku: "X".into(),
        delta: 1,
        reason: "x".into(),
    };
    let err = client.adjust_stock(user(adj)).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    assert_eq!(app.count("SELECT COUNT(*) AS n FROM products").await, 0);
}

#[tokio::test]
async fn get_of_an_unknown_or_malformed_sku_is_refused() {
    let app = spawn_app().await;
    let mut client = app.client().await;
    let err = client
        .get_product(user(GetProductRequest { sku: "NOPE".into() }))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let err = client
        .get_product(user(GetProductRequest {
            sku: "no pe".into(),
        }))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn list_pages_through_every_product_by_sku() {
    let app = spawn_app().await;
    for sku in ["C", "A", "E", "B", "D"] {
        app.create(sku, 1, 0, RTC).await;
    }
    let mut client = app.client().await;
    let (mut seen, mut token) = (Vec::new(), String::new());
    loop {
        let page = client
            .list_products(user(ListProductsRequest {
                page_size: 2,
                page_token: token,
            }))
            .await
            .unwrap()
            .into_inner();
        assert!(page.products.len() <= 2);
        seen.extend(page.products.into_iter().map(|p| p.sku));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(seen, ["A", "B", "C", "D", "E"]);
    for bad in [
        ListProductsRequest {
            page_size: -1,
            page_token: String::new(),
        },
        ListProductsRequest {
            page_size: 2,
            page_token: "forged".into(),
        },
    ] {
        let err = client.list_products(user(bad)).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
    }
}

fn adjust(request_id: &str, sku: &str, delta: i64) -> AdjustStockRequest {
    AdjustStockRequest {
        request_id: request_id.into(),
        sku: sku.into(),
        delta,
        reason: "delivery".into(),
    }
}

#[tokio::test]
async fn restock_reaches_the_database_and_the_gate_once() {
    let app = spawn_app().await;
    app.create("R1", 5, 0, RTC).await;
    let mut client = app.client().await;
    let id = unique_name("restock");
    let first = client
        .adjust_stock(admin(adjust(&id, "R1", 7)))
        .await
        .unwrap()
        .into_inner();
    assert!(!first.replayed);
    let p = first.product.unwrap();
    assert_eq!((p.on_hand, p.gate_available), (12, 12));
    let again = client
        .adjust_stock(admin(adjust(&id, "R1", 7)))
        .await
        .unwrap()
        .into_inner();
    assert!(again.replayed);
    assert_eq!(again.product.unwrap().on_hand, 12);
    // The stock.adjusted event is applied by the consumer too, and must change nothing more.
    app.wait_count("SELECT COUNT(*) AS n FROM inbox", 1).await;
    let snap = app.gate.snapshot("R1").await.unwrap().unwrap();
    assert_eq!(snap.available, 12);
    assert_eq!(
        app.count("SELECT COUNT(*) AS n FROM stock_ledger WHERE kind = 'RESTOCK'")
            .await,
        1
    );
    assert_eq!(app.outbox_of("stock.adjusted").await.len(), 1);
}

#[tokio::test]
async fn a_restock_whose_commit_fails_puts_no_unit_on_sale() {
    let app = spawn_app().await;
    app.create("R3", 5, 0, RTC).await;
    let mut client = app.client().await;
    app.failpoints.arm_n(
        "stock.adjust.before_commit",
        flashsale_platform::failpoint::Action::Error,
        Some(1),
    );
    let id = unique_name("restock");
    client
        .adjust_stock(admin(adjust(&id, "R3", 7)))
        .await
        .unwrap_err();
    assert_eq!(app.count("SELECT on_hand AS n FROM stock").await, 5);
    let snap = app.gate.snapshot("R3").await.unwrap().unwrap();
    assert_eq!(
        snap.available, 5,
        "the database does not have the units, so the gate must not sell them"
    );
    // The retry commits, and the gate follows once.
    let done = client
        .adjust_stock(admin(adjust(&id, "R3", 7)))
        .await
        .unwrap()
        .into_inner();
    assert!(!done.replayed);
    assert_eq!(done.product.unwrap().gate_available, 12);
    app.wait_count("SELECT COUNT(*) AS n FROM inbox", 1).await;
    assert_eq!(
        app.gate.snapshot("R3").await.unwrap().unwrap().available,
        12
    );
}

#[tokio::test]
async fn a_write_off_whose_commit_fails_never_leaves_the_gate_above_the_database() {
    let app = spawn_app().await;
    app.create("R4", 5, 0, RTC).await;
    let mut client = app.client().await;
    app.failpoints.arm_n(
        "stock.adjust.before_commit",
        flashsale_platform::failpoint::Action::Error,
        Some(1),
    );
    let id = unique_name("write_off");
    client
        .adjust_stock(admin(adjust(&id, "R4", -2)))
        .await
        .unwrap_err();
    assert_eq!(app.count("SELECT on_hand AS n FROM stock").await, 5);
    assert!(app.gate.snapshot("R4").await.unwrap().unwrap().available <= 5);
    let done = client
        .adjust_stock(admin(adjust(&id, "R4", -2)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(done.product.unwrap().on_hand, 3);
    app.wait_count("SELECT COUNT(*) AS n FROM inbox", 1).await;
    assert_eq!(app.gate.snapshot("R4").await.unwrap().unwrap().available, 3);
}

#[tokio::test]
async fn reused_request_id_with_another_payload_is_refused() {
    let app = spawn_app().await;
    app.create("R2", 5, 0, RTC).await;
    let mut client = app.client().await;
    client
        .adjust_stock(admin(adjust("same", "R2", 3)))
        .await
        .unwrap();
    let err = client
        .adjust_stock(admin(adjust("same", "R2", 4)))
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::FailedPrecondition, "IDEMPOTENCY_KEY_REUSED")
    );
    assert_eq!(app.count("SELECT on_hand AS n FROM stock").await, 8);
}

#[tokio::test]
async fn write_off_below_reserved_is_refused_and_changes_nothing() {
    let app = spawn_app().await;
    app.create("W1", 5, 0, RTC).await;
    app.exec("UPDATE stock SET reserved = 4 WHERE sku = 'W1'")
        .await;
    let mut client = app.client().await;
    let err = client
        .adjust_stock(admin(adjust("w", "W1", -2)))
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::FailedPrecondition, "INSUFFICIENT_STOCK")
    );
    assert_eq!(app.count("SELECT on_hand AS n FROM stock").await, 5);
    assert_eq!(
        app.count("SELECT COUNT(*) AS n FROM stock_adjustments")
            .await,
        0
    );
    let ok = client
        .adjust_stock(admin(adjust("w2", "W1", -1)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ok.product.unwrap().on_hand, 4);
}

#[tokio::test]
async fn bad_adjustments_are_invalid_or_not_found() {
    let app = spawn_app().await;
    app.create("A1", 5, 0, RTC).await;
    let mut client = app.client().await;
    for (req, field) in [
        (adjust("", "A1", 1), "request_id"),
        (adjust(&"r".repeat(65), "A1", 1), "request_id"),
        (adjust("r", "A1", 0), "delta"),
        (adjust("r", "bad sku", 1), "sku"),
        (
            AdjustStockRequest {
                reason: String::new(),
                ..adjust("r", "A1", 1)
            },
            "reason",
        ),
    ] {
        let err = client.adjust_stock(admin(req)).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{field}");
        assert!(flashsale_platform::error::violated_fields(&err).contains(&field.to_owned()));
    }
    let err = client
        .adjust_stock(admin(adjust("r", "NOPE", 1)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert_eq!(app.count("SELECT on_hand AS n FROM stock").await, 5);
}
