//! The modes measured beside the platform, on the same machine and at the same concurrency:
//! the naive design it replaces (one PostgreSQL transaction per request: the hot row, the
//! per-user limit, the order record), that design's hot row alone (opt-in), the raw gate (the
//! platform's reserve script straight on Redis, no gRPC), the raw insert (the order + outbox
//! insert straight on PostgreSQL), and the no-op ceiling (an empty RPC).

use std::{sync::Arc, time::Duration};

use anyhow::Context as _;
use flashsale_order::testing as order;
use flashsale_product_stock::testing::{Gate, ReserveOutcome};
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

/// How the naive design talks to PostgreSQL: the same work, in four round trips or in one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum NaiveVariant {
    /// `BEGIN`, the advisory lock, one statement, `COMMIT` (or `ROLLBACK`): four round trips.
    Naive,
    /// One `SELECT` of a PL/pgSQL function doing the same work, in autocommit: one round trip.
    NaiveFn,
}

impl NaiveVariant {
    pub const ALL: [Self; 2] = [Self::Naive, Self::NaiveFn];

    /// The name of the variant as its mode and flag spell it.
    pub fn label(self) -> &'static str {
        match self {
            Self::Naive => "naive",
            Self::NaiveFn => "naive-fn",
        }
    }
}

/// The naive design's order, in one PL/pgSQL function: the buyer's advisory lock, the per-user
/// limit, the conditional `UPDATE` of the hot row, the order (idempotent on its request id) and
/// its history row; returns `ACCEPTED`, `USER_LIMIT`, `SOLD_OUT` or `REPLAY`, in the same order
/// of checks as the statement of [`naive`]. A replay gives its unit back in the same
/// transaction (the statement variant rolls back instead): the hot row ends the same.
const NAIVE_FUNCTION: &str = "CREATE OR REPLACE FUNCTION naive_place_order(p_sku text, p_user text, \
       p_order uuid, p_request text, p_limit bigint) RETURNS text LANGUAGE plpgsql AS $fn$ \
     DECLARE v_bought bigint; v_order uuid; \
     BEGIN \
       PERFORM pg_advisory_xact_lock(hashtextextended(p_user || '/' || p_sku, 0)); \
       SELECT COALESCE(sum(quantity), 0)::bigint INTO v_bought FROM orders \
         WHERE user_id = p_user AND sku = p_sku AND status <> 'CANCELLED'; \
       IF p_limit > 0 AND v_bought + 1 > p_limit THEN RETURN 'USER_LIMIT'; END IF; \
       UPDATE naive_stock SET available = available - 1 WHERE sku = p_sku AND available >= 1; \
       IF NOT FOUND THEN RETURN 'SOLD_OUT'; END IF; \
       INSERT INTO orders (order_id, user_id, request_id, sku, quantity, unit_price_cents, \
         total_cents, deduction_policy, status) \
         VALUES (p_order, p_user, p_request, p_sku, 1, 1999, 1999, 'RESERVE_THEN_COMMIT', 'PENDING') \
         ON CONFLICT (user_id, request_id) DO NOTHING RETURNING order_id INTO v_order; \
       IF v_order IS NULL THEN \
         UPDATE naive_stock SET available = available + 1 WHERE sku = p_sku; \
         RETURN 'REPLAY'; \
       END IF; \
       INSERT INTO order_status_history (order_id, from_status, to_status) \
         VALUES (v_order, NULL, 'PENDING'); \
       RETURN 'ACCEPTED'; \
     END $fn$";

/// Readies the naive database for a sale of `stock` units of `sku`: the order schema without
/// its notification triggers, empty order tables, the hot row, and the one-round-trip function.
pub async fn prepare_naive(db: &DatabaseConnection, stock: i64, sku: &str) -> anyhow::Result<()> {
    order::migrate(db)
        .await
        .context("migrate the naive bench database")?;
    refuse_foreign_orders(db, "--naive-db").await?;
    db.execute_unprepared(
        "DROP TRIGGER IF EXISTS orders_notify_insert ON orders; \
         DROP TRIGGER IF EXISTS orders_notify_update ON orders; \
         DROP TRIGGER IF EXISTS orders_notify ON orders",
    )
    .await
    .context("drop the notification triggers of the naive database")?;
    naive_stock(db, stock, sku).await?;
    db.execute_unprepared("TRUNCATE orders, order_status_history, outbox CASCADE")
        .await
        .context("empty the naive order tables")?;
    db.execute_unprepared(NAIVE_FUNCTION)
        .await
        .context("create the naive order function")?;
    Ok(())
}

