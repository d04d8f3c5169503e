//! PayOrder calls arriving together: one read of their orders, the provider asked once per
//! order to start, one statement recording every payment — and each call answered as it would
//! be alone (a replay, another buyer's order, a wrong amount, an order not yet payable). An
//! order past its deadline sends the batch one by one, and is cancelled.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use flashsale_order::{
    app::{Checkout, PayCall, Saga, write_pending},
    config::SagaSettings,
    domain::{
        NewPayment, OrderError, PaymentAtProvider, PaymentProvider, PlaceOrder, Policy,
        ProviderError, ProviderPayment, RefundCall, StartPayment, Status,
    },
};
use flashsale_platform::auth::{Caller, Role};
use sea_orm::{ConnectionTrait as _, DatabaseConnection};
use uuid::Uuid;

use crate::helpers::{confirmed_order, migrated_orders_db};

/// A provider that creates one payment per order and counts its calls per order.
#[derive(Default)]
struct CountingProvider {
    calls: Mutex<HashMap<Uuid, u32>>,
}

#[async_trait::async_trait]
impl PaymentProvider for CountingProvider {
    async fn create_payment(&self, p: &NewPayment) -> Result<ProviderPayment, ProviderError> {
        *self.calls.lock().unwrap().entry(p.order_id).or_default() += 1;
        Ok(ProviderPayment {
            provider_payment_id: format!("pay_{}", p.order_id.simple()),
            checkout_url: format!("http://sim/checkout/{}", p.order_id.simple()),
            amount_cents: p.amount_cents,
            currency: p.currency.clone(),
        })
    }

    async fn refund(&self, _: &RefundCall) -> Result<(), ProviderError> {
        Err(ProviderError::Refused("not in this test".into()))
    }

    async fn payment(&self, _: &str) -> Result<PaymentAtProvider, ProviderError> {
        Err(ProviderError::Refused("not in this test".into()))
    }
}

fn call(user: &str, order_id: Uuid, amount_cents: i64) -> PayCall {
    PayCall {
        caller: Caller {
            subject: user.to_owned(),
            role: Role::User,
        },
        pay: StartPayment {
            order_id,
            amount_cents,
        },
        trace: Default::default(),
    }
}

async fn count(conn: &DatabaseConnection, sql: &str) -> i64 {
    flashsale_test_support::probe::count(conn, sql)
        .await
        .unwrap()
}

#[tokio::test]
async fn pay_orders_arriving_together_are_started_in_one_batch_and_each_answered_as_alone() {
    let (_db, conn) = migrated_orders_db().await;
    let amqp = flashsale_messaging::AmqpConfig::default();
    let saga = Saga::new(
        conn.clone(),
        flashsale_order::api::amqp::payment_timeout_queue(&amqp, Duration::from_secs(900)),
        &SagaSettings::default(),
    );
    let provider = Arc::new(CountingProvider::default());
    let checkout = Checkout::new(conn.clone(), provider.clone(), "EUR", "http://order/notify");
    let mut orders = Vec::new();
    for i in 0..20 {
        orders.push(confirmed_order(&conn, &saga, &format!("u{i}")).await);
    }
    let pending = PlaceOrder::new("late", "k", "SKU", 1, 10).unwrap();
    write_pending(&conn, &pending, 100, Policy::ReserveThenCommit)
        .await
        .unwrap();

    let mut calls: Vec<PayCall> = orders
        .iter()
        .enumerate()
        .map(|(i, o)| call(&format!("u{i}"), *o, 0))
        .collect();
    calls.push(call("u1", orders[0], 0)); // another buyer's order
    calls.push(call("u2", orders[2], 999)); // the wrong amount
    calls.push(call("late", pending.order_id(), 0)); // not confirmed yet
    let answers = checkout.start_payments(calls).await;
    assert_eq!(answers.len(), 23);
    for (i, a) in answers.iter().take(20).enumerate() {
        let started = a.as_ref().unwrap();
        assert_eq!(started.order.order_id, orders[i]);
        assert!(!started.replayed);
        assert_eq!(
            started.payment.provider_payment_id,
            format!("pay_{}", orders[i].simple())
        );
    }
    assert!(
        matches!(answers[20], Err(OrderError::NotFound(_))),
        "{:?}",
        answers[20]
    );
    assert!(
        matches!(answers[21], Err(OrderError::WrongAmount(100))),
        "{:?}",
        answers[21]
    );
    assert!(
        matches!(answers[22], Err(OrderError::NotPayable(Status::Pending))),
        "{:?}",
        answers[22]
    );
    // The provider was asked once per order started, and the payments were recorded together.
    let asked = provider.calls.lock().unwrap().clone();
    assert_eq!(asked.len(), 20);
    assert!(asked.values().all(|n| *n == 1), "{asked:?}");
    assert_eq!(
        count(&conn, "SELECT count(*) AS n FROM provider_payments").await,
        20
    );
    assert_eq!(
        count(
            &conn,
            "SELECT count(DISTINCT xmin::text) AS n FROM provider_payments"
        )
        .await,
        1,
        "one statement recorded them all"
    );

    // Again: every call a replay, the provider not asked again.
    let again: Vec<PayCall> = orders
        .iter()
        .enumerate()
        .map(|(i, o)| call(&format!("u{i}"), *o, 0))
        .collect();
    for a in checkout.start_payments(again).await {
        assert!(a.unwrap().replayed);
    }
    assert!(provider.calls.lock().unwrap().values().all(|n| *n == 1));

    // An order past its deadline in a batch: cancelled under its lock, the others started.
    let overdue = confirmed_order(&conn, &saga, "slow").await;
    let fresh = confirmed_order(&conn, &saga, "quick").await;
    conn.execute_unprepared(&format!(
        "UPDATE orders SET payment_deadline = now() - interval '1 second' WHERE order_id = '{overdue}'"
    ))
    .await
    .unwrap();
    let answers = checkout
        .start_payments(vec![call("slow", overdue, 0), call("quick", fresh, 0)])
        .await;
    assert!(
        matches!(answers[0], Err(OrderError::NotPayable(Status::Cancelled))),
        "{:?}",
        answers[0]
    );
    assert_eq!(answers[1].as_ref().unwrap().order.order_id, fresh);
    assert_eq!(
        count(
            &conn,
            &format!(
                "SELECT count(*) AS n FROM orders WHERE order_id = '{overdue}' \
                 AND status = 'CANCELLED' AND cancel_reason = 'PAYMENT_TIMEOUT'"
            )
        )
        .await,
        1
    );
}
