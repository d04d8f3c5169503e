//! Shipping paid orders: deducted, then shipped and completed; refused by the warehouse after
//! the deduction, failed and the unit returned by the cancel; COMMIT_AT_ORDER without a second
//! deduction; redeliveries without a second shipment or commit; and a product-stock that never
//! answers, which delays a shipment and never fails it.

use flashsale_messaging::envelope;
use flashsale_proto::{
    events::v1::{OrderCancelled, envelope::Payload},
    order::v1::{CancelReason, OrderStatus},
    outbound::v1::{GetShipmentRequest, ListShipmentsRequest, ShipmentStatus},
    product::v1::DeductionPolicy,
};
use flashsale_test_support::{
    fixtures,
    grpc::{token, with_token},
};
use tonic::Code;

use crate::stack::{admin, spawn_stack};

const RTC: DeductionPolicy = DeductionPolicy::ReserveThenCommit;
const CAO: DeductionPolicy = DeductionPolicy::CommitAtOrder;

#[tokio::test]
async fn a_paid_order_is_committed_and_shipped_once_even_when_redelivered() {
    let stack = spawn_stack(|_| {}).await;
    stack.product("SHIP", 5, RTC).await;
    let order = stack.reserved_order("alice", "SHIP", RTC).await;
    let paid = stack.paid(order, "alice", "SHIP", RTC);
    stack.publish(&paid).await;
    stack.publish(&paid).await; // redelivered
    let mut again = stack.paid(order, "alice", "SHIP", RTC);
    again.message_id = uuid::Uuid::now_v7().to_string(); // re-sent under a new id
    stack.publish(&again).await;
    let s = stack.finished(order).await;
    assert_eq!((s.status, s.attempts), (ShipmentStatus::Shipped as i32, 1));
    let p = stack.get_product("SHIP").await;
    assert_eq!((p.on_hand, p.reserved), (4, 0), "committed exactly once");
    assert_eq!(stack.count("SELECT COUNT(*) AS n FROM shipments").await, 1);
    flashsale_test_support::eventually(
        std::time::Duration::from_secs(10),
        "all three handled",
        || async { (stack.count("SELECT COUNT(*) AS n FROM outbox").await == 1).then_some(()) },
    )
    .await
    .unwrap();
    let completed = stack.outbox_of("outbound.completed").await;
    assert_eq!(completed.len(), 1);
    fixtures::assert_same_shape(&completed[0]).unwrap();
}

#[tokio::test]
async fn a_warehouse_refusal_after_the_deduction_fails_the_shipment_and_the_cancel_returns_the_unit()
 {
    let stack = spawn_stack(|s| s.warehouse.fail_skus = "BROKEN".into()).await;
    stack.product("BROKEN", 3, RTC).await;
    let order = stack.reserved_order("alice", "BROKEN", RTC).await;
    stack
        .publish(&stack.paid(order, "alice", "BROKEN", RTC))
        .await;
    let s = stack.finished(order).await;
    assert_eq!(s.status, ShipmentStatus::Failed as i32);
    assert!(s.stock_committed, "deducted before the warehouse was asked");
    assert!(
        s.failure_reason.contains("could not pick"),
        "{}",
        s.failure_reason
    );
    let p = stack.get_product("BROKEN").await;
    assert_eq!((p.on_hand, p.reserved), (2, 0), "deducted first");
    let failed = stack.outbox_of("outbound.failed").await;
    assert_eq!(failed.len(), 1);
    fixtures::assert_same_shape(&failed[0]).unwrap();
    let Some(Payload::OutboundFailed(f)) = &failed[0].payload else {
        panic!("payload")
    };
    assert_eq!(f.order_id, order.to_string());

    // The order service cancels the order (OUTBOUND_FAILED) and refunds it: its unit goes back
    // to stock, in the database and in the gate.
    let cancelled = OrderCancelled {
        order_id: order.to_string(),
        user_id: "alice".into(),
        sku: "BROKEN".into(),
        quantity: 1,
        reason: CancelReason::OutboundFailed as i32,
        previous_status: OrderStatus::Paid as i32,
    };
    stack
        .publish(&envelope::new(
            Payload::OrderCancelled(cancelled),
            order.to_string(),
            "",
            "order",
        ))
        .await;
    let p = flashsale_test_support::eventually(
        std::time::Duration::from_secs(20),
        "the unit given back",
        || async {
            let p = stack.get_product("BROKEN").await;
            (p.on_hand == 3 && p.gate_available == 3).then_some(p)
        },
    )
    .await
    .unwrap();
    assert_eq!((p.on_hand, p.reserved), (3, 0));
}

