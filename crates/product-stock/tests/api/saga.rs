//! product-stock in the saga: order.created / order.cancelled / stock.adjusted consumed once
//! each, CommitReservation, COMMIT_AT_ORDER, tombstones, and the database refusing an oversell
//! that a wrong gate let through.

use flashsale_proto::{
    events::v1::{OrderCancelled, OrderCreated, ReservationFailureReason, envelope::Payload},
    order::v1::{CancelReason, OrderStatus},
    product::v1::{CommitReservationRequest, DeductionPolicy, ReservationState},
};
use tonic::Code;
use uuid::Uuid;

use crate::{
    helpers::{TestApp, reason, service, spawn_app, user},
    reserve::reserve_req,
};

const RTC: DeductionPolicy = DeductionPolicy::ReserveThenCommit;
const CAO: DeductionPolicy = DeductionPolicy::CommitAtOrder;

pub fn created(order: Uuid, user_id: &str, sku: &str, q: i64) -> Payload {
    Payload::OrderCreated(OrderCreated {
        order_id: order.to_string(),
        user_id: user_id.into(),
        sku: sku.into(),
        quantity: q,
        unit_price_cents: 1999,
        total_cents: 1999 * q,
        deduction_policy: 0,
    })
}

pub fn cancelled(order: Uuid, user_id: &str, sku: &str, q: i64) -> Payload {
    Payload::OrderCancelled(OrderCancelled {
        order_id: order.to_string(),
        user_id: user_id.into(),
        sku: sku.into(),
        quantity: q,
        reason: CancelReason::PaymentTimeout as i32,
        previous_status: OrderStatus::AwaitingPayment as i32,
    })
}

async fn gate_reserve(app: &TestApp, order: Uuid, user_id: &str, sku: &str, q: i64) {
    app.client()
        .await
        .reserve_stock(service(reserve_req(order, user_id, sku, q)))
        .await
        .unwrap();
}

fn state_sql(order: Uuid, state: &str) -> String {
    format!(
        "SELECT COUNT(*) AS n FROM reservations WHERE order_id = '{order}' AND state = '{state}'"
    )
}

#[tokio::test]
async fn order_created_persists_the_hold_and_reports_stock_reserved() {
    let app = spawn_app().await;
    app.create("S1", 10, 0, RTC).await;
    let order = Uuid::new_v4();
    gate_reserve(&app, order, "u1", "S1", 2).await;
    assert_eq!(app.gate.snapshot("S1").await.unwrap().unwrap().held, 2);
    app.publish(created(order, "u1", "S1", 2), &order.to_string())
        .await;
    app.wait_count(&state_sql(order, "RESERVED"), 1).await;
    assert_eq!(app.count("SELECT reserved AS n FROM stock").await, 2);
    let events = app.outbox_of("stock.reserved").await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].correlation_id, order.to_string());
    let snap = app.gate.snapshot("S1").await.unwrap().unwrap();
    assert_eq!(
        (snap.available, snap.held),
        (8, 0),
        "hold must be marked persisted"
    );
}

#[tokio::test]
async fn replayed_created_and_cancelled_events_have_one_effect() {
    let app = spawn_app().await;
    app.create("S2", 10, 0, RTC).await;
    let order = Uuid::new_v4();
    gate_reserve(&app, order, "u1", "S2", 3).await;
    let env = app
        .publish(created(order, "u1", "S2", 3), &order.to_string())
        .await;
    app.publish_envelope(&env).await; // same message id: the inbox drops it
    app.publish(created(order, "u1", "S2", 3), &order.to_string())
        .await; // new id, same order
    app.wait_count("SELECT COUNT(*) AS n FROM inbox", 2).await;
    assert_eq!(app.count("SELECT reserved AS n FROM stock").await, 3);
    assert_eq!(app.outbox_of("stock.reserved").await.len(), 1);

    let cancel = app
        .publish(cancelled(order, "u1", "S2", 3), &order.to_string())
        .await;
    app.publish_envelope(&cancel).await;
    app.publish(cancelled(order, "u1", "S2", 3), &order.to_string())
        .await;
    app.wait_count("SELECT COUNT(*) AS n FROM inbox", 4).await;
    app.wait_count(&state_sql(order, "RELEASED"), 1).await;
    assert_eq!(app.count("SELECT reserved AS n FROM stock").await, 0);
    assert_eq!(app.outbox_of("stock.released").await.len(), 1);
    app.wait_gate("S2", (10, 0)).await;
    assert_eq!(
        app.count("SELECT SUM(reserved_delta)::bigint AS n FROM stock_ledger")
            .await,
        0
    );
}

