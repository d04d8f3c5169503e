//! Two replicas' refund workers over one database send each refund to the provider once, even
//! when the provider answers as slowly as the call timeout allows: a claim covers the one call
//! made under it.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use flashsale_order::{
    app::Refunds,
    config::PaymentSettings,
    domain::{
        NewPayment, PaymentAtProvider, PaymentProvider, ProviderError, ProviderPayment, RefundCall,
    },
};
use flashsale_platform::shutdown::Shutdown;
use sea_orm::{ConnectionTrait as _, DatabaseConnection, DbBackend, Statement};
use uuid::Uuid;

use crate::helpers::migrated_orders_db;

/// A provider that takes `delay` over every refund and counts the calls per refund id.
struct SlowProvider {
    delay: Duration,
    calls: Mutex<HashMap<String, u32>>,
    in_flight: AtomicUsize,
}

#[async_trait::async_trait]
impl PaymentProvider for SlowProvider {
    async fn create_payment(&self, _: &NewPayment) -> Result<ProviderPayment, ProviderError> {
        Err(ProviderError::Refused("not in this test".into()))
    }

    async fn refund(&self, r: &RefundCall) -> Result<(), ProviderError> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        *self
            .calls
            .lock()
            .unwrap()
            .entry(r.refund_id.clone())
            .or_default() += 1;
        tokio::time::sleep(self.delay).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }

    async fn payment(&self, _: &str) -> Result<PaymentAtProvider, ProviderError> {
        Err(ProviderError::Refused("not in this test".into()))
    }
}

/// A cancelled order with a REQUESTED refund, due now.
async fn requested_refund(db: &DatabaseConnection) -> Uuid {
    let id = Uuid::new_v4();
    for sql in [
        "INSERT INTO orders (order_id, user_id, request_id, sku, quantity, unit_price_cents, \
         total_cents, deduction_policy, status, cancel_reason) \
         VALUES ($1, 'alice', $1::text, 'REFUND-1', 1, 100, 100, 'RESERVE_THEN_COMMIT', \
                 'CANCELLED', 'PAYMENT_TIMEOUT')",
        "INSERT INTO refunds (order_id, payment_id, amount_cents, reason, currency, status) \
         VALUES ($1, 'pay_' || $1::text, 100, 'PAYMENT_TIMEOUT', 'EUR', 'REQUESTED')",
    ] {
        db.execute_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            sql,
            [id.into()],
        ))
        .await
        .unwrap();
    }
    id
}

async fn count(db: &DatabaseConnection, sql: &str) -> i64 {
    let row = db
        .query_one_raw(Statement::from_string(DbBackend::Postgres, sql))
        .await
        .unwrap()
        .unwrap();
    row.try_get("", "n").unwrap()
}

#[tokio::test]
async fn two_replicas_ask_a_slow_provider_once_per_refund() {
    const REFUNDS: usize = 32;
    let (_db, conn) = migrated_orders_db().await;
    let mut ids = Vec::new();
    for _ in 0..REFUNDS {
        ids.push(requested_refund(&conn).await);
    }
    let settings = PaymentSettings {
        call_timeout_ms: 1_000,
        refund_sweep_interval_ms: 50,
        ..PaymentSettings::default()
    };
    // Every call takes nearly the whole call timeout.
    let provider = Arc::new(SlowProvider {
        delay: Duration::from_millis(900),
        calls: Mutex::default(),
        in_flight: AtomicUsize::new(0),
    });
    let stops: Vec<Shutdown> = (0..2).map(|_| Shutdown::new()).collect();
    for stop in &stops {
        let replica = Refunds::new(conn.clone(), provider.clone(), &settings);
        tokio::spawn(replica.run(stop.clone()));
    }
    flashsale_test_support::eventually(Duration::from_secs(60), "every refund paid", || async {
        let left = count(
            &conn,
            "SELECT COUNT(*) AS n FROM refunds WHERE status <> 'SUCCEEDED'",
        )
        .await;
        (left == 0).then_some(())
    })
    .await
    .unwrap();
    // Calls a second replica started meanwhile end too.
    flashsale_test_support::eventually(Duration::from_secs(30), "no call in flight", || async {
        (provider.in_flight.load(Ordering::SeqCst) == 0).then_some(())
    })
    .await
    .unwrap();
    for stop in &stops {
        stop.trigger();
    }
    let calls = provider.calls.lock().unwrap().clone();
    let total: u32 = calls.values().sum();
    let most = calls.values().copied().max().unwrap_or(0);
    eprintln!(
        "provider refund calls: {total} for {REFUNDS} refunds (at most {most} for one refund)"
    );
    for id in &ids {
        assert_eq!(
            calls.get(&id.to_string()).copied(),
            Some(1),
            "refund {id} was sent {:?} times",
            calls.get(&id.to_string())
        );
    }
}