#[tokio::test]
async fn commit_at_order_ships_without_a_second_deduction() {
    let stack = spawn_stack(|_| {}).await;
    stack.product("TICKET", 4, CAO).await;
    let order = stack.reserved_order("alice", "TICKET", CAO).await;
    assert_eq!(stack.get_product("TICKET").await.on_hand, 3);
    stack
        .publish(&stack.paid(order, "alice", "TICKET", CAO))
        .await;
    assert_eq!(
        stack.finished(order).await.status,
        ShipmentStatus::Shipped as i32
    );
    assert_eq!(stack.get_product("TICKET").await.on_hand, 3);
}

#[tokio::test]
async fn a_refused_commit_fails_the_shipment() {
    let stack = spawn_stack(|_| {}).await;
    stack.product("GONE", 3, RTC).await;
    // Paid, but product-stock never persisted a reservation for it.
    let order = uuid::Uuid::new_v4();
    stack
        .publish(&stack.paid(order, "alice", "GONE", RTC))
        .await;
    let s = stack.finished(order).await;
    assert_eq!(s.status, ShipmentStatus::Failed as i32);
    assert!(
        s.failure_reason.contains("NotFound"),
        "{}",
        s.failure_reason
    );
    assert_eq!(stack.get_product("GONE").await.on_hand, 3);
}

