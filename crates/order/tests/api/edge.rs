//! Input that cannot poison: control characters refused in every string field, a batch write
//! the database refuses written again one order at a time, and requests tonic cannot decode
//! answered with the contract's codes.

use std::{sync::Arc, time::Duration};

use flashsale_order::{
    app::{Admission, Intake, PendingWrite, WRITE_FALLBACKS, write_pending_batch_or_each},
    config::{AdmissionSettings, SagaSettings},
    domain::{PlaceOrder, Policy},
    infra::{db::Inserted, stock::GrpcStock},
};
use flashsale_platform::{
    auth::{JwtKeys, Role, ServiceToken},
    error::{reason_of, violated_fields},
    failpoint::{Action, Failpoints},
    settings::AuthSettings,
};
use flashsale_proto::order::v1::{
    CancelOrderRequest, CreateOrderRequest, GetOrderRequest, ListOrdersRequest,
    ListPendingOrdersRequest, ListStuckOrdersRequest, LookupOrdersRequest, PayOrderRequest,
    WatchOrderRequest,
};
use flashsale_test_support::{
    eventually,
    grpc::{token, with_token},
};
use tonic::Code;

use crate::helpers::{as_admin, as_user, spawn_stack};

/// A CreateOrder as the order service would write it after the gate, with any request id (the
/// edge refuses a control character; the app layer below it does not check again).
fn write(user: &str, request_id: &str) -> PendingWrite {
    PendingWrite {
        place: PlaceOrder {
            user_id: user.to_owned(),
            request_id: request_id.to_owned(),
            sku: "SKU".to_owned(),
            quantity: 1,
        },
        unit_price_cents: 100,
        policy: Policy::ReserveThenCommit,
        accepted_at: None,
    }
}

#[tokio::test]
async fn a_batch_the_database_refuses_is_written_again_one_order_at_a_time() {
    let (_db, conn) = crate::helpers::migrated_orders_db().await;
    let mut writes: Vec<PendingWrite> = (0..10).map(|i| write(&format!("u{i}"), "k")).collect();
    // PostgreSQL refuses a NUL in text: as one statement, this batch fails as a whole.
    writes.insert(4, write("poison", "a\0"));
    let answers = write_pending_batch_or_each(&conn, writes, &Failpoints::default()).await;

    assert_eq!(answers.len(), 11);
    for (i, a) in answers.iter().enumerate() {
        match (i, a) {
            (4, a) => assert!(a.is_err(), "the poisoned write was accepted: {a:?}"),
            (_, Ok(w)) => assert!(matches!(w.inserted, Inserted::New), "{i}: {w:?}"),
            (_, Err(e)) => panic!("write {i} failed beside the poisoned one: {e}"),
        }
    }
    let count = |sql| flashsale_test_support::probe::count(&conn, sql);
    assert_eq!(count("SELECT COUNT(*) AS n FROM orders").await.unwrap(), 10);
    assert_eq!(
        count("SELECT COUNT(*) AS n FROM outbox WHERE message_type = 'order.created'")
            .await
            .unwrap(),
        10
    );
    assert_eq!(
        count("SELECT COUNT(*) AS n FROM order_status_history")
            .await
            .unwrap(),
        10
    );
}

