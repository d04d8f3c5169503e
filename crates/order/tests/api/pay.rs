//! PayOrder starts a payment at the provider; only the provider's signed notification makes an
//! order PAID, once. Forged, stale, replayed, mismatched and unknown notifications change
//! nothing. CancelOrder and ownership too; refunds of late payments are in `refunds.rs`.

use std::time::Duration;

use flashsale_platform::auth::Role;
use flashsale_proto::{
    order::v1::{CancelOrderRequest, CancelReason, OrderStatus, PayOrderRequest},
    payment::v1::{PaymentEvent, PaymentEventType},
};
use flashsale_test_support::grpc::token;
use tonic::Code;

use crate::helpers::{
    TestApp, as_admin, as_user, reason, signed, signed_now, spawn_stack, spawn_stack_paying,
    succeeded,
};

pub(crate) fn pay_req(order_id: &str, payment_id: &str, amount: i64) -> PayOrderRequest {
    PayOrderRequest {
        order_id: order_id.into(),
        payment_id: payment_id.into(),
        amount_cents: amount,
    }
}

pub(crate) async fn awaiting(app: &TestApp, user: &str, key: &str, sku: &str) -> String {
    let o = app.order(user, key, sku, 1).await.unwrap();
    app.wait_status(user, &o.order_id, OrderStatus::AwaitingPayment)
        .await;
    o.order_id
}

/// The provider id of the payment started for `id`.
pub(crate) async fn started(app: &TestApp, id: &str) -> String {
    app.start_payment("alice", id)
        .await
        .unwrap()
        .checkout
        .unwrap()
        .provider_payment_id
}

pub(crate) async fn paid_events(app: &TestApp) -> usize {
    app.outbox_of("order.paid").await.len()
}

#[tokio::test]
async fn paying_starts_a_provider_payment_and_only_its_notification_makes_the_order_paid() {
    let app = spawn_stack(|_| {}).await;
    app.product("P1", 5, 0).await;
    let id = awaiting(&app, "alice", "k", "P1").await;
    let mut c = app.client().await;
    let first = c
        .pay_order(as_user("alice", pay_req(&id, "", 0)))
        .await
        .unwrap()
        .into_inner();
    let checkout = first.checkout.clone().unwrap();
    assert_eq!(
        (
            first.order.as_ref().unwrap().status,
            first.replayed,
            checkout.amount_cents,
            checkout.currency.as_str()
        ),
        (OrderStatus::AwaitingPayment as i32, false, 2500, "EUR")
    );
    assert!(
        checkout
            .checkout_url
            .contains(&checkout.provider_payment_id)
    );
    // An old client's fields: its own key and the full amount; the same payment comes back.
    let again = c
        .pay_order(as_user("alice", pay_req(&id, "pay-1", 2500)))
        .await
        .unwrap()
        .into_inner();
    assert!(again.replayed);
    assert_eq!(again.checkout.unwrap(), checkout);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        app.get("alice", &id).await.status,
        OrderStatus::AwaitingPayment as i32,
        "starting a payment pays nothing"
    );
    assert_eq!(paid_events(&app).await, 0);

    app.buyer_pays(&checkout.provider_payment_id).await;
    let o = app.wait_status("alice", &id, OrderStatus::Paid).await;
    assert_eq!(o.payment_id, checkout.provider_payment_id);
    let after = c
        .pay_order(as_user("alice", pay_req(&id, "", 0)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (after.order.unwrap().status, after.replayed),
        (OrderStatus::Paid as i32, true)
    );
    assert_eq!(paid_events(&app).await, 1);
    assert_eq!(app.outbox_of("order.paid").await[0].correlation_id, id);
    assert_eq!(app.count("SELECT COUNT(*) AS n FROM refunds").await, 0);
    let cancel = c
        .cancel_order(as_user("alice", CancelOrderRequest { order_id: id }))
        .await
        .unwrap_err();
    assert_eq!(reason(&cancel), "ORDER_NOT_CANCELLABLE");
}