/// One request of the naive design: `user` buys one unit of `sku` under request id `request`.
pub async fn naive_call(
    db: &DatabaseConnection,
    variant: NaiveVariant,
    sku: &str,
    user: &str,
    request: &str,
    limit: i64,
) -> Outcome {
    let run = async {
        match variant {
            NaiveVariant::Naive => naive_statement(db, sku, user, request, limit).await,
            NaiveVariant::NaiveFn => {
                let row = db
                    .query_one_raw(pg(
                        "SELECT naive_place_order($1, $2, $3, $4, $5) AS outcome",
                        [
                            sku.into(),
                            user.into(),
                            Uuid::new_v4().into(),
                            request.into(),
                            limit.into(),
                        ],
                    ))
                    .await?
                    .ok_or_else(|| {
                        sea_orm::DbErr::Custom("the naive function returned no row".into())
                    })?;
                let outcome: String = row.try_get("", "outcome")?;
                Ok(if outcome == "ACCEPTED" {
                    Outcome::Accepted
                } else {
                    Outcome::Refused(outcome)
                })
            }
        }
    };
    run.await.unwrap_or_else(|e: sea_orm::DbErr| {
        Outcome::Error(e.to_string().chars().take(60).collect())
    })
}

/// The four-round-trip request: see [`naive`].
async fn naive_statement(
    db: &DatabaseConnection,
    sku: &str,
    user: &str,
    request: &str,
    limit: i64,
) -> Result<Outcome, sea_orm::DbErr> {
    let txn = db.begin().await?;
    txn.execute_raw(pg(
        "SELECT pg_advisory_xact_lock(hashtextextended($1 || '/' || $2, 0))",
        [user.into(), sku.into()],
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
                sku.into(),
                user.into(),
                Uuid::new_v4().into(),
                request.into(),
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
        return Ok(Outcome::Accepted);
    };
    txn.rollback().await?;
    Ok(outcome)
}

/// The naive design: the whole order in one PostgreSQL transaction per request, as a service
/// without the gate would write it, holding the hot row's lock as briefly as it can. The
/// buyer's own advisory lock (taken first, so two requests of one buyer cannot both pass the
/// per-user limit; buyers do not wait for each other) and then one statement: the conditional
/// `UPDATE` of the hot row, guarded by the per-user limit, and the order (idempotent on its
/// request id) with its history row, in the order service's own tables — the same record the
/// platform writes, without the saga's outbox row (nothing is left to do afterwards) and
/// without the `WatchOrder` notification triggers. Four round trips per request (`BEGIN`, the
/// lock, the statement, `COMMIT`); [`NaiveVariant::NaiveFn`] does the same work in one.
pub async fn naive(
    db: DatabaseConnection,
    load: &Load,
    sku: &str,
    per_user_limit: u32,
) -> anyhow::Result<Measurement> {
    naive_with(db, load, sku, per_user_limit, NaiveVariant::Naive).await
}

/// The naive design in `variant`: [`naive`] or its one-round-trip function.
pub async fn naive_with(
    db: DatabaseConnection,
    load: &Load,
    sku: &str,
    per_user_limit: u32,
    variant: NaiveVariant,
) -> anyhow::Result<Measurement> {
    prepare_naive(&db, load.stock, sku).await?;
    let (db, sku, buyers) = (Arc::new(db), sku.to_owned(), load.buyers.max(1));
    let (tag, limit) = (
        Uuid::new_v4().simple().to_string(),
        i64::from(per_user_limit),
    );
    let name = match variant {
        NaiveVariant::Naive => "naive (PostgreSQL row + order)",
        NaiveVariant::NaiveFn => "naive-fn (one-call PostgreSQL function)",
    };
    drive(
        name,
        load.requests,
        load.concurrency,
        load.deadline,
        move |i| {
            let (db, sku, tag) = (db.clone(), sku.clone(), tag.clone());
            async move {
                let user = format!("buyer{}", i % buyers);
                naive_call(&db, variant, &sku, &user, &format!("{tag}-{i}"), limit).await
            }
        },
    )
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
    naive_stock(&db, load.stock, sku).await?;
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
async fn naive_stock(db: &DatabaseConnection, stock: i64, sku: &str) -> anyhow::Result<()> {
    db.execute_unprepared(
        "CREATE TABLE IF NOT EXISTS naive_stock (sku text PRIMARY KEY, available bigint NOT NULL CHECK (available >= 0))",
    )
    .await?;
    db.execute_unprepared("TRUNCATE naive_stock").await?;
    db.execute_raw(pg(
        "INSERT INTO naive_stock (sku, available) VALUES ($1, $2)",
        [sku.into(), stock.into()],
    ))
    .await?;
    Ok(())
}

fn pg<const N: usize>(sql: &str, values: [sea_orm::Value; N]) -> sea_orm::Statement {
    sea_orm::Statement::from_sql_and_values(sea_orm::DatabaseBackend::Postgres, sql, values)
}

/// The platform's reserve script on Redis with no gRPC around it.
pub async fn raw_gate(
    gate: Gate,
    load: &Load,
    sku: &str,
    per_user_limit: u32,
) -> anyhow::Result<Measurement> {
    gate.forget(sku).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    gate.load(sku, load.stock)
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
                    match gate
                        .reserve(&sku, &format!("buyer{}", i % buyers), 1, per_user_limit)
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
    order::migrate(&db)
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
                let place = match order::PlaceOrder::new(
                    &format!("buyer{}", i % buyers),
                    &format!("{tag}-{i}"),
                    &sku,
                    1,
                    1,
                ) {
                    Ok(p) => p,
                    Err(e) => return Outcome::Error(e.to_string()),
                };
                match order::write_pending(&db, &place, 1999, order::Policy::ReserveThenCommit)
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

/// Orders per statement of the order service's write batcher (`Intake::new` in
/// crates/order/src/app/intake.rs spawns it with at most 128 writes per batch, one batch in
/// flight per replica).
pub const ORDER_WRITE_BATCH: usize = 128;

/// The insert-batch mode's flags.
#[derive(clap::Args, Clone, Debug)]
pub struct InsertBatchArgs {
    /// Orders per statement of the insert-batch mode (1..=1000); default the order service's
    /// write batch.
    #[arg(long, default_value_t = ORDER_WRITE_BATCH)]
    pub insert_batch_size: usize,
    /// Batches the insert-batch mode writes at once (1..=64); default one, as the order
    /// service's writer (one batch in flight per replica).
    #[arg(long, default_value_t = 1)]
    pub insert_batches_in_flight: usize,
}

impl InsertBatchArgs {
    /// Refuses bad values, naming the flag.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            (1..=1000).contains(&self.insert_batch_size),
            "--insert-batch-size must be 1..=1000 (got {})",
            self.insert_batch_size
        );
        anyhow::ensure!(
            (1..=64).contains(&self.insert_batches_in_flight),
            "--insert-batches-in-flight must be 1..=64 (got {})",
            self.insert_batches_in_flight
        );
        Ok(())
    }
}

/// The order service's own batched write (`flashsale_order::testing::write_pending_batch`: many
/// PENDING orders, their history and their `order.created` outbox rows in one statement and one
/// commit) straight on PostgreSQL, in full batches of `batch` orders, `in_flight` batches at a
/// time: the ceiling of what the intake can write. `requests` counts orders (the last batch
/// may be short); the latencies are per batch statement, not per order.
pub async fn batched_insert(
    db: DatabaseConnection,
    load: &Load,
    sku: &str,
    batch: usize,
    in_flight: usize,
) -> anyhow::Result<Measurement> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    order::migrate(&db)
        .await
        .context("migrate the bench order database")?;
    refuse_foreign_orders(&db, "--insert-db").await?;
    db.execute_unprepared("TRUNCATE orders, order_status_history, outbox CASCADE")
        .await
        .context("empty the bench order tables")?;
    let batch = batch.max(1);
    let orders = load.requests;
    let calls = orders.div_ceil(batch);
    let written = Arc::new(AtomicUsize::new(0));
    let sent = Arc::new(AtomicUsize::new(0));
    let (db, sku, buyers) = (Arc::new(db), sku.to_owned(), load.buyers.max(1));
    let tag = Uuid::new_v4().simple().to_string();
    let name = format!("batched insert (PostgreSQL, {batch} per statement)");
    let mut m = drive(&name, calls, in_flight.max(1), load.deadline, {
        let (written, sent) = (written.clone(), sent.clone());
        move |c| {
            let (db, sku, tag) = (db.clone(), sku.clone(), tag.clone());
            let (written, sent) = (written.clone(), sent.clone());
            async move {
                let mut writes = Vec::with_capacity(batch);
                for i in c * batch..((c + 1) * batch).min(orders) {
                    match order::PlaceOrder::new(
                        &format!("buyer{}", i % buyers),
                        &format!("{tag}-{i}"),
                        &sku,
                        1,
                        1,
                    ) {
                        Ok(place) => writes.push(order::PendingWrite {
                            place,
                            unit_price_cents: 1999,
                            policy: order::Policy::ReserveThenCommit,
                            accepted_at: None,
                        }),
                        Err(e) => return Outcome::Error(e.to_string()),
                    }
                }
                sent.fetch_add(writes.len(), Ordering::Relaxed);
                match order::write_pending_batch(&db, writes).await {
                    Ok(answers) => {
                        let new = answers
                            .iter()
                            .filter(|w| matches!(w.inserted, order::Inserted::New))
                            .count();
                        written.fetch_add(new, Ordering::Relaxed);
                        if new == answers.len() {
                            Outcome::Accepted
                        } else {
                            Outcome::Error("orders not new".into())
                        }
                    }
                    Err(e) => Outcome::Error(e.to_string().chars().take(60).collect()),
                }
            }
        }
    })
    .await?;
    // Counted in orders, not batches.
    m.requests = sent.load(Ordering::Relaxed);
    m.accepted = written.load(Ordering::Relaxed);
    Ok(m)
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

#[cfg(test)]
mod tests {
    use flashsale_test_support::TestDatabase;

    use super::*;

    async fn count(db: &DatabaseConnection, sql: &str) -> i64 {
        db.query_one_raw(sea_orm::Statement::from_string(
            sea_orm::DatabaseBackend::Postgres,
            sql,
        ))
        .await
        .unwrap()
        .unwrap()
        .try_get::<i64>("", "n")
        .unwrap()
    }

    /// Each call of `calls` in turn, with the hot row's units after it.
    async fn sequence(
        db: &DatabaseConnection,
        variant: NaiveVariant,
        sku: &str,
        limit: i64,
        calls: &[(&str, &str)],
    ) -> Vec<(Outcome, i64)> {
        let mut out = Vec::new();
        for (user, request) in calls {
            let o = naive_call(db, variant, sku, user, request, limit).await;
            let left = count(
                db,
                &format!("SELECT available AS n FROM naive_stock WHERE sku = '{sku}'"),
            )
            .await;
            out.push((o, left));
        }
        out
    }

    #[tokio::test]
    async fn the_one_call_function_answers_as_the_naive_statement() {
        let accepted = Outcome::Accepted;
        let refused = |r: &str| Outcome::Refused(r.to_owned());
        for variant in NaiveVariant::ALL {
            let tdb = TestDatabase::create().await.unwrap();
            let db = tdb.connect().await.unwrap();
            // A limit of one per buyer, two units.
            prepare_naive(&db, 2, "BENCH-LIMITED").await.unwrap();
            let got = sequence(
                &db,
                variant,
                "BENCH-LIMITED",
                1,
                &[
                    ("b0", "r0"),
                    ("b0", "r1"),
                    ("b0", "r0"),
                    ("b1", "r2"),
                    ("b2", "r3"),
                ],
            )
            .await;
            assert_eq!(
                got,
                vec![
                    (accepted.clone(), 1),
                    (refused("USER_LIMIT"), 1),
                    // A replay of a buyer at the limit meets the limit first.
                    (refused("USER_LIMIT"), 1),
                    (accepted.clone(), 0),
                    (refused("SOLD_OUT"), 0),
                ],
                "{variant:?}"
            );
            let orders = count(&db, "SELECT count(*) AS n FROM orders").await;
            let history = count(&db, "SELECT count(*) AS n FROM order_status_history").await;
            assert_eq!((orders, history), (2, 2), "{variant:?}");
            // No limit: a replay takes no unit and writes nothing; sold out comes first after.
            prepare_naive(&db, 2, "BENCH-OPEN").await.unwrap();
            let got = sequence(
                &db,
                variant,
                "BENCH-OPEN",
                0,
                &[
                    ("b0", "r0"),
                    ("b0", "r0"),
                    ("b0", "r1"),
                    ("b1", "r2"),
                    ("b0", "r0"),
                ],
            )
            .await;
            assert_eq!(
                got,
                vec![
                    (accepted.clone(), 1),
                    (refused("REPLAY"), 1),
                    (accepted.clone(), 0),
                    (refused("SOLD_OUT"), 0),
                    (refused("SOLD_OUT"), 0),
                ],
                "{variant:?}"
            );
            let orders = count(&db, "SELECT count(*) AS n FROM orders").await;
            assert_eq!(orders, 2, "{variant:?}");
            db.close().await.ok();
        }
    }

    #[tokio::test]
    async fn both_variants_hold_the_stock_and_the_limit_under_concurrency() {
        for variant in NaiveVariant::ALL {
            for (stock, want) in [(10, 10), (30, 20)] {
                let tdb = TestDatabase::create().await.unwrap();
                let db = bench_db(&flashsale_test_support::postgres_server_url(), &tdb.name, 8)
                    .await
                    .unwrap();
                // 60 calls from 20 buyers, one unit each at most, 16 in flight.
                let load = Load {
                    requests: 60,
                    buyers: 20,
                    concurrency: 16,
                    connections: 1,
                    stock,
                    deadline: Duration::from_secs(60),
                };
                let m = naive_with(db.clone(), &load, "BENCH-RACE", 1, variant)
                    .await
                    .unwrap();
                assert_eq!(m.errored(), 0, "{variant:?} {:?}", m.errors);
                assert_eq!(m.accepted, want, "{variant:?} stock {stock}");
                assert_eq!(
                    m.refused.values().sum::<usize>(),
                    60 - want,
                    "{variant:?} {:?}",
                    m.refused
                );
                let buyers = count(&db, "SELECT count(DISTINCT user_id) AS n FROM orders").await;
                let left = count(&db, "SELECT available AS n FROM naive_stock").await;
                assert_eq!(
                    (buyers, left),
                    (want as i64, stock - want as i64),
                    "{variant:?}"
                );
                db.close().await.ok();
            }
        }
    }

    #[tokio::test]
    async fn the_batched_insert_writes_every_order_in_full_batches() {
        let tdb = TestDatabase::create().await.unwrap();
        let db = bench_db(&flashsale_test_support::postgres_server_url(), &tdb.name, 2)
            .await
            .unwrap();
        let load = Load {
            requests: 300,
            buyers: 50,
            concurrency: 64,
            connections: 1,
            stock: 1,
            deadline: Duration::from_secs(60),
        };
        let m = batched_insert(db.clone(), &load, "BENCH-BATCH", 128, 1)
            .await
            .unwrap();
        assert_eq!((m.requests, m.accepted, m.errored()), (300, 300, 0));
        // Three statements: 128, 128 and 44 orders.
        assert_eq!(m.latency_us.len(), 3);
        let orders = count(&db, "SELECT count(*) AS n FROM orders").await;
        let outbox = count(&db, "SELECT count(*) AS n FROM outbox").await;
        assert_eq!((orders, outbox), (300, 300));
        db.close().await.ok();
    }

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        batch: InsertBatchArgs,
    }

    #[test]
    fn bad_insert_batch_flags_are_refused_by_name() {
        use clap::Parser as _;
        for (flag, value) in [
            ("--insert-batch-size", "0"),
            ("--insert-batch-size", "1001"),
            ("--insert-batches-in-flight", "0"),
            ("--insert-batches-in-flight", "65"),
        ] {
            let cli = Cli::try_parse_from(["t", flag, value]).unwrap();
            let e = cli.batch.validate().unwrap_err().to_string();
            assert!(e.contains(flag), "{e}");
        }
        let cli = Cli::try_parse_from(["t"]).unwrap();
        cli.batch.validate().unwrap();
        assert_eq!(cli.batch.insert_batch_size, ORDER_WRITE_BATCH);
    }
}
