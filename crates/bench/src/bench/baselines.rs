//! The modes measured beside the platform, on the same machine and at the same concurrency:
//! the naive design it replaces (one PostgreSQL transaction per request: the hot row, the
//! per-user limit, the order record), that design's hot row alone (opt-in), the raw gate (the
//! platform's reserve script straight on Redis, no gRPC), the raw insert (the order + outbox
//! insert straight on PostgreSQL), and the no-op ceiling (an empty RPC).

use std::{sync::Arc, time::Duration};

use anyhow::Context as _;
use flashsale_product_stock::infra::gate::{RedisGate, ReserveOutcome};
use sea_orm::{ConnectOptions, ConnectionTrait, Database, DatabaseConnection, TransactionTrait};
use uuid::Uuid;

use super::measure::{Measurement, Outcome, drive};

/// What every mode shares.
#[derive(Clone, Debug)]
pub struct Load {
    pub requests: usize,
    pub buyers: usize,
    pub concurrency: usize,
    /// HTTP/2 connections the gRPC modes (no-op, platform) spread their calls over.
    pub connections: usize,
    pub stock: i64,
    pub deadline: Duration,
}

/// How long a bench call waits for a pooled connection before it counts as an error.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// Connects (creating the database when missing) with a pool of `pool` connections: the
/// services' pools and this one must fit together under PostgreSQL's `max_connections`, or
/// calls wait for a connection and the wait, not the design, sets the figures.
pub async fn bench_db(
    server_url: &str,
    name: &str,
    pool: u32,
) -> anyhow::Result<DatabaseConnection> {
    let admin = Database::connect(format!("{server_url}/postgres"))
        .await
        .context("connect to PostgreSQL")?;
    let exists = admin
        .query_one_raw(sea_orm::Statement::from_sql_and_values(
            sea_orm::DatabaseBackend::Postgres,
            "SELECT 1 FROM pg_database WHERE datname = $1",
            [name.into()],
        ))
        .await?
        .is_some();
    if !exists {
        admin
            .execute_unprepared(&format!("CREATE DATABASE \"{name}\""))
            .await
            .context("create bench database")?;
    }
    admin.close().await.ok();
    let mut opts = ConnectOptions::new(format!("{server_url}/{name}"));
    opts.max_connections(pool.max(1))
        .min_connections(pool.max(1))
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_timeout(Duration::from_secs(10))
        .sqlx_logging(false);
    Database::connect(opts)
        .await
        .context("connect to the bench database")
}

/// The naive design: the whole order in one PostgreSQL transaction per request, as a service
/// without the gate would write it, holding the hot row's lock as briefly as it can. The
/// buyer's own advisory lock (taken first, so two requests of one buyer cannot both pass the
/// per-user limit; buyers do not wait for each other) and then one statement: the conditional
/// `UPDATE` of the hot row, guarded by the per-user limit, and the order (idempotent on its
/// request id) with its history row, in the order service's own tables — the same record the
/// platform writes, without the saga's outbox row (nothing is left to do afterwards) and
/// without the `WatchOrder` notification triggers.
pub async fn naive(
    db: DatabaseConnection,
    load: &Load,
    sku: &str,
    per_user_limit: u32,
) -> anyhow::Result<Measurement> {
    use sea_orm_migration::MigratorTrait as _;
    flashsale_order::migration::Migrator::up(&db, None)
        .await
        .context("migrate the naive bench database")?;
    refuse_foreign_orders(&db, "--naive-db").await?;
    db.execute_unprepared(
        "DROP TRIGGER IF EXISTS orders_notify_insert ON orders; \
         DROP TRIGGER IF EXISTS orders_notify_update ON orders; \
         DROP TRIGGER IF EXISTS orders_notify ON orders",
    )
    .await
    .context("drop the notification triggers of the naive database")?;
    naive_stock(&db, load, sku).await?;
    db.execute_unprepared("TRUNCATE orders, order_status_history, outbox CASCADE")
        .await
        .context("empty the naive order tables")?;
    let (db, sku, buyers) = (Arc::new(db), sku.to_owned(), load.buyers.max(1));
    let (tag, limit) = (
        Uuid::new_v4().simple().to_string(),
        i64::from(per_user_limit),
    );
    drive("naive (PostgreSQL row + order)", load.requests, load.concurrency, load.deadline, move |i| {
        let (db, sku, tag) = (db.clone(), sku.clone(), tag.clone());
        async move {
            let user = format!("buyer{}", i % buyers);
            let run = async {
                let txn = db.begin().await?;
                txn.execute_raw(pg(
                    "SELECT pg_advisory_xact_lock(hashtextextended($1 || '/' || $2, 0))",
                    [user.clone().into(), sku.clone().into()],
                ))
                .await?;
                let row = txn
                    .query_one_raw(pg(
                        "WITH bought AS (SELECT COALESCE(sum(quantity), 0)::bigint AS n FROM orders \
                           WHERE user_id = $2 AND sku = $1 AND status <> 'CANCELLED'), \
                         took AS (UPDATE naive_stock SET available = available - 1 \
                           WHERE sku = $1 AND available >= 1 \
                             AND ($5 = 0 OR (SELECT n FROM bought) + 1 <= $5) RETURNING sku), \
                         o AS (INSERT INTO orders (order_id, user_id, request_id, sku, quantity, \
                           unit_price_cents, total_cents, deduction_policy, status) \
                           SELECT $3, $2, $4, sku, 1, 1999, 1999, 'RESERVE_THEN_COMMIT', 'PENDING' FROM took \
                           ON CONFLICT (user_id, request_id) DO NOTHING RETURNING order_id), \
                         h AS (INSERT INTO order_status_history (order_id, from_status, to_status) \
                           SELECT order_id, NULL, 'PENDING' FROM o) \
                         SELECT (SELECT n FROM bought) AS bought, \
                           (SELECT count(*) FROM took)::bigint AS took, \
                           (SELECT count(*) FROM o)::bigint AS wrote",
                        [
                            sku.clone().into(),
                            user.clone().into(),
                            Uuid::new_v4().into(),
                            format!("{tag}-{i}").into(),
                            limit.into(),
                        ],
                    ))
                    .await?
                    .ok_or_else(|| sea_orm::DbErr::Custom("the naive statement returned no row".into()))?;
                let (bought, took, wrote): (i64, i64, i64) = (
                    row.try_get("", "bought")?,
                    row.try_get("", "took")?,
                    row.try_get("", "wrote")?,
                );
                let outcome = if took == 0 && limit > 0 && bought + 1 > limit {
                    Outcome::Refused("USER_LIMIT".into())
                } else if took == 0 {
                    Outcome::Refused("SOLD_OUT".into())
                } else if wrote == 0 {
                    // The request id was used before: a replay, which takes no unit.
                    Outcome::Refused("REPLAY".into())
                } else {
                    txn.commit().await?;
                    return Ok::<_, sea_orm::DbErr>(Outcome::Accepted);
                };
                txn.rollback().await?;
                Ok(outcome)
            };
            run.await
                .unwrap_or_else(|e| Outcome::Error(e.to_string().chars().take(60).collect()))
        }
    })
    .await
}

