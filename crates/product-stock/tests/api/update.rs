//! UpdateProduct: a change of terms applies once (a retry is a replay), only to the version it
//! was read from (etag), by the rules for a sale in progress, and reaches every replica's
//! reservations through `product.updated`; every bad request is refused naming its field and
//! changes nothing.

use std::time::{Duration, Instant};

use flashsale_contract::{FieldMask, ms_to_timestamp};
use flashsale_proto::{
    events::v1::envelope::Payload,
    product::v1::{
        CreateProductRequest, DeductionPolicy, GetProductRequest, Product, UpdateProductRequest,
        product_stock_service_client::ProductStockServiceClient,
    },
};
use flashsale_test_support::grpc::channel;
use tonic::Code;
use uuid::Uuid;

use crate::{
    helpers::{TestApp, admin, reason, service, spawn_app, user},
    reserve::reserve_req,
};

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

fn mask(paths: &[&str]) -> Option<FieldMask> {
    Some(FieldMask {
        paths: paths.iter().map(|p| (*p).to_owned()).collect(),
    })
}

fn update(request_id: &str, product: Product, paths: &[&str]) -> UpdateProductRequest {
    UpdateProductRequest {
        request_id: request_id.into(),
        product: Some(product),
        update_mask: mask(paths),
    }
}

async fn get(app: &TestApp, sku: &str) -> Product {
    app.client()
        .await
        .get_product(user(GetProductRequest { sku: sku.into() }))
        .await
        .unwrap()
        .into_inner()
        .product
        .unwrap()
}

async fn create(app: &TestApp, sku: &str, sale_start: Option<i64>) -> Product {
    app.client()
        .await
        .create_product(admin(CreateProductRequest {
            sku: sku.into(),
            name: "Old gin".into(),
            price_cents: 2_500,
            initial_stock: 10,
            per_user_limit: 3,
            deduction_policy: DeductionPolicy::ReserveThenCommit as i32,
            sale_start: sale_start.and_then(ms_to_timestamp),
            sale_price_cents: Some(1_999),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner()
        .product
        .unwrap()
}

#[tokio::test]
async fn an_update_changes_only_the_named_fields_once_and_bumps_the_etag() {
    let app = spawn_app().await;
    let before = create(&app, "UPD-1", None).await;
    assert_eq!(before.etag, "1");
    let start = now_ms() + 3_600_000;
    let new = Product {
        sku: "UPD-1".into(),
        etag: before.etag.clone(),
        name: "New gin".into(),
        price_cents: 3_000,
        per_user_limit: 1,
        sale_start: ms_to_timestamp(start),
        // Not named in the mask: ignored.
        stock_buckets: 9,
        on_hand: 1_000,
        ..Product::default()
    };
    let paths = ["name", "price_cents", "per_user_limit", "sale_start"];
    let got = app
        .client()
        .await
        .update_product(admin(update("u-1", new.clone(), &paths)))
        .await
        .unwrap()
        .into_inner();
    assert!(!got.replayed);
    let after = got.product.unwrap();
    assert_eq!(
        (
            after.name.as_str(),
            after.price_cents,
            after.per_user_limit,
            after.sale_start,
            after.sale_price_cents,
            after.etag.as_str()
        ),
        (
            "New gin",
            3_000,
            1,
            ms_to_timestamp(start),
            Some(1_999),
            "2"
        )
    );
    assert_eq!((after.stock_buckets, after.on_hand), (1, 10));
    assert_eq!(get(&app, "UPD-1").await, after);
    let told = app.outbox_of("product.updated").await;
    assert_eq!(told.len(), 1);
    let Some(Payload::ProductUpdated(ev)) = &told[0].payload else {
        panic!("{told:?}");
    };
    assert_eq!((ev.sku.as_str(), ev.etag.as_str()), ("UPD-1", "2"));
    assert_eq!(ev.fields, paths);

    // The retry is a replay: nothing applies again, whatever its (now stale) etag.
    let again = app
        .client()
        .await
        .update_product(admin(update("u-1", new.clone(), &paths)))
        .await
        .unwrap()
        .into_inner();
    assert!(again.replayed);
    assert_eq!(again.product.unwrap().etag, "2");
    assert_eq!(app.outbox_of("product.updated").await.len(), 1);
    // The same key with another change is refused.
    let other = Product {
        price_cents: 3_100,
        ..new
    };
    let e = app
        .client()
        .await
        .update_product(admin(update("u-1", other, &paths)))
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), reason(&e).as_str()),
        (Code::FailedPrecondition, "IDEMPOTENCY_KEY_REUSED")
    );
    assert_eq!(get(&app, "UPD-1").await.price_cents, 3_000);
}

