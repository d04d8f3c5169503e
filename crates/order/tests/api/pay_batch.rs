//! The provider's notifications and `outbound.completed` applied in batches: one transaction
//! for the common case, and a batch with anything unusual in it answered one by one with the
//! same results as single calls.

use std::time::Duration;

use chrono::Utc;
use flashsale_contract::payment::sign;
use flashsale_messaging::envelope;
use flashsale_order::{
    app::{Completed, Payments, Saga, SignedNotice},
    config::SagaSettings,
    domain::{OrderError, ProviderPayment},
    infra::payment_store,
};
use flashsale_proto::{
    events::v1::{Envelope, OutboundCompleted, envelope::Payload},
    payment::v1::{PaymentEvent, PaymentEventType},
};
use flashsale_test_support::TestDatabase;
use prost::Message as _;
use sea_orm::{ConnectionTrait as _, DatabaseConnection};
use sea_orm_migration::MigratorTrait as _;
use uuid::Uuid;

const CONSUMER: &str = "order.saga-events";
const SECRET: &str = "a-webhook-secret-of-at-least-32-bytes!!";

struct Setup {
    _db: TestDatabase,
    conn: DatabaseConnection,
    saga: Saga,
    payments: Payments,
}

async fn setup() -> Setup {
    let db = TestDatabase::create().await.unwrap();
    let conn = db.connect().await.unwrap();
    flashsale_order::migration::Migrator::up(&conn, None)
        .await
        .unwrap();
    let amqp = flashsale_messaging::AmqpConfig::default();
    let saga = Saga::new(
        conn.clone(),
        flashsale_order::api::amqp::payment_timeout_queue(&amqp, Duration::from_secs(900)),
        &SagaSettings::default(),
    );
    let payments = Payments::new(conn.clone(), SECRET, 300_000);
    Setup {
        _db: db,
        conn,
        saga,
        payments,
    }
}

/// An order awaiting payment with a payment started at the provider: (order, payment id).
async fn awaiting(s: &Setup, user: &str) -> (Uuid, String) {
    let order = crate::helpers::confirmed_order(&s.conn, &s.saga, user).await;
    let payment = format!("pay_{}", Uuid::new_v4().simple());
    payment_store::insert_payment(
        &s.conn,
        order,
        &ProviderPayment {
            provider_payment_id: payment.clone(),
            checkout_url: "http://sim/checkout".into(),
            amount_cents: 100,
            currency: "EUR".into(),
        },
    )
    .await
    .unwrap();
    (order, payment)
}

fn notice(order: Uuid, payment: &str, kind: PaymentEventType) -> SignedNotice {
    let payload = PaymentEvent {
        event_id: format!("evt_{}", Uuid::new_v4().simple()),
        r#type: kind as i32,
        payment_id: payment.to_owned(),
        merchant_reference: order.to_string(),
        amount_cents: 100,
        currency: "EUR".into(),
        create_time: None,
    }
    .encode_to_vec();
    let timestamp = Utc::now().timestamp();
    SignedNotice {
        signature: sign(SECRET.as_bytes(), timestamp, &payload),
        payload,
        timestamp,
        trace: Default::default(),
    }
}

async fn count(conn: &DatabaseConnection, sql: &str) -> i64 {
    let row = conn
        .query_one_raw(sea_orm::Statement::from_string(
            sea_orm::DatabaseBackend::Postgres,
            sql,
        ))
        .await
        .unwrap()
        .unwrap();
    row.try_get::<i64>("", "n").unwrap()
}