#[tokio::test]
async fn a_user_token_cannot_make_an_order_paid() {
    let app = spawn_stack(|_| {}).await;
    app.product("P5", 5, 0).await;
    let id = awaiting(&app, "alice", "k", "P5").await;
    let payment = started(&app, &id).await;
    let ev = succeeded(&payment, &id, 2500, "EUR");
    let alice = token("alice", Role::User);
    let mut unsigned = signed_now(&ev);
    unsigned.signature.clear();
    let e = app.notify(unsigned, Some(&alice)).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    // The buyer signs it herself: she does not know the provider's secret.
    let forged = signed(
        &ev,
        "alice's guess at the provider secret!!",
        chrono::Utc::now().timestamp(),
    );
    let e = app.notify(forged, Some(&alice)).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    let admin = token("root", Role::Admin);
    let forged = signed(
        &ev,
        "not the secret either, but 32 bytes",
        chrono::Utc::now().timestamp(),
    );
    assert_eq!(
        app.notify(forged, Some(&admin)).await.unwrap_err().code(),
        Code::Unauthenticated,
        "no token makes a notification valid"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        app.get("alice", &id).await.status,
        OrderStatus::AwaitingPayment as i32
    );
    assert_eq!(paid_events(&app).await, 0);
}

#[tokio::test]
async fn forged_stale_mismatched_and_unknown_notifications_change_nothing() {
    let app = spawn_stack(|_| {}).await;
    app.product("P2", 5, 0).await;
    let id = awaiting(&app, "alice", "k", "P2").await;
    let payment = started(&app, &id).await;
    let good = succeeded(&payment, &id, 2500, "EUR");
    let now = chrono::Utc::now().timestamp();
    let secret = flashsale_contract::payment::DEV_WEBHOOK_SECRET;

    let mut tampered = signed_now(&good);
    tampered.payload = prost::Message::encode_to_vec(&PaymentEvent {
        amount_cents: 1,
        ..good.clone()
    });
    let stale = signed(&good, secret, now - 3_600);
    let future = signed(&good, secret, now + 3_600);
    let mut resigned = signed_now(&good);
    resigned.timestamp += 1;
    for (what, req) in [
        ("tampered payload", tampered),
        ("an hour old", stale),
        ("an hour ahead", future),
        ("timestamp changed", resigned),
    ] {
        let e = app.notify(req, None).await.unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated, "{what}: {e:?}");
    }
    let wrong = |ev: PaymentEvent| signed_now(&ev);
    let cases = [
        (
            wrong(PaymentEvent {
                amount_cents: 2499,
                ..good.clone()
            }),
            Code::FailedPrecondition,
        ),
        (
            wrong(PaymentEvent {
                currency: "USD".into(),
                ..good.clone()
            }),
            Code::FailedPrecondition,
        ),
        (
            wrong(PaymentEvent {
                merchant_reference: uuid::Uuid::new_v4().to_string(),
                ..good.clone()
            }),
            Code::FailedPrecondition,
        ),
        (
            wrong(PaymentEvent {
                payment_id: "pay_unknown".into(),
                ..good.clone()
            }),
            Code::NotFound,
        ),
        (
            wrong(PaymentEvent {
                payment_id: String::new(),
                ..good.clone()
            }),
            Code::InvalidArgument,
        ),
        (
            wrong(PaymentEvent {
                r#type: 0,
                ..good.clone()
            }),
            Code::InvalidArgument,
        ),
        (
            wrong(PaymentEvent {
                currency: "euro".into(),
                ..good.clone()
            }),
            Code::InvalidArgument,
        ),
    ];
    for (req, code) in cases {
        let e = app.notify(req, None).await.unwrap_err();
        assert_eq!(e.code(), code, "{e:?}");
        if code == Code::FailedPrecondition {
            assert_eq!(reason(&e), "PAYMENT_MISMATCH");
        }
    }
    let mut junk = signed_now(&good);
    junk.payload = b"\xff\xff not a protobuf".to_vec();
    junk.signature =
        flashsale_contract::payment::sign(secret.as_bytes(), junk.timestamp, &junk.payload);
    assert_eq!(
        app.notify(junk, None).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    let mut huge = signed_now(&good);
    huge.payload = vec![0; flashsale_contract::payment::NOTIFICATION_MAX_BYTES + 1];
    huge.signature =
        flashsale_contract::payment::sign(secret.as_bytes(), huge.timestamp, &huge.payload);
    let e = app.notify(huge, None).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert_eq!(flashsale_platform::error::violated_fields(&e), ["payload"]);

    assert_eq!(
        app.get("alice", &id).await.status,
        OrderStatus::AwaitingPayment as i32
    );
    assert_eq!(paid_events(&app).await, 0);
    assert_eq!(
        app.count("SELECT COUNT(*) AS n FROM provider_payments WHERE status = 'PENDING'")
            .await,
        1
    );
    // The genuine one still works afterwards.
    let ok = app.notify(signed_now(&good), None).await.unwrap();
    assert!(!ok.duplicate);
    assert_eq!(ok.order_id, id);
    app.wait_status("alice", &id, OrderStatus::Paid).await;
}

