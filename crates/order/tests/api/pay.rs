//! PayOrder starts a payment at the provider; only the provider's signed notification makes an
//! order PAID, once. Forged, stale, replayed, mismatched and unknown notifications change
//! nothing; a payment that arrives too late is refunded through the provider, and a refund the
//! provider keeps refusing is retried, then parked and listed. CancelOrder and ownership too.

use std::time::Duration;

use flashsale_platform::auth::Role;
use flashsale_proto::{
    order::v1::{
        CancelOrderRequest, CancelReason, ListRefundsRequest, OrderStatus, PayOrderRequest,
        RefundStatus, RetryRefundRequest,
    },
    payment::v1::{PaymentEvent, PaymentEventType},
};
use flashsale_test_support::grpc::token;
use tonic::Code;

use crate::helpers::{
    TestApp, as_admin, as_user, reason, signed, signed_now, spawn_stack, spawn_stack_paying,
    succeeded,
};

fn pay_req(order_id: &str, payment_id: &str, amount: i64) -> PayOrderRequest {
    PayOrderRequest {
        order_id: order_id.into(),
        payment_id: payment_id.into(),
        amount_cents: amount,
    }
}

async fn awaiting(app: &TestApp, user: &str, key: &str, sku: &str) -> String {
    let o = app.order(user, key, sku, 1).await.unwrap();
    app.wait_status(user, &o.order_id, OrderStatus::AwaitingPayment)
        .await;
    o.order_id
}

/// The provider id of the payment started for `id`.
async fn started(app: &TestApp, id: &str) -> String {
    app.start_payment("alice", id)
        .await
        .unwrap()
        .checkout
        .unwrap()
        .provider_payment_id
}