#[tokio::test]
async fn a_stale_etag_is_aborted_and_changes_nothing() {
    let app = spawn_app().await;
    let p = create(&app, "UPD-2", None).await;
    let change = |id: &str, etag: &str, price: i64| {
        update(
            id,
            Product {
                sku: "UPD-2".into(),
                etag: etag.into(),
                price_cents: price,
                ..Product::default()
            },
            &["price_cents"],
        )
    };
    app.client()
        .await
        .update_product(admin(change("a", &p.etag, 2_600)))
        .await
        .unwrap();
    let e = app
        .client()
        .await
        .update_product(admin(change("b", &p.etag, 2_700)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Aborted, "{e:?}");
    assert_eq!(reason(&e), "ETAG_MISMATCH");
    let now = get(&app, "UPD-2").await;
    assert_eq!((now.price_cents, now.etag.as_str()), (2_600, "2"));
    // Without an etag the change applies to whatever version is there.
    app.client()
        .await
        .update_product(admin(change("c", "", 2_700)))
        .await
        .unwrap();
    assert_eq!(get(&app, "UPD-2").await.price_cents, 2_700);
}

#[tokio::test]
async fn every_bad_update_is_refused_naming_its_field_and_changes_nothing() {
    let app = spawn_app().await;
    let start = now_ms() + 3_600_000;
    let p = create(&app, "UPD-3", Some(start)).await;
    let base = || Product {
        sku: "UPD-3".into(),
        etag: p.etag.clone(),
        ..Product::default()
    };
    let now = now_ms();
    let cases: Vec<(&str, UpdateProductRequest, Code, Vec<&str>)> = vec![
        (
            "empty mask",
            update("b1", base(), &[]),
            Code::InvalidArgument,
            vec!["update_mask"],
        ),
        (
            "no mask",
            UpdateProductRequest {
                update_mask: None,
                ..update("b2", base(), &[])
            },
            Code::InvalidArgument,
            vec!["update_mask"],
        ),
        (
            "a fixed field",
            update("b3", base(), &["stock_buckets"]),
            Code::InvalidArgument,
            vec!["update_mask"],
        ),
        (
            "no such field",
            update("b4", base(), &["colour"]),
            Code::InvalidArgument,
            vec!["update_mask"],
        ),
        (
            "blank name",
            update(
                "b5",
                Product {
                    name: " ".into(),
                    ..base()
                },
                &["name"],
            ),
            Code::InvalidArgument,
            vec!["product.name"],
        ),
        (
            "end before start",
            update(
                "b6",
                Product {
                    sale_end: ms_to_timestamp(start - 1_000),
                    ..base()
                },
                &["sale_end"],
            ),
            Code::InvalidArgument,
            vec!["product.sale_end"],
        ),
        (
            "start in the past",
            update(
                "b7",
                Product {
                    sale_start: ms_to_timestamp(now - 60_000),
                    ..base()
                },
                &["sale_start"],
            ),
            Code::InvalidArgument,
            vec!["product.sale_start"],
        ),
        (
            "a sale price above the price",
            update(
                "b8",
                Product {
                    sale_price_cents: Some(2_501),
                    ..base()
                },
                &["sale_price_cents"],
            ),
            Code::InvalidArgument,
            vec!["product.sale_price_cents"],
        ),
        (
            "a price below the sale price",
            update(
                "b9",
                Product {
                    price_cents: 1_000,
                    ..base()
                },
                &["price_cents"],
            ),
            Code::InvalidArgument,
            vec!["product.price_cents"],
        ),
        (
            "an etag this server never gave",
            update(
                "b10",
                Product {
                    etag: "W/\"x\"".into(),
                    price_cents: 2_000,
                    ..base()
                },
                &["price_cents"],
            ),
            Code::InvalidArgument,
            vec!["product.etag"],
        ),
        (
            "an empty request id",
            update(
                "",
                Product {
                    price_cents: 2_000,
                    ..base()
                },
                &["price_cents"],
            ),
            Code::InvalidArgument,
            vec!["request_id"],
        ),
        (
            "a bad sku",
            update(
                "b12",
                Product {
                    sku: "a b".into(),
                    price_cents: 2_000,
                    ..base()
                },
                &["price_cents"],
            ),
            Code::InvalidArgument,
            vec!["product.sku"],
        ),
        (
            "an unknown sku",
            update(
                "b13",
                Product {
                    sku: "NOPE".into(),
                    price_cents: 2_000,
                    ..base()
                },
                &["price_cents"],
            ),
            Code::NotFound,
            vec![],
        ),
    ];
    for (what, req, code, fields) in cases {
        let e = app
            .client()
            .await
            .update_product(admin(req))
            .await
            .unwrap_err();
        assert_eq!(e.code(), code, "{what}: {e:?}");
        assert_eq!(
            flashsale_platform::error::violated_fields(&e),
            fields,
            "{what}: {e:?}"
        );
        assert_eq!(get(&app, "UPD-3").await, p, "{what} changed the product");
    }
    // Not an admin.
    let e = app
        .client()
        .await
        .update_product(service(update("b14", base(), &["name"])))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    assert!(app.outbox_of("product.updated").await.is_empty());
}

#[tokio::test]
async fn an_open_sale_keeps_its_start_but_closes_early_and_accepted_orders_keep_their_price() {
    let app = spawn_app().await;
    let p = create(&app, "UPD-4", Some(now_ms() - 60_000)).await;
    let order = Uuid::new_v4();
    let first = app
        .client()
        .await
        .reserve_stock(service(reserve_req(order, "u1", "UPD-4", 1)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.unit_price_cents, 1_999);
    let later = update(
        "m1",
        Product {
            sku: "UPD-4".into(),
            sale_start: ms_to_timestamp(now_ms() + 60_000),
            ..Product::default()
        },
        &["sale_start"],
    );
    let e = app
        .client()
        .await
        .update_product(admin(later))
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), reason(&e).as_str()),
        (Code::FailedPrecondition, "SALE_IN_PROGRESS")
    );
    let kept = get(&app, "UPD-4").await;
    assert_eq!((kept.sale_start, kept.etag), (p.sale_start, p.etag));
    // A new sale price applies to the next order; the first keeps its own.
    app.client()
        .await
        .update_product(admin(update(
            "m2",
            Product {
                sku: "UPD-4".into(),
                sale_price_cents: Some(1_500),
                ..Product::default()
            },
            &["sale_price_cents"],
        )))
        .await
        .unwrap();
    let second = app
        .client()
        .await
        .reserve_stock(service(reserve_req(Uuid::new_v4(), "u2", "UPD-4", 1)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(second.unit_price_cents, 1_500);
    let replay = app
        .client()
        .await
        .reserve_stock(service(reserve_req(order, "u1", "UPD-4", 1)))
        .await
        .unwrap()
        .into_inner();
    assert!(replay.replayed);
    // Closed early: from now on nobody buys.
    app.client()
        .await
        .update_product(admin(update(
            "m3",
            Product {
                sku: "UPD-4".into(),
                sale_end: ms_to_timestamp(now_ms() + 300),
                ..Product::default()
            },
            &["sale_end"],
        )))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let e = app
        .client()
        .await
        .reserve_stock(service(reserve_req(Uuid::new_v4(), "u3", "UPD-4", 1)))
        .await
        .unwrap_err();
    assert_eq!(reason(&e), "SALE_ENDED", "{e:?}");
}

#[tokio::test]
async fn another_replica_sells_at_the_new_price_and_limit_once_the_event_reaches_it() {
    let app = spawn_app().await;
    create(&app, "UPD-5", None).await;
    let (port, stop) = app.spawn_replica().await;
    let mut other = ProductStockServiceClient::new(channel(port).await.unwrap());
    // The other replica reads the terms once and keeps them.
    let first = other
        .reserve_stock(service(reserve_req(Uuid::new_v4(), "u0", "UPD-5", 1)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.unit_price_cents, 1_999);

    let changed = Instant::now();
    app.client()
        .await
        .update_product(admin(update(
            "r1",
            Product {
                sku: "UPD-5".into(),
                sale_price_cents: Some(1_234),
                per_user_limit: 1,
                ..Product::default()
            },
            &["sale_price_cents", "per_user_limit"],
        )))
        .await
        .unwrap();
    // Each buyer once, on the other replica, until it sells at the new price.
    let mut seen = None;
    for i in 0..100 {
        let got = other
            .reserve_stock(service(reserve_req(
                Uuid::new_v4(),
                &format!("u{}", i + 1),
                "UPD-5",
                1,
            )))
            .await
            .unwrap()
            .into_inner();
        if got.unit_price_cents == 1_234 {
            seen = Some(changed.elapsed());
            break;
        }
        assert_eq!(got.unit_price_cents, 1_999);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = seen.expect("the other replica never sold at the new price");
    eprintln!("the other replica sold at the new price {took:?} after the update");
    // And by the new limit: a buyer of one unit may buy no second.
    let e = other
        .reserve_stock(service(reserve_req(Uuid::new_v4(), "u0", "UPD-5", 1)))
        .await
        .unwrap_err();
    assert_eq!(reason(&e), "USER_LIMIT_EXCEEDED", "{e:?}");
    stop.trigger();
}
