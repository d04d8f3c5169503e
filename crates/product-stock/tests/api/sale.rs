//! Sale windows and sale prices: CreateProduct takes and shows them, refuses every bad one
//! naming the field (and creates nothing), and the gate refuses reservations outside the window
//! by its own clock, naming the opening or the closing.

use std::time::Duration;

use flashsale_contract::{Timestamp, ms_to_timestamp, parse_rfc3339_ms, reason::meta, rfc3339_ms};
use flashsale_proto::product::v1::{
    CreateProductRequest, DeductionPolicy, GetProductRequest, ReserveStockBatchRequest,
};
use tonic::Code;
use uuid::Uuid;

use crate::{
    helpers::{admin, reason, service, spawn_app, user},
    reserve::reserve_req,
};

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

fn at(ms: i64) -> Option<Timestamp> {
    ms_to_timestamp(ms)
}

fn on_sale(sku: &str, start_ms: Option<i64>, end_ms: Option<i64>) -> CreateProductRequest {
    CreateProductRequest {
        sku: sku.into(),
        name: "Flash gin".into(),
        price_cents: 2_500,
        initial_stock: 5,
        per_user_limit: 0,
        deduction_policy: DeductionPolicy::ReserveThenCommit as i32,
        stock_buckets: 0,
        sale_start: start_ms.and_then(ms_to_timestamp),
        sale_end: end_ms.and_then(ms_to_timestamp),
        sale_price_cents: Some(1_999),
    }
}

/// The instant `key` of a status's `ErrorInfo` metadata.
fn instant(s: &tonic::Status, key: &str) -> i64 {
    let m = flashsale_platform::error::info_metadata(s);
    let v = m
        .get(key)
        .unwrap_or_else(|| panic!("no {key} in {m:?}: {s:?}"));
    parse_rfc3339_ms(v).unwrap_or_else(|| panic!("{key} = {v:?} is no instant"))
}

#[tokio::test]
async fn a_product_keeps_its_window_and_sale_price_to_the_millisecond() {
    let app = spawn_app().await;
    let start = now_ms() + 3_600_000;
    let mut req = on_sale("GIN-1", Some(start), Some(start + 600_000));
    // Finer than a millisecond is dropped.
    if let Some(ts) = req.sale_start.as_mut() {
        ts.nanos += 456;
    }
    let p = app
        .client()
        .await
        .create_product(admin(req))
        .await
        .unwrap()
        .into_inner()
        .product
        .unwrap();
    assert_eq!(p.sale_start, at(start));
    assert_eq!(p.sale_end, at(start + 600_000));
    assert_eq!(p.sale_price_cents, Some(1_999));
    let got = app
        .client()
        .await
        .get_product(user(GetProductRequest {
            sku: "GIN-1".into(),
        }))
        .await
        .unwrap()
        .into_inner()
        .product
        .unwrap();
    assert_eq!(got, p);
    // A product without a window has none.
    let plain = app
        .client()
        .await
        .create_product(admin(CreateProductRequest {
            sale_price_cents: None,
            ..on_sale("GIN-2", None, None)
        }))
        .await
        .unwrap()
        .into_inner()
        .product
        .unwrap();
    assert_eq!(
        (plain.sale_start, plain.sale_end, plain.sale_price_cents),
        (None, None, None)
    );
}

#[tokio::test]
async fn a_bad_window_or_sale_price_is_refused_naming_it_and_creates_nothing() {
    let app = spawn_app().await;
    let now = now_ms();
    let cases: Vec<(&str, CreateProductRequest, Vec<&str>)> = vec![
        (
            "end before start",
            on_sale("BAD-1", Some(now + 60_000), Some(now + 30_000)),
            vec!["sale_end"],
        ),
        (
            "end at start",
            on_sale("BAD-2", Some(now + 60_000), Some(now + 60_000)),
            vec!["sale_end"],
        ),
        (
            "window in the past",
            on_sale("BAD-3", Some(now - 120_000), Some(now - 60_000)),
            vec!["sale_end"],
        ),
        (
            "sale price above the price",
            CreateProductRequest {
                sale_price_cents: Some(2_501),
                ..on_sale("BAD-4", None, None)
            },
            vec!["sale_price_cents"],
        ),
        (
            "negative sale price",
            CreateProductRequest {
                sale_price_cents: Some(-1),
                ..on_sale("BAD-5", None, None)
            },
            vec!["sale_price_cents"],
        ),
        (
            "start no instant",
            CreateProductRequest {
                sale_start: Some(Timestamp {
                    seconds: 1,
                    nanos: -5,
                }),
                ..on_sale("BAD-6", None, None)
            },
            vec!["sale_start"],
        ),
        (
            "end beyond year 9999",
            CreateProductRequest {
                sale_end: Some(Timestamp {
                    seconds: 253_402_300_800,
                    nanos: 0,
                }),
                ..on_sale("BAD-7", None, None)
            },
            vec!["sale_end"],
        ),
        (
            "start before 1970",
            CreateProductRequest {
                sale_start: Some(Timestamp {
                    seconds: -10,
                    nanos: 0,
                }),
                ..on_sale("BAD-8", None, None)
            },
            vec!["sale_start"],
        ),
        (
            "every field bad at once",
            CreateProductRequest {
                price_cents: -1,
                sale_price_cents: Some(-3),
                ..on_sale("BAD-9", Some(now + 60_000), Some(now + 1_000))
            },
            vec!["price_cents", "sale_end", "sale_price_cents"],
        ),
    ];
    for (what, req, fields) in cases {
        let sku = req.sku.clone();
        let e = app
            .client()
            .await
            .create_product(admin(req))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{what}: {e:?}");
        assert_eq!(
            flashsale_platform::error::violated_fields(&e),
            fields,
            "{what}: {e:?}"
        );
        let gone = app
            .client()
            .await
            .get_product(user(GetProductRequest { sku: sku.clone() }))
            .await
            .unwrap_err();
        assert_eq!(gone.code(), Code::NotFound, "{what}: {sku} was created");
    }
}

