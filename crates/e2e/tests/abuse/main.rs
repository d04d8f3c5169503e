//! Abuse against the running service binaries (and the payment provider simulator), as a buyer,
//! a bot or someone posing as the provider would try it: a buyer's token cannot make an order
//! PAID; a forged, stale or replayed notification changes nothing and one with the wrong amount
//! or currency is refused; a flood from one buyer is cut off with RESOURCE_EXHAUSTED while
//! others are served, and leaves the stock gate's Redis keys as they were; a NUL byte fails only
//! the request that carries it; every admin call of every service is in its audit log with its
//! caller. (Mutual TLS between the binaries is in `tests/tls`, the development secret refused
//! without the development setting in `tests/binaries`.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use deadpool_redis::redis;
use flashsale_contract::payment::{DEV_WEBHOOK_SECRET, sign};
use flashsale_e2e::Stack;
use flashsale_platform::{auth::Role, error::reason_of};
use flashsale_proto::{
    order::v1::{
        CreateOrderRequest, GetOrderRequest, NotifyPaymentRequest, Order, OrderStatus,
        PayOrderRequest, order_service_client::OrderServiceClient,
        payment_notification_service_client::PaymentNotificationServiceClient,
    },
    payment::v1::{
        PayCheckoutRequest, PaymentEvent, PaymentEventType,
        payment_provider_service_client::PaymentProviderServiceClient,
    },
    product::v1::{
        CreateProductRequest, DeductionPolicy,
        product_stock_service_client::ProductStockServiceClient,
    },
};
use flashsale_test_support::{
    eventually,
    grpc::{token, with_token},
    redis_url, unique_name,
};
use prost::Message as _;
use tonic::{Code, transport::Channel};

fn user<T>(u: &str, m: T) -> tonic::Request<T> {
    with_token(m, &token(u, Role::User))
}

fn create(request_id: &str, sku: &str) -> CreateOrderRequest {
    CreateOrderRequest {
        request_id: request_id.into(),
        sku: sku.into(),
        quantity: 1,
    }
}

async fn product(stack: &Stack, sku: &str, stock: i64, per_user_limit: u32) {
    let mut c = ProductStockServiceClient::new(stack.product_stock.channel().await.unwrap());
    c.create_product(with_token(
        CreateProductRequest {
            sku: sku.into(),
            name: format!("{sku} bottle"),
            price_cents: 700,
            initial_stock: stock,
            per_user_limit,
            deduction_policy: DeductionPolicy::ReserveThenCommit as i32,
            stock_buckets: 0,
            ..Default::default()
        },
        &token("root", Role::Admin),
    ))
    .await
    .unwrap();
}

async fn get(orders: &OrderServiceClient<Channel>, u: &str, id: &str) -> Order {
    orders
        .clone()
        .get_order(user(
            u,
            GetOrderRequest {
                order_id: id.into(),
            },
        ))
        .await
        .unwrap()
        .into_inner()
        .order
        .unwrap()
}

async fn wait_status(
    stack: &Stack,
    orders: &OrderServiceClient<Channel>,
    u: &str,
    id: &str,
    want: OrderStatus,
) -> Order {
    let reached = eventually(Duration::from_secs(60), "order status", || async {
        let o = get(orders, u, id).await;
        (o.status == want as i32).then_some(o)
    })
    .await;
    match reached {
        Ok(o) => o,
        Err(e) => panic!("{e}: {:?}\n{}", get(orders, u, id).await, stack.logs()),
    }
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(0))
}

/// A SUCCEEDED notification of `payment_id` for `order_id`, signed with `secret` at `at`.
fn notification(
    payment_id: &str,
    order_id: &str,
    amount_cents: i64,
    currency: &str,
    secret: &str,
    at: i64,
) -> NotifyPaymentRequest {
    let payload = PaymentEvent {
        event_id: unique_name("evt"),
        r#type: PaymentEventType::Succeeded as i32,
        payment_id: payment_id.into(),
        merchant_reference: order_id.into(),
        amount_cents,
        currency: currency.into(),
        create_time: None,
    }
    .encode_to_vec();
    NotifyPaymentRequest {
        signature: sign(secret.as_bytes(), at, &payload),
        payload,
        timestamp: at,
    }
}

