//! An order write the database fails for a passing reason (here a cancelled statement) keeps
//! the gate's hold: the caller is told to retry, and the retry with the same request id writes
//! the order under that very hold. No `order.cancelled` gives the units away under it.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use flashsale_proto::{
    order::v1::{CancelReason, OrderStatus},
    product::v1::ReconcileStockRequest,
};
use flashsale_test_support::eventually;
use sea_orm::{ConnectionTrait as _, FromQueryResult, Statement, TransactionTrait as _};
use tonic::Code;

use crate::helpers::{TestApp, as_admin, as_user, create_req, reason, spawn_stack};

const SETTLE: Duration = Duration::from_secs(20);

#[derive(FromQueryResult)]
struct Pid {
    pid: i32,
}

const BLOCKED_INSERTS: &str = "SELECT pid FROM pg_stat_activity \
    WHERE datname = current_database() AND pid <> pg_backend_pid() \
      AND wait_event_type = 'Lock' AND query LIKE '%INSERT INTO orders%'";

/// The backends of the order service's `INSERT INTO orders` waiting for a lock now.
async fn blocked_inserts(app: &TestApp) -> Vec<i32> {
    let find = Statement::from_string(sea_orm::DbBackend::Postgres, BLOCKED_INSERTS);
    Pid::find_by_statement(find)
        .all(&app.conn)
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.pid)
        .collect()
}

/// Cancels the statement a backend is running, as an operator's `pg_cancel_backend`.
async fn cancel(app: &TestApp, pid: i32) {
    let cancelled = app
        .conn
        .execute_raw(Statement::from_sql_and_values(
            sea_orm::DbBackend::Postgres,
            "SELECT pg_cancel_backend($1)",
            [pid.into()],
        ))
        .await;
    assert!(cancelled.is_ok(), "{cancelled:?}");
}

/// The backend of the order service's `INSERT INTO orders` once it waits for a lock.
async fn blocked_insert(app: &TestApp) -> i32 {
    eventually(
        SETTLE,
        "the order insert waiting for the table lock",
        || async { blocked_inserts(app).await.first().copied() },
    )
    .await
    .unwrap()
}

/// What the race left behind once the saga settled.
#[derive(Debug, PartialEq)]
struct Outcome {
    /// The first CreateOrder's answer: `Ok` or the code and reason.
    first: Result<(), (Code, String)>,
    /// The retry's answer, as `first`, with whether it was the same order.
    retry: Result<(), (Code, String)>,
    /// Orders in the database, and the status of the one order (if any).
    orders: i64,
    status: Option<(OrderStatus, CancelReason)>,
    /// product-stock's database: units reserved and available; its gate's available counter.
    reserved: i64,
    available: i64,
    gate_available: i64,
    /// ReconcileStock (report only) on the product.
    drift: i64,
    /// `order.cancelled` events queued by the order service.
    cancels: usize,
}

fn answer<T>(r: &Result<T, tonic::Status>) -> Result<(), (Code, String)> {
    match r {
        Ok(_) => Ok(()),
        Err(s) => Err((s.code(), reason(s))),
    }
}

/// The order's status once it left PENDING (or the order is not there), and the gate then
/// agrees with the database; what stands at the deadline otherwise.
async fn settle(app: &TestApp, order_id: &str) -> Outcome {
    let read = || async {
        let orders = app.count("SELECT COUNT(*) AS n FROM orders").await;
        let status = if orders > 0 && !order_id.is_empty() {
            let o = app.get("alice", order_id).await;
            OrderStatus::try_from(o.status)
                .ok()
                .zip(CancelReason::try_from(o.cancel_reason).ok())
        } else {
            None
        };
        let p = app.get_product("HOLD").await;
        let report = app
            .stock()
            .await
            .reconcile_stock(as_admin(ReconcileStockRequest {
                skus: vec!["HOLD".into()],
                repair: false,
            }))
            .await
            .unwrap()
            .into_inner()
            .reports;
        Outcome {
            first: Ok(()),
            retry: Ok(()),
            orders,
            status,
            reserved: p.reserved,
            available: p.available,
            gate_available: p.gate_available,
            drift: report[0].drift,
            cancels: app.outbox_of("order.cancelled").await.len(),
        }
    };
    let settled = eventually(SETTLE, "the saga to settle", || async {
        let o = read().await;
        let moved_on = !matches!(o.status, Some((OrderStatus::Pending, _)));
        (moved_on && o.gate_available == o.available && o.drift == 0).then_some(o)
    })
    .await;
    match settled {
        Ok(o) => o,
        Err(_) => read().await,
    }
}

