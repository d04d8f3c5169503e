//! An order write the database fails for a passing reason (here a cancelled statement) keeps
//! the gate's hold: the caller is told to retry, and the retry with the same request id writes
//! the order under that very hold. No `order.cancelled` gives the units away under it.
//!
//! An order write never outlives its caller's deadline (nor `saga.intake_write_deadline_ms`):
//! one not begun by then is dropped, one under way is cancelled, both keeping the hold. So once
//! LookupOrders told product-stock's hold sweeper an order is missing, it stays missing.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use flashsale_order::domain::PlaceOrder;
use flashsale_platform::auth::Role;
use flashsale_proto::{
    order::v1::{CancelReason, LookupOrdersRequest, OrderStatus},
    product::v1::ReconcileStockRequest,
};
use flashsale_test_support::{
    eventually,
    grpc::{token, with_token},
};
use sea_orm::{ConnectionTrait as _, FromQueryResult, Statement, TransactionTrait as _};
use tonic::Code;

use crate::helpers::{
    TestApp, as_admin, as_user, create_req, reason, spawn_stack, spawn_stack_with,
};

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

/// A LookupOrders as product-stock's hold sweeper asks it: whether the order exists.
async fn looked_up(app: &TestApp, order_id: &str) -> bool {
    let req = LookupOrdersRequest {
        order_ids: vec![order_id.to_owned()],
    };
    let found = app
        .client()
        .await
        .lookup_orders(with_token(req, &token("product-stock", Role::Service)))
        .await
        .unwrap()
        .into_inner()
        .orders;
    found.iter().any(|o| o.order_id == order_id)
}