#[tokio::test]
async fn duplicate_replayed_and_out_of_order_notifications_take_effect_once() {
    let app = spawn_stack(|_| {}).await;
    app.product("P6", 5, 0).await;
    let id = awaiting(&app, "alice", "k", "P6").await;
    let payment = started(&app, &id).await;
    let ok = succeeded(&payment, &id, 2500, "EUR");
    let delivery = signed_now(&ok);
    let first = app.notify(delivery.clone(), None).await.unwrap();
    assert!(!first.duplicate);
    let replay = app.notify(delivery, None).await.unwrap();
    assert!(
        replay.duplicate,
        "the same signed bytes again change nothing"
    );
    let redelivered = app.notify(signed_now(&ok), None).await.unwrap();
    assert!(redelivered.duplicate);
    // A declined attempt reported after the success: acknowledged, nothing moves back.
    let declined = PaymentEvent {
        r#type: PaymentEventType::AttemptFailed as i32,
        ..ok.clone()
    };
    app.notify(signed_now(&declined), None).await.unwrap();
    let o = app.get("alice", &id).await;
    assert_eq!(
        (o.status, o.payment_id.as_str()),
        (OrderStatus::Paid as i32, payment.as_str())
    );
    assert_eq!(paid_events(&app).await, 1);
    assert_eq!(app.count("SELECT COUNT(*) AS n FROM refunds").await, 0);
}

#[tokio::test]
async fn a_provider_that_loses_duplicates_and_reorders_notifications_pays_each_order_once() {
    let app = spawn_stack_paying(
        |_| {},
        |s| {
            s.duplicate_fraction = 1.0;
            s.attempt_failed_fraction = 1.0;
            s.reorder = true;
            s.delivery_failures = 1;
            s.notify_jitter = Duration::from_millis(100);
        },
    )
    .await;
    app.product("P7", 5, 0).await;
    let mut ids = Vec::new();
    for k in ["a", "b", "c"] {
        let id = awaiting(&app, "alice", k, "P7").await;
        app.pay("alice", &id).await;
        ids.push(id);
    }
    let sim = app.sim.as_ref().unwrap();
    flashsale_test_support::eventually(Duration::from_secs(10), "every duplicate sent", || async {
        (sim.stats().duplicates == 6).then_some(())
    })
    .await
    .unwrap();
    let stats = sim.stats();
    assert_eq!((stats.events, stats.lost), (6, 6), "{stats:?}");
    assert_eq!(paid_events(&app).await, 3);
    assert_eq!(
        app.count("SELECT COUNT(*) AS n FROM order_status_history WHERE to_status = 'PAID'")
            .await,
        3
    );
}