#[tokio::test]
async fn a_cancel_before_its_create_leaves_a_tombstone_and_the_late_create_is_refused() {
    let app = spawn_app().await;
    app.create("S3", 5, 0, RTC).await;
    let order = Uuid::new_v4();
    gate_reserve(&app, order, "u1", "S3", 1).await;
    app.publish(cancelled(order, "u1", "S3", 1), &order.to_string())
        .await;
    app.wait_count(&state_sql(order, "RELEASED"), 1).await;
    app.wait_gate("S3", (5, 0)).await;
    app.publish(created(order, "u1", "S3", 1), &order.to_string())
        .await;
    app.wait_count("SELECT COUNT(*) AS n FROM inbox", 2).await;
    let failed = app.outbox_of("stock.reservation_failed").await;
    assert_eq!(failed.len(), 1);
    let Some(Payload::StockReservationFailed(f)) = &failed[0].payload else {
        panic!("wrong payload")
    };
    assert_eq!(f.reason, ReservationFailureReason::OrderCancelled as i32);
    assert_eq!(app.count("SELECT reserved AS n FROM stock").await, 0);
    assert_eq!(app.gate.snapshot("S3").await.unwrap().unwrap().available, 5);
}

#[tokio::test]
async fn commit_reservation_deducts_once_and_refuses_what_it_cannot_commit() {
    let app = spawn_app().await;
    app.create("S4", 10, 0, RTC).await;
    let (order, other) = (Uuid::new_v4(), Uuid::new_v4());
    for o in [order, other] {
        gate_reserve(&app, o, "u1", "S4", 2).await;
        app.publish(created(o, "u1", "S4", 2), &o.to_string()).await;
    }
    app.wait_count(
        "SELECT COUNT(*) AS n FROM reservations WHERE state = 'RESERVED'",
        2,
    )
    .await;
    let mut c = app.client().await;
    let req = |o: Uuid| CommitReservationRequest {
        order_id: o.to_string(),
    };
    let first = c
        .commit_reservation(service(req(order)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (first.quantity, first.state, first.replayed),
        (2, ReservationState::Committed as i32, false)
    );
    let again = c
        .commit_reservation(service(req(order)))
        .await
        .unwrap()
        .into_inner();
    assert!(again.replayed);
    assert_eq!(app.count("SELECT on_hand AS n FROM stock").await, 8);
    assert_eq!(app.count("SELECT reserved AS n FROM stock").await, 2);
    assert_eq!(app.outbox_of("stock.committed").await.len(), 1);

    app.publish(cancelled(other, "u1", "S4", 2), &other.to_string())
        .await;
    app.wait_count(&state_sql(other, "RELEASED"), 1).await;
    let err = c.commit_reservation(service(req(other))).await.unwrap_err();
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::FailedPrecondition, "RESERVATION_RELEASED")
    );
    let err = c
        .commit_reservation(service(req(Uuid::new_v4())))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let err = c
        .commit_reservation(service(CommitReservationRequest {
            order_id: "x".into(),
        }))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = c.commit_reservation(user(req(order))).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    assert_eq!(app.count("SELECT on_hand AS n FROM stock").await, 8);
}

#[tokio::test]
async fn commit_at_order_deducts_on_hand_at_creation_and_a_cancel_puts_it_back() {
    let app = spawn_app().await;
    app.create("T1", 4, 0, CAO).await;
    let order = Uuid::new_v4();
    gate_reserve(&app, order, "u1", "T1", 1).await;
    app.publish(created(order, "u1", "T1", 1), &order.to_string())
        .await;
    app.wait_count(&state_sql(order, "COMMITTED"), 1).await;
    assert_eq!(app.count("SELECT on_hand AS n FROM stock").await, 3);
    assert_eq!(app.count("SELECT reserved AS n FROM stock").await, 0);
    let r = app
        .client()
        .await
        .commit_reservation(service(CommitReservationRequest {
            order_id: order.to_string(),
        }))
        .await;
    assert!(
        r.unwrap().into_inner().replayed,
        "already committed at order"
    );
    app.publish(cancelled(order, "u1", "T1", 1), &order.to_string())
        .await;
    app.wait_count(&state_sql(order, "RELEASED"), 1).await;
    assert_eq!(app.count("SELECT on_hand AS n FROM stock").await, 4);
    app.wait_gate("T1", (4, 0)).await;
}