/// Refuses to empty an order database that holds orders the bench did not write (its products
/// are all `BENCH-…`): `--naive-db` or `--insert-db` naming a live service's database.
async fn refuse_foreign_orders(db: &DatabaseConnection, flag: &str) -> anyhow::Result<()> {
    let foreign = db
        .query_one_raw(sea_orm::Statement::from_string(
            sea_orm::DatabaseBackend::Postgres,
            "SELECT EXISTS (SELECT 1 FROM orders WHERE sku NOT LIKE 'BENCH-%') AS other",
        ))
        .await?
        .map(|row| row.try_get::<bool>("", "other"))
        .transpose()?
        .unwrap_or(false);
    anyhow::ensure!(
        !foreign,
        "{flag}: that database holds orders the bench did not write; it empties its database, so give it one of its own"
    );
    Ok(())
}

/// The naive design reduced to its hot row: the conditional UPDATE and a bare five-column
/// order row (one index), no per-user limit, no idempotency key, no history. Not a design that
/// could run the sale (it ignores the per-user limit); it shows what the row lock alone allows.
pub async fn naive_bare(
    db: DatabaseConnection,
    load: &Load,
    sku: &str,
) -> anyhow::Result<Measurement> {
    db.execute_unprepared(
        "CREATE TABLE IF NOT EXISTS naive_orders (order_id uuid PRIMARY KEY, user_id text NOT NULL, sku text NOT NULL,
             quantity bigint NOT NULL, created_at timestamptz NOT NULL DEFAULT now());",
    )
    .await?;
    db.execute_unprepared("TRUNCATE naive_orders").await?;
    naive_stock(&db, load, sku).await?;
    let (db, sku, buyers) = (Arc::new(db), sku.to_owned(), load.buyers.max(1));
    drive("bare naive (PostgreSQL row only)", load.requests, load.concurrency, load.deadline, move |i| {
        let (db, sku) = (db.clone(), sku.clone());
        async move {
            let run = async {
                let txn = db.begin().await?;
                let updated = txn
                    .execute_raw(pg(
                        "UPDATE naive_stock SET available = available - 1 WHERE sku = $1 AND available >= 1",
                        [sku.clone().into()],
                    ))
                    .await?;
                if updated.rows_affected() == 0 {
                    txn.rollback().await?;
                    return Ok::<_, sea_orm::DbErr>(false);
                }
                txn.execute_raw(pg(
                    "INSERT INTO naive_orders (order_id, user_id, sku, quantity) VALUES ($1, $2, $3, 1)",
                    [Uuid::new_v4().into(), format!("buyer{}", i % buyers).into(), sku.into()],
                ))
                .await?;
                txn.commit().await?;
                Ok(true)
            };
            match run.await {
                Ok(true) => Outcome::Accepted,
                Ok(false) => Outcome::Refused("SOLD_OUT".into()),
                Err(e) => Outcome::Error(e.to_string().chars().take(60).collect()),
            }
        }
    })
    .await
}