/// Steps: the orders table locked in SHARE mode by another session, CreateOrder(R) blocked on
/// it, the blocked insert cancelled (`pg_cancel_backend`, SQLSTATE 57014), the lock released
/// and R retried at once.
#[tokio::test]
async fn a_cancelled_order_insert_keeps_the_hold_and_the_retry_writes_the_order() {
    let app = spawn_stack(|_| {}).await;
    app.product("HOLD", 5, 0).await;

    let locker = app.db.connect().await.unwrap();
    let lock = locker.begin().await.unwrap();
    lock.execute_unprepared("LOCK TABLE orders IN SHARE MODE")
        .await
        .unwrap();
    let mut client = app.client().await;
    let first = tokio::spawn(async move {
        client
            .create_order(as_user("alice", create_req("r", "HOLD", 2)))
            .await
    });
    cancel(&app, blocked_insert(&app).await).await;
    let first = first.await.unwrap();
    lock.rollback().await.unwrap();
    let retry = app.order("alice", "r", "HOLD", 2).await;
    let order_id = match &retry {
        Ok(o) => o.order_id.clone(),
        Err(_) => String::new(),
    };

    let mut outcome = settle(&app, &order_id).await;
    outcome.first = answer(&first);
    outcome.retry = answer(&retry);
    // The cancelled statement wrote nothing: the buyer is told to retry and the hold waits for
    // that retry, which writes the order under it. The gate and the database then agree (two
    // units reserved for the one order, three left) and nothing released the order's units.
    let expected = Outcome {
        first: Err((Code::Unavailable, "DATABASE_UNAVAILABLE".into())),
        retry: Ok(()),
        orders: 1,
        status: Some((OrderStatus::AwaitingPayment, CancelReason::Unspecified)),
        reserved: 2,
        available: 3,
        gate_available: 3,
        drift: 0,
        cancels: 0,
    };
    assert_eq!(outcome, expected);
}

/// The same with a batch: while the first order's insert waits for the lock, five more buyers'
/// orders queue up and are written as one batch, which is cancelled too, then each order on its
/// own, cancelled too. Every hold is kept, and every retry writes its order.
#[tokio::test]
async fn a_cancelled_batch_of_orders_keeps_every_hold_and_each_retry_writes_its_order() {
    const BUYERS: usize = 6;
    let app = spawn_stack(|_| {}).await;
    app.product("BATCH", 10, 0).await;

    let locker = app.db.connect().await.unwrap();
    let lock = locker.begin().await.unwrap();
    lock.execute_unprepared("LOCK TABLE orders IN SHARE MODE")
        .await
        .unwrap();
    let answered = Arc::new(AtomicUsize::new(0));
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..BUYERS {
        let (mut client, answered) = (app.client().await, answered.clone());
        calls.spawn(async move {
            let user = format!("u{i}");
            let answer = client
                .create_order(as_user(&user, create_req("r", "BATCH", 1)))
                .await;
            answered.fetch_add(1, Ordering::SeqCst);
            (user, answer)
        });
    }
    // Every buyer holds a unit at the gate (the first one's insert waits for the lock, the others
    // wait behind it for the next batch) before any statement is cancelled.
    eventually(SETTLE, "every buyer's hold", || async {
        (app.get_product("BATCH").await.gate_available == 4).then_some(())
    })
    .await
    .unwrap();
    let first = blocked_insert(&app).await;
    cancel(&app, first).await;
    // Then the batch's insert, then each order's own, as they come to wait for the lock.
    eventually(SETTLE, "every buyer's answer", || async {
        for pid in blocked_inserts(&app).await {
            cancel(&app, pid).await;
        }
        (answered.load(Ordering::SeqCst) == BUYERS).then_some(())
    })
    .await
    .unwrap();
    let mut answers = Vec::new();
    while let Some(joined) = calls.join_next().await {
        answers.push(joined.unwrap());
    }
    lock.rollback().await.unwrap();

    assert_eq!(answers.len(), BUYERS);
    for (user, answer) in &answers {
        assert_eq!(
            answer
                .as_ref()
                .map(|_| ())
                .map_err(|s| (s.code(), reason(s))),
            Err((Code::Unavailable, "DATABASE_UNAVAILABLE".to_owned())),
            "{user}"
        );
    }
    let (_, metrics) = flashsale_test_support::grpc::http_get(app.metrics_port, "/metrics")
        .await
        .unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with(flashsale_order::app::WRITE_FALLBACKS) && !l.ends_with(" 0")),
        "no write batch fell back to one order at a time"
    );
    assert!(app.outbox_of("order.cancelled").await.is_empty());

    for (user, _) in &answers {
        let order = app
            .order(user, "r", "BATCH", 1)
            .await
            .unwrap_or_else(|e| panic!("{user}'s retry: {e:?}"));
        app.wait_status(user, &order.order_id, OrderStatus::AwaitingPayment)
            .await;
    }
    let p = eventually(SETTLE, "the gate to match the database", || async {
        let p = app.get_product("BATCH").await;
        (p.reserved == 6).then_some(p)
    })
    .await
    .unwrap();
    assert_eq!((p.reserved, p.available, p.gate_available), (6, 4, 4));
    assert!(app.outbox_of("order.cancelled").await.is_empty());
}
