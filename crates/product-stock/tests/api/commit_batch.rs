//! `CommitReservation` in batches: the commits waiting at the same moment share one
//! transaction, and a batch holding anything unusual answers each call as it would alone.

use flashsale_product_stock::{app::StockSaga, domain::StockError};
use flashsale_proto::product::v1::{CommitReservationRequest, DeductionPolicy, ReservationState};
use uuid::Uuid;

use crate::{
    helpers::{TestApp, service, spawn_app},
    saga::cancelled,
    saga_batch::{held, item, stock_saga},
};

const RTC: DeductionPolicy = DeductionPolicy::ReserveThenCommit;

/// Persists `n` new orders of `q` units of `sku` (reservations RESERVED) and returns their ids.
async fn reserved(
    app: &TestApp,
    svc: &StockSaga,
    prefix: &str,
    sku: &str,
    n: usize,
    q: i64,
) -> Vec<Uuid> {
    let mut envs = Vec::new();
    for i in 0..n {
        envs.push(held(app, &format!("{prefix}{i}"), sku, q).await);
    }
    let answers = svc.persist_created(envs.iter().map(item).collect()).await;
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    envs.iter()
        .map(|e| e.correlation_id.parse().unwrap())
        .collect()
}

#[tokio::test]
async fn the_commits_of_a_batch_share_one_transaction_and_a_replay_changes_nothing() {
    let app = spawn_app().await;
    app.create("K1", 100, 0, RTC).await;
    app.create("K2", 50, 0, RTC).await;
    let svc = stock_saga(&app);
    let mut ids = reserved(&app, &svc, "u", "K1", 30, 2).await;
    ids.extend(reserved(&app, &svc, "v", "K2", 10, 1).await);

    let answers = svc.commit_reservations(ids.clone()).await;
    for (id, a) in ids.iter().zip(&answers) {
        let (r, replayed) = a.as_ref().unwrap();
        assert_eq!(r.order_id, *id, "answers in the order of the calls");
        assert!(!replayed);
        assert_eq!(
            r.state,
            flashsale_product_stock::domain::ReservationState::Committed
        );
    }
    assert_eq!(
        app.count(
            "SELECT COUNT(DISTINCT xmin::text) AS n FROM reservations WHERE state = 'COMMITTED'"
        )
        .await,
        1,
        "one transaction"
    );
    let stock = |sku: &str, col: &str| format!("SELECT {col} AS n FROM stock WHERE sku = '{sku}'");
    assert_eq!(app.count(&stock("K1", "on_hand")).await, 40);
    assert_eq!(app.count(&stock("K1", "reserved")).await, 0);
    assert_eq!(app.count(&stock("K2", "on_hand")).await, 40);
    assert_eq!(app.count(&stock("K2", "reserved")).await, 0);
    assert_eq!(
        app.count(
            "SELECT COUNT(*) AS n FROM stock_ledger WHERE kind = 'COMMIT' \
             AND on_hand_delta = reserved_delta AND on_hand_delta < 0"
        )
        .await,
        40
    );
    assert_eq!(app.outbox_of("stock.committed").await.len(), 40);

    // The same batch again (outbound retrying): every answer a replay, nothing moves.
    let again = svc.commit_reservations(ids.clone()).await;
    assert!(
        again.iter().all(|a| matches!(a, Ok((_, true)))),
        "{again:?}"
    );
    assert_eq!(app.count(&stock("K1", "on_hand")).await, 40);
    assert_eq!(app.count(&stock("K2", "on_hand")).await, 40);
    assert_eq!(app.outbox_of("stock.committed").await.len(), 40);
}

#[tokio::test]
async fn a_batch_with_unknown_released_or_repeated_orders_answers_each_as_it_would_alone() {
    let app = spawn_app().await;
    app.create("K3", 20, 0, RTC).await;
    let svc = stock_saga(&app);
    let ids = reserved(&app, &svc, "w", "K3", 4, 1).await;
    let (a, b, released, before) = (ids[0], ids[1], ids[2], ids[3]);
    assert!(matches!(
        svc.commit_reservation(before).await,
        Ok((_, false))
    ));
    let cancel = flashsale_messaging::envelope::new(
        cancelled(released, "w2", "K3", 1),
        released.to_string(),
        "",
        "order",
    );
    let Some(flashsale_proto::events::v1::envelope::Payload::OrderCancelled(ev)) = &cancel.payload
    else {
        panic!("not order.cancelled")
    };
    svc.on_order_cancelled("product-stock.order-events", &cancel, ev)
        .await
        .unwrap();
    let unknown = Uuid::new_v4();

    let batch = vec![a, released, unknown, before, b, a];
    let answers = svc.commit_reservations(batch).await;
    assert!(
        matches!(answers[1], Err(StockError::ReservationReleased(id)) if id == released),
        "{answers:?}"
    );
    assert!(
        matches!(answers[2], Err(StockError::UnknownReservation(id)) if id == unknown),
        "{answers:?}"
    );
    assert!(
        matches!(answers[3], Ok((_, true))),
        "committed before: a replay"
    );
    assert!(matches!(answers[4], Ok((_, false))));
    let a_replays: Vec<bool> = [&answers[0], &answers[5]]
        .iter()
        .map(|x| match x {
            Ok((_, replayed)) => *replayed,
            Err(e) => panic!("{e}"),
        })
        .collect();
    assert_eq!(
        a_replays.iter().filter(|r| **r).count(),
        1,
        "the order asked twice is committed once: {a_replays:?}"
    );
    // a, b and the one committed before left the stock; the released unit came back.
    assert_eq!(
        app.count("SELECT on_hand AS n FROM stock WHERE sku = 'K3'")
            .await,
        17
    );
    assert_eq!(
        app.count("SELECT reserved AS n FROM stock WHERE sku = 'K3'")
            .await,
        0
    );
    assert_eq!(app.outbox_of("stock.committed").await.len(), 3);
}

#[tokio::test]
async fn concurrent_commit_calls_share_transactions_and_deduct_each_unit_once() {
    let app = spawn_app().await;
    app.create("K4", 200, 0, RTC).await;
    let svc = stock_saga(&app);
    let ids = reserved(&app, &svc, "x", "K4", 64, 1).await;
    let client = app.client().await;
    let calls = ids.iter().map(|id| {
        let mut c = client.clone();
        let req = CommitReservationRequest {
            order_id: id.to_string(),
        };
        async move { c.commit_reservation(service(req)).await }
    });
    let answers = futures_util::future::join_all(calls).await;
    for (id, a) in ids.iter().zip(answers) {
        let a = a.unwrap().into_inner();
        assert_eq!(a.order_id, id.to_string());
        assert_eq!(a.state, ReservationState::Committed as i32);
        assert!(!a.replayed);
    }
    assert_eq!(
        app.count("SELECT on_hand AS n FROM stock WHERE sku = 'K4'")
            .await,
        136
    );
    assert_eq!(
        app.count("SELECT reserved AS n FROM stock WHERE sku = 'K4'")
            .await,
        0
    );
    assert_eq!(app.outbox_of("stock.committed").await.len(), 64);
    let transactions = app
        .count("SELECT COUNT(DISTINCT xmin::text) AS n FROM reservations WHERE state = 'COMMITTED'")
        .await;
    assert!(
        transactions < 32,
        "64 concurrent commits took {transactions} transactions"
    );
}