#[tokio::test]
async fn notifications_arriving_together_pay_their_orders_in_one_transaction() {
    let s = setup().await;
    let mut started = Vec::new();
    for i in 0..25 {
        started.push(awaiting(&s, &format!("u{i}")).await);
    }
    let notices = started
        .iter()
        .map(|(o, p)| notice(*o, p, PaymentEventType::Succeeded))
        .collect();
    let answers = s.payments.notify_many(notices).await;
    for ((order, _), a) in started.iter().zip(&answers) {
        let a = a.as_ref().unwrap();
        assert_eq!(a.order_id, *order);
        assert!(!a.duplicate);
    }
    let paid = "SELECT COUNT(*) AS n FROM orders WHERE status = 'PAID' AND payment_id IS NOT NULL";
    assert_eq!(count(&s.conn, paid).await, 25);
    assert_eq!(
        count(
            &s.conn,
            "SELECT COUNT(DISTINCT xmin::text) AS n FROM orders WHERE status = 'PAID'"
        )
        .await,
        1,
        "one transaction paid them all"
    );
    assert_eq!(
        count(&s.conn, "SELECT COUNT(*) AS n FROM provider_payments WHERE status = 'SUCCEEDED' AND confirmed_at IS NOT NULL").await,
        25
    );
    assert_eq!(
        count(&s.conn, "SELECT COUNT(*) AS n FROM order_status_history WHERE to_status = 'PAID' AND reason = 'payment.succeeded'").await,
        25
    );
    let events = flashsale_test_support::probe::outbox(&s.conn, Some("order.paid"))
        .await
        .unwrap();
    assert_eq!(events.len(), 25, "one order.paid per order");
    for (order, payment) in &started {
        let ev = events
            .iter()
            .find_map(|e| match &e.payload {
                Some(Payload::OrderPaid(p)) if p.order_id == order.to_string() => Some(p),
                _ => None,
            })
            .unwrap();
        assert_eq!(&ev.payment_id, payment);
        assert_eq!(ev.amount_cents, 100);
    }
    // The same notifications again (the provider retries): duplicates, nothing more.
    let again = started
        .iter()
        .map(|(o, p)| notice(*o, p, PaymentEventType::Succeeded))
        .collect();
    let answers = s.payments.notify_many(again).await;
    assert!(
        answers
            .iter()
            .all(|a| a.as_ref().is_ok_and(|a| a.duplicate)),
        "{answers:?}"
    );
    let events = flashsale_test_support::probe::outbox(&s.conn, Some("order.paid"))
        .await
        .unwrap();
    assert_eq!(events.len(), 25);
}

#[tokio::test]
async fn a_notification_batch_with_unusual_ones_answers_each_as_alone() {
    let s = setup().await;
    let (a, pa) = awaiting(&s, "a").await;
    let (b, pb) = awaiting(&s, "b").await;
    let (c, pc) = awaiting(&s, "c").await;
    let (d, pd) = awaiting(&s, "d").await;
    // Paid before: its notification again is a duplicate.
    assert!(
        !s.payments
            .notify(&notice(c, &pc, PaymentEventType::Succeeded))
            .await
            .unwrap()
            .duplicate
    );
    let mut forged = notice(d, &pd, PaymentEventType::Succeeded);
    forged.signature = "0".repeat(64);
    let unknown = notice(a, "pay_never_started", PaymentEventType::Succeeded);
    let answers = s
        .payments
        .notify_many(vec![
            notice(a, &pa, PaymentEventType::Succeeded),
            notice(c, &pc, PaymentEventType::Succeeded),
            forged,
            unknown,
            notice(b, &pb, PaymentEventType::AttemptFailed),
        ])
        .await;
    assert!(
        answers[0]
            .as_ref()
            .is_ok_and(|x| !x.duplicate && x.order_id == a),
        "{answers:?}"
    );
    assert!(
        answers[1].as_ref().is_ok_and(|x| x.duplicate),
        "{answers:?}"
    );
    assert!(
        matches!(answers[2], Err(OrderError::Unauthenticated(_))),
        "{answers:?}"
    );
    assert!(
        matches!(answers[3], Err(OrderError::UnknownPayment(_))),
        "{answers:?}"
    );
    assert!(
        answers[4].as_ref().is_ok_and(|x| !x.duplicate),
        "{answers:?}"
    );
    let status = |id: Uuid| {
        format!("SELECT COUNT(*) AS n FROM orders WHERE order_id = '{id}' AND status = 'PAID'")
    };
    assert_eq!(count(&s.conn, &status(a)).await, 1);
    assert_eq!(
        count(&s.conn, &status(b)).await,
        0,
        "an attempt that failed pays nothing"
    );
    assert_eq!(
        count(&s.conn, &status(d)).await,
        0,
        "a forged notification pays nothing"
    );
    assert_eq!(
        count(
            &s.conn,
            "SELECT COUNT(*) AS n FROM outbox WHERE message_type = 'order.paid'"
        )
        .await,
        2
    );
}