#[tokio::test]
async fn bad_payments_are_refused_and_change_nothing() {
    let app = spawn_stack(|_| {}).await;
    app.product("P2B", 5, 0).await;
    let id = awaiting(&app, "alice", "k", "P2B").await;
    let mut c = app.client().await;
    let wrong = c
        .pay_order(as_user("alice", pay_req(&id, "", 1)))
        .await
        .unwrap_err();
    assert_eq!(wrong.code(), Code::InvalidArgument);
    assert!(wrong.message().contains("2500"), "{wrong:?}");
    let other = c
        .pay_order(as_user("mallory", pay_req(&id, "", 0)))
        .await
        .unwrap_err();
    assert_eq!(
        other.code(),
        Code::NotFound,
        "another user's order is not disclosed"
    );
    for (req, field) in [
        (pay_req("nope", "", 0), "order_id"),
        (pay_req(&id, &"p".repeat(65), 0), "payment_id"),
        (pay_req(&id, "", -1), "amount_cents"),
    ] {
        let err = c.pay_order(as_user("alice", req)).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{field}");
        assert_eq!(flashsale_platform::error::violated_fields(&err), [field]);
    }
    let admin = c
        .pay_order(as_admin(pay_req(&id, "", 0)))
        .await
        .unwrap_err();
    assert_eq!(admin.code(), Code::PermissionDenied);
    assert_eq!(
        app.get("alice", &id).await.status,
        OrderStatus::AwaitingPayment as i32
    );
    assert_eq!(
        app.count("SELECT COUNT(*) AS n FROM provider_payments")
            .await,
        0
    );
}

#[tokio::test]
async fn a_provider_that_does_not_answer_is_unavailable_and_changes_nothing() {
    let app = spawn_stack(|s| s.payment.provider_url = "http://127.0.0.1:1".into()).await;
    app.product("P8", 5, 0).await;
    let id = awaiting(&app, "alice", "k", "P8").await;
    let e = app.start_payment("alice", &id).await.unwrap_err();
    assert_eq!(
        (e.code(), reason(&e).as_str()),
        (Code::Unavailable, "PAYMENT_PROVIDER_UNAVAILABLE")
    );
    assert_eq!(
        app.get("alice", &id).await.status,
        OrderStatus::AwaitingPayment as i32
    );
    assert_eq!(
        app.count("SELECT COUNT(*) AS n FROM provider_payments")
            .await,
        0
    );
}

#[tokio::test]
async fn cancelling_returns_the_units_and_a_cancelled_order_cannot_be_paid() {
    let app = spawn_stack(|_| {}).await;
    app.product("P3", 5, 0).await;
    let id = awaiting(&app, "alice", "k", "P3").await;
    let mut c = app.client().await;
    let stranger = c
        .cancel_order(as_user(
            "bob",
            CancelOrderRequest {
                order_id: id.clone(),
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(stranger.code(), Code::NotFound);
    let o = c
        .cancel_order(as_user(
            "alice",
            CancelOrderRequest {
                order_id: id.clone(),
            },
        ))
        .await
        .unwrap()
        .into_inner()
        .order
        .unwrap();
    assert_eq!(
        (o.status, o.cancel_reason),
        (
            OrderStatus::Cancelled as i32,
            CancelReason::UserCancelled as i32
        )
    );
    let again = c
        .cancel_order(as_user(
            "alice",
            CancelOrderRequest {
                order_id: id.clone(),
            },
        ))
        .await
        .unwrap();
    assert_eq!(
        again.into_inner().order.unwrap().status,
        OrderStatus::Cancelled as i32
    );
    flashsale_test_support::eventually(Duration::from_secs(20), "units back", || async {
        let p = app.get_product("P3").await;
        (p.reserved == 0 && p.gate_available == 5).then_some(())
    })
    .await
    .unwrap();
    let late = app.start_payment("alice", &id).await.unwrap_err();
    assert_eq!(
        (late.code(), reason(&late).as_str()),
        (Code::FailedPrecondition, "ORDER_NOT_PAYABLE")
    );
    assert_eq!(
        app.count("SELECT COUNT(*) AS n FROM provider_payments")
            .await,
        0
    );
    assert_eq!(
        app.count("SELECT COUNT(*) AS n FROM refunds").await,
        0,
        "nothing was taken"
    );
}
