//! Per-user limits: a flood from one user is refused RESOURCE_EXHAUSTED with a retry delay while
//! other users are served (CreateOrder, PayOrder, reads, CancelOrder), WatchOrder streams are
//! capped per user, and a refusal writes nothing that outlives it (the gate keeps no key for a
//! buyer refused at their limit, nor for a buyer ordering and cancelling in a loop).

use std::time::{Duration, Instant};

use deadpool_redis::redis;
use flashsale_order::config::LimitSettings;
use flashsale_platform::error::reason_of;
use flashsale_proto::order::v1::{
    CancelOrderRequest, GetOrderRequest, ListOrdersRequest, OrderStatus, PayOrderRequest,
    WatchOrderRequest,
};
use flashsale_test_support::eventually;
use tonic::Code;
use tonic_types::StatusExt as _;

use crate::helpers::{
    TestApp, as_admin, as_user, create_req, reason, spawn_stack, spawn_stack_with,
};

/// The retry delay a RESOURCE_EXHAUSTED carries.
fn retry_after(status: &tonic::Status) -> Duration {
    status
        .get_details_retry_info()
        .and_then(|r| r.retry_delay)
        .unwrap_or_else(|| panic!("no RetryInfo in {status:?}"))
}

/// Every gate key of `sku` (product-stock's Redis, under the test's prefix).
async fn gate_keys(app: &TestApp, sku: &str) -> Vec<String> {
    let s = app.stock_settings.as_ref().expect("spawn_stack");
    let pool = flashsale_platform::redis::pool(&s.redis).unwrap();
    let mut conn = pool.get().await.unwrap();
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}stock:{{p:{sku}}}*", s.redis.key_prefix))
        .query_async(&mut *conn)
        .await
        .unwrap();
    keys.sort();
    keys
}

/// Every key of product-stock's Redis under the test's prefix.
async fn all_gate_keys(app: &TestApp) -> Vec<String> {
    let s = app.stock_settings.as_ref().expect("spawn_stack");
    let pool = flashsale_platform::redis::pool(&s.redis).unwrap();
    let mut conn = pool.get().await.unwrap();
    redis::cmd("KEYS")
        .arg(format!("{}*", s.redis.key_prefix))
        .query_async(&mut *conn)
        .await
        .unwrap()
}

/// Asserts `status` is a per-user refusal with a retry delay of at most `max`.
fn assert_rate_limited(status: &tonic::Status, max: Duration) {
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(reason(status), "RATE_LIMITED");
    let wait = retry_after(status);
    assert!(wait > Duration::ZERO && wait <= max, "{wait:?}");
}

