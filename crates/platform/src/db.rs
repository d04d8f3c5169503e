//! The service's own PostgreSQL database: created if missing, then connected as a pool.

use std::time::Duration;

use anyhow::Context as _;
use sea_orm::{ConnectOptions, ConnectionTrait, Database, DatabaseConnection, Statement};

use crate::settings::{DatabaseSettings, redact_url};

/// Creates the database named in `settings.url` when it does not exist yet (connecting to the
/// `postgres` maintenance database of the same server), then opens the pool.
pub async fn connect(settings: &DatabaseSettings) -> anyhow::Result<DatabaseConnection> {
    ensure_database(&settings.url).await?;
    let mut opts = ConnectOptions::new(settings.url.clone());
    opts.max_connections(settings.max_connections)
        .min_connections(1)
        .connect_timeout(Duration::from_secs(5))
        .acquire_timeout(Duration::from_secs(5))
        .sqlx_logging(false);
    Database::connect(opts)
        .await
        .with_context(|| format!("connect to {}", redact_url(&settings.url)))
}

async fn ensure_database(url: &str) -> anyhow::Result<()> {
    let mut parsed = url::Url::parse(url).context("parse database.url")?;
    let name = parsed.path().trim_start_matches('/').to_owned();
    anyhow::ensure!(!name.is_empty(), "database.url names no database");
    parsed.set_path("/postgres");
    let mut admin_opts = ConnectOptions::new(parsed.as_str());
    admin_opts
        .max_connections(1)
        .connect_timeout(Duration::from_secs(5))
        .sqlx_logging(false);
    let admin = Database::connect(admin_opts)
        .await
        .with_context(|| format!("connect to {}", redact_url(parsed.as_str())))?;
    let exists = admin
        .query_one_raw(Statement::from_sql_and_values(
            sea_orm::DatabaseBackend::Postgres,
            "SELECT 1 FROM pg_database WHERE datname = $1",
            [name.clone().into()],
        ))
        .await
        .context("look up database")?
        .is_some();
    if !exists {
        let quoted = name.replace('"', "\"\"");
        match admin
            .execute_unprepared(&format!("CREATE DATABASE \"{quoted}\""))
            .await
        {
            Ok(_) => tracing::info!(database = %name, "created database"),
            // Another replica may have created it at the same moment.
            Err(e) if e.to_string().contains("already exists") => {}
            Err(e) => return Err(e).context("create database"),
        }
    }
    admin.close().await.ok();
    Ok(())
}
