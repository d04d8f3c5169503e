//! Reconciliation with the provider: a payment whose notification never arrives is asked about
//! at the provider and applied as its notification would have been — PAID once, a late one
//! refunded, a pending one left alone — and two replicas ask about each payment once.

use std::{sync::Arc, time::Duration};

use flashsale_order::{
    app::{Payments, Reconciled, Reconciler},
    infra::payment::GrpcPaymentProvider,
};
use flashsale_proto::{
    order::v1::{CancelReason, OrderStatus, RefundStatus},
    payment::v1::PaymentStatus,
};

use crate::helpers::{TestApp, spawn_stack_paying};

/// An order of `sku` awaiting payment, its payment started at the provider: (order, payment).
async fn started(app: &TestApp, sku: &str, key: &str) -> (String, String) {
    let o = app.order("alice", key, sku, 1).await.unwrap();
    app.wait_status("alice", &o.order_id, OrderStatus::AwaitingPayment)
        .await;
    let payment = app
        .start_payment("alice", &o.order_id)
        .await
        .unwrap()
        .checkout
        .unwrap()
        .provider_payment_id;
    (o.order_id, payment)
}

/// A reconciler of this app's order service, as another replica would run it.
fn reconciler(app: &TestApp) -> Reconciler {
    let p = &app.settings.payment;
    let provider = Arc::new(GrpcPaymentProvider::new(p).unwrap());
    let payments = Payments::new(
        app.conn.clone(),
        &p.webhook_secret,
        p.notification_tolerance_ms,
    );
    Reconciler::new(app.conn.clone(), provider, payments, p)
}

/// Orders and refunds keep to themselves; notifications never arrive; reconciliation runs
/// every 100 ms for payments a second old.
async fn stack_without_notifications() -> TestApp {
    spawn_stack_paying(
        |s| {
            s.saga.payment_timeout_ms = 3_600_000;
            s.saga.sweep_interval_ms = 3_600_000;
            s.payment.reconcile_after_ms = 1_000;
            s.payment.reconcile_interval_ms = 100;
        },
        |s| s.drop_notifications = true,
    )
    .await
}

#[tokio::test]
async fn a_payment_whose_notification_is_dropped_ends_the_order_paid_through_reconciliation() {
    let app = stack_without_notifications().await;
    app.product("RC1", 5, 0).await;
    let (id, payment) = started(&app, "RC1", "k").await;
    app.buyer_pays(&payment).await;
    let o = app.wait_status("alice", &id, OrderStatus::Paid).await;
    assert_eq!(o.payment_id, payment);
    let sim = app.sim.as_ref().unwrap().stats();
    assert_eq!(sim.accepted, 0, "no notification reached the service");
    assert!(sim.lost >= 1);
    assert_eq!(app.outbox_of("order.paid").await.len(), 1);
    assert_eq!(app.count("SELECT COUNT(*) AS n FROM refunds").await, 0);
}

#[tokio::test]
async fn a_late_payment_found_by_reconciliation_is_refunded() {
    let app = stack_without_notifications().await;
    app.product("RC2", 5, 0).await;
    let (id, payment) = started(&app, "RC2", "k").await;
    app.exec(&format!(
        "UPDATE orders SET payment_deadline = now() - interval '1 second' WHERE order_id = '{id}'"
    ))
    .await;
    app.buyer_pays(&payment).await;
    let o = flashsale_test_support::eventually(Duration::from_secs(30), "refund paid", || async {
        let o = app.get("alice", &id).await;
        (o.refund_status == RefundStatus::Completed as i32).then_some(o)
    })
    .await
    .unwrap();
    assert_eq!(o.status, OrderStatus::Cancelled as i32);
    assert_eq!(o.cancel_reason, CancelReason::PaymentTimeout as i32);
    assert_eq!(o.refund_cents, 2500);
    let sim = &app.sim.as_ref().unwrap().simulator;
    assert_eq!(
        sim.payment(&payment).unwrap().status,
        PaymentStatus::Refunded as i32
    );
    assert_eq!(sim.refund_calls(&id), 1, "the refund is sent once");
    assert!(app.outbox_of("order.paid").await.is_empty());
    assert_eq!(app.outbox_of("order.refunded").await.len(), 1);
}

#[tokio::test]
async fn two_replicas_reconcile_each_payment_once_and_leave_a_pending_one_alone() {
    // The service's own job stays out of the way: this test runs two replicas' by hand.
    let app = spawn_stack_paying(
        |s| s.payment.reconcile_interval_ms = 3_600_000,
        |s| s.drop_notifications = true,
    )
    .await;
    app.product("RC3", 5, 0).await;
    let (paid, paid_payment) = started(&app, "RC3", "k1").await;
    let (pending, _) = started(&app, "RC3", "k2").await;
    app.buyer_pays(&paid_payment).await;
    let (a, b) = (reconciler(&app), reconciler(&app));
    let none = a.reconcile_due().await.unwrap();
    assert_eq!(none, Reconciled::default(), "both payments are too young");
    app.exec("UPDATE provider_payments SET created_at = now() - interval '10 minutes'")
        .await;
    let (ra, rb) = tokio::join!(a.reconcile_due(), b.reconcile_due());
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert_eq!(
        ra.asked + rb.asked,
        2,
        "each payment asked about once: {ra:?} {rb:?}"
    );
    assert_eq!((ra.paid + rb.paid, ra.pending + rb.pending), (1, 1));
    app.wait_status("alice", &paid, OrderStatus::Paid).await;
    assert_eq!(
        app.get("alice", &pending).await.status,
        OrderStatus::AwaitingPayment as i32
    );
    // Run again: nothing is due; and even asked anew, the pending one changes nothing and the
    // paid one is not asked about.
    assert_eq!(a.reconcile_due().await.unwrap(), Reconciled::default());
    app.exec("UPDATE provider_payments SET checked_at = NULL")
        .await;
    let again = b.reconcile_due().await.unwrap();
    assert_eq!((again.asked, again.pending, again.paid), (1, 1, 0));
    assert_eq!(app.outbox_of("order.paid").await.len(), 1);
    assert_eq!(
        app.get("alice", &pending).await.status,
        OrderStatus::AwaitingPayment as i32
    );
    assert_eq!(app.count("SELECT COUNT(*) AS n FROM refunds").await, 0);
}
