//! The usage of a service's connection pools, read every [`crate::metrics::UPKEEP`]: connections
//! in use and idle, the pool's bound, and (Redis) callers waiting for a connection. A pool in
//! use to its bound with callers waiting is where a service's calls queue. Labelled `service`,
//! since tests run several services in one process.

use metrics::gauge;

use crate::shutdown::{Shutdown, every};

/// Gauge: database connections, by `service` and `state` (`in_use`, `idle`).
pub const DB_CONNECTIONS: &str = "flashsale_db_pool_connections";
/// Gauge: the most database connections the pool opens, by `service`.
pub const DB_MAX: &str = "flashsale_db_pool_max_connections";
/// Gauge: Redis connections, by `service` and `state` (`in_use`, `idle`).
pub const REDIS_CONNECTIONS: &str = "flashsale_redis_pool_connections";
/// Gauge: the most Redis connections the pool opens, by `service`.
pub const REDIS_MAX: &str = "flashsale_redis_pool_max_connections";
/// Gauge: callers waiting for a Redis connection, by `service`.
pub const REDIS_WAITING: &str = "flashsale_redis_pool_waiting";

/// Describes the pool families.
pub fn describe() {
    use metrics::describe_gauge;
    describe_gauge!(
        DB_CONNECTIONS,
        "Database connections of the service's pool, by state (in_use, idle)."
    );
    describe_gauge!(
        DB_MAX,
        "The most database connections the service's pool opens."
    );
    describe_gauge!(
        REDIS_CONNECTIONS,
        "Redis connections of the service's pool, by state (in_use, idle)."
    );
    describe_gauge!(
        REDIS_MAX,
        "The most Redis connections the service's pool opens."
    );
    describe_gauge!(REDIS_WAITING, "Callers waiting for a Redis connection.");
}

/// Records the database pool of `db` once.
pub fn record_db(service: &'static str, db: &sea_orm::DatabaseConnection) {
    let pool = db.get_postgres_connection_pool();
    let open = pool.size() as f64;
    let idle = pool.num_idle() as f64;
    gauge!(DB_CONNECTIONS, "service" => service, "state" => "in_use").set((open - idle).max(0.0));
    gauge!(DB_CONNECTIONS, "service" => service, "state" => "idle").set(idle);
    gauge!(DB_MAX, "service" => service).set(f64::from(pool.options().get_max_connections()));
}

/// Records the Redis pool `pool` once.
pub fn record_redis(service: &'static str, pool: &crate::redis::Pool) {
    let s = pool.status();
    let in_use = s.size.saturating_sub(s.available);
    gauge!(REDIS_CONNECTIONS, "service" => service, "state" => "in_use").set(in_use as f64);
    gauge!(REDIS_CONNECTIONS, "service" => service, "state" => "idle").set(s.available as f64);
    gauge!(REDIS_MAX, "service" => service).set(s.max_size as f64);
    gauge!(REDIS_WAITING, "service" => service).set(s.waiting as f64);
}

/// Records the database pool every [`crate::metrics::UPKEEP`] until `shutdown`.
pub async fn watch_db(
    service: &'static str,
    db: sea_orm::DatabaseConnection,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    every(
        crate::metrics::UPKEEP,
        shutdown,
        "database pool gauges",
        || {
            record_db(service, &db);
            std::future::ready(Ok::<(), std::convert::Infallible>(()))
        },
    )
    .await
}

/// Records the Redis pool every [`crate::metrics::UPKEEP`] until `shutdown`.
pub async fn watch_redis(
    service: &'static str,
    pool: crate::redis::Pool,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    every(
        crate::metrics::UPKEEP,
        shutdown,
        "Redis pool gauges",
        || {
            record_redis(service, &pool);
            std::future::ready(Ok::<(), std::convert::Infallible>(()))
        },
    )
    .await
}
