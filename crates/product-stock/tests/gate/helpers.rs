//! A gate under a fresh key prefix, and raw Redis access to look behind it.

use std::time::Duration;

use deadpool_redis::redis;
use flashsale_platform::{redis::Pool, settings::RedisSettings};
use flashsale_product_stock::infra::gate::{GateSnapshot, ProductKeys, RedisGate};
use uuid::Uuid;

pub const SKU: &str = "SKU-1";
pub const NOW: i64 = 1_700_000_000_000;

pub struct TestGate {
    pub gate: RedisGate,
    pub pool: Pool,
    pub prefix: String,
}

impl TestGate {
    pub fn new() -> Self {
        Self::with_pool_size(4)
    }

    pub fn with_pool_size(size: usize) -> Self {
        let prefix = format!("{}:", flashsale_test_support::unique_name("gate_test"));
        let settings = RedisSettings {
            url: flashsale_test_support::redis_url(),
            key_prefix: prefix.clone(),
            pool_size: size,
            ..Default::default()
        };
        let pool = flashsale_platform::redis::pool(&settings).unwrap();
        let gate = RedisGate::new(pool.clone(), prefix.clone(), Duration::from_secs(3600));
        Self { gate, pool, prefix }
    }

    pub fn keys(&self, sku: &str) -> ProductKeys {
        self.gate.keys(sku).unwrap()
    }

    /// Loads `sku` with `available` units and no buyers.
    pub async fn loaded(&self, sku: &str, available: i64) {
        assert!(self.gate.load(sku, available, &[]).await.unwrap());
    }

    pub async fn snapshot(&self, sku: &str) -> GateSnapshot {
        self.gate
            .snapshot(sku)
            .await
            .unwrap()
            .expect("the gate is loaded")
    }

    /// Reserves one order of `qty` units for `user` and returns its id.
    pub async fn reserve(&self, sku: &str, user: &str, qty: i64) -> Uuid {
        let order = Uuid::new_v4();
        let outcome = self
            .gate
            .reserve(sku, order, user, qty, 0, NOW)
            .await
            .unwrap();
        assert!(
            matches!(
                outcome,
                flashsale_product_stock::infra::gate::ReserveOutcome::Reserved { .. }
            ),
            "{outcome:?}"
        );
        order
    }

    pub async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        let mut conn = self.pool.get().await.unwrap();
        cmd.query_async(&mut *conn).await.unwrap()
    }

    pub async fn users(&self, sku: &str) -> Vec<(String, i64)> {
        let mut users: Vec<(String, i64)> = self
            .query(redis::cmd("HGETALL").arg(self.keys(sku).users()))
            .await;
        users.sort();
        users
    }

    pub async fn pending(&self, sku: &str) -> Vec<String> {
        self.query(
            redis::cmd("ZRANGE")
                .arg(self.keys(sku).pending())
                .arg(0)
                .arg(-1),
        )
        .await
    }

    pub async fn order_state(&self, sku: &str, order: Uuid) -> Option<String> {
        self.query(redis::cmd("HGET").arg(self.keys(sku).order(order)).arg("s"))
            .await
    }

    /// Every key under this test's prefix.
    pub async fn all_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self
            .query(redis::cmd("KEYS").arg(format!("{}*", self.prefix)))
            .await;
        keys.sort();
        keys
    }

    /// Deletes every key under this test's prefix and checks none is left.
    pub async fn cleanup(self) {
        let keys = self.all_keys().await;
        if !keys.is_empty() {
            let _: u64 = self.query(redis::cmd("DEL").arg(&keys)).await;
        }
        assert!(self.all_keys().await.is_empty());
    }
}

/// `outcome` with the gate's clock checked and dropped, to compare the rest: a first grant
/// carries the gate's time (within a minute of this machine's, whose Redis it is), a replay none.
pub fn clock_checked(
    outcome: flashsale_product_stock::infra::gate::ReserveOutcome,
) -> flashsale_product_stock::infra::gate::ReserveOutcome {
    use flashsale_product_stock::infra::gate::ReserveOutcome;
    match outcome {
        ReserveOutcome::Reserved {
            remaining,
            replayed,
            gate_ms,
        } => {
            match gate_ms {
                Some(ms) => {
                    assert!(!replayed, "a replay carries no clock");
                    let now = chrono::Utc::now().timestamp_millis();
                    assert!((ms - now).abs() < 60_000, "gate clock {ms}, here {now}");
                }
                None => assert!(replayed, "a first grant carries the gate's clock"),
            }
            ReserveOutcome::Reserved {
                remaining,
                replayed,
                gate_ms: None,
            }
        }
        other => other,
    }
}