/// `flashsale_order_writes_expired_total` by stage: (`queued`, `running`).
async fn writes_expired(app: &TestApp) -> (u64, u64) {
    let (_, metrics) = flashsale_test_support::grpc::http_get(app.metrics_port, "/metrics")
        .await
        .unwrap();
    let stage = |stage: &str| {
        let prefix = format!(
            "{}{{stage=\"{stage}\"}} ",
            flashsale_order::app::WRITES_EXPIRED
        );
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    (stage("queued"), stage("running"))
}

const RUNNING_INSERTS: &str = "SELECT COUNT(*) AS n FROM pg_stat_activity \
    WHERE datname = current_database() AND pid <> pg_backend_pid() \
      AND state <> 'idle' AND query LIKE '%INSERT INTO orders%'";

/// What a write outliving its buyer's deadline left behind.
#[derive(Debug, PartialEq)]
struct LateWrite {
    /// Whether the first CreateOrder (its buyer gave up at its deadline) was acknowledged.
    first_acknowledged: bool,
    /// Once the hold sweeper gave the hold away: whether LookupOrders found the order, and
    /// whether the order's insert was still waiting for the lock then.
    found_when_swept: bool,
    insert_waiting_when_swept: bool,
    /// Once the lock is released and no insert runs any more: orders in the database, and
    /// whether LookupOrders finds the order now.
    orders_after_release: i64,
    found_after_release: bool,
    /// Writes dropped at their deadline: (never begun, cancelled under way).
    writes_expired: (u64, u64),
    /// The retry, the order's status, the stock and the events once the saga settled.
    settled: Outcome,
}

/// Steps: the orders table locked in SHARE mode by another session, CreateOrder(R) with a one
/// second deadline blocks on its insert and its buyer gives up; product-stock's hold sweeper
/// (a two second hold TTL) asks LookupOrders, is told the order is missing and gives the hold
/// away; the lock is released, R is retried. Whatever the order service told the sweeper must
/// stay true: the order is never written after that, and no retry is acknowledged with an
/// order the tombstone then cancels.
#[tokio::test]
async fn a_write_whose_buyer_gave_up_never_lands_after_the_sweeper_found_its_order_missing() {
    const BUYER_DEADLINE: Duration = Duration::from_secs(1);
    let app = spawn_stack_with(
        |_| {},
        |s| {
            s.stock.hold_ttl_ms = 2_000;
            s.stock.sweep_interval_ms = 100;
        },
    )
    .await;
    app.product("HOLD", 5, 0).await;
    let order_id = PlaceOrder::new("alice", "r", "HOLD", 2, 100)
        .unwrap()
        .order_id()
        .to_string();

    let locker = app.db.connect().await.unwrap();
    let lock = locker.begin().await.unwrap();
    lock.execute_unprepared("LOCK TABLE orders IN SHARE MODE")
        .await
        .unwrap();
    let mut client = app.client().await;
    let mut req = as_user("alice", create_req("r", "HOLD", 2));
    req.set_timeout(BUYER_DEADLINE);
    let first = tokio::spawn(async move { client.create_order(req).await });
    let insert = blocked_insert(&app).await;
    let first = first.await.unwrap();
    eprintln!("first answer: {:?}", answer(&first));

    let swept = format!(
        "SELECT COUNT(*) AS n FROM reservations \
         WHERE order_id = '{order_id}' AND cause = 'HOLD_EXPIRED'"
    );
    eventually(SETTLE, "the sweeper to give the hold away", || async {
        (app.stock_count(&swept).await == 1).then_some(())
    })
    .await
    .unwrap();
    let found_when_swept = looked_up(&app, &order_id).await;
    let insert_waiting_when_swept = blocked_inserts(&app).await.contains(&insert);

    lock.rollback().await.unwrap();
    app.wait_count(RUNNING_INSERTS, 0).await;
    let orders_after_release = app.count("SELECT COUNT(*) AS n FROM orders").await;
    let found_after_release = looked_up(&app, &order_id).await;
    let writes_expired = writes_expired(&app).await;

    let retry = app.order("alice", "r", "HOLD", 2).await;
    let mut settled = settle(&app, &order_id).await;
    // Whether the server's timer or the cancelled insert answers first is a race: both mean
    // the buyer gave up unanswered.
    settled.first = answer(&first).map_err(|_| (Code::Unknown, "gave up".to_owned()));
    settled.retry = answer(&retry);
    let outcome = LateWrite {
        first_acknowledged: first.is_ok(),
        found_when_swept,
        insert_waiting_when_swept,
        orders_after_release,
        found_after_release,
        writes_expired,
        settled,
    };
    eprintln!("{outcome:#?}");
    // The write died with its buyer's deadline, before the sweeper asked: the order service
    // said "missing" and it stays missing. The retry is told the order was cancelled (the
    // tombstone), nobody was told of an order, and every unit is back.
    let expected = LateWrite {
        first_acknowledged: false,
        found_when_swept: false,
        insert_waiting_when_swept: false,
        orders_after_release: 0,
        found_after_release: false,
        writes_expired: (0, 1),
        settled: Outcome {
            first: Err((Code::Unknown, "gave up".into())),
            retry: Err((Code::FailedPrecondition, "ORDER_CANCELLED".into())),
            orders: 0,
            status: None,
            reserved: 0,
            available: 5,
            gate_available: 5,
            drift: 0,
            cancels: 0,
        },
    };
    assert_eq!(outcome, expected);
}

/// Steps: the orders table locked in SHARE mode, alice's CreateOrder blocks on its insert (the
/// one write batch in flight), bob's CreateOrder with a one second deadline queues behind it
/// and his buyer gives up; the lock is released, alice's order is written, and bob's write,
/// past its deadline when its batch begins, is dropped unwritten with his hold kept. Bob's
/// retry writes his order under that hold.
#[tokio::test]
async fn a_write_queued_past_its_buyers_deadline_is_never_begun_and_the_retry_writes_it() {
    let app = spawn_stack(|_| {}).await;
    app.product("HOLD", 5, 0).await;
    let bob_order = PlaceOrder::new("bob", "r", "HOLD", 1, 100)
        .unwrap()
        .order_id()
        .to_string();

    let locker = app.db.connect().await.unwrap();
    let lock = locker.begin().await.unwrap();
    lock.execute_unprepared("LOCK TABLE orders IN SHARE MODE")
        .await
        .unwrap();
    let mut client = app.client().await;
    let alice = tokio::spawn(async move {
        client
            .create_order(as_user("alice", create_req("r", "HOLD", 2)))
            .await
    });
    blocked_insert(&app).await;
    let mut req = as_user("bob", create_req("r", "HOLD", 1));
    req.set_timeout(Duration::from_secs(1));
    let bob = app.client().await.create_order(req).await;
    assert!(bob.is_err(), "bob's CreateOrder was answered: {bob:?}");
    assert_eq!(
        app.get_product("HOLD").await.gate_available,
        2,
        "both holds taken"
    );

    lock.rollback().await.unwrap();
    let alice = alice.await.unwrap();
    assert!(alice.is_ok(), "{alice:?}");
    // Bob's write is settled once it was dropped or written.
    let (expired, written) = eventually(SETTLE, "bob's write to be settled", || async {
        let (n, written) = (
            writes_expired(&app).await,
            looked_up(&app, &bob_order).await,
        );
        (n != (0, 0) || written).then_some((n, written))
    })
    .await
    .unwrap();
    assert_eq!(
        (expired, written),
        ((1, 0), false),
        "dropped before it began"
    );
    assert_eq!(app.count("SELECT COUNT(*) AS n FROM orders").await, 1);
    assert!(app.outbox_of("order.cancelled").await.is_empty());

    // Bob's hold was kept: his retry writes his order under it.
    let retry = app.order("bob", "r", "HOLD", 1).await.unwrap();
    assert_eq!(retry.order_id, bob_order);
    app.wait_status("bob", &bob_order, OrderStatus::AwaitingPayment)
        .await;
    let p = eventually(SETTLE, "the gate to match the database", || async {
        let p = app.get_product("HOLD").await;
        (p.reserved == 3).then_some(p)
    })
    .await
    .unwrap();
    assert_eq!((p.reserved, p.available, p.gate_available), (3, 2, 2));
    assert!(app.outbox_of("order.cancelled").await.is_empty());
}
