//! `order.paid` shipped in batches: one transaction (and product-stock's commits at once) for
//! the common case; a batch with anything unusual in it shipped one by one with the same
//! results as single deliveries.

use std::{sync::Arc, time::Duration};

use flashsale_outbound::{
    app::{Paid, Shipping},
    infra::{
        stock::GrpcCommitter,
        warehouse::{AlwaysShips, FlakyWarehouse, Warehouse},
    },
};
use flashsale_platform::auth::{JwtKeys, ServiceToken};
use flashsale_proto::product::v1::DeductionPolicy;
use uuid::Uuid;

use crate::stack::{Stack, spawn_stack};

const RTC: DeductionPolicy = DeductionPolicy::ReserveThenCommit;
const CAO: DeductionPolicy = DeductionPolicy::CommitAtOrder;

/// The shipping use cases over the stack's outbound database and product-stock, called
/// directly (the stack's own consumer sees none of these deliveries).
fn shipping(stack: &Stack) -> Shipping {
    shipping_with(stack, Arc::new(AlwaysShips))
}

/// [`shipping`] with another warehouse.
fn shipping_with(stack: &Stack, warehouse: Arc<dyn Warehouse>) -> Shipping {
    let mut s = flashsale_outbound::config::Settings::default();
    s.auth.allow_development_secret = true;
    s.upstream.product_stock_url = format!("http://127.0.0.1:{}", stack.stock_port);
    s.shipping.retry_base_ms = 20;
    let keys = JwtKeys::from_settings(&s.auth, "outbound").unwrap();
    let token = Arc::new(ServiceToken::new(keys, "outbound").unwrap());
    let stock =
        GrpcCommitter::new(&s.upstream, &s.grpc.tls, token, Duration::from_secs(3)).unwrap();
    Shipping::new(stack.conn.clone(), Arc::new(stock), warehouse, s.shipping)
}

fn paid(stack: &Stack, order: Uuid, user: &str, sku: &str, policy: DeductionPolicy) -> Paid {
    Paid {
        env: stack.paid(order, user, sku, policy),
        trace: Default::default(),
    }
}

#[tokio::test]
async fn paid_orders_arriving_together_ship_in_one_transaction() {
    let stack = spawn_stack(|_| {}).await;
    stack.product("BATCH", 20, RTC).await;
    stack.product("TICKET", 5, CAO).await;
    let mut items = Vec::new();
    for i in 0..10 {
        let user = format!("u{i}");
        let order = stack.reserved_order(&user, "BATCH", RTC).await;
        items.push(paid(&stack, order, &user, "BATCH", RTC));
    }
    for i in 0..2 {
        let user = format!("t{i}");
        let order = stack.reserved_order(&user, "TICKET", CAO).await;
        items.push(paid(&stack, order, &user, "TICKET", CAO));
    }
    let ship = shipping(&stack);
    let answers = ship.ship_paid(items.clone()).await;
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    assert_eq!(
        stack
            .count("SELECT COUNT(*) AS n FROM shipments WHERE status = 'SHIPPED' AND attempts = 1")
            .await,
        12
    );
    assert_eq!(
        stack
            .count("SELECT COUNT(DISTINCT xmin::text) AS n FROM shipments")
            .await,
        1,
        "one transaction shipped them all"
    );
    assert_eq!(
        stack
            .count(
                "SELECT COUNT(*) AS n FROM shipment_attempts WHERE attempt = 1 AND outcome = 'OK'"
            )
            .await,
        22,
        "each RESERVE_THEN_COMMIT attempt's commit and warehouse steps, each COMMIT_AT_ORDER one's warehouse step"
    );
    assert_eq!(stack.outbox_of("outbound.completed").await.len(), 12);
    let p = stack.get_product("BATCH").await;
    assert_eq!(
        (p.on_hand, p.reserved),
        (10, 0),
        "each reservation committed once"
    );
    let t = stack.get_product("TICKET").await;
    assert_eq!(t.on_hand, 3, "COMMIT_AT_ORDER: no second deduction");

    // The same deliveries again: nothing more happens.
    let again = ship.ship_paid(items).await;
    assert!(again.iter().all(Result::is_ok), "{again:?}");
    assert_eq!(stack.outbox_of("outbound.completed").await.len(), 12);
    assert_eq!(stack.get_product("BATCH").await.on_hand, 10);
}

