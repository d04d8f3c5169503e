//! PayOrder and CancelOrder: one winner, idempotent payments, refunds for payments that lose,
//! ownership, bad input.

use flashsale_proto::order::v1::{
    CancelOrderRequest, CancelReason, OrderStatus, PayOrderRequest, RefundStatus,
};
use tonic::Code;

use crate::helpers::{TestApp, as_admin, as_user, reason, spawn_stack};

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

#[tokio::test]
async fn paying_moves_the_order_to_paid_once() {
    let app = spawn_stack(|_| {}).await;
    app.product("P1", 5, 0).await;
    let id = awaiting(&app, "alice", "k", "P1").await;
    let mut c = app.client().await;
    let paid = c
        .pay_order(as_user("alice", pay_req(&id, "pay-1", 2500)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (paid.order.as_ref().unwrap().status, paid.replayed),
        (OrderStatus::Paid as i32, false)
    );
    assert_eq!(paid.order.unwrap().payment_id, "pay-1");
    let again = c
        .pay_order(as_user("alice", pay_req(&id, "pay-1", 2500)))
        .await
        .unwrap()
        .into_inner();
    assert!(again.replayed);
    let twice = c
        .pay_order(as_user("alice", pay_req(&id, "pay-2", 2500)))
        .await
        .unwrap_err();
    assert_eq!(reason(&twice), "ORDER_NOT_PAYABLE");
    assert_eq!(app.outbox_of("order.paid").await.len(), 1);
    assert_eq!(app.count("SELECT COUNT(*) AS n FROM refunds").await, 0);
    let cancel = c
        .cancel_order(as_user(
            "alice",
            CancelOrderRequest {
                order_id: id.clone(),
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(reason(&cancel), "ORDER_NOT_CANCELLABLE");
}

#[tokio::test]
async fn bad_payments_are_refused_and_change_nothing() {
    let app = spawn_stack(|_| {}).await;
    app.product("P2", 5, 0).await;
    let id = awaiting(&app, "alice", "k", "P2").await;
    let mut c = app.client().await;
    let wrong = c
        .pay_order(as_user("alice", pay_req(&id, "p", 1)))
        .await
        .unwrap_err();
    assert_eq!(wrong.code(), Code::InvalidArgument);
    assert!(wrong.message().contains("2500"), "{wrong:?}");
    let other = c
        .pay_order(as_user("mallory", pay_req(&id, "p", 2500)))
        .await
        .unwrap_err();
    assert_eq!(
        other.code(),
        Code::NotFound,
        "another user's order is not disclosed"
    );
    for (req, field) in [
        (pay_req("nope", "p", 2500), "order_id"),
        (pay_req(&id, "", 2500), "payment_id"),
        (pay_req(&id, &"p".repeat(65), 2500), "payment_id"),
        (pay_req(&id, "p", -1), "amount_cents"),
    ] {
        let err = c.pay_order(as_user("alice", req)).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{field}");
    }
    let admin = c
        .pay_order(as_admin(pay_req(&id, "p", 2500)))
        .await
        .unwrap_err();
    assert_eq!(admin.code(), Code::PermissionDenied);
    assert_eq!(
        app.get("alice", &id).await.status,
        OrderStatus::AwaitingPayment as i32
    );
    assert_eq!(app.count("SELECT COUNT(*) AS n FROM payments").await, 0);
}

#[tokio::test]
async fn cancelling_returns_the_units_and_a_late_payment_is_refunded_once() {
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
        .into_inner();
    let o = o.order.unwrap();
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
    flashsale_test_support::eventually(
        std::time::Duration::from_secs(20),
        "units back",
        || async {
            let p = app.get_product("P3").await;
            (p.reserved == 0 && p.gate_available == 5).then_some(())
        },
    )
    .await
    .unwrap();

    let late = c
        .pay_order(as_user("alice", pay_req(&id, "late", 2500)))
        .await
        .unwrap_err();
    assert_eq!(
        (late.code(), reason(&late).as_str()),
        (Code::FailedPrecondition, "ORDER_NOT_PAYABLE")
    );
    let again = c
        .pay_order(as_user("alice", pay_req(&id, "late", 2500)))
        .await
        .unwrap_err();
    assert_eq!(reason(&again), "ORDER_NOT_PAYABLE");
    let o = app.get("alice", &id).await;
    assert_eq!(
        (o.refund_status, o.refund_cents),
        (RefundStatus::Recorded as i32, 2500)
    );
    assert_eq!(app.count("SELECT COUNT(*) AS n FROM refunds").await, 1);
    assert_eq!(app.outbox_of("order.refunded").await.len(), 1);
}

#[tokio::test]
async fn a_payment_after_the_deadline_loses_even_before_the_timeout_arrives() {
    let app = spawn_stack(|s| {
        s.saga.payment_timeout_ms = 3_600_000;
        s.saga.sweep_interval_ms = 3_600_000;
    })
    .await;
    app.product("P4", 5, 0).await;
    let id = awaiting(&app, "alice", "k", "P4").await;
    app.exec(&format!(
        "UPDATE orders SET payment_deadline = now() - interval '1 second' WHERE order_id = '{id}'"
    ))
    .await;
    let err = app
        .client()
        .await
        .pay_order(as_user("alice", pay_req(&id, "late", 2500)))
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "ORDER_NOT_PAYABLE");
    let o = app.get("alice", &id).await;
    assert_eq!(
        (o.status, o.cancel_reason),
        (
            OrderStatus::Cancelled as i32,
            CancelReason::PaymentTimeout as i32
        )
    );
    assert_eq!(
        (o.refund_status, o.refund_cents),
        (RefundStatus::Recorded as i32, 2500)
    );
    assert_eq!(
        app.outbox_of("order.cancelled").await.len(),
        1,
        "the units go back"
    );
}