#[tokio::test]
async fn no_buyer_token_forged_stale_replayed_or_wrong_notification_pays_an_order() {
    let stack = Stack::start(&[]).await.unwrap();
    product(&stack, "ABUSE-PAY", 5, 0).await;
    let orders = OrderServiceClient::new(stack.order.channel().await.unwrap());
    let mut notify = PaymentNotificationServiceClient::new(stack.order.channel().await.unwrap());
    let id = orders
        .clone()
        .create_order(user("alice", create("k", "ABUSE-PAY")))
        .await
        .unwrap()
        .into_inner()
        .order
        .unwrap()
        .order_id;
    wait_status(&stack, &orders, "alice", &id, OrderStatus::AwaitingPayment).await;

    // The buyer's PayOrder, with the old fields claiming a payment of the whole amount, only
    // starts a payment at the provider.
    let started = orders
        .clone()
        .pay_order(user(
            "alice",
            PayOrderRequest {
                order_id: id.clone(),
                payment_id: "i-paid".into(),
                amount_cents: 700,
            },
        ))
        .await
        .unwrap()
        .into_inner();
    let checkout = started.checkout.unwrap();
    let payment = checkout.provider_payment_id.clone();
    assert_eq!(
        started.order.unwrap().status,
        OrderStatus::AwaitingPayment as i32
    );

    let genuine = |amount: i64, currency: &str, secret: &str, at: i64| {
        notification(&payment, &id, amount, currency, secret, at)
    };
    // Refused, each changing nothing: unsigned with a buyer's (or an admin's) token; signed
    // with another secret; signed right but an hour old or an hour ahead; the wrong amount;
    // the wrong currency; another order's reference.
    let mut unsigned = genuine(700, "EUR", DEV_WEBHOOK_SECRET, now());
    unsigned.signature.clear();
    for (who, role) in [("alice", Role::User), ("root", Role::Admin)] {
        let e = notify
            .notify_payment(with_token(unsigned.clone(), &token(who, role)))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated, "{who}: {e:?}");
    }
    let forged = genuine(
        700,
        "EUR",
        "a-secret-that-is-not-the-providers-secret",
        now(),
    );
    let stale = genuine(700, "EUR", DEV_WEBHOOK_SECRET, now() - 3_600);
    let ahead = genuine(700, "EUR", DEV_WEBHOOK_SECRET, now() + 3_600);
    for (what, req) in [("forged", forged), ("stale", stale), ("ahead", ahead)] {
        let e = notify.notify_payment(req).await.unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated, "{what}: {e:?}");
    }
    let cheap = genuine(1, "EUR", DEV_WEBHOOK_SECRET, now());
    let dollars = genuine(700, "USD", DEV_WEBHOOK_SECRET, now());
    let elsewhere = notification(
        &payment,
        &uuid_like(),
        700,
        "EUR",
        DEV_WEBHOOK_SECRET,
        now(),
    );
    for (what, req) in [
        ("wrong amount", cheap),
        ("wrong currency", dollars),
        ("another order", elsewhere),
    ] {
        let e = notify.notify_payment(req).await.unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{what}: {e:?}");
        assert_eq!(reason_of(&e).as_deref(), Some("PAYMENT_MISMATCH"), "{what}");
    }
    let o = get(&orders, "alice", &id).await;
    assert_eq!(o.status, OrderStatus::AwaitingPayment as i32, "{o:?}");

    // The buyer pays at the provider: its signed notification makes the order PAID (and it
    // ships). A replay of a valid notification then changes nothing.
    let mut provider =
        PaymentProviderServiceClient::new(stack.payment_sim.channel().await.unwrap());
    provider
        .pay_checkout(PayCheckoutRequest {
            payment_id: payment.clone(),
        })
        .await
        .unwrap();
    let paid = wait_status(&stack, &orders, "alice", &id, OrderStatus::Shipped).await;
    let replay = genuine(700, "EUR", DEV_WEBHOOK_SECRET, now());
    for _ in 0..2 {
        let r = notify
            .notify_payment(replay.clone())
            .await
            .unwrap()
            .into_inner();
        assert!(r.duplicate, "{r:?}");
    }
    let after = get(&orders, "alice", &id).await;
    assert_eq!(
        (after.status, after.refund_status, after.update_time),
        (paid.status, paid.refund_status, paid.update_time),
        "a replay changed the order"
    );
}

/// A canonical UUID no order has.
fn uuid_like() -> String {
    let n = unique_name("x");
    let hex = n.rsplit('_').next().unwrap_or("000000000000");
    format!("00000000-0000-4000-8000-{hex:0>12}")
}

/// Every key under `prefix` in the test Redis.
async fn redis_keys(prefix: &str) -> Vec<String> {
    let cfg = deadpool_redis::Config::from_url(redis_url());
    let pool = cfg
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .unwrap();
    let mut conn = pool.get().await.unwrap();
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut *conn)
        .await
        .unwrap();
    keys.sort();
    keys
}