#[tokio::test]
async fn a_product_stock_that_never_answers_delays_the_shipment_and_never_fails_it() {
    let stack = spawn_stack(|s| {
        s.upstream.product_stock_url = "http://127.0.0.1:1".into();
        s.shipping.retry_base_ms = 1;
        s.shipping.retry_max_ms = 20;
        s.shipping.sweep_interval_ms = 10;
        s.shipping.alert_after_ms = 1_000;
    })
    .await;
    let order = uuid::Uuid::new_v4();
    stack.publish(&stack.paid(order, "alice", "ANY", RTC)).await;
    // Far more attempts than a retry ladder would allow, and still not failed.
    flashsale_test_support::eventually(
        std::time::Duration::from_secs(30),
        "twelve delayed attempts",
        || async {
            (stack
                .count("SELECT COUNT(*) AS n FROM shipment_attempts WHERE outcome = 'TRANSIENT'")
                .await
                >= 12)
                .then_some(())
        },
    )
    .await
    .unwrap();
    let mut c = stack.outbound().await;
    let get = GetShipmentRequest {
        order_id: order.to_string(),
    };
    let s = c
        .get_shipment(admin(get))
        .await
        .unwrap()
        .into_inner()
        .shipment
        .unwrap();
    assert_eq!(s.status, ShipmentStatus::Picking as i32);
    assert!(s.attempts >= 12, "{}", s.attempts);
    assert!(!s.stock_committed);
    assert!(
        s.last_error.contains("CommitReservation"),
        "{}",
        s.last_error
    );
    assert!(s.next_attempt_time.is_some());
    assert_eq!(
        stack
            .count("SELECT COUNT(*) AS n FROM shipment_attempts WHERE step = 'warehouse'")
            .await,
        0,
        "the warehouse is never asked before the deduction"
    );
    assert_eq!(stack.outbox_of("outbound.failed").await.len(), 0);

    // Overdue once older than alert_after_ms: listed with its last error.
    let overdue = flashsale_test_support::eventually(
        std::time::Duration::from_secs(30),
        "listed as overdue",
        || {
            let mut c = c.clone();
            async move {
                let req = ListShipmentsRequest {
                    status: ShipmentStatus::Picking as i32,
                    page_size: 10,
                    page_token: String::new(),
                    older_than_ms: 1_000,
                };
                let page = c.list_shipments(admin(req)).await.ok()?.into_inner();
                (!page.shipments.is_empty()).then_some(page.shipments)
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(overdue[0].order_id, order.to_string());
    assert!(!overdue[0].last_error.is_empty());
    for bad in [-1, 31 * 86_400_000] {
        let req = ListShipmentsRequest {
            older_than_ms: bad,
            ..Default::default()
        };
        let status = c.list_shipments(admin(req)).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(
            flashsale_platform::error::violated_fields(&status),
            ["older_than_ms"]
        );
    }
}

#[tokio::test]
async fn shipments_are_visible_to_their_buyer_and_listed_for_admins() {
    let stack = spawn_stack(|_| {}).await;
    stack.product("VIS", 5, RTC).await;
    let mut orders = Vec::new();
    for _ in 0..3 {
        let order = stack.reserved_order("alice", "VIS", RTC).await;
        stack.publish(&stack.paid(order, "alice", "VIS", RTC)).await;
        stack.finished(order).await;
        orders.push(order);
    }
    let mut c = stack.outbound().await;
    let mine = GetShipmentRequest {
        order_id: orders[0].to_string(),
    };
    let got = c
        .get_shipment(with_token(
            mine.clone(),
            &token("alice", flashsale_platform::auth::Role::User),
        ))
        .await;
    assert_eq!(
        got.unwrap().into_inner().shipment.unwrap().order_id,
        orders[0].to_string()
    );
    let theirs = c
        .get_shipment(with_token(
            mine,
            &token("bob", flashsale_platform::auth::Role::User),
        ))
        .await;
    assert_eq!(theirs.unwrap_err().code(), Code::NotFound);
    let bad = c
        .get_shipment(admin(GetShipmentRequest {
            order_id: "x".into(),
        }))
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);

    let first = ListShipmentsRequest {
        page_size: 2,
        status: ShipmentStatus::Shipped as i32,
        page_token: String::new(),
        older_than_ms: 0,
    };
    let page = c.list_shipments(admin(first)).await.unwrap().into_inner();
    assert_eq!(page.shipments.len(), 2);
    let next = ListShipmentsRequest {
        page_size: 2,
        status: ShipmentStatus::Shipped as i32,
        page_token: page.next_page_token.clone(),
        older_than_ms: 0,
    };
    let rest = c.list_shipments(admin(next)).await.unwrap().into_inner();
    assert_eq!(
        (rest.shipments.len(), rest.next_page_token.as_str()),
        (1, "")
    );
    let other_filter = ListShipmentsRequest {
        page_size: 2,
        status: 0,
        page_token: page.next_page_token,
        older_than_ms: 0,
    };
    assert_eq!(
        c.list_shipments(admin(other_filter))
            .await
            .unwrap_err()
            .code(),
        Code::InvalidArgument
    );
    let user = c.list_shipments(with_token(
        ListShipmentsRequest::default(),
        &token("alice", flashsale_platform::auth::Role::User),
    ));
    assert_eq!(user.await.unwrap_err().code(), Code::PermissionDenied);
    let negative = ListShipmentsRequest {
        page_size: -1,
        ..Default::default()
    };
    assert_eq!(
        c.list_shipments(admin(negative)).await.unwrap_err().code(),
        Code::InvalidArgument
    );
}

#[tokio::test]
async fn the_order_paid_fixture_is_accepted() {
    let stack = spawn_stack(|_| {}).await;
    let env = fixtures::envelope("order.paid").unwrap();
    let Some(Payload::OrderPaid(ev)) = &env.payload else {
        panic!("fixture payload")
    };
    let order: uuid::Uuid = ev.order_id.parse().unwrap();
    stack.publish(&env).await;
    // No reservation exists for the fixture's order, so the shipment fails; it was accepted.
    assert_eq!(
        stack.finished(order).await.status,
        ShipmentStatus::Failed as i32
    );
}

#[tokio::test]
async fn a_control_character_in_any_string_field_is_invalid_argument_naming_it() {
    let stack = spawn_stack(|_| {}).await;
    let mut c = stack.outbound().await;
    let get = GetShipmentRequest {
        order_id: format!("{}\0", uuid::Uuid::new_v4()),
    };
    let status = c.get_shipment(admin(get)).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(
        flashsale_platform::error::violated_fields(&status),
        ["order_id"]
    );
    let list = ListShipmentsRequest {
        page_token: "s1.\n".into(),
        ..Default::default()
    };
    let status = c.list_shipments(admin(list)).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(
        flashsale_platform::error::violated_fields(&status),
        ["page_token"]
    );
    assert_eq!(stack.count("SELECT COUNT(*) AS n FROM shipments").await, 0);
}