async fn paid_events(app: &TestApp) -> usize {
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

#[tokio::test]
async fn a_payment_after_the_deadline_is_refunded_through_the_provider() {
    let app = spawn_stack(|s| {
        s.saga.payment_timeout_ms = 3_600_000;
        s.saga.sweep_interval_ms = 3_600_000;
    })
    .await;
    app.product("P4", 5, 0).await;
    let id = awaiting(&app, "alice", "k", "P4").await;
    let payment = started(&app, &id).await;
    app.exec(&format!(
        "UPDATE orders SET payment_deadline = now() - interval '1 second' WHERE order_id = '{id}'"
    ))
    .await;
    // The buyer pays at the provider, too late; the provider's notification arrives after.
    app.buyer_pays(&payment).await;
    let o = app.wait_status("alice", &id, OrderStatus::Cancelled).await;
    assert_eq!(o.cancel_reason, CancelReason::PaymentTimeout as i32);
    let o = flashsale_test_support::eventually(Duration::from_secs(20), "refund paid", || async {
        let o = app.get("alice", &id).await;
        (o.refund_status == RefundStatus::Completed as i32).then_some(o)
    })
    .await
    .unwrap();
    assert_eq!(o.refund_cents, 2500);
    let at_provider = app
        .sim
        .as_ref()
        .unwrap()
        .simulator
        .payment(&payment)
        .unwrap();
    assert_eq!(
        at_provider.status,
        flashsale_proto::payment::v1::PaymentStatus::Refunded as i32
    );
    assert_eq!(app.outbox_of("order.refunded").await.len(), 1);
    assert_eq!(
        app.outbox_of("order.cancelled").await.len(),
        1,
        "the units go back"
    );
    assert_eq!(paid_events(&app).await, 0);
    // A later start of the same order: not payable, nothing refunded twice.
    let again = app.start_payment("alice", &id).await.unwrap_err();
    assert_eq!(reason(&again), "ORDER_NOT_PAYABLE");
    assert_eq!(app.count("SELECT COUNT(*) AS n FROM refunds").await, 1);
}

/// A late payment whose refund the provider declines `declines` times, with `max` attempts.
async fn late_refund(sku: &str, declines: u32, max: u32) -> (TestApp, String) {
    let app = spawn_stack_paying(
        |s| {
            s.saga.payment_timeout_ms = 3_600_000;
            s.saga.sweep_interval_ms = 3_600_000;
            s.payment.refund_max_attempts = max;
            s.payment.refund_retry_base_ms = 20;
            s.payment.refund_sweep_interval_ms = 50;
        },
        |s| s.refund_failures = declines,
    )
    .await;
    app.product(sku, 5, 0).await;
    let id = awaiting(&app, "alice", "k", sku).await;
    let payment = started(&app, &id).await;
    app.exec(&format!(
        "UPDATE orders SET payment_deadline = now() - interval '1 second' WHERE order_id = '{id}'"
    ))
    .await;
    app.buyer_pays(&payment).await;
    (app, id)
}

#[tokio::test]
async fn a_refund_the_provider_declines_is_retried_until_it_is_paid() {
    let (app, id) = late_refund("P9", 2, 5).await;
    flashsale_test_support::eventually(Duration::from_secs(20), "refund paid", || async {
        let o = app.get("alice", &id).await;
        (o.refund_status == RefundStatus::Completed as i32).then_some(())
    })
    .await
    .unwrap();
    assert_eq!(
        app.count("SELECT attempts::int8 AS n FROM refunds").await,
        3,
        "declined twice, paid at the third call"
    );
}

#[tokio::test]
async fn a_refund_that_keeps_failing_is_parked_failed_and_listed() {
    let (app, id) = late_refund("P10", u32::MAX, 3).await;
    let o =
        flashsale_test_support::eventually(Duration::from_secs(20), "refund parked", || async {
            let o = app.get("alice", &id).await;
            (o.refund_status == RefundStatus::Failed as i32).then_some(o)
        })
        .await
        .unwrap();
    assert_eq!(o.refund_cents, 2500);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        app.count("SELECT attempts::int8 AS n FROM refunds").await,
        3,
        "parked after refund_max_attempts, not called again"
    );
    let mut c = app.client().await;
    let failed = c
        .list_refunds(as_admin(ListRefundsRequest {
            status: RefundStatus::Failed as i32,
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(failed.refunds.len(), 1);
    let r = &failed.refunds[0];
    assert_eq!(
        (
            r.order_id.as_str(),
            r.attempts,
            r.amount_cents,
            r.currency.as_str(),
            r.reason
        ),
        (
            id.as_str(),
            3,
            2500,
            "EUR",
            CancelReason::PaymentTimeout as i32
        )
    );
    assert!(r.last_error.contains("REFUND_DECLINED"), "{r:?}");
    assert!(r.next_attempt_time.is_none());
    let paid = c
        .list_refunds(as_admin(ListRefundsRequest {
            status: RefundStatus::Completed as i32,
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    assert!(paid.refunds.is_empty());
    let (_, body) = flashsale_test_support::grpc::http_get(app.metrics_port, "/metrics")
        .await
        .unwrap();
    assert!(
        body.contains("flashsale_refunds_unsettled{status=\"FAILED\"}"),
        "{body}"
    );
}

#[tokio::test]
async fn listing_refunds_is_for_admins_with_valid_filters() {
    let app = spawn_stack(|_| {}).await;
    let mut c = app.client().await;
    let user = c
        .list_refunds(as_user("alice", ListRefundsRequest::default()))
        .await
        .unwrap_err();
    assert_eq!(user.code(), Code::PermissionDenied);
    for (req, field) in [
        (
            ListRefundsRequest {
                status: RefundStatus::None as i32,
                ..Default::default()
            },
            "status",
        ),
        (
            ListRefundsRequest {
                status: 42,
                ..Default::default()
            },
            "status",
        ),
        (
            ListRefundsRequest {
                page_size: -1,
                ..Default::default()
            },
            "page_size",
        ),
        (
            ListRefundsRequest {
                page_size: 501,
                ..Default::default()
            },
            "page_size",
        ),
        (
            ListRefundsRequest {
                page_token: "r1.1.x.0".into(),
                ..Default::default()
            },
            "page_token",
        ),
    ] {
        let e = c.list_refunds(as_admin(req)).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{field}");
        assert_eq!(flashsale_platform::error::violated_fields(&e), [field]);
    }
    let empty = c
        .list_refunds(as_admin(ListRefundsRequest::default()))
        .await
        .unwrap()
        .into_inner();
    assert!(empty.refunds.is_empty() && empty.next_page_token.is_empty());
}

#[tokio::test]
async fn an_admin_retries_a_parked_refund_and_the_provider_then_pays_it() {
    // The provider declines the first three calls: all of them, with three attempts.
    let (app, id) = late_refund("P11", 3, 3).await;
    flashsale_test_support::eventually(Duration::from_secs(20), "refund parked", || async {
        let o = app.get("alice", &id).await;
        (o.refund_status == RefundStatus::Failed as i32).then_some(())
    })
    .await
    .unwrap();
    let mut c = app.client().await;
    let retry = |order_id: &str| RetryRefundRequest {
        order_id: order_id.into(),
    };
    let user = c
        .retry_refund(as_user("alice", retry(&id)))
        .await
        .unwrap_err();
    assert_eq!(user.code(), Code::PermissionDenied);
    let bad = c.retry_refund(as_admin(retry("nope"))).await.unwrap_err();
    assert_eq!(
        flashsale_platform::error::violated_fields(&bad),
        ["order_id"]
    );
    let none = c
        .retry_refund(as_admin(retry(&uuid::Uuid::new_v4().to_string())))
        .await
        .unwrap_err();
    assert_eq!(none.code(), Code::NotFound);
    assert_eq!(
        app.get("alice", &id).await.refund_status,
        RefundStatus::Failed as i32,
        "refusals change nothing"
    );

    let r = c
        .retry_refund(as_admin(retry(&id)))
        .await
        .unwrap()
        .into_inner()
        .refund
        .unwrap();
    assert_eq!((r.status, r.attempts), (RefundStatus::Recorded as i32, 0));
    flashsale_test_support::eventually(Duration::from_secs(20), "refund paid", || async {
        let o = app.get("alice", &id).await;
        (o.refund_status == RefundStatus::Completed as i32).then_some(())
    })
    .await
    .unwrap();
    let done = c.retry_refund(as_admin(retry(&id))).await.unwrap_err();
    assert_eq!(
        (done.code(), reason(&done).as_str()),
        (Code::FailedPrecondition, "REFUND_COMPLETED")
    );
}
