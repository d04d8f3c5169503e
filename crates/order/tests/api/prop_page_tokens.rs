//! Generated page tokens against every listing of the order service — ListOrders,
//! ListPendingOrders, ListStuckOrders, ListRefunds and ListDeadLetters: arbitrary Unicode
//! (multi-byte and control characters among it), bytes made text, and near misses of a token
//! the service issued. A token it issued is served; anything else is INVALID_ARGUMENT naming
//! `page_token`, never another code (a handler that panics reads as CANCELLED), and no answer
//! changes a row (see `flashsale_test_support::page_tokens`). A page token that is not UTF-8 at
//! all, which no typed client can send, is INVALID_ARGUMENT naming it too.

use std::future::Future;

use flashsale_messaging::envelope;
use flashsale_platform::{auth::Role, error::violated_fields};
use flashsale_proto::{
    events::v1::{StockReserved, envelope::Payload},
    order::v1::{
        ListOrdersRequest, ListOrdersResponse, ListPendingOrdersRequest, ListRefundsRequest,
        ListStuckOrdersRequest,
    },
};
use flashsale_test_support::{
    generated::{park, table_digest},
    grpc::{token, with_token},
    page_tokens::{check_dead_letter_page_tokens, check_page_tokens},
};
use tonic::Code;
use uuid::Uuid;

use crate::helpers::{Client, TestApp, as_admin, as_user, spawn_app};

/// Every table of the order service a request could change.
const TABLES: [&str; 8] = [
    "orders",
    "order_status_history",
    "payments",
    "provider_payments",
    "refunds",
    "outbox:message_id,routing_key,payload",
    "inbox",
    "dead_letters",
];

/// Cases per listing.
const CASES: u32 = 96;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn as_service<T>(msg: T) -> tonic::Request<T> {
    with_token(msg, &token("product-stock", Role::Service))
}

/// Writes alice's order of `sku` in `status`, last changed `minutes` ago; returns its id.
async fn insert(app: &TestApp, sku: &str, status: &str, minutes: i32) -> Uuid {
    let id = Uuid::new_v4();
    let (reason, payment) = match status {
        "CANCELLED" => ("'USER_CANCELLED'", "NULL".to_owned()),
        "PAID" => ("NULL", format!("'{id}'")),
        _ => ("NULL", "NULL".to_owned()),
    };
    app.exec(&format!(
        "INSERT INTO orders (order_id, user_id, request_id, sku, quantity, unit_price_cents, \
         total_cents, deduction_policy, status, cancel_reason, payment_id, created_at, \
         updated_at) VALUES ('{id}', 'alice', '{id}', '{sku}', 1, 100, 100, \
         'RESERVE_THEN_COMMIT', '{status}', {reason}, {payment}, \
         now() - make_interval(mins => {minutes}), now() - make_interval(mins => {minutes}))"
    ))
    .await;
    id
}

/// The next-page tokens of every page of a listing, one item a page: `page` asks for the page
/// after a token and answers its next-page token.
async fn issued<F, Fut>(page: F) -> Vec<String>
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = String>,
{
    let mut issued = Vec::new();
    let mut next = page(String::new()).await;
    while !next.is_empty() {
        issued.push(next.clone());
        next = page(next).await;
    }
    issued
}

/// Runs the property of one listing against `app`, with its tokens of `issued` and `send`
/// asking for a page.
fn check<S, SF>(rt: &tokio::runtime::Runtime, app: TestApp, issued: Vec<String>, send: S)
where
    S: Fn(Client, String) -> SF,
    SF: Future<Output = Result<(), tonic::Status>>,
{
    assert!(issued.len() >= 2, "{issued:?}");
    let result = check_page_tokens(
        rt,
        issued,
        CASES,
        |page_token| {
            let app = &app;
            let send = &send;
            async move { send(app.client().await, page_token).await }
        },
        || table_digest(&app.conn, &TABLES),
    );
    drop(app);
    if let Err(e) = result {
        panic!("{e}");
    }
}

fn orders_req(page_token: String) -> ListOrdersRequest {
    ListOrdersRequest {
        page_size: 1,
        page_token,
        ..Default::default()
    }
}