#[tokio::test]
async fn the_database_refuses_an_oversell_even_when_the_gate_is_wrong() {
    let app = spawn_app().await;
    app.create("O1", 3, 0, RTC).await;
    app.gate.repair("O1", 10).await.unwrap(); // the gate now believes in 10 units
    let orders: Vec<Uuid> = (0..6).map(|_| Uuid::new_v4()).collect();
    for (i, o) in orders.iter().enumerate() {
        gate_reserve(&app, *o, &format!("u{i}"), "O1", 1).await;
        app.publish(created(*o, &format!("u{i}"), "O1", 1), &o.to_string())
            .await;
    }
    app.wait_count("SELECT COUNT(*) AS n FROM inbox", 6).await;
    assert_eq!(app.count("SELECT reserved AS n FROM stock").await, 3);
    assert_eq!(
        app.count("SELECT COUNT(*) AS n FROM reservations WHERE state = 'RESERVED'")
            .await,
        3
    );
    assert_eq!(app.outbox_of("stock.reservation_failed").await.len(), 3);
    // And the CHECK constraint stands behind the conditional update.
    let err =
        sea_orm::ConnectionTrait::execute_unprepared(&app.conn, "UPDATE stock SET reserved = 4")
            .await;
    assert!(err.is_err(), "CHECK must refuse reserved > on_hand");
}

#[tokio::test]
async fn events_for_unknown_products_are_refused_and_malformed_ones_parked() {
    let app = spawn_app().await;
    let order = Uuid::new_v4();
    app.publish(created(order, "u1", "NOPE", 1), &order.to_string())
        .await;
    app.wait_count("SELECT COUNT(*) AS n FROM inbox", 1).await;
    let failed = app.outbox_of("stock.reservation_failed").await;
    let Some(Payload::StockReservationFailed(f)) = &failed[0].payload else {
        panic!("wrong payload")
    };
    assert_eq!(f.reason, ReservationFailureReason::UnknownProduct as i32);

    app.publish(created(order, "u1", "bad sku", 1), "x").await;
    app.publish(cancelled(Uuid::new_v4(), "u1", "S", 0), "x")
        .await;
    flashsale_test_support::eventually(
        std::time::Duration::from_secs(15),
        "two parked",
        || async {
            (app.parked(flashsale_product_stock::api::amqp::ORDER_EVENTS_QUEUE)
                .await
                == 2)
                .then_some(())
        },
    )
    .await
    .unwrap();
    assert_eq!(app.count("SELECT COUNT(*) AS n FROM reservations").await, 0);
}

#[tokio::test]
async fn a_cancel_that_fails_after_the_gate_release_gives_the_units_back_once() {
    let app = spawn_app().await;
    app.create("F1", 5, 0, RTC).await;
    let order = Uuid::new_v4();
    gate_reserve(&app, order, "u1", "F1", 2).await;
    app.publish(created(order, "u1", "F1", 2), &order.to_string())
        .await;
    app.wait_count(&state_sql(order, "RESERVED"), 1).await;
    // The first attempt prepares the release in the gate, then dies before its commit; the
    // retry finishes.
    app.failpoints.arm_n(
        "stock.order_cancelled.before_commit",
        flashsale_platform::failpoint::Action::Error,
        Some(1),
    );
    app.publish(cancelled(order, "u1", "F1", 2), &order.to_string())
        .await;
    app.wait_count(&state_sql(order, "RELEASED"), 1).await;
    app.wait_gate("F1", (5, 0)).await;
    assert_eq!(app.count("SELECT reserved AS n FROM stock").await, 0);
    assert_eq!(app.outbox_of("stock.released").await.len(), 1);
}

