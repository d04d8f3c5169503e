//! ReserveStock: the gate's answers, idempotency, bad input, the flood, and a cold start after
//! Redis lost the product.

use std::collections::HashMap;

use deadpool_redis::redis;
use flashsale_proto::product::v1::{DeductionPolicy, GetProductRequest, ReserveStockRequest};
use tonic::Code;
use uuid::Uuid;

use crate::helpers::{Client, admin, reason, service, spawn_app, user};

const RTC: DeductionPolicy = DeductionPolicy::ReserveThenCommit;

pub fn reserve_req(order: Uuid, user_id: &str, sku: &str, quantity: i64) -> ReserveStockRequest {
    ReserveStockRequest {
        order_id: order.to_string(),
        user_id: user_id.into(),
        sku: sku.into(),
        quantity,
    }
}

async fn reserve(
    client: &mut Client,
    order: Uuid,
    user_id: &str,
    sku: &str,
    q: i64,
) -> Result<i64, tonic::Status> {
    client
        .reserve_stock(service(reserve_req(order, user_id, sku, q)))
        .await
        .map(|r| r.into_inner().gate_available)
}

#[tokio::test]
async fn reserve_answers_reserved_then_each_refusal_with_its_reason() {
    let app = spawn_app().await;
    app.create("G1", 3, 2, RTC).await;
    let mut c = app.client().await;
    let ok = c
        .reserve_stock(service(reserve_req(Uuid::new_v4(), "u1", "G1", 2)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (ok.gate_available, ok.unit_price_cents, ok.replayed),
        (1, 1999, false)
    );
    assert_eq!(ok.deduction_policy, RTC as i32);

    let limit = reserve(&mut c, Uuid::new_v4(), "u1", "G1", 1)
        .await
        .unwrap_err();
    assert_eq!(
        (limit.code(), reason(&limit).as_str()),
        (Code::FailedPrecondition, "USER_LIMIT_EXCEEDED")
    );
    let short = reserve(&mut c, Uuid::new_v4(), "u2", "G1", 2)
        .await
        .unwrap_err();
    assert_eq!(reason(&short), "INSUFFICIENT_STOCK");
    assert_eq!(
        reserve(&mut c, Uuid::new_v4(), "u2", "G1", 1)
            .await
            .unwrap(),
        0
    );
    let sold = reserve(&mut c, Uuid::new_v4(), "u3", "G1", 1)
        .await
        .unwrap_err();
    assert_eq!(reason(&sold), "SOLD_OUT");
    // Nothing of this reached the database: reservations are persisted by order.created only.
    assert_eq!(app.count("SELECT COUNT(*) AS n FROM reservations").await, 0);
    assert_eq!(app.count("SELECT reserved AS n FROM stock").await, 0);
}

#[tokio::test]
async fn replayed_reserve_returns_the_first_answer_and_a_changed_one_is_refused() {
    let app = spawn_app().await;
    app.create("G2", 5, 0, RTC).await;
    let mut c = app.client().await;
    let order = Uuid::new_v4();
    let first = c
        .reserve_stock(service(reserve_req(order, "u1", "G2", 2)))
        .await
        .unwrap()
        .into_inner();
    let again = c
        .reserve_stock(service(reserve_req(order, "u1", "G2", 2)))
        .await
        .unwrap()
        .into_inner();
    assert!(again.replayed);
    assert_eq!(again.gate_available, first.gate_available);
    assert_eq!(app.gate.snapshot("G2").await.unwrap().unwrap().available, 3);
    let err = reserve(&mut c, order, "u1", "G2", 3).await.unwrap_err();
    assert_eq!(reason(&err), "IDEMPOTENCY_KEY_REUSED");
}

#[tokio::test]
async fn bad_reserve_input_is_refused_and_changes_nothing() {
    let app = spawn_app().await;
    app.create("G3", 5, 0, RTC).await;
    let mut c = app.client().await;
    let max = app.settings.stock.max_quantity;
    let id = Uuid::new_v4().to_string();
    let cases = [
        (
            ReserveStockRequest {
                order_id: "nope".into(),
                ..reserve_req(Uuid::new_v4(), "u", "G3", 1)
            },
            "order_id",
        ),
        (
            ReserveStockRequest {
                order_id: id.replace('-', ""),
                ..reserve_req(Uuid::new_v4(), "u", "G3", 1)
            },
            "order_id",
        ),
        (reserve_req(Uuid::new_v4(), "", "G3", 1), "user_id"),
        (reserve_req(Uuid::new_v4(), "u", "", 1), "sku"),
        (reserve_req(Uuid::new_v4(), "u", "G3", 0), "quantity"),
        (reserve_req(Uuid::new_v4(), "u", "G3", -4), "quantity"),
        (reserve_req(Uuid::new_v4(), "u", "G3", max + 1), "quantity"),
    ];
    for (req, field) in cases {
        let err = c.reserve_stock(service(req)).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{field}");
        assert!(
            flashsale_platform::error::violated_fields(&err).contains(&field.to_owned()),
            "{field}"
        );
    }
    assert_eq!(app.gate.snapshot("G3").await.unwrap().unwrap().available, 5);
    let err = c
        .reserve_stock(user(reserve_req(Uuid::new_v4(), "u", "G3", 1)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    let err = c
        .reserve_stock(reserve_req(Uuid::new_v4(), "u", "G3", 1))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
}

#[tokio::test]
async fn unknown_sku_is_not_found_and_creates_no_redis_keys() {
    let app = spawn_app().await;
    let mut c = app.client().await;
    let err = reserve(&mut c, Uuid::new_v4(), "u", "GHOST", 1)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert_eq!(
        app.gate.forget("GHOST").await.unwrap(),
        0,
        "keys were created for an unknown sku"
    );
}

#[tokio::test]
async fn a_flood_of_2000_reserves_from_500_users_takes_exactly_the_stock() {
    let app = spawn_app().await;
    app.create("FLOOD", 100, 2, RTC).await;
    let mut tasks = tokio::task::JoinSet::new();
    let clients: Vec<Client> = futures_util::future::join_all((0..8).map(|_| app.client())).await;
    for i in 0..2000usize {
        let mut c = clients[i % clients.len()].clone();
        let user_id = format!("user-{}", i % 500);
        tasks.spawn(async move {
            // UNAVAILABLE (the gate's pool busy on a loaded machine) is retried with the same
            // order id, as a client does; every other answer is final.
            let order_id = Uuid::new_v4();
            let mut r = reserve(&mut c, order_id, &user_id, "FLOOD", 1).await;
            for _ in 0..50 {
                match &r {
                    // Unavailable, or no answer in time on a loaded machine: the same order
                    // id again, which replays its first answer if it had one.
                    Err(s)
                        if matches!(
                            s.code(),
                            Code::Unavailable | Code::Cancelled | Code::DeadlineExceeded
                        ) =>
                    {
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        r = reserve(&mut c, order_id, &user_id, "FLOOD", 1).await;
                    }
                    _ => break,
                }
            }
            (user_id, r.map_err(|s| (s.code(), reason(&s))))
        });
    }
    let (mut won, mut per_user) = (0, HashMap::<String, i64>::new());
    while let Some(joined) = tasks.join_next().await {
        let (user_id, result) = joined.unwrap();
        match result {
            Ok(remaining) => {
                assert!(remaining >= 0, "counter went below zero");
                won += 1;
                *per_user.entry(user_id).or_default() += 1;
            }
            Err((code, why)) => {
                assert_eq!(code, Code::FailedPrecondition);
                assert!(
                    ["SOLD_OUT", "INSUFFICIENT_STOCK", "USER_LIMIT_EXCEEDED"]
                        .contains(&why.as_str()),
                    "{why}"
                );
            }
        }
    }
    assert_eq!(won, 100);
    assert!(per_user.values().all(|&n| n <= 2), "a user got more than 2");
    let snap = app.gate.snapshot("FLOOD").await.unwrap().unwrap();
    assert_eq!((snap.available, snap.held), (0, 100));
}

#[tokio::test]
async fn after_redis_lost_the_product_the_next_reserve_rebuilds_it_from_the_database() {
    let app = spawn_app().await;
    app.create("COLD", 10, 3, RTC).await;
    // The database already holds 4 units for u1 (persisted earlier), 1 for u2.
    app.exec(
        "UPDATE stock SET reserved = 5 WHERE sku = 'COLD';
         INSERT INTO reservations (order_id, sku, user_id, quantity, state, policy) VALUES
           (gen_random_uuid(), 'COLD', 'u1', 3, 'RESERVED', 'RESERVE_THEN_COMMIT'),
           (gen_random_uuid(), 'COLD', 'u2', 2, 'COMMITTED', 'RESERVE_THEN_COMMIT')",
    )
    .await;
    assert!(app.gate.forget("COLD").await.unwrap() > 0);
    let mut c = app.client().await;
    let err = reserve(&mut c, Uuid::new_v4(), "u1", "COLD", 1)
        .await
        .unwrap_err();
    assert_eq!(
        reason(&err),
        "USER_LIMIT_EXCEEDED",
        "per-user counts must be rebuilt too"
    );
    assert_eq!(
        reserve(&mut c, Uuid::new_v4(), "u3", "COLD", 2)
            .await
            .unwrap(),
        3
    );
    let p = c
        .get_product(admin(GetProductRequest { sku: "COLD".into() }))
        .await
        .unwrap()
        .into_inner()
        .product
        .unwrap();
    assert_eq!((p.available, p.gate_available), (5, 3));
}

#[tokio::test]
async fn a_replica_on_a_redis_restored_from_a_stale_snapshot_drops_the_gate_and_rebuilds_it() {
    let app = spawn_app().await;
    app.create("STALE", 10, 0, RTC).await;
    // Six units sold since the snapshot: the database has them, the restored gate does not.
    app.exec(
        "UPDATE stock SET reserved = 6 WHERE sku = 'STALE';
         INSERT INTO reservations (order_id, sku, user_id, quantity, state, policy) VALUES
           (gen_random_uuid(), 'STALE', 'u1', 6, 'RESERVED', 'RESERVE_THEN_COMMIT')",
    )
    .await;
    assert_eq!(
        app.gate.snapshot("STALE").await.unwrap().unwrap().available,
        10
    );
    // The data came from a Redis started earlier (a real restart cannot be done on the shared
    // server): its run id is another one.
    let gate_run = format!("{}gate_run", app.settings.redis.key_prefix);
    let mut conn = flashsale_platform::redis::pool(&app.settings.redis)
        .unwrap()
        .get()
        .await
        .unwrap();
    let recorded: Option<String> = redis::cmd("GET")
        .arg(&gate_run)
        .query_async(&mut *conn)
        .await
        .unwrap();
    assert!(
        recorded.is_some(),
        "the first app recorded its Redis's run id"
    );
    let _: () = redis::cmd("SET")
        .arg(&gate_run)
        .arg("an-earlier-redis")
        .query_async(&mut *conn)
        .await
        .unwrap();

    // A replica connecting now (as every replica does after a Redis restart) drops the gate
    // before its first command, so the next reservation rebuilds it from the database.
    let replica = flashsale_product_stock::startup::build_with_orders(
        app.settings.clone(),
        Default::default(),
        app.orders.clone(),
    )
    .await
    .unwrap();
    let port = replica.grpc_port();
    let stop = replica.shutdown();
    let task = tokio::spawn(replica.run_until_stopped());
    let mut c = Client::new(flashsale_test_support::grpc::channel(port).await.unwrap());
    assert_eq!(
        reserve(&mut c, Uuid::new_v4(), "u2", "STALE", 4)
            .await
            .unwrap(),
        0,
        "only the 4 units the database still has"
    );
    let err = reserve(&mut c, Uuid::new_v4(), "u3", "STALE", 1)
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "SOLD_OUT");
    let recorded: Option<String> = redis::cmd("GET")
        .arg(&gate_run)
        .query_async(&mut *conn)
        .await
        .unwrap();
    assert_ne!(recorded.as_deref(), Some("an-earlier-redis"));
    stop.trigger();
    let _ = task.await;
}

fn buyers_req(sku: &str, max_buyers: u32) -> flashsale_proto::product::v1::GetGateBuyersRequest {
    flashsale_proto::product::v1::GetGateBuyersRequest {
        sku: sku.into(),
        max_buyers,
        known_refills: String::new(),
    }
}

#[tokio::test]
async fn gate_buyers_lists_who_holds_units_with_the_counter() {
    let app = spawn_app().await;
    app.create("GB1", 3, 0, RTC).await;
    let mut c = app.client().await;
    let empty = c
        .get_gate_buyers(service(buyers_req("GB1", 10)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (empty.gate_available, empty.buyer_count, empty.complete),
        (3, 0, true)
    );
    assert!(empty.user_ids.is_empty());
    for (u, q) in [("u1", 1), ("u2", 2)] {
        reserve(&mut c, Uuid::new_v4(), u, "GB1", q).await.unwrap();
    }
    // A refused buyer is not a buyer.
    reserve(&mut c, Uuid::new_v4(), "u3", "GB1", 1)
        .await
        .unwrap_err();
    let got = c
        .get_gate_buyers(service(buyers_req("GB1", 10)))
        .await
        .unwrap()
        .into_inner();
    let mut users = got.user_ids.clone();
    users.sort();
    assert_eq!((got.gate_available, got.buyer_count), (0, 2));
    assert!(got.complete);
    assert_eq!(users, ["u1", "u2"]);
    // More buyers than asked for: counted, not listed.
    let capped = c
        .get_gate_buyers(service(buyers_req("GB1", 1)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((capped.buyer_count, capped.complete), (2, false));
    assert!(capped.user_ids.is_empty());
}

#[tokio::test]
async fn gate_buyers_sends_no_list_while_no_units_came_back() {
    let app = spawn_app().await;
    app.create("GB3", 2, 0, RTC).await;
    let mut c = app.client().await;
    for u in ["u1", "u2"] {
        reserve(&mut c, Uuid::new_v4(), u, "GB3", 1).await.unwrap();
    }
    let first = c
        .get_gate_buyers(service(buyers_req("GB3", 10)))
        .await
        .unwrap()
        .into_inner();
    assert!(first.complete && !first.unchanged);
    assert!(!first.refills.is_empty());
    let again = |known: String| flashsale_proto::product::v1::GetGateBuyersRequest {
        known_refills: known,
        ..buyers_req("GB3", 10)
    };
    // Sold out and nothing came back: the earlier list still holds, none is sent.
    let same = c
        .get_gate_buyers(service(again(first.refills.clone())))
        .await
        .unwrap()
        .into_inner();
    assert!(same.unchanged && !same.complete);
    assert!(same.user_ids.is_empty());
    assert_eq!(
        (same.gate_available, same.buyer_count, same.refills.as_str()),
        (0, 2, first.refills.as_str())
    );
    // A restock: units came back, so the list comes again with a new count.
    c.adjust_stock(admin(flashsale_proto::product::v1::AdjustStockRequest {
        request_id: "restock".into(),
        sku: "GB3".into(),
        delta: 1,
        reason: "delivery".into(),
    }))
    .await
    .unwrap();
    let moved = c
        .get_gate_buyers(service(again(first.refills.clone())))
        .await
        .unwrap()
        .into_inner();
    assert!(!moved.unchanged && moved.complete);
    assert_ne!(moved.refills, first.refills);
    assert_eq!((moved.gate_available, moved.user_ids.len()), (1, 2));
}

#[tokio::test]
async fn bad_gate_buyers_input_is_refused() {
    let app = spawn_app().await;
    app.create("GB2", 3, 0, RTC).await;
    let mut c = app.client().await;
    for (sku, max, field) in [
        ("GB2", 0, "max_buyers"),
        ("GB2", 100_001, "max_buyers"),
        ("bad{sku}", 10, "sku"),
        ("", 10, "sku"),
    ] {
        let err = c
            .get_gate_buyers(service(buyers_req(sku, max)))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{sku:?} {max}");
        assert_eq!(
            flashsale_platform::error::violated_fields(&err),
            [field],
            "{sku:?} {max}"
        );
    }
    for known in ["12a", "-1", " 1", &"1".repeat(33)] {
        let req = flashsale_proto::product::v1::GetGateBuyersRequest {
            known_refills: known.into(),
            ..buyers_req("GB2", 10)
        };
        let err = c.get_gate_buyers(service(req)).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{known:?}");
        assert_eq!(
            flashsale_platform::error::violated_fields(&err),
            ["known_refills"],
            "{known:?}"
        );
    }
    let missing = c
        .get_gate_buyers(service(buyers_req("NOPE", 10)))
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    let denied = c
        .get_gate_buyers(user(buyers_req("GB2", 10)))
        .await
        .unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied);
}

fn batch(
    items: Vec<ReserveStockRequest>,
) -> flashsale_proto::product::v1::ReserveStockBatchRequest {
    flashsale_proto::product::v1::ReserveStockBatchRequest { items }
}

#[tokio::test]
async fn a_reserve_batch_answers_each_item_as_reserve_stock_would() {
    let app = spawn_app().await;
    app.create("RB1", 2, 1, RTC).await;
    app.create("RB2", 1, 0, RTC).await;
    let mut c = app.client().await;
    let first = Uuid::new_v4();
    let items = vec![
        reserve_req(first, "u1", "RB1", 1),
        reserve_req(Uuid::new_v4(), "u1", "RB1", 1), // u1's limit is 1
        reserve_req(Uuid::new_v4(), "u2", "RB1", 1),
        reserve_req(Uuid::new_v4(), "u3", "RB1", 1), // sold out by now
        reserve_req(Uuid::new_v4(), "u4", "NOPE", 1),
        ReserveStockRequest {
            order_id: "not-a-uuid".into(),
            ..reserve_req(Uuid::new_v4(), "u5", "RB2", 1)
        },
        reserve_req(Uuid::new_v4(), "u6", "RB2", 2), // only 1 left
        reserve_req(first, "u1", "RB1", 1),          // a replay
    ];
    let out = c
        .reserve_stock_batch(service(batch(items)))
        .await
        .unwrap()
        .into_inner()
        .outcomes;
    assert_eq!(out.len(), 8);
    let got: Vec<(bool, i32, &str)> = out
        .iter()
        .map(|o| (o.reserved.is_some(), o.code, o.reason.as_str()))
        .collect();
    let fp = Code::FailedPrecondition as i32;
    assert_eq!(
        got,
        [
            (true, 0, ""),
            (false, fp, "USER_LIMIT_EXCEEDED"),
            (true, 0, ""),
            (false, fp, "SOLD_OUT"),
            (false, Code::NotFound as i32, "NOT_FOUND"),
            (false, Code::InvalidArgument as i32, "INVALID_ARGUMENT"),
            (false, fp, "INSUFFICIENT_STOCK"),
            (true, 0, ""),
        ]
    );
    assert_eq!(out[5].fields, ["order_id"]);
    assert!(out[7].reserved.as_ref().unwrap().replayed);
    assert_eq!(out[2].reserved.as_ref().unwrap().gate_available, 0);
    let snap = app.gate.snapshot("RB1").await.unwrap().unwrap();
    assert_eq!((snap.available, snap.held), (0, 2));
    let snap = app.gate.snapshot("RB2").await.unwrap().unwrap();
    assert_eq!((snap.available, snap.held), (1, 0), "refusals took nothing");
}

#[tokio::test]
async fn bad_reserve_batches_are_refused_whole() {
    let app = spawn_app().await;
    app.create("RB3", 5, 0, RTC).await;
    let mut c = app.client().await;
    let empty = c
        .reserve_stock_batch(service(batch(vec![])))
        .await
        .unwrap_err();
    assert_eq!(empty.code(), Code::InvalidArgument);
    assert_eq!(
        flashsale_platform::error::violated_fields(&empty),
        ["items"]
    );
    let many: Vec<_> = (0..257)
        .map(|i| reserve_req(Uuid::new_v4(), &format!("u{i}"), "RB3", 1))
        .collect();
    let big = c
        .reserve_stock_batch(service(batch(many)))
        .await
        .unwrap_err();
    assert_eq!(big.code(), Code::InvalidArgument);
    let denied = c
        .reserve_stock_batch(user(batch(vec![reserve_req(
            Uuid::new_v4(),
            "u",
            "RB3",
            1,
        )])))
        .await
        .unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied);
    let snap = app.gate.snapshot("RB3").await.unwrap().unwrap();
    assert_eq!(snap.available, 5, "nothing reserved");
}

#[tokio::test]
async fn a_reserve_batch_after_redis_lost_the_product_rebuilds_it_first() {
    let app = spawn_app().await;
    app.create("COLDB", 3, 0, RTC).await;
    assert!(app.gate.forget("COLDB").await.unwrap() > 0);
    let mut c = app.client().await;
    let items = (0..4)
        .map(|i| reserve_req(Uuid::new_v4(), &format!("u{i}"), "COLDB", 1))
        .collect();
    let out = c
        .reserve_stock_batch(service(batch(items)))
        .await
        .unwrap()
        .into_inner()
        .outcomes;
    let reserved = out.iter().filter(|o| o.reserved.is_some()).count();
    let sold_out = out.iter().filter(|o| o.reason == "SOLD_OUT").count();
    assert_eq!((reserved, sold_out), (3, 1), "{out:?}");
    let snap = app.gate.snapshot("COLDB").await.unwrap().unwrap();
    assert_eq!((snap.available, snap.held), (0, 3));
}