#[tokio::test]
async fn a_poisoned_order_beside_forty_concurrent_buyers_fails_alone_and_gives_its_units_back() {
    let app = spawn_stack(|_| {}).await;
    app.product("POISON", 100, 0).await;
    let auth = AuthSettings {
        allow_development_secret: true,
        ..AuthSettings::default()
    };
    let keys = JwtKeys::from_settings(&auth, "test").unwrap();
    let token = Arc::new(ServiceToken::new(keys, "order").unwrap());
    let stock = GrpcStock::new(
        &flashsale_platform::settings::UpstreamSettings {
            product_stock_url: format!("http://127.0.0.1:{}", app.stock_port),
            ..Default::default()
        },
        &flashsale_platform::tls::GrpcTlsSettings::default(),
        token,
        Duration::from_secs(5),
    )
    .unwrap();
    // The edge refuses a NUL; the use case below it is called directly, as a request that got
    // past a broken edge would reach it. A pause before the write lines every order up, so
    // they are written in the same batches.
    let failpoints = Failpoints::default();
    failpoints.arm(
        "order.create.before_write",
        Action::Sleep(Duration::from_millis(300)),
    );
    let intake = Intake::new(
        app.conn.clone(),
        Arc::new(stock),
        &SagaSettings::default(),
        Admission::new(app.conn.clone(), &AdmissionSettings::default()),
        failpoints,
    );
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..44 {
        let intake = intake.clone();
        let poisoned = i % 11 == 3;
        let request_id = if poisoned {
            format!("a\0{i}")
        } else {
            format!("r{i}")
        };
        let place = PlaceOrder {
            user_id: format!("buyer{i}"),
            request_id,
            sku: "POISON".to_owned(),
            quantity: 1,
        };
        calls.spawn(async move { (poisoned, intake.place(place).await) });
    }
    let (mut accepted, mut failed) = (0, 0);
    while let Some(joined) = calls.join_next().await {
        match joined.unwrap() {
            (false, Ok((order, replayed))) => {
                assert!(!replayed);
                assert_eq!(order.sku, "POISON");
                accepted += 1;
            }
            (false, Err(e)) => panic!("a clean order failed beside the poisoned ones: {e}"),
            (true, Ok(o)) => panic!("a poisoned order was written: {o:?}"),
            (true, Err(_)) => failed += 1,
        }
    }
    assert_eq!((accepted, failed), (40, 4));
    assert_eq!(app.count("SELECT COUNT(*) AS n FROM orders").await, 40);
    let (_, metrics) = flashsale_test_support::grpc::http_get(app.metrics_port, "/metrics")
        .await
        .unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with(WRITE_FALLBACKS) && !l.ends_with(" 0")),
        "no write batch fell back, so the poisoned orders were never batched with others"
    );
    // The poisoned orders' units go back to the gate; the clean ones are persisted.
    let settled = eventually(Duration::from_secs(20), "units settle", || async {
        let p = app.get_product("POISON").await;
        (p.reserved == 40 && p.gate_available == 60).then_some(p)
    })
    .await;
    assert!(
        settled.is_ok(),
        "units never settled: {:?}",
        app.get_product("POISON").await
    );
}

fn service<T>(msg: T) -> tonic::Request<T> {
    with_token(msg, &token("product-stock", Role::Service))
}

fn ok<T>(answer: Result<tonic::Response<T>, tonic::Status>) -> Result<(), tonic::Status> {
    answer.map(drop)
}

/// `call` answers INVALID_ARGUMENT naming `field`.
fn assert_invalid(answer: Result<(), tonic::Status>, field: &str) {
    let status = answer.expect_err("accepted");
    assert_eq!(status.code(), Code::InvalidArgument, "{field}: {status:?}");
    assert_eq!(violated_fields(&status), [field], "{status:?}");
}

#[tokio::test]
async fn a_control_character_in_any_string_field_is_invalid_argument_naming_it() {
    let app = spawn_stack(|_| {}).await;
    app.product("CTRL", 10, 0).await;
    let c = app.client().await;
    let id = uuid::Uuid::new_v4().to_string();
    let create = |request_id: &str, sku: &str| CreateOrderRequest {
        request_id: request_id.into(),
        sku: sku.into(),
        quantity: 1,
    };

    assert_invalid(
        ok(c.clone()
            .create_order(as_user("alice", create("a\0", "CTRL")))
            .await),
        "request_id",
    );
    assert_invalid(
        ok(c.clone()
            .create_order(as_user("alice", create("k\u{7}", "CTRL")))
            .await),
        "request_id",
    );
    assert_invalid(
        ok(c.clone()
            .create_order(as_user("alice", create("k", "CTRL\0")))
            .await),
        "sku",
    );
    let get = GetOrderRequest {
        order_id: format!("{id}\0"),
    };
    assert_invalid(
        ok(c.clone().get_order(as_user("alice", get)).await),
        "order_id",
    );
    let list = ListOrdersRequest {
        user_id: "bob\0".into(),
        ..Default::default()
    };
    assert_invalid(ok(c.clone().list_orders(as_admin(list)).await), "user_id");
    let list = ListOrdersRequest {
        page_token: "o1.\n".into(),
        ..Default::default()
    };
    assert_invalid(
        ok(c.clone().list_orders(as_user("alice", list)).await),
        "page_token",
    );
    let watch = WatchOrderRequest {
        order_id: "\0".into(),
    };
    assert_invalid(
        ok(c.clone().watch_order(as_user("alice", watch)).await),
        "order_id",
    );
    let pay = PayOrderRequest {
        order_id: id.clone(),
        payment_id: "p\0".into(),
        amount_cents: 2500,
    };
    assert_invalid(
        ok(c.clone().pay_order(as_user("alice", pay)).await),
        "payment_id",
    );
    let cancel = CancelOrderRequest {
        order_id: "\u{1b}[2J".into(),
    };
    assert_invalid(
        ok(c.clone().cancel_order(as_user("alice", cancel)).await),
        "order_id",
    );
    let stuck = ListStuckOrdersRequest {
        page_token: "\0".into(),
        ..Default::default()
    };
    assert_invalid(
        ok(c.clone().list_stuck_orders(as_admin(stuck)).await),
        "page_token",
    );
    let lookup = LookupOrdersRequest {
        order_ids: vec![format!("\0{id}")],
    };
    assert_invalid(
        ok(c.clone().lookup_orders(service(lookup)).await),
        "order_ids[0]",
    );
    let pending = ListPendingOrdersRequest {
        sku: "CTRL\0".into(),
        ..Default::default()
    };
    assert_invalid(
        ok(c.clone().list_pending_orders(service(pending)).await),
        "sku",
    );
    let pending = ListPendingOrdersRequest {
        sku: "CTRL".into(),
        page_token: "\u{85}".into(),
        ..Default::default()
    };
    assert_invalid(
        ok(c.clone().list_pending_orders(service(pending)).await),
        "page_token",
    );

    // Nothing was written, nothing taken at the gate.
    assert_eq!(app.count("SELECT COUNT(*) AS n FROM orders").await, 0);
    assert_eq!(app.count("SELECT COUNT(*) AS n FROM outbox").await, 0);
    assert_eq!(app.get_product("CTRL").await.gate_available, 10);
}

