//! The order saga's consumers and timers: payment timeout (delayed message and sweeper),
//! timed-out units bought again, shipment outcome, the payment/timeout race, bad events.

use std::time::Duration;

use flashsale_proto::{
    events::v1::{OutboundCompleted, OutboundFailed, StockReserved, envelope::Payload},
    order::v1::{CancelReason, OrderStatus, RefundStatus},
};

use crate::helpers::{as_user, reason, spawn_stack};

#[tokio::test]
async fn unpaid_orders_time_out_and_their_units_can_be_bought_again() {
    let app = spawn_stack(|s| s.saga.payment_timeout_ms = 1_000).await;
    app.product("T1", 2, 0).await;
    let a = app.order("alice", "a", "T1", 1).await.unwrap();
    let b = app.order("bob", "b", "T1", 1).await.unwrap();
    assert_eq!(
        reason(&app.order("carol", "c", "T1", 1).await.unwrap_err()),
        "SOLD_OUT"
    );
    for (user, o) in [("alice", &a), ("bob", &b)] {
        let done = app
            .wait_status(user, &o.order_id, OrderStatus::Cancelled)
            .await;
        assert_eq!(done.cancel_reason, CancelReason::PaymentTimeout as i32);
    }
    flashsale_test_support::eventually(Duration::from_secs(20), "units back", || async {
        let p = app.get_product("T1").await;
        (p.reserved == 0 && p.gate_available == 2).then_some(())
    })
    .await
    .unwrap();
    assert_eq!(app.outbox_of("order.cancelled").await.len(), 2);
    // Past the sold-out cache, the returned units sell again.
    let again = flashsale_test_support::eventually(Duration::from_secs(5), "rebuy", || async {
        app.order("carol", "c2", "T1", 1).await.ok()
    })
    .await
    .unwrap();
    app.wait_status("carol", &again.order_id, OrderStatus::AwaitingPayment)
        .await;
}

#[tokio::test]
async fn the_sweeper_cancels_by_the_stored_deadline_when_no_timer_arrives() {
    let app = spawn_stack(|s| s.saga.payment_timeout_ms = 3_600_000).await;
    app.product("T2", 3, 0).await;
    let o = app.order("alice", "a", "T2", 1).await.unwrap();
    app.wait_status("alice", &o.order_id, OrderStatus::AwaitingPayment)
        .await;
    app.exec(&format!(
        "UPDATE orders SET payment_deadline = now() - interval '1 second' WHERE order_id = '{}'",
        o.order_id
    ))
    .await;
    let done = app
        .wait_status("alice", &o.order_id, OrderStatus::Cancelled)
        .await;
    assert_eq!(done.cancel_reason, CancelReason::PaymentTimeout as i32);
}

