//! Generated page tokens against product-stock's listings, ListProducts and ListDeadLetters:
//! arbitrary Unicode (multi-byte and control characters among it), bytes made text, and near
//! misses of a token the service issued. A token it issued is served; anything else is
//! INVALID_ARGUMENT naming `page_token`, never another code (a handler that panics reads as
//! CANCELLED), and no answer changes a row (see `flashsale_test_support::page_tokens`).

use flashsale_messaging::envelope;
use flashsale_product_stock::api::amqp::order_events_topology;
use flashsale_proto::{
    events::v1::{OrderCancelled, envelope::Payload},
    product::v1::{DeductionPolicy, ListProductsRequest},
};
use flashsale_test_support::{
    generated::{park, table_digest},
    page_tokens::{check_dead_letter_page_tokens, check_page_tokens},
};

use crate::helpers::{spawn_app, user};

/// Every table of product-stock.
const TABLES: [&str; 8] = [
    "products",
    "stock",
    "reservations",
    "stock_ledger",
    "stock_adjustments",
    "outbox:message_id,routing_key,payload",
    "inbox",
    "dead_letters",
];

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn list_products_answers_any_page_token_with_a_page_or_invalid_argument_naming_it() {
    let rt = runtime();
    let (app, issued) = rt.block_on(async {
        let app = spawn_app().await;
        for sku in ["TOK-A", "TOK-B", "TOK-C", "TOK-D"] {
            app.create(sku, 5, 0, DeductionPolicy::ReserveThenCommit)
                .await;
        }
        let mut c = app.client().await;
        let (mut issued, mut token) = (Vec::new(), String::new());
        loop {
            let page = c
                .list_products(user(ListProductsRequest {
                    page_size: 1,
                    page_token: token,
                }))
                .await
                .unwrap()
                .into_inner();
            if page.next_page_token.is_empty() {
                break;
            }
            token = page.next_page_token.clone();
            issued.push(page.next_page_token);
        }
        (app, issued)
    });
    assert_eq!(issued.len(), 3, "{issued:?}");
    let result = check_page_tokens(
        &rt,
        issued,
        128,
        |page_token| {
            let app = &app;
            async move {
                app.client()
                    .await
                    .list_products(user(ListProductsRequest {
                        page_size: 2,
                        page_token,
                    }))
                    .await
                    .map(drop)
            }
        },
        || table_digest(&app.conn, &TABLES),
    );
    drop(app);
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[test]
fn list_dead_letters_answers_any_page_token_with_a_page_or_invalid_argument_naming_it() {
    let rt = runtime();
    let (app, queue) = rt.block_on(async {
        let app = spawn_app().await;
        let queue = order_events_topology(&app.settings.amqp).queue().to_owned();
        for _ in 0..3 {
            let order = uuid::Uuid::new_v4().to_string();
            let cancelled = Payload::OrderCancelled(OrderCancelled {
                order_id: order.clone(),
                user_id: "alice".into(),
                sku: "GONE".into(),
                quantity: 1,
                ..Default::default()
            });
            let env = envelope::new(cancelled, order, "", "order");
            park(&app.conn, &queue, &env).await.unwrap();
        }
        (app, queue)
    });
    let result = check_dead_letter_page_tokens(&rt, app.grpc_port, &app.conn, &TABLES, &queue, 96);
    drop(app);
    if let Err(e) = result {
        panic!("{e}");
    }
}