#[tokio::test]
async fn a_token_whose_subject_holds_a_control_character_is_unauthenticated() {
    let app = spawn_stack(|_| {}).await;
    app.product("SUB", 10, 0).await;
    let req = with_token(
        CreateOrderRequest {
            request_id: "k".into(),
            sku: "SUB".into(),
            quantity: 1,
        },
        &token("mallory\0", Role::User),
    );
    let status = app.client().await.create_order(req).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("sub"), "{}", status.message());
    assert_eq!(app.count("SELECT COUNT(*) AS n FROM orders").await, 0);
}

/// CreateOrderRequest as bytes on the wire: `request_id` may be anything, UTF-8 or not.
#[derive(Clone, PartialEq, prost::Message)]
struct RawCreateOrder {
    #[prost(bytes = "vec", tag = "1")]
    request_id: Vec<u8>,
    #[prost(string, tag = "2")]
    sku: String,
    #[prost(int64, tag = "3")]
    quantity: i64,
}

/// Sends `raw` as a CreateOrder of `user` to the order service on `port`.
async fn raw_create(
    port: u16,
    user: &str,
    raw: RawCreateOrder,
) -> Result<flashsale_proto::order::v1::CreateOrderResponse, tonic::Status> {
    let channel = flashsale_test_support::grpc::channel(port).await.unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(
        "/flashsale.order.v1.OrderService/CreateOrder",
    );
    grpc.unary(as_user(user, raw), path, tonic_prost::ProstCodec::default())
        .await
        .map(tonic::Response::into_inner)
}

#[tokio::test]
async fn a_string_field_that_is_not_utf8_is_invalid_argument_naming_it() {
    let app = spawn_stack(|_| {}).await;
    app.product("UTF", 10, 0).await;
    let raw = RawCreateOrder {
        request_id: vec![b'k', 0xff, 0xfe],
        sku: "UTF".into(),
        quantity: 1,
    };
    let status = raw_create(app.grpc_port, "alice", raw).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(violated_fields(&status), ["request_id"], "{status:?}");
    // The same bytes as valid UTF-8 go through: the wire form itself is right.
    let fine = RawCreateOrder {
        request_id: b"k".to_vec(),
        sku: "UTF".into(),
        quantity: 1,
    };
    raw_create(app.grpc_port, "alice", fine).await.unwrap();
    assert_eq!(app.count("SELECT COUNT(*) AS n FROM orders").await, 1);
}

#[tokio::test]
async fn a_message_over_the_size_limit_is_resource_exhausted() {
    let app = spawn_stack(|s| s.grpc.max_message_bytes = 1024).await;
    app.product("BIG", 10, 0).await;
    let raw = RawCreateOrder {
        request_id: vec![b'k'; 2048],
        sku: "BIG".into(),
        quantity: 1,
    };
    let status = raw_create(app.grpc_port, "alice", raw).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(reason_of(&status).as_deref(), Some("MESSAGE_TOO_LARGE"));
    assert_eq!(app.count("SELECT COUNT(*) AS n FROM orders").await, 0);
    assert_eq!(app.get_product("BIG").await.gate_available, 10);
}
