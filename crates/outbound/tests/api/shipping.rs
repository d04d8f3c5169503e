//! Shipping paid orders: committed and completed, failed and reported, COMMIT_AT_ORDER without a
//! second deduction, redeliveries without a second shipment or commit, and a product-stock that
//! never answers.

use flashsale_proto::{
    events::v1::envelope::Payload,
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
async fn a_warehouse_failure_fails_the_shipment_without_committing() {
    let stack = spawn_stack(|s| s.warehouse.fail_skus = "BROKEN".into()).await;
    stack.product("BROKEN", 3, RTC).await;
    let order = stack.reserved_order("alice", "BROKEN", RTC).await;
    stack
        .publish(&stack.paid(order, "alice", "BROKEN", RTC))
        .await;
    let s = stack.finished(order).await;
    assert_eq!(s.status, ShipmentStatus::Failed as i32);
    assert!(
        s.failure_reason.contains("could not pick"),
        "{}",
        s.failure_reason
    );
    let p = stack.get_product("BROKEN").await;
    assert_eq!(
        (p.on_hand, p.reserved),
        (3, 1),
        "nothing committed; the order's cancel releases it"
    );
    let failed = stack.outbox_of("outbound.failed").await;
    assert_eq!(failed.len(), 1);
    fixtures::assert_same_shape(&failed[0]).unwrap();
    let Some(Payload::OutboundFailed(f)) = &failed[0].payload else {
        panic!("payload")
    };
    assert_eq!(f.order_id, order.to_string());
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
async fn a_product_stock_that_never_answers_fails_the_shipment_after_its_attempts() {
    let stack = spawn_stack(|s| {
        s.upstream.product_stock_url = "http://127.0.0.1:1".into();
        s.shipping.max_attempts = 2;
        s.shipping.stuck_after_ms = 100;
    })
    .await;
    let order = uuid::Uuid::new_v4();
    stack.publish(&stack.paid(order, "alice", "ANY", RTC)).await;
    let s = stack.finished(order).await;
    assert_eq!((s.status, s.attempts), (ShipmentStatus::Failed as i32, 2));
    assert!(
        s.failure_reason.starts_with("gave up after 2 attempts"),
        "{}",
        s.failure_reason
    );
    assert_eq!(
        stack
            .count("SELECT COUNT(*) AS n FROM shipment_attempts WHERE outcome = 'TRANSIENT'")
            .await,
        2
    );
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
    };
    let page = c.list_shipments(admin(first)).await.unwrap().into_inner();
    assert_eq!(page.shipments.len(), 2);
    let next = ListShipmentsRequest {
        page_size: 2,
        status: ShipmentStatus::Shipped as i32,
        page_token: page.next_page_token.clone(),
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
