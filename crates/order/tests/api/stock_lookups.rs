//! LookupOrders and ListPendingOrders, the questions product-stock asks before it gives a gate
//! hold away or rebuilds a gate; and, with both services running, what they protect: holds of
//! acknowledged orders survive a broker outage and a lost gate (docs/architecture.md#operations).

use std::{collections::BTreeSet, time::Duration};

use flashsale_platform::auth::Role;
use flashsale_proto::{
    order::v1::{ListPendingOrdersRequest, LookupOrdersRequest, OrderStatus},
    product::v1::ReserveStockRequest,
};
use flashsale_test_support::{
    grpc::{token, with_token},
    unique_name,
};
use tonic::Code;
use uuid::Uuid;

use crate::helpers::{TestApp, as_admin, as_user, reason, spawn_app, spawn_stack_with};

fn as_service<T>(msg: T) -> tonic::Request<T> {
    with_token(msg, &token("product-stock", Role::Service))
}

/// Writes an order straight into the order database.
async fn insert(app: &TestApp, sku: &str, user: &str, status: &str) -> Uuid {
    let id = Uuid::new_v4();
    let reason = if status == "CANCELLED" {
        "'USER_CANCELLED'"
    } else {
        "NULL"
    };
    app.exec(&format!(
        "INSERT INTO orders (order_id, user_id, request_id, sku, quantity, unit_price_cents, \
         total_cents, deduction_policy, status, cancel_reason) VALUES ('{id}', '{user}', '{id}', \
         '{sku}', 2, 100, 200, 'RESERVE_THEN_COMMIT', '{status}', {reason})"
    ))
    .await;
    id
}

fn lookup(ids: &[String]) -> LookupOrdersRequest {
    LookupOrdersRequest {
        order_ids: ids.to_vec(),
    }
}

fn fields(s: &tonic::Status) -> Vec<String> {
    flashsale_platform::error::violated_fields(s)
}

#[tokio::test]
async fn lookup_orders_answers_the_orders_that_exist() {
    let app = spawn_app().await;
    let pending = insert(&app, "L1", "alice", "PENDING").await;
    let cancelled = insert(&app, "L1", "bob", "CANCELLED").await;
    let missing = Uuid::new_v4();
    let ids = [pending, cancelled, missing].map(|id| id.to_string());
    let found = app
        .client()
        .await
        .lookup_orders(as_service(lookup(&ids)))
        .await
        .unwrap()
        .into_inner()
        .orders;
    let mut got: Vec<(String, i32, String, i64)> = found
        .into_iter()
        .map(|o| (o.order_id, o.status, o.user_id, o.quantity))
        .collect();
    got.sort();
    let mut want = vec![
        (
            pending.to_string(),
            OrderStatus::Pending as i32,
            "alice".to_owned(),
            2,
        ),
        (
            cancelled.to_string(),
            OrderStatus::Cancelled as i32,
            "bob".to_owned(),
            2,
        ),
    ];
    want.sort();
    assert_eq!(got, want, "the missing order is absent");
}

#[tokio::test]
async fn lookup_orders_refuses_bad_input_and_callers_that_are_not_services() {
    let app = spawn_app().await;
    let id = insert(&app, "L2", "alice", "PENDING").await.to_string();
    let mut c = app.client().await;
    let too_many: Vec<String> = (0..501).map(|_| Uuid::new_v4().to_string()).collect();
    let cases: Vec<(Vec<String>, Vec<&str>)> = vec![
        (vec![], vec!["order_ids"]),
        (too_many, vec!["order_ids"]),
        (vec![id.clone(), "nope".into()], vec!["order_ids[1]"]),
        (
            vec![Uuid::new_v4().simple().to_string(), format!("{{{id}}}")],
            vec!["order_ids[0]", "order_ids[1]"],
        ),
    ];
    for (ids, want) in cases {
        let e = c.lookup_orders(as_service(lookup(&ids))).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{ids:?}");
        assert_eq!(fields(&e), want, "{ids:?}");
    }
    let ok = [id.clone()];
    for req in [as_user("alice", lookup(&ok)), as_admin(lookup(&ok))] {
        let e = c.lookup_orders(req).await.unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied);
    }
    // Exactly 500 is fine.
    let mut most: Vec<String> = (0..499).map(|_| Uuid::new_v4().to_string()).collect();
    most.push(id);
    let found = c.lookup_orders(as_service(lookup(&most))).await.unwrap();
    assert_eq!(found.into_inner().orders.len(), 1);
    assert_eq!(app.count("SELECT COUNT(*) AS n FROM orders").await, 1);
}

fn pending_req(sku: &str, page_size: i32, page_token: &str) -> ListPendingOrdersRequest {
    ListPendingOrdersRequest {
        sku: sku.into(),
        page_size,
        page_token: page_token.into(),
    }
}

