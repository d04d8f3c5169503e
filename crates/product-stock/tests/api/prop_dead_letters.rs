//! Generated requests against product-stock's DeadLetterService, with messages parked from both
//! of its consumer queues: each answer is OK or a documented code, only an admin is served, and
//! a refused request changes no row (see `flashsale_test_support::generated`).

use flashsale_messaging::envelope;
use flashsale_product_stock::api::amqp::{order_events_topology, stock_events_topology};
use flashsale_proto::events::v1::{OrderCancelled, StockAdjusted, envelope::Payload};
use flashsale_test_support::generated::{check_dead_letter_service, park};

use crate::helpers::spawn_app;

#[test]
fn generated_dead_letter_requests_get_documented_answers_and_refusals_change_nothing() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (app, queues, ids) = rt.block_on(async {
        let app = spawn_app().await;
        let orders = order_events_topology(&app.settings.amqp).queue().to_owned();
        let stock = stock_events_topology(&app.settings.amqp).queue().to_owned();
        let mut ids = Vec::new();
        for n in 0..4 {
            let order = uuid::Uuid::new_v4().to_string();
            let cancelled = Payload::OrderCancelled(OrderCancelled {
                order_id: order.clone(),
                user_id: "alice".into(),
                sku: "GONE".into(),
                quantity: 1,
                ..Default::default()
            });
            let env = envelope::new(cancelled, order, "", "order");
            ids.push(park(&app.conn, &orders, &env).await.unwrap());
            let adjusted = Payload::StockAdjusted(StockAdjusted {
                request_id: format!("adj-{n}"),
                sku: "GONE".into(),
                delta: 1,
                on_hand: 1,
                ..Default::default()
            });
            let env = envelope::new(adjusted, "GONE", "", "product-stock");
            ids.push(park(&app.conn, &stock, &env).await.unwrap());
        }
        (app, vec![orders, stock], ids)
    });
    let result = check_dead_letter_service(
        &rt,
        app.grpc_port,
        &app.conn,
        &[
            "products",
            "stock",
            "reservations",
            "stock_ledger",
            "stock_adjustments",
            "outbox:message_id,routing_key,payload",
            "inbox",
            "dead_letters",
        ],
        queues,
        ids,
        96,
    );
    drop(app);
    if let Err(e) = result {
        panic!("{e}");
    }
}