/// The hot row of the naive designs, holding the sale's stock.
async fn naive_stock(db: &DatabaseConnection, load: &Load, sku: &str) -> anyhow::Result<()> {
    db.execute_unprepared(
        "CREATE TABLE IF NOT EXISTS naive_stock (sku text PRIMARY KEY, available bigint NOT NULL CHECK (available >= 0))",
    )
    .await?;
    db.execute_unprepared("TRUNCATE naive_stock").await?;
    db.execute_raw(pg(
        "INSERT INTO naive_stock (sku, available) VALUES ($1, $2)",
        [sku.into(), load.stock.into()],
    ))
    .await?;
    Ok(())
}

fn pg<const N: usize>(sql: &str, values: [sea_orm::Value; N]) -> sea_orm::Statement {
    sea_orm::Statement::from_sql_and_values(sea_orm::DatabaseBackend::Postgres, sql, values)
}

/// The platform's reserve script on Redis with no gRPC around it.
pub async fn raw_gate(
    gate: RedisGate,
    load: &Load,
    sku: &str,
    per_user_limit: u32,
) -> anyhow::Result<Measurement> {
    gate.forget(sku).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    gate.load(sku, load.stock, &[])
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let (sku, buyers) = (sku.to_owned(), load.buyers.max(1));
    let result = drive(
        "raw gate (Redis Lua)",
        load.requests,
        load.concurrency,
        load.deadline,
        {
            let gate = gate.clone();
            let sku = sku.clone();
            move |i| {
                let (gate, sku) = (gate.clone(), sku.clone());
                async move {
                    let now = chrono::Utc::now().timestamp_millis();
                    match gate
                        .reserve(
                            &sku,
                            Uuid::new_v4(),
                            &format!("buyer{}", i % buyers),
                            1,
                            per_user_limit,
                            now,
                        )
                        .await
                    {
                        Ok(ReserveOutcome::Reserved { .. }) => Outcome::Accepted,
                        Ok(other) => Outcome::Refused(
                            format!("{other:?}")
                                .split([' ', '{'])
                                .next()
                                .unwrap_or("")
                                .to_owned(),
                        ),
                        Err(e) => Outcome::Error(e.to_string()),
                    }
                }
            }
        },
    )
    .await;
    gate.forget(&sku)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    result
}

/// The order + outbox insert of CreateOrder, straight on PostgreSQL (the order schema).
pub async fn raw_insert(
    db: DatabaseConnection,
    load: &Load,
    sku: &str,
) -> anyhow::Result<Measurement> {
    use sea_orm_migration::MigratorTrait as _;
    flashsale_order::migration::Migrator::up(&db, None)
        .await
        .context("migrate the bench order database")?;
    refuse_foreign_orders(&db, "--insert-db").await?;
    // Every run starts from empty tables: indexes grown by earlier runs would make each run
    // slower than the last.
    db.execute_unprepared("TRUNCATE orders, order_status_history, outbox CASCADE")
        .await
        .context("empty the bench order tables")?;
    let (db, sku, buyers) = (Arc::new(db), sku.to_owned(), load.buyers.max(1));
    let tag = Uuid::new_v4().simple().to_string();
    drive(
        "raw insert (PostgreSQL)",
        load.requests,
        load.concurrency,
        load.deadline,
        move |i| {
            let (db, sku, tag) = (db.clone(), sku.clone(), tag.clone());
            async move {
                let place = match flashsale_order::domain::PlaceOrder::new(
                    &format!("buyer{}", i % buyers),
                    &format!("{tag}-{i}"),
                    &sku,
                    1,
                    1,
                ) {
                    Ok(p) => p,
                    Err(e) => return Outcome::Error(e.to_string()),
                };
                match flashsale_order::app::write_pending(
                    &db,
                    &place,
                    1999,
                    flashsale_order::domain::Policy::ReserveThenCommit,
                )
                .await
                {
                    Ok(_) => Outcome::Accepted,
                    Err(e) => Outcome::Error(e.to_string().chars().take(60).collect()),
                }
            }
        },
    )
    .await
}

/// An empty RPC: the gRPC health check of `url`, what the gRPC stack answers at all.
pub async fn noop(urls: &[String], load: &Load) -> anyhow::Result<Measurement> {
    // As many connections as the platform mode opens, over the same replicas, so that the two
    // compare.
    let mut clients = Vec::new();
    for c in 0..load.connections.max(1) {
        let url = &urls[c % urls.len().max(1)];
        let channel = crate::client::connect(url, Duration::from_secs(10)).await?;
        clients.push(tonic_health::pb::health_client::HealthClient::new(channel));
    }
    drive(
        "no-op (gRPC health)",
        load.requests,
        load.concurrency,
        load.deadline,
        move |i| {
            let mut c = clients[i % clients.len()].clone();
            async move {
                match c
                    .check(tonic_health::pb::HealthCheckRequest {
                        service: String::new(),
                    })
                    .await
                {
                    Ok(_) => Outcome::Accepted,
                    Err(s) => Outcome::Error(format!("{:?}", s.code())),
                }
            }
        },
    )
    .await
}
