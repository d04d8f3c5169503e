//! Admission control: past the bound on orders waiting for the saga, or on paid orders waiting
//! to ship, CreateOrder refuses a new buyer with RESOURCE_EXHAUSTED `OVERLOADED` and a retry
//! delay, before the gate (nothing is taken or written); the buyer is let in again once the
//! backlog drains.

use std::time::{Duration, Instant};

use flashsale_order::{
    app::Admission,
    config::AdmissionSettings,
    domain::{OrderError, PlaceOrder, Policy},
};
use flashsale_proto::order::v1::OrderStatus;
use flashsale_test_support::unique_name;
use tonic::Code;
use tonic_types::StatusExt as _;

use crate::helpers::{reason, spawn_stack_with};

/// The retry delay a RESOURCE_EXHAUSTED carries.
fn retry_after(status: &tonic::Status) -> Duration {
    status
        .get_details_retry_info()
        .and_then(|r| r.retry_delay)
        .unwrap_or_else(|| panic!("no RetryInfo in {status:?}"))
}

#[tokio::test]
async fn past_its_bound_of_unconfirmed_orders_a_new_buyer_is_refused_before_the_gate_until_the_backlog_drains()
 {
    // product-stock listens on another exchange: the orders stay PENDING.
    let app = spawn_stack_with(
        |s| {
            s.admission.max_unconfirmed = 3;
            s.admission.check_interval_ms = 20;
            s.admission.retry_after_ms = 50;
        },
        |st| st.amqp.exchange = unique_name("fs_test_ex_elsewhere"),
    )
    .await;
    app.product("ADM", 10, 0).await;
    let mut accepted = Vec::new();
    for i in 0..3 {
        let o = app.order(&format!("u{i}"), "r", "ADM", 1).await.unwrap();
        assert_eq!(o.status, OrderStatus::Pending as i32);
        accepted.push(o);
    }

    // Three orders wait for the saga: the fourth buyer is refused at once, with a delay.
    let refused = app.order("late", "r", "ADM", 1).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert_eq!(reason(&refused), "OVERLOADED");
    assert_eq!(retry_after(&refused), Duration::from_millis(50));
    assert!(
        refused.message().contains("waiting to be confirmed"),
        "{refused:?}"
    );
    // Nothing was taken or written for the refused buyer.
    let gate = app.stock_gate();
    let snap = gate.snapshot("ADM").await.unwrap().unwrap();
    assert_eq!((snap.available, snap.held), (7, 3));
    assert_eq!(
        app.count("SELECT count(*) AS n FROM orders WHERE user_id = 'late'")
            .await,
        0
    );

    // One order confirmed: the backlog is under its bound again at the next count, and the
    // buyer who retries after the delay it was given is let in.
    app.exec(&format!(
        "UPDATE orders SET status = 'AWAITING_PAYMENT' WHERE order_id = '{}'",
        accepted[0].order_id
    ))
    .await;
    let give_up = Instant::now() + Duration::from_secs(10);
    let order = loop {
        match app.order("late", "r", "ADM", 1).await {
            Ok(o) => break o,
            Err(s) => {
                assert_eq!(reason(&s), "OVERLOADED", "{s:?}");
                assert!(Instant::now() < give_up, "still refused: {s:?}");
                tokio::time::sleep(retry_after(&s)).await;
            }
        }
    };
    assert_eq!(order.status, OrderStatus::Pending as i32);
    let snap = gate.snapshot("ADM").await.unwrap().unwrap();
    assert_eq!((snap.available, snap.held), (6, 4));
    // Full again.
    let again = app.order("later", "r", "ADM", 1).await.unwrap_err();
    assert_eq!(reason(&again), "OVERLOADED", "{again:?}");
}