#[tokio::test]
async fn shipment_outcomes_finish_the_order_and_a_failed_one_is_refunded_once() {
    let app = spawn_stack(|_| {}).await;
    app.product("T3", 5, 0).await;
    let mut ids = Vec::new();
    for key in ["ship", "fail"] {
        let o = app.order("alice", key, "T3", 1).await.unwrap();
        app.wait_status("alice", &o.order_id, OrderStatus::AwaitingPayment)
            .await;
        app.pay("alice", &o.order_id).await;
        ids.push(o.order_id);
    }
    let (ship, fail) = (&ids[0], &ids[1]);
    let completed = OutboundCompleted {
        order_id: ship.clone(),
        shipment_id: "s1".into(),
        sku: "T3".into(),
        quantity: 1,
    };
    app.publish(Payload::OutboundCompleted(completed), ship)
        .await;
    app.wait_status("alice", ship, OrderStatus::Shipped).await;

    let failed = OutboundFailed {
        order_id: fail.clone(),
        shipment_id: "s2".into(),
        sku: "T3".into(),
        quantity: 1,
        reason: "warehouse fire".into(),
    };
    let env = app
        .publish(Payload::OutboundFailed(failed.clone()), fail)
        .await;
    app.publish_envelope(&env).await; // redelivered
    app.publish(Payload::OutboundFailed(failed), fail).await; // re-sent with a new id
    let o = app.wait_status("alice", fail, OrderStatus::Cancelled).await;
    assert_eq!(
        (o.cancel_reason, o.refund_cents),
        (CancelReason::OutboundFailed as i32, 2500)
    );
    // Requested from the provider at once, paid back by the refund worker.
    flashsale_test_support::eventually(Duration::from_secs(20), "refund paid", || async {
        let o = app.get("alice", fail).await;
        (o.refund_status == RefundStatus::Completed as i32).then_some(())
    })
    .await
    .unwrap();
    // stock.reserved twice, outbound.completed, outbound.failed twice (the redelivery is dropped).
    app.wait_count("SELECT COUNT(*) AS n FROM inbox", 5).await;
    assert_eq!(app.count("SELECT COUNT(*) AS n FROM refunds").await, 1);
    assert_eq!(app.outbox_of("order.refunded").await.len(), 1);
    flashsale_test_support::eventually(Duration::from_secs(20), "unit back", || async {
        (app.get_product("T3").await.reserved == 1).then_some(())
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn five_hundred_payments_racing_the_timeout_each_have_one_winner() {
    let app = spawn_stack(|s| s.saga.payment_timeout_ms = 6_000).await;
    app.product("RACE", 500, 0).await;
    let client = app.client().await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..500 {
        let mut c = client.clone();
        tasks.spawn(async move {
            let req = crate::helpers::create_req("k", "RACE", 1);
            c.create_order(as_user(&format!("u{i}"), req))
                .await
                .map(|r| r.into_inner().order.unwrap())
        });
    }
    let mut orders = Vec::new();
    while let Some(r) = tasks.join_next().await {
        orders.push(r.unwrap().unwrap());
    }
    app.wait_count(
        "SELECT COUNT(*) AS n FROM orders WHERE payment_deadline IS NOT NULL",
        500,
    )
    .await;
    // Every buyer starts a payment, then pays at the provider aimed at the deadline itself, a
    // little before or after: the notification races the timeout.
    let app = std::sync::Arc::new(app);
    let mut tasks = tokio::task::JoinSet::new();
    for (i, o) in orders.iter().enumerate() {
        let o = app.get(&o.user_id, &o.order_id).await;
        let deadline = o.payment_deadline.unwrap();
        let app = app.clone();
        tasks.spawn(async move {
            let Ok(started) = app.start_payment(&o.user_id, &o.order_id).await else {
                return false;
            };
            let at =
                deadline.seconds * 1000 + i64::from(deadline.nanos) / 1_000_000 + (i as i64 % 41)
                    - 20;
            let wait = at - chrono::Utc::now().timestamp_millis();
            if wait > 0 {
                tokio::time::sleep(Duration::from_millis(wait as u64)).await;
            }
            app.buyer_pays(&started.checkout.unwrap().provider_payment_id)
                .await;
            true
        });
    }
    let mut payers = 0;
    while let Some(r) = tasks.join_next().await {
        payers += i64::from(r.unwrap());
    }
    app.wait_count(
        "SELECT COUNT(*) AS n FROM orders WHERE status IN ('PAID', 'CANCELLED')",
        500,
    )
    .await;
    app.wait_count(
        "SELECT COUNT(*) AS n FROM provider_payments WHERE status = 'SUCCEEDED'",
        payers,
    )
    .await;
    let paid = app
        .count("SELECT COUNT(*) AS n FROM orders WHERE status = 'PAID'")
        .await;
    let refunded = app.count("SELECT COUNT(*) AS n FROM refunds").await;
    assert_eq!(
        paid + refunded,
        payers,
        "each payment paid its order or was refunded"
    );
    assert_eq!(app.outbox_of("order.paid").await.len() as i64, paid);
    assert_eq!(
        app.count("SELECT COUNT(*) AS n FROM refunds r JOIN orders o USING (order_id) WHERE o.status <> 'CANCELLED'").await,
        0,
        "a paid order was refunded"
    );
    println!("race: {payers} payments, {paid} paid, {refunded} too late and refunded");
}

#[tokio::test]
async fn malformed_and_unknown_events_are_parked_and_change_nothing() {
    let app = spawn_stack(|_| {}).await;
    let unknown = StockReserved {
        order_id: uuid::Uuid::new_v4().to_string(),
        sku: "X".into(),
        quantity: 1,
        deduction_policy: 1,
    };
    app.publish(Payload::StockReserved(unknown), "x").await;
    let malformed = StockReserved {
        order_id: "not-a-uuid".into(),
        sku: "X".into(),
        quantity: 1,
        deduction_policy: 1,
    };
    app.publish(Payload::StockReserved(malformed), "x").await;
    flashsale_test_support::eventually(Duration::from_secs(20), "two parked", || async {
        (app.parked().await == 2).then_some(())
    })
    .await
    .unwrap();
    assert_eq!(app.count("SELECT COUNT(*) AS n FROM orders").await, 0);
}

#[tokio::test]
async fn a_refusal_for_an_order_never_written_is_dropped_not_parked() {
    let app = spawn_stack(|_| {}).await;
    let ghost = flashsale_proto::events::v1::StockReservationFailed {
        order_id: uuid::Uuid::new_v4().to_string(),
        sku: "X".into(),
        quantity: 1,
        reason: flashsale_proto::events::v1::ReservationFailureReason::OrderCancelled as i32,
        detail: "hold expired".into(),
    };
    app.publish(Payload::StockReservationFailed(ghost), "x")
        .await;
    app.wait_count("SELECT COUNT(*) AS n FROM inbox", 1).await;
    assert_eq!(app.parked().await, 0);
    assert_eq!(app.count("SELECT COUNT(*) AS n FROM orders").await, 0);
}

fn batch_timer(first: &str, more: &[&str]) -> Payload {
    Payload::PaymentTimeout(flashsale_proto::events::v1::PaymentTimeout {
        order_id: first.to_owned(),
        deadline: None,
        more_order_ids: more.iter().map(|s| (*s).to_owned()).collect(),
    })
}

#[tokio::test]
async fn one_batch_timer_cancels_each_of_its_orders_that_is_past_due() {
    // No timer of its own and no sweep fires during the test: only the batch timer acts.
    let app = spawn_stack(|s| {
        s.saga.payment_timeout_ms = 3_600_000;
        s.saga.sweep_interval_ms = 3_600_000;
    })
    .await;
    app.product("T9", 5, 0).await;
    let mut ids = Vec::new();
    for user in ["u1", "u2", "u3"] {
        let o = app.order(user, "k", "T9", 1).await.unwrap();
        app.wait_status(user, &o.order_id, OrderStatus::AwaitingPayment)
            .await;
        ids.push(o.order_id);
    }
    // u1 and u3 are past their deadline; u2 still has time.
    app.exec(&format!(
        "UPDATE orders SET payment_deadline = now() - interval '1 second' WHERE order_id IN ('{}', '{}')",
        ids[0], ids[2]
    ))
    .await;
    app.publish(batch_timer(&ids[0], &[&ids[1], &ids[2]]), &ids[0])
        .await;
    for (user, id) in [("u1", &ids[0]), ("u3", &ids[2])] {
        let done = app.wait_status(user, id, OrderStatus::Cancelled).await;
        assert_eq!(done.cancel_reason, CancelReason::PaymentTimeout as i32);
    }
    assert_eq!(
        app.get("u2", &ids[1]).await.status,
        OrderStatus::AwaitingPayment as i32
    );
    // Each cancellation is correlated with its own order.
    let mut correlated: Vec<String> = app
        .outbox_of("order.cancelled")
        .await
        .into_iter()
        .map(|e| e.correlation_id)
        .collect();
    correlated.sort();
    let mut want = vec![ids[0].clone(), ids[2].clone()];
    want.sort();
    assert_eq!(correlated, want);
}

#[tokio::test]
async fn a_batch_timer_with_a_malformed_or_unknown_id_is_parked_and_changes_nothing() {
    let app = spawn_stack(|s| {
        s.saga.payment_timeout_ms = 3_600_000;
        s.saga.sweep_interval_ms = 3_600_000;
    })
    .await;
    app.product("T10", 5, 0).await;
    let o = app.order("u1", "k", "T10", 1).await.unwrap();
    app.wait_status("u1", &o.order_id, OrderStatus::AwaitingPayment)
        .await;
    app.exec(&format!(
        "UPDATE orders SET payment_deadline = now() - interval '1 second' WHERE order_id = '{}'",
        o.order_id
    ))
    .await;
    let unknown = uuid::Uuid::new_v4().to_string();
    app.publish(batch_timer(&o.order_id, &["not-a-uuid"]), "x")
        .await;
    app.publish(batch_timer(&o.order_id, &[&unknown]), "x")
        .await;
    let too_many: Vec<String> = (0..1_000)
        .map(|_| uuid::Uuid::new_v4().to_string())
        .collect();
    let too_many: Vec<&str> = too_many.iter().map(String::as_str).collect();
    app.publish(batch_timer(&o.order_id, &too_many), "x").await;
    flashsale_test_support::eventually(Duration::from_secs(20), "three parked", || async {
        (app.parked().await == 3).then_some(())
    })
    .await
    .unwrap();
    assert_eq!(
        app.get("u1", &o.order_id).await.status,
        OrderStatus::AwaitingPayment as i32,
        "the valid order named in refused timers is untouched"
    );
    assert!(app.outbox_of("order.cancelled").await.is_empty());
}
