//! The order-change notifications WatchOrder is fed from: one per statement, carrying every
//! changed order's id.

use std::{collections::HashMap, time::Duration};

use flashsale_order::{
    app::{PendingWrite, write_pending_batch},
    domain::{PlaceOrder, Policy},
    infra::changes::ORDER_CHANGES_CHANNEL,
};
use flashsale_test_support::TestDatabase;
use sea_orm_migration::MigratorTrait as _;
use uuid::Uuid;

/// Notifications received until `want` ids were seen or 20 s passed: (payloads, ids seen).
async fn collect(
    listener: &mut sqlx::postgres::PgListener,
    want: usize,
) -> (usize, HashMap<Uuid, usize>) {
    let mut seen: HashMap<Uuid, usize> = HashMap::new();
    let mut payloads = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while seen.values().sum::<usize>() < want {
        let Ok(n) = tokio::time::timeout_at(deadline, listener.recv()).await else {
            break;
        };
        let n = n.unwrap();
        payloads += 1;
        assert!(n.payload().len() < 8_000, "payload too long for NOTIFY");
        for id in n.payload().split(',') {
            *seen.entry(id.parse().unwrap()).or_default() += 1;
        }
    }
    (payloads, seen)
}

#[tokio::test]
async fn a_statement_changing_many_orders_notifies_every_id_once_in_few_payloads() {
    let db = TestDatabase::create().await.unwrap();
    let conn = db.connect().await.unwrap();
    flashsale_order::migration::Migrator::up(&conn, None)
        .await
        .unwrap();
    let mut listener =
        sqlx::postgres::PgListener::connect_with(conn.get_postgres_connection_pool())
            .await
            .unwrap();
    listener.listen(ORDER_CHANGES_CHANNEL).await.unwrap();

    let writes: Vec<PendingWrite> = (0..450)
        .map(|i| PendingWrite {
            place: PlaceOrder::new(&format!("u{i}"), "k", "SKU", 1, 10).unwrap(),
            unit_price_cents: 100,
            policy: Policy::ReserveThenCommit,
            accepted_at: None,
        })
        .collect();
    let ids: Vec<Uuid> = writes.iter().map(|w| w.place.order_id()).collect();
    write_pending_batch(&conn, writes).await.unwrap();
    let (payloads, seen) = collect(&mut listener, ids.len()).await;
    assert_eq!(seen.len(), ids.len(), "every inserted order is announced");
    assert!(ids.iter().all(|id| seen.get(id) == Some(&1)));
    assert_eq!(payloads, 3, "450 ids in chunks of at most 200");

    // One UPDATE of all of them: one more round of notifications, again every id once.
    sea_orm::ConnectionTrait::execute_unprepared(
        &conn,
        "UPDATE orders SET updated_at = now() WHERE sku = 'SKU'",
    )
    .await
    .unwrap();
    let (payloads, seen) = collect(&mut listener, ids.len()).await;
    assert_eq!(seen.len(), ids.len());
    assert!(ids.iter().all(|id| seen.get(id) == Some(&1)));
    assert_eq!(payloads, 3);
}