#[test]
fn list_orders_answers_any_page_token_with_a_page_or_invalid_argument_naming_it() {
    let rt = runtime();
    let (app, tokens) = rt.block_on(async {
        let app = spawn_app().await;
        for minutes in [4, 3, 2] {
            insert(&app, "TOK", "CANCELLED", minutes).await;
        }
        let c = app.client().await;
        let tokens = issued(|t| {
            let mut c = c.clone();
            async move {
                let page = c.list_orders(as_user("alice", orders_req(t))).await;
                page.unwrap().into_inner().next_page_token
            }
        })
        .await;
        (app, tokens)
    });
    check(&rt, app, tokens, |mut c, t| async move {
        c.list_orders(as_user("alice", orders_req(t)))
            .await
            .map(drop)
    });
}

fn pending_req(page_token: String) -> ListPendingOrdersRequest {
    ListPendingOrdersRequest {
        sku: "TOK".into(),
        page_size: 1,
        page_token,
    }
}

#[test]
fn list_pending_orders_answers_any_page_token_with_a_page_or_invalid_argument_naming_it() {
    let rt = runtime();
    let (app, tokens) = rt.block_on(async {
        let app = spawn_app().await;
        for _ in 0..3 {
            insert(&app, "TOK", "PENDING", 0).await;
        }
        let c = app.client().await;
        let tokens = issued(|t| {
            let mut c = c.clone();
            async move {
                let page = c.list_pending_orders(as_service(pending_req(t))).await;
                page.unwrap().into_inner().next_page_token
            }
        })
        .await;
        (app, tokens)
    });
    check(&rt, app, tokens, |mut c, t| async move {
        c.list_pending_orders(as_service(pending_req(t)))
            .await
            .map(drop)
    });
}

fn stuck_req(page_token: String) -> ListStuckOrdersRequest {
    ListStuckOrdersRequest {
        page_size: 1,
        page_token,
        ..Default::default()
    }
}

#[test]
fn list_stuck_orders_answers_any_page_token_with_a_page_or_invalid_argument_naming_it() {
    let rt = runtime();
    let (app, tokens) = rt.block_on(async {
        let app = spawn_app().await;
        // Paid long ago and never shipped: stuck past the default ten minutes.
        for minutes in [40, 35, 30] {
            insert(&app, "TOK", "PAID", minutes).await;
        }
        let c = app.client().await;
        let tokens = issued(|t| {
            let mut c = c.clone();
            async move {
                let page = c.list_stuck_orders(as_admin(stuck_req(t))).await;
                page.unwrap().into_inner().next_page_token
            }
        })
        .await;
        (app, tokens)
    });
    check(&rt, app, tokens, |mut c, t| async move {
        c.list_stuck_orders(as_admin(stuck_req(t))).await.map(drop)
    });
}

fn refunds_req(page_token: String) -> ListRefundsRequest {
    ListRefundsRequest {
        page_size: 1,
        page_token,
        ..Default::default()
    }
}

#[test]
fn list_refunds_answers_any_page_token_with_a_page_or_invalid_argument_naming_it() {
    let rt = runtime();
    let (app, tokens) = rt.block_on(async {
        let app = spawn_app().await;
        // Settled refunds of cancelled orders: nothing for the refund worker to do.
        for minutes in [3, 2, 1] {
            let id = insert(&app, "TOK", "CANCELLED", minutes).await;
            app.exec(&format!(
                "INSERT INTO refunds (order_id, payment_id, amount_cents, reason, status, \
                 created_at) VALUES ('{id}', 'pay-{id}', 100, 'LATE_PAYMENT', 'SUCCEEDED', \
                 now() - make_interval(mins => {minutes}))"
            ))
            .await;
        }
        let c = app.client().await;
        let tokens = issued(|t| {
            let mut c = c.clone();
            async move {
                let page = c.list_refunds(as_admin(refunds_req(t))).await;
                page.unwrap().into_inner().next_page_token
            }
        })
        .await;
        (app, tokens)
    });
    check(&rt, app, tokens, |mut c, t| async move {
        c.list_refunds(as_admin(refunds_req(t))).await.map(drop)
    });
}