#[tokio::test]
async fn list_pending_orders_pages_through_one_products_pending_orders() {
    let app = spawn_app().await;
    let mut want = BTreeSet::new();
    for i in 0..5 {
        want.insert(
            insert(&app, "P1", &format!("u{i}"), "PENDING")
                .await
                .to_string(),
        );
    }
    insert(&app, "P1", "x", "AWAITING_PAYMENT").await;
    insert(&app, "P1", "y", "CANCELLED").await;
    insert(&app, "P2", "z", "PENDING").await;
    let mut c = app.client().await;
    let (mut got, mut token, mut pages) = (Vec::new(), String::new(), 0);
    loop {
        let page = c
            .list_pending_orders(as_service(pending_req("P1", 2, &token)))
            .await
            .unwrap()
            .into_inner();
        pages += 1;
        assert!(page.orders.len() <= 2);
        for o in page.orders {
            assert_eq!(
                (o.sku.as_str(), o.status),
                ("P1", OrderStatus::Pending as i32)
            );
            got.push(o.order_id);
        }
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(pages, 3);
    assert_eq!(got.iter().cloned().collect::<BTreeSet<_>>(), want);
    let mut sorted = got.clone();
    sorted.sort();
    assert_eq!(got, sorted, "ordered by order id");
    let none = c
        .list_pending_orders(as_service(pending_req("P3", 0, "")))
        .await
        .unwrap()
        .into_inner();
    assert!(none.orders.is_empty() && none.next_page_token.is_empty());
}

#[tokio::test]
async fn list_pending_orders_refuses_bad_input_and_callers_that_are_not_services() {
    let app = spawn_app().await;
    for i in 0..3 {
        insert(&app, "P1", &format!("u{i}"), "PENDING").await;
    }
    let mut c = app.client().await;
    let first = c
        .list_pending_orders(as_service(pending_req("P1", 1, "")))
        .await
        .unwrap()
        .into_inner();
    let token = first.next_page_token;
    assert!(!token.is_empty());
    let cases = [
        (pending_req("", 0, ""), "sku"),
        (pending_req("a b", 0, ""), "sku"),
        (pending_req(&"x".repeat(65), 0, ""), "sku"),
        (pending_req("P1", -1, ""), "page_size"),
        (pending_req("P1", 0, "junk"), "page_token"),
        (pending_req("P2", 0, &token), "page_token"),
    ];
    for (req, field) in cases {
        let e = c
            .list_pending_orders(as_service(req.clone()))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{req:?}");
        assert_eq!(fields(&e), [field], "{req:?}");
    }
    for req in [
        as_user("u0", pending_req("P1", 0, "")),
        as_admin(pending_req("P1", 0, "")),
    ] {
        let e = c.list_pending_orders(req).await.unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied);
    }
    assert_eq!(app.count("SELECT COUNT(*) AS n FROM orders").await, 3);
}

/// Both services; the order service's events never reach product-stock (another exchange), as
/// during a broker outage: acknowledged orders stay PENDING and their holds unpersisted.
async fn stack_without_events(
    tune_stock: impl FnOnce(&mut flashsale_product_stock::config::Settings),
) -> TestApp {
    spawn_stack_with(
        |_| {},
        |s| {
            s.amqp.exchange = unique_name("fs_test_ex_cut");
            tune_stock(s);
        },
    )
    .await
}

#[tokio::test]
async fn a_lost_gate_is_rebuilt_without_selling_the_units_of_acknowledged_orders_again() {
    let app = stack_without_events(|_| {}).await;
    app.product("R1", 10, 0).await;
    for i in 0..4 {
        let o = app.order(&format!("a{i}"), "r", "R1", 1).await.unwrap();
        assert_eq!(o.status, OrderStatus::Pending as i32);
    }
    assert_eq!(
        app.stock_count("SELECT COUNT(*) AS n FROM reservations")
            .await,
        0
    );
    let gate = app.stock_gate();
    assert!(gate.forget("R1").await.unwrap() > 0);

    let mut sold = 0;
    for i in 0..10 {
        match app.order(&format!("b{i}"), "r", "R1", 1).await {
            Ok(_) => sold += 1,
            Err(e) => assert_eq!(reason(&e), "SOLD_OUT", "{e:?}"),
        }
    }
    assert_eq!(
        sold, 6,
        "10 units − 4 acknowledged before the gate was lost"
    );
    let snap = gate.snapshot("R1").await.unwrap().unwrap();
    assert_eq!((snap.available, snap.held), (0, 10));
}

#[tokio::test]
async fn the_sweeper_keeps_the_holds_of_acknowledged_orders_while_their_events_are_late() {
    let app = stack_without_events(|s| {
        s.stock.hold_ttl_ms = 300;
        s.stock.sweep_interval_ms = 100;
    })
    .await;
    app.product("S1", 10, 0).await;
    let mut orders = Vec::new();
    for i in 0..3 {
        orders.push(app.order(&format!("a{i}"), "r", "S1", 1).await.unwrap());
    }
    // A hold whose CreateOrder never wrote its order (it crashed after the gate).
    let orphan = Uuid::new_v4();
    app.stock()
        .await
        .reserve_stock(as_service(ReserveStockRequest {
            order_id: orphan.to_string(),
            user_id: "ghost".into(),
            sku: "S1".into(),
            quantity: 2,
        }))
        .await
        .unwrap();

    let expired = format!(
        "SELECT COUNT(*) AS n FROM reservations WHERE order_id = '{orphan}' AND cause = 'HOLD_EXPIRED'"
    );
    flashsale_test_support::eventually(Duration::from_secs(15), "orphan expired", || async {
        (app.stock_count(&expired).await == 1).then_some(())
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        app.stock_count("SELECT COUNT(*) AS n FROM reservations")
            .await,
        1,
        "only the orphan was given away"
    );
    let snap = app.stock_gate().snapshot("S1").await.unwrap().unwrap();
    assert_eq!((snap.available, snap.held), (7, 3));
    for o in &orders {
        let now = app.get(&o.user_id, &o.order_id).await;
        assert_eq!(now.status, OrderStatus::Pending as i32, "{now:?}");
    }
}
