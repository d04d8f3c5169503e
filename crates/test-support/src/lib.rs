//! Helpers for flashsale's integration tests: each test gets its own PostgreSQL database, its
//! own Redis key prefix and its own AMQP exchange/queue names, so tests run in parallel against
//! the real servers and never depend on what another test left behind.

pub mod fixtures;
pub mod foundation;
pub mod generated;
pub mod grpc;
pub mod otlp;
pub mod page_tokens;
pub mod probe;
pub mod rabbit_cluster;
pub mod redis_cluster;
pub mod servers;
pub mod settings;
pub mod tls;

use std::time::Duration;

use anyhow::Context as _;
use sea_orm::{ConnectionTrait, Database, DatabaseConnection};

/// Server URL (no database path) of the PostgreSQL the tests use.
pub fn postgres_server_url() -> String {
    std::env::var("FLASHSALE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".to_owned())
}

/// URL of the Redis the tests use.
pub fn redis_url() -> String {
    std::env::var("FLASHSALE_TEST_REDIS_URL")
        .unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// URL of the RabbitMQ the tests use.
pub fn amqp_url() -> String {
    std::env::var("FLASHSALE_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

/// A name no other test run uses: `prefix` followed by 12 random hex digits.
pub fn unique_name(prefix: &str) -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("{prefix}_{}", &id[..12])
}

/// A fresh, empty PostgreSQL database, dropped (with `FORCE`) when the value is dropped.
pub struct TestDatabase {
    pub name: String,
    pub url: String,
}

impl TestDatabase {
    /// Creates `fs_test_<random>` on the test server.
    pub async fn create() -> anyhow::Result<Self> {
        let server = postgres_server_url();
        let name = unique_name("fs_test");
        let admin = Database::connect(format!("{server}/postgres"))
            .await
            .context("connect to the postgres maintenance database")?;
        admin
            .execute_unprepared(&format!("CREATE DATABASE \"{name}\""))
            .await
            .context("create test database")?;
        admin.close().await.ok();
        Ok(Self {
            url: format!("{server}/{name}"),
            name,
        })
    }

    /// Opens a connection pool on this database.
    pub async fn connect(&self) -> anyhow::Result<DatabaseConnection> {
        Database::connect(&self.url)
            .await
            .context("connect to test database")
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let server = postgres_server_url();
        let name = self.name.clone();
        // Drop runs inside a tokio runtime that may be shutting down; use a thread of its own.
        let handle = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                if let Ok(admin) = Database::connect(format!("{server}/postgres")).await {
                    let sql = format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)");
                    let _ = admin.execute_unprepared(&sql).await;
                    admin.close().await.ok();
                }
            });
        });
        let _ = handle.join();
    }
}

/// Polls `check` every 20 ms until it returns `Some`, or fails after `timeout`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