#[test]
fn list_dead_letters_answers_any_page_token_with_a_page_or_invalid_argument_naming_it() {
    let rt = runtime();
    let (app, queue) = rt.block_on(async {
        let app = spawn_app().await;
        let queue = flashsale_order::api::amqp::topology(&app.settings.amqp)
            .queue()
            .to_owned();
        for _ in 0..3 {
            let order = Uuid::new_v4().to_string();
            let reserved = Payload::StockReserved(StockReserved {
                order_id: order.clone(),
                sku: "GONE".into(),
                quantity: 1,
                ..Default::default()
            });
            let env = envelope::new(reserved, order, "", "product-stock");
            park(&app.conn, &queue, &env).await.unwrap();
        }
        (app, queue)
    });
    let result =
        check_dead_letter_page_tokens(&rt, app.grpc_port, &app.conn, &TABLES, &queue, CASES);
    drop(app);
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// ListOrdersRequest as bytes on the wire: `page_token` may be anything, UTF-8 or not.
#[derive(Clone, PartialEq, prost::Message)]
struct RawListOrders {
    #[prost(int32, tag = "3")]
    page_size: i32,
    #[prost(bytes = "vec", tag = "4")]
    page_token: Vec<u8>,
}

/// Sends `raw` as alice's ListOrders to the order service on `port`.
async fn raw_list(port: u16, raw: RawListOrders) -> Result<ListOrdersResponse, tonic::Status> {
    let channel = flashsale_test_support::grpc::channel(port).await.unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(
        "/flashsale.order.v1.OrderService/ListOrders",
    );
    grpc.unary(
        as_user("alice", raw),
        path,
        tonic_prost::ProstCodec::default(),
    )
    .await
    .map(tonic::Response::into_inner)
}

#[tokio::test]
async fn a_page_token_that_is_not_utf8_is_invalid_argument_naming_it() {
    let app = spawn_app().await;
    for minutes in [2, 1] {
        insert(&app, "TOK", "CANCELLED", minutes).await;
    }
    let first = raw_list(
        app.grpc_port,
        RawListOrders {
            page_size: 1,
            page_token: Vec::new(),
        },
    )
    .await
    .unwrap();
    let real = first.next_page_token.into_bytes();
    assert!(!real.is_empty());
    // A lone continuation byte, a truncated multi-byte character, a surrogate, an overlong
    // encoding, and the issued token with a byte flipped into one that is not UTF-8.
    let mut flipped = real.clone();
    flipped[3] = 0xff;
    for bytes in [
        vec![0x80],
        b"o1.\xe2\x82".to_vec(),
        b"o1.\xed\xa0\x80".to_vec(),
        b"o1.\xc0\xaf".to_vec(),
        flipped,
    ] {
        let raw = RawListOrders {
            page_size: 1,
            page_token: bytes.clone(),
        };
        let status = raw_list(app.grpc_port, raw).await.unwrap_err();
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "{bytes:?}: {status:?}"
        );
        assert_eq!(violated_fields(&status), ["page_token"], "{status:?}");
    }
    // The issued token, on the same wire form, is served.
    let raw = RawListOrders {
        page_size: 1,
        page_token: real,
    };
    let page = raw_list(app.grpc_port, raw).await.unwrap();
    assert_eq!(page.orders.len(), 1);
}

#[tokio::test]
async fn a_forged_page_token_with_an_instant_the_database_cannot_hold_is_invalid_argument() {
    let app = spawn_app().await;
    for minutes in [2, 1] {
        insert(&app, "TOK", "CANCELLED", minutes).await;
    }
    let mut c = app.client().await;
    let first = c
        .list_orders(as_user("alice", orders_req(String::new())))
        .await
        .unwrap()
        .into_inner();
    // The token's filter check is no secret: keep it, and move the instant to 253,000 years
    // before the epoch (chrono holds it, PostgreSQL's timestamptz does not).
    let parts: Vec<&str> = first.next_page_token.split('.').collect();
    let forged = format!("o1.-8000000000000000000.{}.{}", parts[2], parts[3]);
    let status = c
        .list_orders(as_user("alice", orders_req(forged)))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(violated_fields(&status), ["page_token"], "{status:?}");
}