fn completed(order: Uuid) -> Completed {
    let env: Envelope = envelope::new(
        Payload::OutboundCompleted(OutboundCompleted {
            order_id: order.to_string(),
            shipment_id: Uuid::new_v4().to_string(),
            sku: "SKU".into(),
            quantity: 1,
        }),
        order.to_string(),
        "",
        "outbound",
    );
    Completed {
        consumer: CONSUMER.into(),
        env,
        order_id: order.to_string(),
        trace: Default::default(),
        attempt: 1,
    }
}

#[tokio::test]
async fn completed_shipments_arriving_together_ship_their_orders_in_one_transaction() {
    let s = setup().await;
    let mut orders = Vec::new();
    for i in 0..20 {
        let (o, p) = awaiting(&s, &format!("u{i}")).await;
        s.payments
            .notify(&notice(o, &p, PaymentEventType::Succeeded))
            .await
            .unwrap();
        orders.push(o);
    }
    let items: Vec<Completed> = orders.iter().map(|o| completed(*o)).collect();
    let answers = s.saga.ship_completed(items.clone()).await;
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    assert_eq!(
        count(
            &s.conn,
            "SELECT COUNT(*) AS n FROM orders WHERE status = 'SHIPPED'"
        )
        .await,
        20
    );
    assert_eq!(
        count(
            &s.conn,
            "SELECT COUNT(DISTINCT xmin::text) AS n FROM orders WHERE status = 'SHIPPED'"
        )
        .await,
        1,
        "one transaction shipped them all"
    );
    assert_eq!(
        count(&s.conn, "SELECT COUNT(*) AS n FROM order_status_history WHERE to_status = 'SHIPPED' AND reason = 'outbound.completed'").await,
        20
    );
    // Delivered again: claimed already, nothing changes.
    let again = s.saga.ship_completed(items).await;
    assert!(again.iter().all(Result::is_ok), "{again:?}");
    assert_eq!(
        count(
            &s.conn,
            "SELECT COUNT(*) AS n FROM order_status_history WHERE to_status = 'SHIPPED'"
        )
        .await,
        20
    );
}

#[tokio::test]
async fn a_completion_batch_with_an_unusual_one_answers_each_as_alone() {
    let s = setup().await;
    let (paid, p) = awaiting(&s, "a").await;
    s.payments
        .notify(&notice(paid, &p, PaymentEventType::Succeeded))
        .await
        .unwrap();
    // Still awaiting payment: a completion for it changes nothing (but is consumed).
    let (unpaid, _) = awaiting(&s, "b").await;
    let answers = s
        .saga
        .ship_completed(vec![
            completed(paid),
            completed(unpaid),
            completed(Uuid::new_v4()),
        ])
        .await;
    assert!(answers[0].is_ok() && answers[1].is_ok(), "{answers:?}");
    assert!(
        matches!(answers[2], Err(OrderError::Invalid(_))),
        "{answers:?}"
    );
    assert_eq!(
        count(
            &s.conn,
            &format!(
                "SELECT COUNT(*) AS n FROM orders WHERE order_id = '{paid}' AND status = 'SHIPPED'"
            )
        )
        .await,
        1
    );
    assert_eq!(
        count(&s.conn, &format!("SELECT COUNT(*) AS n FROM orders WHERE order_id = '{unpaid}' AND status = 'AWAITING_PAYMENT'")).await,
        1
    );
}
