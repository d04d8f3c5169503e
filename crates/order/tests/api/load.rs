//! A flood: 3,000 CreateOrder calls from 1,000 users (limit 1) for 200 units.

use flashsale_proto::order::v1::OrderStatus;

use crate::helpers::{as_user, create_req, reason, spawn_stack};

#[tokio::test]
async fn three_thousand_orders_for_two_hundred_units_accept_exactly_two_hundred() {
    let app = spawn_stack(|_| {}).await;
    app.product("FLOOD", 200, 1).await;
    let clients: Vec<_> = futures_util::future::join_all((0..8).map(|_| app.client())).await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..3000usize {
        let mut c = clients[i % clients.len()].clone();
        tasks.spawn(async move {
            let user = format!("u{}", i % 1000);
            let req = create_req(&format!("r{i}"), "FLOOD", 1);
            c.create_order(as_user(&user, req))
                .await
                .map(|r| r.into_inner().order.unwrap())
                .map_err(|s| (reason(&s), s))
        });
    }
    let (mut accepted, mut refused) = (Vec::new(), 0);
    while let Some(r) = tasks.join_next().await {
        match r.unwrap() {
            Ok(o) => accepted.push(o),
            Err((why, status)) => {
                assert!(
                    ["SOLD_OUT", "USER_LIMIT_EXCEEDED", "INSUFFICIENT_STOCK"]
                        .contains(&why.as_str()),
                    "{why}: {status:?}"
                );
                refused += 1;
            }
        }
    }
    assert_eq!(accepted.len(), 200);
    assert_eq!(refused, 2800);
    let users: std::collections::BTreeSet<_> = accepted.iter().map(|o| o.user_id.clone()).collect();
    assert_eq!(users.len(), 200, "a user got two");
    app.wait_count(
        "SELECT COUNT(*) AS n FROM orders WHERE status = 'AWAITING_PAYMENT'",
        200,
    )
    .await;
    assert_eq!(app.count("SELECT COUNT(*) AS n FROM orders").await, 200);
    let p = app.get_product("FLOOD").await;
    assert_eq!((p.reserved, p.gate_available, p.available), (200, 0, 0));
    let sample = app.get(&accepted[0].user_id, &accepted[0].order_id).await;
    assert_eq!(sample.status, OrderStatus::AwaitingPayment as i32);
}

#[tokio::test]
async fn a_flood_on_a_product_in_stock_buckets_accepts_exactly_its_stock_once_per_user() {
    let app = spawn_stack(|_| {}).await;
    let p = app.product_in_buckets("HOT", 100, 1, 8).await;
    assert_eq!((p.stock_buckets, p.gate_available), (8, 100));
    let clients: Vec<_> = futures_util::future::join_all((0..8).map(|_| app.client())).await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..1000usize {
        let mut c = clients[i % clients.len()].clone();
        tasks.spawn(async move {
            let user = format!("u{}", i % 400);
            let req = create_req(&format!("r{i}"), "HOT", 1);
            // UNAVAILABLE is retried as a client would, with the same request id.
            for _ in 0..10 {
                match c.create_order(as_user(&user, req.clone())).await {
                    Ok(r) => return Ok(r.into_inner().order.unwrap()),
                    Err(s) if s.code() == tonic::Code::Unavailable => continue,
                    Err(s) if reason(&s).is_empty() => {
                        return Err(format!("{:?} {}", s.code(), s.message()));
                    }
                    Err(s) => return Err(reason(&s)),
                }
            }
            Err("UNAVAILABLE ten times".to_owned())
        });
    }
    let (mut accepted, mut refused) = (Vec::new(), 0);
    while let Some(r) = tasks.join_next().await {
        match r.unwrap() {
            Ok(o) => accepted.push(o),
            Err(why) => {
                assert!(
                    ["SOLD_OUT", "USER_LIMIT_EXCEEDED"].contains(&why.as_str()),
                    "{why}"
                );
                refused += 1;
            }
        }
    }
    assert_eq!(accepted.len(), 100);
    assert_eq!(refused, 900);
    let users: std::collections::BTreeSet<_> = accepted.iter().map(|o| o.user_id.clone()).collect();
    assert_eq!(users.len(), 100, "a user got two");
    app.wait_count(
        "SELECT COUNT(*) AS n FROM orders WHERE status = 'AWAITING_PAYMENT'",
        100,
    )
    .await;
    let p = app.get_product("HOT").await;
    assert_eq!((p.reserved, p.gate_available, p.available), (100, 0, 0));
}
