//! The one door into this service's internals, behind the `testing` feature: the stock gate on
//! its own, with no gRPC, database or saga around it. The benchmark (`flashsale bench`) measures
//! what the Redis script costs through it, and the order service's tests take the gate away
//! (Redis lost) or read its counters. Everything else of the service is reached through its
//! gRPC contract and its events, as a gateway would.

use std::time::Duration;

use flashsale_platform::settings::RedisSettings;
use uuid::Uuid;

use crate::infra::gate::RedisGate;
pub use crate::infra::gate::{
    GateError, GateSnapshot, ReserveArgs, ReserveOutcome, SaleWindow, product_tag,
};

/// The stock gate of one key prefix, over a pool of its own.
#[derive(Clone)]
pub struct Gate {
    gate: RedisGate,
    pool: flashsale_platform::redis::Pool,
}

impl Gate {
    /// A gate on the Redis of `settings`, under `settings.key_prefix`; an order's record
    /// lives `record_ttl`. Each new connection is checked as the service checks it.
    pub fn connect(settings: &RedisSettings, record_ttl: Duration) -> anyhow::Result<Self> {
        let pool = RedisGate::pool(settings, &settings.key_prefix)?;
        let gate = RedisGate::new(pool.clone(), settings.key_prefix.clone(), record_ttl);
        Ok(Self { gate, pool })
    }

    /// The gate's pool, for commands of the caller's own (`WAIT`, say).
    pub fn pool(&self) -> &flashsale_platform::redis::Pool {
        &self.pool
    }

    /// Puts `stock` units of `sku` on sale; false if the product was already loaded.
    pub async fn load(&self, sku: &str, stock: i64) -> Result<bool, GateError> {
        self.gate.load(sku, stock, &[]).await
    }

    /// Removes every key of `sku`, as a Redis that lost its data would; returns how many.
    pub async fn forget(&self, sku: &str) -> Result<u64, GateError> {
        self.gate.forget(sku).await
    }

    /// The counters of `sku` (`None` when it is not loaded).
    pub async fn snapshot(&self, sku: &str) -> Result<Option<GateSnapshot>, GateError> {
        self.gate.snapshot(sku).await
    }

    /// Reserves `qty` units of `sku` for a new order of `user_id`, as `ReserveStockBatch` does
    /// for one item (`per_user_limit` 0: none).
    pub async fn reserve(
        &self,
        sku: &str,
        user_id: &str,
        qty: i64,
        per_user_limit: u32,
    ) -> Result<ReserveOutcome, GateError> {
        let now_ms = chrono::Utc::now().timestamp_millis();
        self.gate
            .reserve(sku, Uuid::new_v4(), user_id, qty, per_user_limit, now_ms)
            .await
    }

    /// Many reservations in one round trip, one answer each, in order.
    pub async fn reserve_many(
        &self,
        items: &[ReserveArgs<'_>],
    ) -> Result<Vec<Result<ReserveOutcome, GateError>>, GateError> {
        self.gate.reserve_many(items).await
    }
}