#[tokio::test]
async fn a_flood_from_one_buyer_is_cut_off_while_others_buy_and_the_gate_keeps_no_key_for_it() {
    let prefix = format!("{}:", unique_name("fs_e2e_abuse"));
    let stack = Stack::start(&[
        ("FLASHSALE_ORDER__LIMITS__CREATE_ORDER_PER_SEC", "2"),
        ("FLASHSALE_ORDER__LIMITS__CREATE_ORDER_BURST", "4"),
        (
            "FLASHSALE_PRODUCT_STOCK__REDIS__KEY_PREFIX",
            prefix.as_str(),
        ),
    ])
    .await
    .unwrap();
    product(&stack, "ABUSE-FLOOD", 1_000, 1).await;
    let orders = OrderServiceClient::new(stack.order.channel().await.unwrap());
    let first = orders
        .clone()
        .create_order(user("mallory", create("first", "ABUSE-FLOOD")))
        .await
        .unwrap()
        .into_inner()
        .order
        .unwrap();
    wait_status(
        &stack,
        &orders,
        "mallory",
        &first.order_id,
        OrderStatus::AwaitingPayment,
    )
    .await;
    // The product's keys, once the first order is persisted and the gate rests.
    let before = redis_keys(&prefix).await;
    assert!(!before.is_empty(), "no gate keys under {prefix}");

    // 400 CreateOrders from mallory, each with a fresh request id, 40 at a time; 20 other
    // buyers meanwhile.
    let mut others = tokio::task::JoinSet::new();
    for i in 0..20 {
        let mut c = orders.clone();
        others.spawn(async move {
            c.create_order(user(&format!("calm-{i}"), create("k", "ABUSE-FLOOD")))
                .await
        });
    }
    let mut flood = tokio::task::JoinSet::new();
    let mut answers = Vec::new();
    for i in 0..400 {
        let mut c = orders.clone();
        flood.spawn(async move {
            c.create_order(user(
                "mallory",
                create(&format!("again-{i}"), "ABUSE-FLOOD"),
            ))
            .await
        });
        if flood.len() >= 40
            && let Some(r) = flood.join_next().await
        {
            answers.push(r.unwrap());
        }
    }
    while let Some(r) = flood.join_next().await {
        answers.push(r.unwrap());
    }
    assert_eq!(answers.len(), 400);
    let (mut rate_limited, mut at_limit) = (0, 0);
    for a in answers {
        let s = a.expect_err("mallory is at her per-user limit");
        match s.code() {
            Code::ResourceExhausted => {
                assert_eq!(reason_of(&s).as_deref(), Some("RATE_LIMITED"), "{s:?}");
                rate_limited += 1;
            }
            Code::FailedPrecondition => {
                assert_eq!(
                    reason_of(&s).as_deref(),
                    Some("USER_LIMIT_EXCEEDED"),
                    "{s:?}"
                );
                at_limit += 1;
            }
            other => panic!("{other:?}: {s:?}"),
        }
    }
    let mut served = Vec::new();
    while let Some(r) = others.join_next().await {
        let o = r
            .unwrap()
            .expect("another buyer is served during the flood")
            .into_inner()
            .order
            .unwrap();
        served.push(o);
    }
    println!(
        "mallory's flood: {rate_limited} rate-limited, {at_limit} refused at the gate; {} others served",
        served.len()
    );
    assert!(rate_limited > 0, "the flood was never rate-limited");
    // The others' orders add their keys; mallory's refusals add none. Wait until the others'
    // orders are persisted, then count: the keys are those before plus the others' buyers'.
    for o in &served {
        wait_status(
            &stack,
            &orders,
            &o.user_id,
            &o.order_id,
            OrderStatus::AwaitingPayment,
        )
        .await;
    }
    // Every key the gate has now that it did not have before is the record of one of the
    // others' orders: the 400 refusals left none.
    let after = redis_keys(&prefix).await;
    let new: Vec<&String> = after.iter().filter(|k| !before.contains(k)).collect();
    println!(
        "gate keys: {} before, {} after ({} new, {} orders of others)",
        before.len(),
        after.len(),
        new.len(),
        served.len()
    );
    for key in &new {
        assert!(
            served
                .iter()
                .any(|o| key.ends_with(&format!(":o:{}", o.order_id))),
            "a key that is no other buyer's order record: {key}"
        );
    }
}

#[tokio::test]
async fn a_nul_byte_fails_only_the_request_that_carries_it() {
    let stack = Stack::start(&[]).await.unwrap();
    product(&stack, "ABUSE-NUL", 100, 0).await;
    let orders = OrderServiceClient::new(stack.order.channel().await.unwrap());
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..30 {
        let mut c = orders.clone();
        calls.spawn(async move {
            let buyer = format!("buyer-{i}");
            let answer = match i {
                // A NUL in the request id, in the sku, and in the token's subject.
                10 => {
                    c.create_order(user(&buyer, create("k\0", "ABUSE-NUL")))
                        .await
                }
                20 => {
                    c.create_order(user(&buyer, create("k", "ABUSE-NUL\0")))
                        .await
                }
                25 => {
                    c.create_order(user("buyer\0", create("k", "ABUSE-NUL")))
                        .await
                }
                _ => c.create_order(user(&buyer, create("k", "ABUSE-NUL"))).await,
            };
            (i, buyer, answer)
        });
    }
    let mut good = Vec::new();
    while let Some(r) = calls.join_next().await {
        let (i, buyer, answer) = r.unwrap();
        match i {
            10 | 20 => {
                let e = answer.unwrap_err();
                assert_eq!(e.code(), Code::InvalidArgument, "{i}: {e:?}");
            }
            25 => {
                let e = answer.unwrap_err();
                assert_eq!(e.code(), Code::Unauthenticated, "{i}: {e:?}");
            }
            _ => good.push((buyer, answer.unwrap().into_inner().order.unwrap())),
        }
    }
    assert_eq!(good.len(), 27);
    // Every good order goes on through the saga.
    for (buyer, o) in &good {
        wait_status(
            &stack,
            &orders,
            buyer,
            &o.order_id,
            OrderStatus::AwaitingPayment,
        )
        .await;
    }
}

mod audit;
