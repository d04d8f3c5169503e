//! CreateOrder: accepted and queued, refused with the gate's reason and nothing written,
//! idempotent per user on request_id (also under concurrency), bad input.

use flashsale_proto::order::v1::{CreateOrderRequest, OrderStatus};
use tonic::Code;

use crate::helpers::{as_admin, as_user, create_req, reason, spawn_app, spawn_stack};

#[tokio::test]
async fn an_accepted_order_is_queued_then_awaits_payment_priced_from_the_catalog() {
    let app = spawn_stack(|_| {}).await;
    app.product("WINE", 10, 2).await;
    let o = app.order("alice", "k1", "WINE", 2).await.unwrap();
    assert_eq!(o.status, OrderStatus::Pending as i32);
    assert_eq!((o.unit_price_cents, o.total_cents), (2500, 5000));
    let o = app
        .wait_status("alice", &o.order_id, OrderStatus::AwaitingPayment)
        .await;
    assert!(o.payment_deadline.is_some());
    let p = app.get_product("WINE").await;
    assert_eq!((p.reserved, p.gate_available), (2, 8));
    assert_eq!(app.outbox_of("order.created").await.len(), 1);
}

#[tokio::test]
async fn refusals_carry_the_gate_reason_and_write_nothing() {
    let app = spawn_stack(|_| {}).await;
    app.product("ONE", 2, 1).await;
    app.order("alice", "a", "ONE", 1).await.unwrap();
    let limit = app.order("alice", "b", "ONE", 1).await.unwrap_err();
    assert_eq!(
        (limit.code(), reason(&limit).as_str()),
        (Code::FailedPrecondition, "USER_LIMIT_EXCEEDED")
    );
    app.order("bob", "c", "ONE", 1).await.unwrap();
    let sold = app.order("carol", "d", "ONE", 1).await.unwrap_err();
    assert_eq!(reason(&sold), "SOLD_OUT");
    let cached = app.order("dave", "e", "ONE", 1).await.unwrap_err();
    assert_eq!(
        reason(&cached),
        "SOLD_OUT",
        "the sold-out cache answers the same"
    );
    let missing = app.order("bob", "e", "NOPE", 1).await.unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    assert_eq!(app.count("SELECT COUNT(*) AS n FROM orders").await, 2);
    assert_eq!(app.outbox_of("order.created").await.len(), 2);
}