#[tokio::test]
async fn before_the_opening_the_gate_refuses_naming_the_opening_by_its_own_clock() {
    let app = spawn_app().await;
    let start = now_ms() + 3_600_000;
    app.client()
        .await
        .create_product(admin(on_sale("EARLY", Some(start), None)))
        .await
        .unwrap();
    let e = app
        .client()
        .await
        .reserve_stock(service(reserve_req(Uuid::new_v4(), "u1", "EARLY", 1)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert_eq!(reason(&e), "SALE_NOT_STARTED");
    assert_eq!(instant(&e, meta::SALE_START), start);
    // This machine's Redis runs on this machine's clock.
    let gate = instant(&e, meta::GATE_TIME);
    assert!((gate - now_ms()).abs() < 60_000, "gate clock {gate}");
    assert!(e.message().contains(&rfc3339_ms(start)), "{e:?}");

    // The batch answers each item alike, with the same metadata.
    let outcomes = app
        .client()
        .await
        .reserve_stock_batch(service(ReserveStockBatchRequest {
            items: vec![
                reserve_req(Uuid::new_v4(), "u2", "EARLY", 1),
                reserve_req(Uuid::new_v4(), "u3", "NOPE", 1),
            ],
        }))
        .await
        .unwrap()
        .into_inner()
        .outcomes;
    assert_eq!(outcomes[0].reason, "SALE_NOT_STARTED");
    assert_eq!(outcomes[0].code, Code::FailedPrecondition as i32);
    assert_eq!(
        outcomes[0]
            .metadata
            .get(meta::SALE_START)
            .and_then(|v| parse_rfc3339_ms(v)),
        Some(start)
    );
    assert!(outcomes[0].metadata.contains_key(meta::GATE_TIME));
    assert_eq!(outcomes[1].code, Code::NotFound as i32);
    assert!(outcomes[1].metadata.is_empty());
    // Refused: nothing was taken.
    app.wait_gate("EARLY", (5, 0)).await;
}

#[tokio::test]
async fn in_the_window_units_sell_at_the_sale_price_and_after_it_only_replays_are_answered() {
    let app = spawn_app().await;
    let end = now_ms() + 1_500;
    app.client()
        .await
        .create_product(admin(on_sale("LATE", Some(now_ms() - 60_000), Some(end))))
        .await
        .unwrap();
    let order = Uuid::new_v4();
    let sent = now_ms();
    let ok = app
        .client()
        .await
        .reserve_stock(service(reserve_req(order, "u1", "LATE", 2)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ok.unit_price_cents, 1_999, "the sale price");
    let gate = ok
        .gate_time
        .as_ref()
        .and_then(flashsale_contract::timestamp_to_ms)
        .unwrap();
    assert!(
        gate >= sent - 1 && gate <= now_ms() + 1,
        "accepted at {gate}, asked at {sent}"
    );

    // Past the end by this machine's clock, which its Redis shares.
    let wait = end - now_ms() + 20;
    if wait > 0 {
        tokio::time::sleep(Duration::from_millis(wait.unsigned_abs())).await;
    }
    let e = app
        .client()
        .await
        .reserve_stock(service(reserve_req(Uuid::new_v4(), "u2", "LATE", 1)))
        .await
        .unwrap_err();
    assert_eq!(reason(&e), "SALE_ENDED", "{e:?}");
    assert_eq!(instant(&e, meta::SALE_END), end);
    assert!(instant(&e, meta::GATE_TIME) >= end);
    // The order accepted in the window is still answered as its replay, without a clock.
    let replay = app
        .client()
        .await
        .reserve_stock(service(reserve_req(order, "u1", "LATE", 2)))
        .await
        .unwrap()
        .into_inner();
    assert!(replay.replayed);
    assert_eq!(replay.gate_time, None);
    app.wait_gate("LATE", (3, 2)).await;
}