#[tokio::test]
async fn a_cancel_gives_nothing_to_the_gate_until_its_release_has_committed() {
    let app = spawn_app().await;
    app.create("G1", 1, 0, RTC).await;
    let first = Uuid::new_v4();
    gate_reserve(&app, first, "u1", "G1", 1).await;
    app.publish(created(first, "u1", "G1", 1), &first.to_string())
        .await;
    app.wait_count(&state_sql(first, "RESERVED"), 1).await;
    // The release's transaction stays open for a while: the database still counts the unit.
    app.failpoints.arm_n(
        "stock.order_cancelled.before_commit",
        flashsale_platform::failpoint::Action::Sleep(std::time::Duration::from_millis(2000)),
        Some(1),
    );
    app.publish(cancelled(first, "u1", "G1", 1), &first.to_string())
        .await;
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    assert_eq!(app.count("SELECT reserved AS n FROM stock").await, 1);
    let snap = app.gate.snapshot("G1").await.unwrap().unwrap();
    assert_eq!(
        (snap.available, snap.held),
        (0, 0),
        "the unit is still reserved in the database, so the gate must not sell it"
    );
    let second = Uuid::new_v4();
    let early = app
        .client()
        .await
        .reserve_stock(service(reserve_req(second, "u2", "G1", 1)))
        .await
        .unwrap_err();
    assert_eq!(reason(&early), "SOLD_OUT");

    app.wait_count(&state_sql(first, "RELEASED"), 1).await;
    flashsale_test_support::eventually(
        std::time::Duration::from_secs(10),
        "the unit back in the gate",
        || async {
            let s = app.gate.snapshot("G1").await.unwrap().unwrap();
            (s.available == 1).then_some(())
        },
    )
    .await
    .unwrap();
    // The unit sells again, and the database takes that order.
    gate_reserve(&app, second, "u2", "G1", 1).await;
    app.publish(created(second, "u2", "G1", 1), &second.to_string())
        .await;
    app.wait_count(&state_sql(second, "RESERVED"), 1).await;
    assert!(app.outbox_of("stock.reservation_failed").await.is_empty());
}

#[tokio::test]
async fn a_cancel_whose_consumer_dies_after_its_commit_gives_the_units_back_on_redelivery() {
    let app = spawn_app().await;
    app.create("G2", 5, 0, RTC).await;
    let order = Uuid::new_v4();
    gate_reserve(&app, order, "u1", "G2", 2).await;
    app.publish(created(order, "u1", "G2", 2), &order.to_string())
        .await;
    app.wait_count(&state_sql(order, "RESERVED"), 1).await;
    // The release commits, then the consumer fails before the gate gets the units back; the
    // delivery is not acknowledged, and its redelivery finds the message handled.
    app.failpoints.arm_n(
        "stock.order_cancelled.after_commit",
        flashsale_platform::failpoint::Action::Error,
        Some(1),
    );
    app.publish(cancelled(order, "u1", "G2", 2), &order.to_string())
        .await;
    app.wait_count(&state_sql(order, "RELEASED"), 1).await;
    flashsale_test_support::eventually(
        std::time::Duration::from_secs(15),
        "the units back in the gate",
        || async {
            let s = app.gate.snapshot("G2").await.unwrap().unwrap();
            (s.available == 5).then_some(())
        },
    )
    .await
    .unwrap();
    // Once: another delivery of the same cancel changes nothing.
    app.publish(cancelled(order, "u1", "G2", 2), &order.to_string())
        .await;
    app.wait_count("SELECT COUNT(*) AS n FROM inbox", 3).await;
    let snap = app.gate.snapshot("G2").await.unwrap().unwrap();
    assert_eq!((snap.available, snap.held), (5, 0));
    assert_eq!(app.outbox_of("stock.released").await.len(), 1);
}

#[tokio::test]
async fn a_cancel_racing_its_create_releases_the_reservation_the_create_wrote() {
    let app = spawn_app().await;
    app.create("R1", 5, 0, RTC).await;
    let order = Uuid::new_v4();
    gate_reserve(&app, order, "u1", "R1", 1).await;
    // order.created writes its reservation and then holds its transaction open, so the cancel
    // arrives while the reservation exists but is not committed yet.
    app.failpoints.arm_n(
        "stock.order_created.before_commit",
        flashsale_platform::failpoint::Action::Sleep(std::time::Duration::from_millis(1500)),
        Some(1),
    );
    app.publish(created(order, "u1", "R1", 1), &order.to_string())
        .await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    app.publish(cancelled(order, "u1", "R1", 1), &order.to_string())
        .await;
    app.wait_count("SELECT COUNT(*) AS n FROM inbox", 2).await;
    app.wait_count(&state_sql(order, "RELEASED"), 1).await;
    assert_eq!(
        app.count("SELECT reserved AS n FROM stock").await,
        0,
        "the cancelled order's unit must not stay reserved"
    );
    app.wait_gate("R1", (5, 0)).await;
    assert_eq!(
        app.count("SELECT SUM(reserved_delta)::bigint AS n FROM stock_ledger")
            .await,
        0
    );
}