#[tokio::test]
async fn each_backlog_is_counted_in_the_database_and_refuses_at_its_own_bound() {
    let (_db, conn) = crate::helpers::migrated_orders_db().await;
    let write = |user: &str| {
        let conn = conn.clone();
        let place = PlaceOrder::new(user, "r", "ADM", 1, 10).unwrap();
        async move {
            flashsale_order::app::write_pending(&conn, &place, 100, Policy::ReserveThenCommit)
                .await
                .unwrap();
        }
    };
    for u in ["a", "b", "c"] {
        write(u).await;
    }
    let exec = |sql: &'static str| {
        let conn = conn.clone();
        async move {
            use sea_orm::ConnectionTrait as _;
            conn.execute_unprepared(sql).await.unwrap();
        }
    };
    exec("UPDATE orders SET status = 'PAID' WHERE user_id IN ('a', 'b')").await;
    let admission = |unconfirmed: u64, unshipped: u64| {
        Admission::new(
            conn.clone(),
            &AdmissionSettings {
                max_unconfirmed: unconfirmed,
                max_unshipped: unshipped,
                ..AdmissionSettings::default()
            },
        )
    };
    let overloaded = |r: Result<(), OrderError>| match r {
        Err(OrderError::Overloaded { message, .. }) => message,
        other => panic!("expected OVERLOADED, got {other:?}"),
    };

    // 1 PENDING, 2 PAID.
    let a = admission(2, 2);
    a.admit().unwrap();
    a.count().await.unwrap();
    let m = overloaded(a.admit());
    assert!(m.contains("2 paid orders waiting to ship"), "{m}");
    let a = admission(1, 3);
    a.count().await.unwrap();
    let m = overloaded(a.admit());
    assert!(m.contains("1 orders waiting to be confirmed"), "{m}");
    let a = admission(2, 0);
    a.count().await.unwrap();
    a.admit().unwrap();
    // An order being written counts before any count sees it, and after its write until the
    // next count does.
    let writing = a.granted(uuid::Uuid::new_v4());
    overloaded(a.admit());
    drop(writing);
    overloaded(a.admit());
    exec("UPDATE orders SET status = 'SHIPPED' WHERE status = 'PENDING'").await;
    a.count().await.unwrap();
    a.admit().unwrap();

    // An order a count sees written while its write is still ending counts once, in the
    // count, and not again in the tally when its write ends.
    let place = PlaceOrder::new("g", "r", "ADM", 1, 10).unwrap();
    let writing = a.granted(place.order_id());
    flashsale_order::app::write_pending(&conn, &place, 100, Policy::ReserveThenCommit)
        .await
        .unwrap();
    a.count().await.unwrap();
    drop(writing);
    a.admit().unwrap();
    // A write that ended unseen counts until a count sees it, then once.
    let place = PlaceOrder::new("h", "r", "ADM", 1, 10).unwrap();
    let writing = a.granted(place.order_id());
    flashsale_order::app::write_pending(&conn, &place, 100, Policy::ReserveThenCommit)
        .await
        .unwrap();
    drop(writing);
    overloaded(a.admit());
    a.count().await.unwrap();
    overloaded(a.admit());
    exec("UPDATE orders SET status = 'SHIPPED' WHERE status = 'PENDING'").await;
    a.count().await.unwrap();
    a.admit().unwrap();
    // A write that never happened counts only until the next count.
    drop(a.granted(uuid::Uuid::new_v4()));
    drop(a.granted(uuid::Uuid::new_v4()));
    overloaded(a.admit());
    a.count().await.unwrap();
    a.admit().unwrap();

    // A count under way still counts the orders written before it: while it waits on a lock,
    // the bound holds with the previous count and the tally.
    let a = admission(2, 0);
    a.count().await.unwrap();
    write("d").await;
    write("e").await;
    drop(a.granted(uuid::Uuid::new_v4()));
    drop(a.granted(uuid::Uuid::new_v4()));
    overloaded(a.admit());
    {
        use sea_orm::{ConnectionTrait as _, TransactionTrait as _};
        let lock = conn.begin().await.unwrap();
        lock.execute_unprepared("LOCK TABLE orders IN ACCESS EXCLUSIVE MODE")
            .await
            .unwrap();
        let counting = tokio::spawn({
            let a = a.clone();
            async move { a.count().await }
        });
        let waiting = "SELECT count(*) AS n FROM pg_stat_activity \
                       WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%FROM orders WHERE status%'";
        flashsale_test_support::eventually(Duration::from_secs(10), "the count to wait", || {
            let conn = conn.clone();
            async move {
                (flashsale_test_support::probe::count(&conn, waiting)
                    .await
                    .ok()?
                    > 0)
                .then_some(())
            }
        })
        .await
        .unwrap();
        overloaded(a.admit());
        lock.rollback().await.unwrap();
        counting.await.unwrap().unwrap();
    }
    overloaded(a.admit());
    exec("UPDATE orders SET status = 'SHIPPED' WHERE status = 'PENDING'").await;
    a.count().await.unwrap();
    a.admit().unwrap();
    // No bound, no refusal.
    let a = admission(0, 0);
    a.count().await.unwrap();
    assert!(!a.bounded());
    a.admit().unwrap();
}