#[tokio::test]
async fn a_flood_from_one_user_is_rate_limited_while_other_users_are_served() {
    let app = spawn_stack(|s| {
        s.limits.create_order_per_sec = 1;
        s.limits.create_order_burst = 3;
    })
    .await;
    app.product("RATE", 1_000, 0).await;
    let c = app.client().await;
    let started = Instant::now();
    let mut flood = tokio::task::JoinSet::new();
    for i in 0..30 {
        let mut c = c.clone();
        flood.spawn(async move {
            c.create_order(as_user("flooder", create_req(&format!("f{i}"), "RATE", 1)))
                .await
        });
    }
    let mut others = tokio::task::JoinSet::new();
    for i in 0..20 {
        let mut c = c.clone();
        others.spawn(async move {
            c.create_order(as_user(&format!("calm{i}"), create_req("k", "RATE", 1)))
                .await
        });
    }
    let (mut passed, mut limited) = (0u32, 0u32);
    while let Some(r) = flood.join_next().await {
        match r.unwrap() {
            Ok(_) => passed += 1,
            Err(s) => {
                assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
                assert_eq!(reason(&s), "RATE_LIMITED");
                let wait = retry_after(&s);
                assert!(
                    wait > Duration::ZERO && wait <= Duration::from_secs(1),
                    "{wait:?}"
                );
                limited += 1;
            }
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    while let Some(r) = others.join_next().await {
        r.unwrap().expect("another user is served during the flood");
    }
    // A burst of 3, then one a second while the flood lasted.
    let allowed = 3 + elapsed.ceil() as u32;
    assert!(
        (3..=allowed).contains(&passed),
        "{passed} of the flood passed in {elapsed:.1} s"
    );
    assert_eq!(passed + limited, 30);
    assert_eq!(
        app.count("SELECT COUNT(*) AS n FROM orders").await,
        i64::from(20 + passed),
        "a refused call wrote nothing"
    );
}

#[tokio::test]
async fn pay_order_is_rate_limited_per_user() {
    let app = spawn_stack(|s| {
        s.limits.pay_order_per_sec = 1;
        s.limits.pay_order_burst = 2;
    })
    .await;
    let c = app.client().await;
    let pay = || PayOrderRequest {
        order_id: uuid::Uuid::new_v4().to_string(),
        payment_id: uuid::Uuid::new_v4().to_string(),
        amount_cents: 100,
    };
    let mut codes = Vec::new();
    for _ in 0..10 {
        let s = c
            .clone()
            .pay_order(as_user("payer", pay()))
            .await
            .unwrap_err();
        codes.push(s.code());
    }
    // The first calls reach the use case (no such order); the rest are refused before it.
    assert_eq!(codes[..2], [Code::NotFound, Code::NotFound]);
    assert!(
        codes.contains(&Code::ResourceExhausted),
        "never limited: {codes:?}"
    );
    let other = c.clone().pay_order(as_user("other", pay())).await;
    assert_eq!(other.unwrap_err().code(), Code::NotFound);
}

#[tokio::test]
async fn watch_order_streams_are_capped_per_user_and_a_closed_one_frees_its_place() {
    let app = spawn_stack(|s| s.limits.watch_streams_per_user = 2).await;
    app.product("WATCH", 10, 0).await;
    let alice = app.order("alice", "k", "WATCH", 1).await.unwrap();
    let bob = app.order("bob", "k", "WATCH", 1).await.unwrap();
    let c = app.client().await;
    let watch = |user: &str, order_id: &str| {
        let mut c = c.clone();
        let req = as_user(
            user,
            WatchOrderRequest {
                order_id: order_id.to_owned(),
            },
        );
        async move { c.watch_order(req).await.map(tonic::Response::into_inner) }
    };
    let mut first = watch("alice", &alice.order_id).await.unwrap();
    let mut second = watch("alice", &alice.order_id).await.unwrap();
    first.message().await.unwrap().expect("the current state");
    second.message().await.unwrap().expect("the current state");

    let refused = watch("alice", &alice.order_id).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert_eq!(reason_of(&refused).as_deref(), Some("RATE_LIMITED"));
    assert!(retry_after(&refused) > Duration::ZERO);
    // Another user's streams are their own.
    let mut bobs = watch("bob", &bob.order_id).await.unwrap();
    bobs.message().await.unwrap().expect("the current state");

    drop(first);
    let reopened = eventually(Duration::from_secs(10), "a freed place", || async {
        watch("alice", &alice.order_id).await.ok()
    })
    .await;
    assert!(reopened.is_ok(), "a closed stream never freed its place");
}

#[tokio::test]
async fn six_hundred_orders_from_a_buyer_at_their_limit_add_no_key_to_the_gate() {
    let app = spawn_stack(|s| s.limits.create_order_per_sec = 0).await;
    app.product("LIMITED", 1_000, 1).await;
    let first = app.order("alice", "first", "LIMITED", 1).await.unwrap();
    // Once the order is persisted the gate's keys stop moving by themselves.
    app.wait_status("alice", &first.order_id, OrderStatus::AwaitingPayment)
        .await;
    let before = gate_keys(&app, "LIMITED").await;
    let c = app.client().await;
    let mut refusals = 0;
    for chunk in 0..30 {
        let mut calls = tokio::task::JoinSet::new();
        for i in 0..20 {
            let mut c = c.clone();
            let req = create_req(&format!("again-{chunk}-{i}"), "LIMITED", 1);
            calls.spawn(async move { c.create_order(as_user("alice", req)).await });
        }
        while let Some(r) = calls.join_next().await {
            let s = r.unwrap().unwrap_err();
            assert_eq!(reason(&s), "USER_LIMIT_EXCEEDED", "{s:?}");
            refusals += 1;
        }
    }
    let after = gate_keys(&app, "LIMITED").await;
    println!(
        "gate keys of the product: {} before, {} after {refusals} refused CreateOrders",
        before.len(),
        after.len()
    );
    assert_eq!(refusals, 600);
    assert_eq!(after, before, "a refusal left a key behind");
    assert_eq!(app.count("SELECT COUNT(*) AS n FROM orders").await, 1);
}

#[tokio::test]
async fn with_the_default_limits_a_buyer_flooding_at_their_limit_is_cut_off_and_writes_nothing() {
    let app = spawn_stack(|_| {}).await;
    app.product("CUT", 1_000, 1).await;
    let first = app.order("alice", "first", "CUT", 1).await.unwrap();
    // Once the order is persisted the gate's keys stop moving by themselves.
    app.wait_status("alice", &first.order_id, OrderStatus::AwaitingPayment)
        .await;
    let before = gate_keys(&app, "CUT").await;
    let c = app.client().await;
    let (mut at_limit, mut rate_limited) = (0, 0);
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..600 {
        let mut c = c.clone();
        let req = create_req(&format!("again-{i}"), "CUT", 1);
        calls.spawn(async move { c.create_order(as_user("alice", req)).await });
    }
    while let Some(r) = calls.join_next().await {
        let s = r.unwrap().unwrap_err();
        match s.code() {
            Code::ResourceExhausted => rate_limited += 1,
            Code::FailedPrecondition => {
                assert_eq!(reason(&s), "USER_LIMIT_EXCEEDED");
                at_limit += 1;
            }
            other => panic!("{other:?}: {s:?}"),
        }
    }
    println!("600 calls: {at_limit} reached the gate, {rate_limited} were rate-limited");
    assert!(rate_limited > at_limit, "{at_limit} / {rate_limited}");
    assert_eq!(gate_keys(&app, "CUT").await, before);
    // Others buy meanwhile.
    app.order("bob", "k", "CUT", 1).await.unwrap();
}

#[tokio::test]
async fn with_the_default_limits_a_buyer_reading_in_a_loop_is_cut_off_while_others_are_served() {
    let defaults = LimitSettings::default();
    let app = spawn_stack(|s| {
        s.limits.read_per_sec = defaults.read_per_sec;
        s.limits.read_burst = defaults.read_burst;
    })
    .await;
    app.product("READS", 10, 0).await;
    let mine = app.order("flooder", "k", "READS", 1).await.unwrap();
    let calm = app.order("calm", "k", "READS", 1).await.unwrap();
    let c = app.client().await;
    let started = Instant::now();
    let mut flood = tokio::task::JoinSet::new();
    for i in 0..1_200 {
        let (mut c, order_id) = (c.clone(), mine.order_id.clone());
        flood.spawn(async move {
            let answer = match i % 3 {
                0 => {
                    let req = GetOrderRequest { order_id };
                    c.get_order(as_user("flooder", req)).await.map(drop)
                }
                1 => {
                    let req = ListOrdersRequest {
                        page_size: 500,
                        ..Default::default()
                    };
                    c.list_orders(as_user("flooder", req)).await.map(drop)
                }
                // Opening a WatchOrder counts as a read too (the stream is closed at once).
                _ => {
                    let req = WatchOrderRequest { order_id };
                    c.watch_order(as_user("flooder", req)).await.map(drop)
                }
            };
            (i % 3, answer)
        });
    }
    let (mut served, mut limited, mut watches_limited) = (0u32, 0u32, 0u32);
    while let Some(answer) = flood.join_next().await {
        match answer.unwrap() {
            (_, Ok(())) => served += 1,
            (kind, Err(s)) => {
                // A WatchOrder may also meet the cap on open streams (retry in 2 s).
                assert_rate_limited(&s, Duration::from_secs(2));
                if kind == 2 && s.message().contains("WatchOrder calls") {
                    watches_limited += 1;
                }
                limited += 1;
            }
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    println!("1200 reads in {elapsed:.2} s: {served} served, {limited} refused");
    let allowed = defaults.read_burst + (f64::from(defaults.read_per_sec) * elapsed).ceil() as u32;
    assert!(
        (defaults.read_burst..=allowed).contains(&served),
        "{served} of the flood served in {elapsed:.2} s"
    );
    // Meanwhile another buyer reads their order, and an admin reads the flooder's.
    let other = GetOrderRequest {
        order_id: calm.order_id.clone(),
    };
    c.clone().get_order(as_user("calm", other)).await.unwrap();
    for _ in 0..50 {
        let req = ListOrdersRequest {
            user_id: "flooder".into(),
            ..Default::default()
        };
        c.clone().list_orders(as_admin(req)).await.unwrap();
    }
    assert!(
        watches_limited > 0,
        "no WatchOrder was refused by the read limit"
    );
}

#[tokio::test]
async fn cancel_order_is_rate_limited_per_user() {
    let app = spawn_stack(|s| {
        s.limits.cancel_order_per_sec = 1;
        s.limits.cancel_order_burst = 3;
    })
    .await;
    app.product("CANCELS", 10, 0).await;
    let mine = app.order("flooder", "k", "CANCELS", 1).await.unwrap();
    let theirs = app.order("calm", "k", "CANCELS", 1).await.unwrap();
    let c = app.client().await;
    let cancel = |user: &'static str, order_id: &str| {
        let (mut c, order_id) = (c.clone(), order_id.to_owned());
        async move {
            c.cancel_order(as_user(user, CancelOrderRequest { order_id }))
                .await
                .map(drop)
        }
    };
    let mut flood = tokio::task::JoinSet::new();
    for _ in 0..30 {
        flood.spawn(cancel("flooder", &mine.order_id));
    }
    let (mut served, mut limited) = (0, 0);
    while let Some(answer) = flood.join_next().await {
        match answer.unwrap() {
            // The first cancels it, the others answer the cancelled order.
            Ok(()) => served += 1,
            Err(s) => {
                assert_rate_limited(&s, Duration::from_secs(1));
                limited += 1;
            }
        }
    }
    assert!(
        (3..=5).contains(&served),
        "{served} served, {limited} refused"
    );
    cancel("calm", &theirs.order_id)
        .await
        .expect("another buyer cancels meanwhile");
    app.wait_status("calm", &theirs.order_id, OrderStatus::Cancelled)
        .await;
}

#[tokio::test]
async fn sixty_orders_created_and_cancelled_by_one_buyer_leave_at_most_six_gate_keys_once_settled()
{
    let app = spawn_stack_with(
        |s| s.limits.create_order_per_sec = 0,
        |s| s.stock.released_record_ttl_ms = 1_000,
    )
    .await;
    app.product("LOOP", 100, 0).await;
    let before = all_gate_keys(&app).await.len();
    let c = app.client().await;
    let mut ids = Vec::new();
    for i in 0..60 {
        let order = app
            .order("looper", &format!("loop-{i}"), "LOOP", 1)
            .await
            .unwrap();
        let req = CancelOrderRequest {
            order_id: order.order_id.clone(),
        };
        c.clone()
            .cancel_order(as_user("looper", req))
            .await
            .unwrap();
        ids.push(order.order_id);
    }
    // Settled: every unit back in the gate and in the database, every record expired.
    let settled = || async {
        let p = app.get_product("LOOP").await;
        if (p.gate_available, p.available, p.reserved) != (100, 100, 0) {
            return None;
        }
        let keys = all_gate_keys(&app).await.len();
        (keys <= before + 6).then_some(keys)
    };
    let Ok(after) = eventually(Duration::from_secs(60), "the loop settled", settled).await else {
        panic!("never settled: {:?}", all_gate_keys(&app).await);
    };
    println!("gate keys: {before} before, {after} after 60 orders created and cancelled");
    assert_eq!(
        app.count("SELECT COUNT(*) AS n FROM orders WHERE status = 'CANCELLED'")
            .await,
        60
    );

    // A replay of a cancelled order's request after its record is gone still answers the
    // cancelled order, and the units the gate took again for it come back at once.
    let replay = c
        .clone()
        .create_order(as_user("looper", create_req("loop-0", "LOOP", 1)))
        .await
        .unwrap()
        .into_inner();
    let order = replay.order.unwrap();
    assert!(replay.replayed);
    assert_eq!(order.order_id, ids[0]);
    assert_eq!(order.status, OrderStatus::Cancelled as i32);
    let Ok(again) = eventually(Duration::from_secs(30), "the replay settled", settled).await else {
        panic!("the replay never settled: {:?}", all_gate_keys(&app).await);
    };
    assert!(again <= before + 6, "{again}");
}

#[tokio::test]
async fn a_replay_after_the_gate_forgot_a_cancelled_order_on_a_sold_out_product_answers_the_order()
{
    let app = spawn_stack_with(
        |s| s.limits.create_order_per_sec = 0,
        |s| s.stock.released_record_ttl_ms = 1_000,
    )
    .await;
    app.product("LAST", 1, 0).await;
    let c = app.client().await;
    let first = app.order("early", "early-1", "LAST", 1).await.unwrap();
    c.clone()
        .cancel_order(as_user(
            "early",
            CancelOrderRequest {
                order_id: first.order_id.clone(),
            },
        ))
        .await
        .unwrap();
    app.wait_status("early", &first.order_id, OrderStatus::Cancelled)
        .await;
    // The unit goes back on sale and another buyer takes it: sold out again.
    let gate_back = || async { (app.get_product("LAST").await.gate_available == 1).then_some(()) };
    eventually(Duration::from_secs(30), "the unit back", gate_back)
        .await
        .unwrap();
    app.order("late", "late-1", "LAST", 1).await.unwrap();
    // The gate forgets the cancelled order (`stock.released_record_ttl_ms`).
    let forgotten = || async {
        let keys = all_gate_keys(&app).await;
        (!keys.iter().any(|k| k.ends_with(&first.order_id))).then_some(())
    };
    eventually(Duration::from_secs(30), "the record expired", forgotten)
        .await
        .unwrap();

    let replay = c
        .clone()
        .create_order(as_user("early", create_req("early-1", "LAST", 1)))
        .await
        .expect("the replay is answered with the order, not SOLD_OUT")
        .into_inner();
    assert!(replay.replayed);
    let order = replay.order.unwrap();
    assert_eq!(order.order_id, first.order_id);
    assert_eq!(order.status, OrderStatus::Cancelled as i32);
    // A buyer with no order there is still refused.
    let refused = c
        .clone()
        .create_order(as_user("nobody", create_req("n-1", "LAST", 1)))
        .await
        .unwrap_err();
    assert_eq!(reason(&refused), "SOLD_OUT", "{refused:?}");
}
