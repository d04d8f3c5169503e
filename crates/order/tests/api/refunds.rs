//! A payment that arrives too late is refunded through the provider; a refund the provider
//! keeps refusing is retried, then parked, listed for admins and retried by one.

use std::time::Duration;

use flashsale_proto::order::v1::{
    CancelReason, ListRefundsRequest, OrderStatus, RefundStatus, RetryRefundRequest,
};
use tonic::Code;

use crate::helpers::{TestApp, as_admin, as_user, reason, spawn_stack, spawn_stack_paying};
use crate::pay::{awaiting, paid_events, started};

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
