//! A Redis connection pool from settings.

use anyhow::Context as _;
use deadpool_redis::{Config, PoolConfig, Runtime};

use crate::settings::RedisSettings;

/// A pool of `settings.pool_size` connections to `settings.url` (connections open lazily).
pub fn pool(settings: &RedisSettings) -> anyhow::Result<deadpool_redis::Pool> {
    let mut cfg = Config::from_url(settings.url.clone());
    cfg.pool = Some(PoolConfig::new(settings.pool_size));
    cfg.create_pool(Some(Runtime::Tokio1))
        .context("create Redis pool")
}