#[tokio::test]
async fn a_batch_with_an_unusual_delivery_ships_each_as_alone() {
    let stack = spawn_stack(|_| {}).await;
    stack.product("MIX", 5, RTC).await;
    let ship = shipping(&stack);
    let a = stack.reserved_order("a", "MIX", RTC).await;
    let b = stack.reserved_order("b", "MIX", RTC).await;
    // Shipped before: a redelivery.
    assert!(ship.ship_paid(vec![paid(&stack, a, "a", "MIX", RTC)]).await[0].is_ok());
    // Never reserved on product-stock: its commit is refused, the shipment fails.
    let ghost = Uuid::new_v4();
    let answers = ship
        .ship_paid(vec![
            paid(&stack, a, "a", "MIX", RTC),
            paid(&stack, b, "b", "MIX", RTC),
            paid(&stack, ghost, "g", "MIX", RTC),
        ])
        .await;
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    let status = |o: Uuid| {
        format!("SELECT COUNT(*) AS n FROM shipments WHERE order_id = '{o}' AND status = 'SHIPPED'")
    };
    assert_eq!(stack.count(&status(a)).await, 1);
    assert_eq!(stack.count(&status(b)).await, 1);
    assert_eq!(
        stack
            .count(&format!("SELECT COUNT(*) AS n FROM shipments WHERE order_id = '{ghost}' AND status = 'FAILED'"))
            .await,
        1
    );
    assert_eq!(stack.outbox_of("outbound.completed").await.len(), 2);
    assert_eq!(stack.outbox_of("outbound.failed").await.len(), 1);
    let p = stack.get_product("MIX").await;
    assert_eq!((p.on_hand, p.reserved), (3, 0));
}

#[tokio::test]
async fn a_batch_deducts_before_it_ships_and_fails_what_the_warehouse_refuses_in_the_same_transaction()
 {
    let stack = spawn_stack(|_| {}).await;
    stack.product("GOOD", 5, RTC).await;
    stack.product("BROKEN", 5, RTC).await;
    let mut items = Vec::new();
    for (i, sku) in ["GOOD", "BROKEN", "GOOD", "BROKEN"].into_iter().enumerate() {
        let user = format!("u{i}");
        let order = stack.reserved_order(&user, sku, RTC).await;
        items.push(paid(&stack, order, &user, sku, RTC));
    }
    let ship = shipping_with(
        &stack,
        Arc::new(FlakyWarehouse::new(0.0, ["BROKEN".to_owned()])),
    );
    let answers = ship.ship_paid(items).await;
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    assert_eq!(
        stack
            .count("SELECT COUNT(DISTINCT xmin::text) AS n FROM shipments")
            .await,
        1,
        "one transaction shipped two and failed two"
    );
    assert_eq!(
        stack
            .count("SELECT COUNT(*) AS n FROM shipments WHERE status = 'FAILED' AND stock_committed AND attempts = 1")
            .await,
        2
    );
    assert_eq!(
        stack
            .count("SELECT COUNT(*) AS n FROM shipment_attempts WHERE step = 'warehouse'")
            .await,
        4,
        "the warehouse asked once per shipment"
    );
    assert_eq!(stack.outbox_of("outbound.completed").await.len(), 2);
    assert_eq!(stack.outbox_of("outbound.failed").await.len(), 2);
    for sku in ["GOOD", "BROKEN"] {
        let p = stack.get_product(sku).await;
        assert_eq!(
            (p.on_hand, p.reserved),
            (3, 0),
            "{sku}: deducted before shipping"
        );
    }
}
