//! Event contract: the order service accepts every event it consumes in its fixture's shape and
//! publishes every event in its fixture's shape (`proto/fixtures/events/`, shared with
//! product-stock's tests).

use flashsale_proto::{
    events::v1::{Envelope, envelope::Payload},
    order::v1::OrderStatus,
};
use flashsale_test_support::fixtures;

use crate::helpers::{TestApp, as_user, spawn_stack};

/// Inserts the fixtures' order (alice, 2 × WINE-2020-MAGNUM) in `status` under the fixture's id.
async fn fixture_order(app: &TestApp, status: &str) -> String {
    let created = fixtures::envelope("order.created").unwrap();
    let Some(Payload::OrderCreated(ev)) = &created.payload else {
        panic!("fixture payload")
    };
    let paid = if status == "PAID" {
        "'pay-7f3e'"
    } else {
        "NULL"
    };
    app.exec(&format!(
        "INSERT INTO orders (order_id, user_id, request_id, sku, quantity, unit_price_cents, total_cents, \
         deduction_policy, status, payment_deadline, payment_id) VALUES ('{}', 'alice', 'fx', '{}', 2, 4500, 9000, \
         'RESERVE_THEN_COMMIT', '{status}', now() - interval '1 second', {paid})",
        ev.order_id, ev.sku
    ))
    .await;
    ev.order_id.clone()
}

async fn deliver(app: &TestApp, env: &Envelope) {
    let before = app.count("SELECT COUNT(*) AS n FROM inbox").await;
    app.publish_envelope(env).await;
    app.wait_count("SELECT COUNT(*) AS n FROM inbox", before + 1)
        .await;
}

#[tokio::test]
async fn consumed_fixtures_are_accepted() {
    let cases = [
        ("stock.reserved", "PENDING", OrderStatus::AwaitingPayment),
        (
            "stock.reservation_failed",
            "PENDING",
            OrderStatus::Cancelled,
        ),
        (
            "order.payment_timeout",
            "AWAITING_PAYMENT",
            OrderStatus::Cancelled,
        ),
        ("outbound.completed", "PAID", OrderStatus::Shipped),
        ("outbound.failed", "PAID", OrderStatus::Cancelled),
    ];
    for (kind, from, to) in cases {
        let app = spawn_stack(|_| {}).await;
        let id = fixture_order(&app, from).await;
        let env = fixtures::envelope(kind).unwrap();
        // A batch timer names further orders of the same confirmation batch.
        let more = match &env.payload {
            Some(Payload::PaymentTimeout(t)) => t.more_order_ids.clone(),
            _ => Vec::new(),
        };
        for (i, other) in more.iter().enumerate() {
            app.exec(&format!(
                "INSERT INTO orders (order_id, user_id, request_id, sku, quantity, unit_price_cents, total_cents, \
                 deduction_policy, status, cancel_reason, payment_deadline) SELECT '{other}', user_id, 'fx-more-{i}', sku, \
                 quantity, unit_price_cents, total_cents, deduction_policy, status, cancel_reason, payment_deadline \
                 FROM orders WHERE order_id = '{id}'"
            ))
            .await;
        }
        deliver(&app, &env).await;
        assert_eq!(app.get("alice", &id).await.status, to as i32, "{kind}");
        for other in &more {
            assert_eq!(app.get("alice", other).await.status, to as i32, "{kind}");
        }
    }
}

#[tokio::test]
async fn published_events_match_their_fixtures() {
    let app = spawn_stack(|_| {}).await;
    app.product("WINE-2020-MAGNUM", 10, 0).await;
    let paid = app
        .order("alice", "a", "WINE-2020-MAGNUM", 2)
        .await
        .unwrap();
    let late = app
        .order("alice", "b", "WINE-2020-MAGNUM", 1)
        .await
        .unwrap();
    let mut c = app.client().await;
    for o in [&paid, &late] {
        app.wait_status("alice", &o.order_id, OrderStatus::AwaitingPayment)
            .await;
    }
    app.pay("alice", &paid.order_id).await;
    // Started, then cancelled, then paid at the provider anyway: refunded.
    let started = app.start_payment("alice", &late.order_id).await.unwrap();
    let cancel = flashsale_proto::order::v1::CancelOrderRequest {
        order_id: late.order_id.clone(),
    };
    c.cancel_order(as_user("alice", cancel)).await.unwrap();
    app.buyer_pays(&started.checkout.unwrap().provider_payment_id)
        .await;
    app.wait_count("SELECT COUNT(*) AS n FROM refunds", 1).await;

    let mut seen = std::collections::BTreeSet::new();
    for kind in [
        "order.created",
        "order.paid",
        "order.cancelled",
        "order.refunded",
        "order.payment_timeout",
    ] {
        for env in app.outbox_of(kind).await {
            fixtures::assert_same_shape(&env).unwrap();
            seen.insert(env.r#type.clone());
        }
    }
    for kind in [
        "order.created",
        "order.paid",
        "order.cancelled",
        "order.refunded",
        "order.payment_timeout",
    ] {
        assert!(seen.contains(kind), "{kind} not emitted: {seen:?}");
    }
}

#[test]
fn every_units_back_fixture_names_its_product() {
    for kind in flashsale_order::api::amqp::UNITS_BACK_KEYS {
        let env = fixtures::envelope(kind).unwrap();
        let sku = flashsale_order::api::amqp::sku_with_units_back(&env);
        assert!(
            sku.is_some_and(|s| !s.is_empty()),
            "{kind}: the sold-out memory cannot tell which product is back"
        );
    }
}