#[tokio::test]
async fn the_same_key_and_payload_returns_the_same_order_and_another_payload_is_refused() {
    let app = spawn_stack(|_| {}).await;
    app.product("IDEM", 10, 0).await;
    let mut c = app.client().await;
    let first = c
        .create_order(as_user("alice", create_req("k", "IDEM", 1)))
        .await
        .unwrap()
        .into_inner();
    let again = c
        .create_order(as_user("alice", create_req("k", "IDEM", 1)))
        .await
        .unwrap()
        .into_inner();
    assert!(!first.replayed && again.replayed);
    assert_eq!(first.order.unwrap().order_id, again.order.unwrap().order_id);
    let other = c
        .create_order(as_user("alice", create_req("k", "IDEM", 3)))
        .await
        .unwrap_err();
    assert_eq!(
        (other.code(), reason(&other).as_str()),
        (Code::FailedPrecondition, "IDEMPOTENCY_KEY_REUSED")
    );
    let bob = c
        .create_order(as_user("bob", create_req("k", "IDEM", 1)))
        .await
        .unwrap()
        .into_inner();
    assert!(!bob.replayed, "keys are per user");
    assert_eq!(app.count("SELECT COUNT(*) AS n FROM orders").await, 2);
    // The refused payload's hold is given back: only the two orders hold units.
    flashsale_test_support::eventually(
        std::time::Duration::from_secs(20),
        "hold released",
        || async { (app.get_product("IDEM").await.gate_available == 8).then_some(()) },
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn twenty_concurrent_requests_with_one_key_make_one_order() {
    let app = spawn_stack(|_| {}).await;
    app.product("RACE", 100, 0).await;
    let client = app.client().await;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..20 {
        let mut c = client.clone();
        tasks.spawn(async move {
            c.create_order(as_user("alice", create_req("same", "RACE", 2)))
                .await
        });
    }
    let mut ids = std::collections::BTreeSet::new();
    while let Some(r) = tasks.join_next().await {
        ids.insert(r.unwrap().unwrap().into_inner().order.unwrap().order_id);
    }
    assert_eq!(ids.len(), 1);
    assert_eq!(app.count("SELECT COUNT(*) AS n FROM orders").await, 1);
    assert_eq!(
        app.get_product("RACE").await.gate_available,
        98,
        "units taken once"
    );
}

#[tokio::test]
async fn bad_create_input_is_invalid_argument_and_changes_nothing() {
    let app = spawn_app().await;
    let mut c = app.client().await;
    let max = app.settings.saga.max_quantity;
    for (req, field) in [
        (create_req("", "S", 1), "request_id"),
        (create_req(&"k".repeat(65), "S", 1), "request_id"),
        (create_req("k", "", 1), "sku"),
        (create_req("k", "no sku", 1), "sku"),
        (create_req("k", "S", 0), "quantity"),
        (create_req("k", "S", -1), "quantity"),
        (create_req("k", "S", max + 1), "quantity"),
    ] {
        let err = c.create_order(as_user("alice", req)).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{field}");
        assert!(
            flashsale_platform::error::violated_fields(&err).contains(&field.to_owned()),
            "{field}"
        );
    }
    let err = c
        .create_order(as_admin(CreateOrderRequest::default()))
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        Code::PermissionDenied,
        "only buyers place orders"
    );
    let down = c
        .create_order(as_user("alice", create_req("k", "S", 1)))
        .await
        .unwrap_err();
    assert_eq!(
        down.code(),
        Code::Unavailable,
        "product-stock is not running here"
    );
    assert_eq!(app.count("SELECT COUNT(*) AS n FROM orders").await, 0);
}

#[tokio::test]
async fn a_hold_whose_order_cannot_be_written_is_released_at_once() {
    let app = spawn_stack(|_| {}).await;
    app.product("LOST", 3, 0).await;
    app.failpoints.arm_n(
        "order.create.before_write",
        flashsale_platform::failpoint::Action::Error,
        Some(1),
    );
    let err = app.order("alice", "k", "LOST", 2).await.unwrap_err();
    assert_eq!(err.code(), Code::Internal);
    assert_eq!(app.count("SELECT COUNT(*) AS n FROM orders").await, 0);
    flashsale_test_support::eventually(
        std::time::Duration::from_secs(20),
        "hold released",
        || async { (app.get_product("LOST").await.gate_available == 3).then_some(()) },
    )
    .await
    .unwrap();
    // The released order stays refused (its key must be retried with a new request id).
    let again = app.order("alice", "k", "LOST", 2).await.unwrap_err();
    assert_eq!(reason(&again), "ORDER_CANCELLED");
    assert!(app.order("alice", "k2", "LOST", 2).await.is_ok());
}

#[tokio::test]
async fn a_replay_after_the_sell_out_still_returns_its_order() {
    let app = spawn_stack(|s| s.saga.sold_out_cache_ms = 60_000).await;
    app.product("LAST", 1, 0).await;
    let mut c = app.client().await;
    let first = c
        .create_order(as_user("alice", create_req("k", "LAST", 1)))
        .await
        .unwrap()
        .into_inner();
    let sold = c
        .create_order(as_user("bob", create_req("k", "LAST", 1)))
        .await
        .unwrap_err();
    assert_eq!(reason(&sold), "SOLD_OUT");
    // The sold-out cache now answers for LAST; alice's retry must still get her order.
    let again = c
        .create_order(as_user("alice", create_req("k", "LAST", 1)))
        .await
        .unwrap()
        .into_inner();
    assert!(again.replayed);
    assert_eq!(again.order.unwrap().order_id, first.order.unwrap().order_id);
    let carol = c
        .create_order(as_user("carol", create_req("k", "LAST", 1)))
        .await
        .unwrap_err();
    assert_eq!(reason(&carol), "SOLD_OUT");
}

/// A write of `q` units of SKU at 100 cents for `user` under request id `key`.
fn pending_write(user: &str, key: &str, q: i64) -> flashsale_order::app::PendingWrite {
    flashsale_order::app::PendingWrite {
        place: flashsale_order::domain::PlaceOrder::new(user, key, "SKU", q, 10).unwrap(),
        unit_price_cents: 100,
        policy: flashsale_order::domain::Policy::ReserveThenCommit,
        accepted_at: None,
    }
}

#[tokio::test]
async fn one_batch_write_tells_new_repeated_and_reused_keys_apart() {
    use flashsale_order::{app::write_pending_batch, infra::db::Inserted};
    use sea_orm::FromQueryResult as _;
    let (_db, conn) = super::helpers::migrated_orders_db().await;
    let w = pending_write;
    let batch = vec![
        w("a", "k", 1),
        w("a", "k", 1),
        w("a", "k", 2),
        w("b", "k", 1),
    ];
    let got = write_pending_batch(&conn, batch).await.unwrap();
    let kinds: Vec<&str> = got
        .iter()
        .map(|w| match w.inserted {
            Inserted::New => "new",
            Inserted::SameOrder => "same",
            Inserted::KeyTaken => "taken",
            Inserted::Unknown => "unknown",
        })
        .collect();
    assert_eq!(kinds, ["new", "same", "taken", "new"]);
    let again = write_pending_batch(&conn, vec![w("b", "k", 1)])
        .await
        .unwrap();
    assert!(matches!(again[0].inserted, Inserted::SameOrder));
    #[derive(sea_orm::FromQueryResult)]
    struct N {
        n: i64,
    }
    let count = |sql: &'static str| {
        let conn = conn.clone();
        async move {
            N::find_by_statement(sea_orm::Statement::from_string(
                sea_orm::DatabaseBackend::Postgres,
                sql,
            ))
            .one(&conn)
            .await
            .unwrap()
            .unwrap()
            .n
        }
    };
    assert_eq!(count("SELECT COUNT(*) AS n FROM orders").await, 2);
    assert_eq!(
        count("SELECT COUNT(*) AS n FROM outbox").await,
        2,
        "one order.created per new order"
    );
    assert_eq!(
        count("SELECT COUNT(*) AS n FROM order_status_history").await,
        2
    );
}

