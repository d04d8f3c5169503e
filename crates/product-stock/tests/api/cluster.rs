//! The service on a Redis Cluster (`redis.mode = "cluster"`), through a master failover that
//! loses the last holds it acknowledged. A private cluster per test; it fails, never skips,
//! without `redis-server`.

use std::time::Duration;

use flashsale_platform::{redis::key_slot, settings::RedisSettings};
use flashsale_product_stock::infra::gate::product_tag;
use flashsale_proto::product::v1::DeductionPolicy;
use flashsale_test_support::{TestDatabase, redis_cluster::RedisCluster};
use uuid::Uuid;

use crate::{
    helpers::{FakeStatus, TestApp, service, spawn_with, test_settings},
    reserve::reserve_req,
};

const SKU: &str = "CLUSTER-1";
const STOCK: i64 = 50;

async fn reserve_one(app: &TestApp, user: &str) -> (Uuid, i64) {
    let order = Uuid::new_v4();
    let reply = app
        .client()
        .await
        .reserve_stock(service(reserve_req(order, user, SKU, 1)))
        .await
        .unwrap()
        .into_inner();
    // The order service has it from now on (acknowledged, not yet in product-stock's database).
    app.orders.put(SKU, order, user, 1, FakeStatus::Pending);
    (order, reply.gate_available)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_cluster_a_failover_that_lost_acknowledged_holds_rebuilds_the_gate_with_them() {
    let mut cluster = RedisCluster::start().await.unwrap();
    let db = TestDatabase::create().await.unwrap();
    let mut settings = test_settings(&db);
    settings.redis = RedisSettings {
        key_prefix: settings.redis.key_prefix.clone(),
        ..RedisSettings::cluster(cluster.urls())
    };
    let app = spawn_with(settings, db).await;
    app.create(SKU, STOCK, 0, DeductionPolicy::ReserveThenCommit)
        .await;

    let mut orders = Vec::new();
    for i in 0..10 {
        let (order, available) = reserve_one(&app, &format!("before-{i}")).await;
        assert_eq!(available, STOCK - 1 - i);
        orders.push(order);
    }
    let victim = cluster
        .master_of(key_slot(product_tag(SKU).as_bytes()))
        .await
        .unwrap();
    // The replica gets nothing more: the next holds live on the master alone.
    cluster.cut_replication(victim).await.unwrap();
    let mut lost = Vec::new();
    for i in 0..5 {
        let (order, available) = reserve_one(&app, &format!("lost-{i}")).await;
        assert_eq!(available, STOCK - 11 - i);
        lost.push(order);
    }
    cluster.kill_master(victim).await.unwrap();

    // The promoted replica has another run id: the service's periodic check drops the gates it
    // serves (the holds it lost with them)...
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        // An error (the cluster still failing over) means: not yet.
        if let Ok(None) = app.gate.snapshot(SKU).await {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the gate on the promoted master was not dropped"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // ...and the next reservation rebuilds it from the database and the order service: every
    // acknowledged order holds its unit again, the lost ones included.
    let (_, available) = reserve_one(&app, "after").await;
    assert_eq!(available, STOCK - 16);
    let snap = app.gate.snapshot(SKU).await.unwrap().unwrap();
    assert_eq!((snap.available, snap.held), (STOCK - 16, 16));
    let pool = flashsale_platform::redis::pool(&app.settings.redis).unwrap();
    for order in orders.iter().chain(&lost) {
        let key = app.gate.keys(SKU).unwrap().order(*order);
        let mut conn = pool.get().await.unwrap();
        let state: Option<String> = deadpool_redis::redis::cmd("HGET")
            .arg(key)
            .arg("s")
            .query_async(&mut *conn)
            .await
            .unwrap();
        assert_eq!(state.as_deref(), Some("H"), "{order}");
    }
}
