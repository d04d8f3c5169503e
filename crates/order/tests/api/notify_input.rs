//! A notification signed with the provider's secret whose event holds a control character — a
//! NUL in its payment id, merchant reference or event id — is INVALID_ARGUMENT naming the field
//! and changes nothing: the signature proves who sent the bytes, not that they are safe to store.

use flashsale_platform::error::violated_fields;
use flashsale_proto::order::v1::OrderStatus;
use tonic::Code;

use crate::helpers::{signed_now, spawn_stack, succeeded};

#[tokio::test]
async fn a_signed_notification_holding_a_control_character_is_invalid_argument_naming_it() {
    let app = spawn_stack(|_| {}).await;
    app.product("NUL", 5, 0).await;
    let o = app.order("alice", "k", "NUL", 1).await.unwrap();
    app.wait_status("alice", &o.order_id, OrderStatus::AwaitingPayment)
        .await;
    let payment = app
        .start_payment("alice", &o.order_id)
        .await
        .unwrap()
        .checkout
        .unwrap()
        .provider_payment_id;
    let outbox = app.count("SELECT COUNT(*) AS n FROM outbox").await;
    let mut bad_event = succeeded(&payment, &o.order_id, 2500, "EUR");
    bad_event.event_id = "evt\u{7}".into();
    for (field, ev) in [
        (
            "payload.payment_id",
            succeeded(&format!("{payment}\0"), &o.order_id, 2500, "EUR"),
        ),
        (
            "payload.merchant_reference",
            succeeded(&payment, &format!("{}\0", o.order_id), 2500, "EUR"),
        ),
        ("payload.event_id", bad_event),
    ] {
        let e = app.notify(signed_now(&ev), None).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{field}: {e:?}");
        assert_eq!(violated_fields(&e), [field], "{e:?}");
    }
    assert_eq!(
        app.get("alice", &o.order_id).await.status,
        OrderStatus::AwaitingPayment as i32
    );
    assert_eq!(
        app.count("SELECT COUNT(*) AS n FROM provider_payments WHERE status = 'PENDING'")
            .await,
        1
    );
    assert_eq!(app.count("SELECT COUNT(*) AS n FROM outbox").await, outbox);
    // The same event without the control character is applied.
    let fine = succeeded(&payment, &o.order_id, 2500, "EUR");
    let applied = app.notify(signed_now(&fine), None).await.unwrap();
    assert!(!applied.duplicate);
    app.wait_status("alice", &o.order_id, OrderStatus::Paid)
        .await;
}