#[tokio::test]
async fn a_replay_whose_write_cannot_be_read_back_is_unavailable_and_releases_nothing() {
    let app = spawn_stack(|_| {}).await;
    app.product("KEEP", 3, 0).await;
    let first = app.order("alice", "k", "KEEP", 1).await.unwrap();
    // The retry's batch finds the order written already, and reading it back fails.
    app.failpoints.arm_n(
        flashsale_order::app::FP_AFTER_BATCH_WRITE,
        flashsale_platform::failpoint::Action::Error,
        Some(1),
    );
    let err = app.order("alice", "k", "KEEP", 1).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(err.message().contains("retry"), "{err:?}");
    // Nothing released: no cancellation queued, the order stands, and the retry gets it.
    assert!(app.outbox_of("order.cancelled").await.is_empty());
    let again = app.order("alice", "k", "KEEP", 1).await.unwrap();
    assert_eq!(again.order_id, first.order_id);
    app.wait_status(
        "alice",
        &first.order_id,
        flashsale_proto::order::v1::OrderStatus::AwaitingPayment,
    )
    .await;
    assert_eq!(app.get_product("KEEP").await.gate_available, 2);
}

#[tokio::test]
async fn a_batch_whose_read_back_fails_still_answers_its_new_orders() {
    use flashsale_order::{
        app::{FP_AFTER_BATCH_WRITE, write_pending_batch, write_pending_batch_with},
        infra::db::Inserted,
    };
    let (_db, conn) = super::helpers::migrated_orders_db().await;
    let w = pending_write;
    write_pending_batch(&conn, vec![w("a", "k", 1)])
        .await
        .unwrap();
    let failpoints = flashsale_platform::failpoint::Failpoints::default();
    failpoints.arm(
        FP_AFTER_BATCH_WRITE,
        flashsale_platform::failpoint::Action::Error,
    );
    let got = write_pending_batch_with(
        &conn,
        vec![w("a", "k", 1), w("b", "k", 1), w("a", "k", 2)],
        &failpoints,
    )
    .await
    .unwrap();
    let kinds: Vec<&str> = got
        .iter()
        .map(|w| match w.inserted {
            Inserted::New => "new",
            Inserted::SameOrder => "same",
            Inserted::KeyTaken => "taken",
            Inserted::Unknown => "unknown",
        })
        .collect();
    assert_eq!(kinds, ["unknown", "new", "unknown"]);
    assert!(got[1].order.is_some());
    // Without the failpoint the same batch tells them apart.
    failpoints.disarm(FP_AFTER_BATCH_WRITE);
    let again = write_pending_batch(&conn, vec![w("a", "k", 1), w("a", "k", 2)])
        .await
        .unwrap();
    assert!(matches!(again[0].inserted, Inserted::SameOrder));
    assert!(matches!(again[1].inserted, Inserted::KeyTaken));
}
