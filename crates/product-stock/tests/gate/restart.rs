//! A Redis that came back with data from an earlier life (a stale snapshot): a new connection
//! finds another run id recorded and drops every product's gate. The shared Redis cannot be
//! restarted here, so "an earlier life" is a different run id written into `gate_run`.

use std::time::Duration;

use deadpool_redis::redis;
use flashsale_platform::settings::RedisSettings;
use flashsale_product_stock::infra::gate::{RedisGate, ReserveOutcome, RunCheck, check_redis_run};
use uuid::Uuid;

use crate::helpers::{NOW, SKU, TestGate};

const EARLIER: &str = "an-earlier-redis";

/// A gate over the service's own pool, which checks every new connection.
fn checked_gate(t: &TestGate) -> RedisGate {
    let settings = RedisSettings {
        url: flashsale_test_support::redis_url(),
        key_prefix: t.prefix.clone(),
        pool_size: 2,
        ..Default::default()
    };
    let pool = RedisGate::pool(&settings, &t.prefix).unwrap();
    RedisGate::new(pool, t.prefix.clone(), Duration::from_secs(3600))
}

fn gate_run(t: &TestGate) -> String {
    format!("{}gate_run", t.prefix)
}

async fn run_id(t: &TestGate) -> String {
    let info: String = t.query(redis::cmd("INFO").arg("server")).await;
    info.lines()
        .find_map(|l| l.strip_prefix("run_id:"))
        .unwrap()
        .trim()
        .to_owned()
}

async fn recorded(t: &TestGate) -> Option<String> {
    t.query(redis::cmd("GET").arg(gate_run(t))).await
}

async fn record(t: &TestGate, run_id: &str) {
    let _: () = t
        .query(redis::cmd("SET").arg(gate_run(t)).arg(run_id))
        .await;
}

/// A loaded product with one hold, so it has several keys.
async fn gate_with_keys(t: &TestGate) {
    t.loaded(SKU, 10).await;
    t.reserve(SKU, "u1", 2).await;
    t.loaded("SKU-2", 5).await;
}

#[tokio::test]
async fn another_run_id_drops_every_gate_before_the_first_command() {
    let t = TestGate::new();
    gate_with_keys(&t).await;
    record(&t, EARLIER).await;

    let gate = checked_gate(&t);
    assert_eq!(
        gate.snapshot(SKU).await.unwrap(),
        None,
        "the stale gate is gone"
    );
    let outcome = gate
        .reserve(SKU, Uuid::new_v4(), "u2", 1, 0, NOW)
        .await
        .unwrap();
    assert!(matches!(outcome, ReserveOutcome::NotLoaded), "{outcome:?}");
    assert_eq!(
        t.all_keys().await,
        vec![gate_run(&t)],
        "every product's keys"
    );
    assert_eq!(recorded(&t).await, Some(run_id(&t).await));
    // The next reservation's rebuild loads it again.
    assert!(gate.load(SKU, 8, &[]).await.unwrap());
    assert_eq!(t.snapshot(SKU).await.available, 8);
    t.cleanup().await;
}

#[tokio::test]
async fn of_the_connections_that_found_a_stale_run_id_one_records_the_new_one() {
    let t = TestGate::new();
    gate_with_keys(&t).await;
    record(&t, EARLIER).await;
    let mut conn = t.pool.get().await.unwrap();
    let first = check_redis_run(&mut conn, &t.prefix).await.unwrap();
    assert!(
        matches!(first, RunCheck::Stale { deleted, won: true } if deleted > 0),
        "{first:?}"
    );
    assert_eq!(
        check_redis_run(&mut conn, &t.prefix).await.unwrap(),
        RunCheck::Same
    );
    drop(conn);
    t.cleanup().await;
}

#[tokio::test]
async fn the_same_run_id_keeps_the_gate() {
    let t = TestGate::new();
    gate_with_keys(&t).await;
    let now = run_id(&t).await;
    record(&t, &now).await;
    let before = t.all_keys().await;

    let gate = checked_gate(&t);
    assert_eq!(gate.snapshot(SKU).await.unwrap().unwrap().available, 8);
    assert_eq!(t.all_keys().await, before);
    assert_eq!(recorded(&t).await, Some(now));
    t.cleanup().await;
}

#[tokio::test]
async fn no_run_id_recorded_records_it_and_keeps_the_gate() {
    let t = TestGate::new();
    gate_with_keys(&t).await;
    let before = t.all_keys().await;
    assert_eq!(recorded(&t).await, None);

    let gate = checked_gate(&t);
    assert_eq!(gate.snapshot(SKU).await.unwrap().unwrap().available, 8);
    let mut after = t.all_keys().await;
    after.retain(|k| *k != gate_run(&t));
    assert_eq!(after, before);
    assert_eq!(recorded(&t).await, Some(run_id(&t).await));
    t.cleanup().await;
}
