//! `stock.reserved` applied in batches: one transaction for the common case, and a batch with
//! anything unusual in it handled one by one with the same results as single deliveries.

use std::time::Duration;

use flashsale_messaging::envelope;
use flashsale_order::{
    app::{Reserved, Saga, write_pending},
    config::SagaSettings,
    domain::{OrderError, PlaceOrder, Policy},
};
use flashsale_proto::events::v1::{Envelope, StockReserved, envelope::Payload};
use flashsale_test_support::TestDatabase;
use sea_orm::{ConnectionTrait as _, DatabaseConnection};
use sea_orm_migration::MigratorTrait as _;
use uuid::Uuid;

const CONSUMER: &str = "order.saga-events";

async fn setup() -> (TestDatabase, DatabaseConnection, Saga) {
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
    (db, conn, saga)
}

async fn pending(conn: &DatabaseConnection, user: &str) -> Uuid {
    let p = PlaceOrder::new(user, "k", "SKU", 1, 10).unwrap();
    write_pending(conn, &p, 100, Policy::ReserveThenCommit)
        .await
        .unwrap();
    p.order_id()
}

fn reserved(order: Uuid) -> Envelope {
    envelope::new(
        Payload::StockReserved(StockReserved {
            order_id: order.to_string(),
            sku: "SKU".into(),
            quantity: 1,
            deduction_policy: 1,
        }),
        order.to_string(),
        "",
        "product-stock",
    )
}

fn item(env: &Envelope) -> Reserved {
    let Some(Payload::StockReserved(ev)) = &env.payload else {
        panic!("not stock.reserved")
    };
    Reserved {
        consumer: CONSUMER.into(),
        env: env.clone(),
        order_id: ev.order_id.clone(),
        trace: Default::default(),
        attempt: 1,
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
async fn a_batch_of_reserved_orders_awaits_payment_in_one_transaction() {
    let (_db, conn, saga) = setup().await;
    let mut envs = Vec::new();
    for i in 0..30 {
        envs.push(reserved(pending(&conn, &format!("u{i}")).await));
    }
    let answers = saga.confirm_reserved(envs.iter().map(item).collect()).await;
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    assert_eq!(
        count(&conn, "SELECT COUNT(DISTINCT xmin::text) AS n FROM orders WHERE status = 'AWAITING_PAYMENT' AND payment_deadline IS NOT NULL").await,
        1,
        "one transaction moved them all"
    );
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) AS n FROM orders WHERE status = 'AWAITING_PAYMENT'"
        )
        .await,
        30
    );
    assert_eq!(
        count(&conn, "SELECT COUNT(*) AS n FROM order_status_history WHERE to_status = 'AWAITING_PAYMENT' AND reason = 'stock.reserved'").await,
        30
    );
    assert_eq!(
        count(&conn, "SELECT COUNT(*) AS n FROM outbox WHERE message_type = 'order.payment_timeout' AND exchange = '' AND routing_key LIKE '%payment_timeout%'").await,
        1,
        "one payment timer for the batch, through the delay queue"
    );
    let timers = flashsale_test_support::probe::outbox(&conn, Some("order.payment_timeout"))
        .await
        .unwrap();
    let Some(Payload::PaymentTimeout(timer)) = &timers[0].payload else {
        panic!("not a payment timeout: {:?}", timers[0]);
    };
    let mut named: Vec<String> = std::iter::once(timer.order_id.clone())
        .chain(timer.more_order_ids.iter().cloned())
        .collect();
    named.sort();
    let mut want: Vec<String> = envs.iter().map(|e| e.correlation_id.clone()).collect();
    want.sort();
    assert_eq!(named, want, "the timer names every order of the batch once");
    // The same batch delivered again: no second effect.
    let again = saga.confirm_reserved(envs.iter().map(item).collect()).await;
    assert!(again.iter().all(Result::is_ok));
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) AS n FROM outbox WHERE message_type = 'order.payment_timeout'"
        )
        .await,
        1
    );
}

#[tokio::test]
async fn a_batch_with_unusual_deliveries_gives_each_its_own_answer() {
    let (_db, conn, saga) = setup().await;
    let a = reserved(pending(&conn, "a").await);
    let b = reserved(pending(&conn, "b").await);
    // Confirmed before under another message id (product-stock published it twice).
    let twice = pending(&conn, "c").await;
    assert!(saga.confirm_reserved(vec![item(&reserved(twice))]).await[0].is_ok());
    let again = reserved(twice);
    // An order this service never wrote: an invalid event.
    let unknown = reserved(Uuid::new_v4());
    let answers = saga
        .confirm_reserved(vec![item(&a), item(&again), item(&unknown), item(&b)])
        .await;
    assert!(
        answers[0].is_ok() && answers[1].is_ok() && answers[3].is_ok(),
        "{answers:?}"
    );
    assert!(
        matches!(answers[2], Err(OrderError::Invalid(_))),
        "{:?}",
        answers[2]
    );
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) AS n FROM orders WHERE status = 'AWAITING_PAYMENT'"
        )
        .await,
        3
    );
    assert_eq!(
        count(
            &conn,
            "SELECT COUNT(*) AS n FROM outbox WHERE message_type = 'order.payment_timeout'"
        )
        .await,
        3,
        "no second timer for the order confirmed twice"
    );
}
