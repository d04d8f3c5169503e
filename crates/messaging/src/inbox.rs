//! The inbox: a consumer's record of the messages whose effects it committed, so a redelivered
//! or republished message is applied once.
//!
//! Call [`claim`] first thing inside the handler's own transaction; when it returns `false`
//! the message is a duplicate: commit nothing else and return `Ok`. The claim commits (or rolls
//! back) together with the effects, so "processed" never gets ahead of "applied".
//!
//! Every service runs [`run_purger`], so the table holds about `amqp.inbox_retention_hours` of
//! messages instead of every message ever processed.

use std::time::Duration;

use flashsale_platform::shutdown::Shutdown;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, Statement};
use uuid::Uuid;

/// Counter: inbox rows the purger deleted.
pub const PURGED_TOTAL: &str = "flashsale_inbox_purged_total";

/// Records `message_id` as processed by `consumer`; `false` when it already was (a duplicate).
///
/// A concurrent claim of the same id in another transaction waits for that transaction: if it
/// commits this returns `false`, if it rolls back this claim wins.
pub async fn claim<C: ConnectionTrait>(
    conn: &C,
    consumer: &str,
    message_id: Uuid,
) -> Result<bool, DbErr> {
    let stmt = Statement::from_sql_and_values(
        conn.get_database_backend(),
        "INSERT INTO inbox (consumer, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        [consumer.into(), message_id.into()],
    );
    Ok(conn.execute_raw(stmt).await?.rows_affected() == 1)
}

/// Deletes inbox rows older than `older_than` (keep it well above the longest redelivery or
/// replay window) in one statement; returns how many. The scheduled [`run_purger`] deletes in
/// small batches instead, which keeps each statement's locks and WAL short.
pub async fn purge<C: ConnectionTrait>(conn: &C, older_than: Duration) -> Result<u64, DbErr> {
    let stmt = Statement::from_sql_and_values(
        conn.get_database_backend(),
        "DELETE FROM inbox WHERE processed_at < now() - make_interval(secs => $1)",
        [older_than.as_secs_f64().into()],
    );
    Ok(conn.execute_raw(stmt).await?.rows_affected())
}

/// How [`run_purger`] works: see the `amqp.inbox_*` keys in [`crate::AmqpConfig`].
#[derive(Clone, Copy, Debug)]
pub struct PurgeOptions {
    /// Rows older than this are deleted.
    pub retention: Duration,
    /// Most rows one statement deletes.
    pub batch: u32,
    /// How often a purge pass runs.
    pub interval: Duration,
    /// Pause between two batches of one pass, so a large backlog (the first pass after an
    /// upgrade) is worked off without starving the consumers' claims of I/O.
    pub pause: Duration,
}

impl Default for PurgeOptions {
    fn default() -> Self {
        Self {
            retention: Duration::from_secs(7 * 24 * 3_600),
            batch: 1_000,
            interval: Duration::from_secs(60),
            pause: Duration::from_millis(100),
        }
    }
}

/// Deletes at most `batch` inbox rows older than `older_than`, oldest first; returns how many.
/// Rows another replica's purger is deleting at the same time are skipped, not waited for.
pub async fn purge_batch<C: ConnectionTrait>(
    conn: &C,
    older_than: Duration,
    batch: u32,
) -> Result<u64, DbErr> {
    let stmt = Statement::from_sql_and_values(
        conn.get_database_backend(),
        "DELETE FROM inbox WHERE (consumer, message_id) IN ( \
             SELECT consumer, message_id FROM inbox \
             WHERE processed_at < now() - make_interval(secs => $1) \
             ORDER BY processed_at LIMIT $2 FOR UPDATE SKIP LOCKED)",
        [older_than.as_secs_f64().into(), i64::from(batch).into()],
    );
    Ok(conn.execute_raw(stmt).await?.rows_affected())
}

/// One purge pass: [`purge_batch`] until a batch comes back short or `shutdown` is triggered,
/// pausing between batches; returns how many rows it deleted.
pub async fn purge_pass(
    db: &DatabaseConnection,
    options: &PurgeOptions,
    shutdown: &Shutdown,
) -> Result<u64, DbErr> {
    let mut total = 0;
    loop {
        let n = purge_batch(db, options.retention, options.batch).await?;
        total += n;
        metrics::counter!(PURGED_TOTAL).increment(n);
        if n < u64::from(options.batch) || shutdown.is_triggered() {
            break;
        }
        tokio::select! {
            () = shutdown.wait() => break,
            () = tokio::time::sleep(options.pause) => {}
        }
    }
    if total > 0 {
        tracing::info!(purged = total, "old inbox rows purged");
    }
    Ok(total)
}

/// Runs a [`purge_pass`] every `options.interval` until `shutdown` (a failed pass is logged and
/// tried again at the next tick).
pub async fn run_purger(
    db: DatabaseConnection,
    options: PurgeOptions,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let s = shutdown.clone();
    flashsale_platform::shutdown::every(options.interval, shutdown, "inbox purge", || {
        purge_pass(&db, &options, &s)
    })
    .await
}

/// [`claim`] for many messages of one consumer in one statement; returns how many were new
/// (all of them, unless some were processed before or appear twice).
pub async fn claim_many<C: ConnectionTrait>(
    conn: &C,
    consumer: &str,
    message_ids: &[Uuid],
) -> Result<usize, DbErr> {
    if message_ids.is_empty() {
        return Ok(0);
    }
    let mut insert =
        flashsale_platform::db::MultiRow::new("INSERT INTO inbox (consumer, message_id) VALUES");
    for id in message_ids {
        insert.row([consumer.into(), (*id).into()]);
    }
    let done = conn
        .execute_raw(insert.finish("ON CONFLICT DO NOTHING"))
        .await?;
    Ok(usize::try_from(done.rows_affected()).unwrap_or(usize::MAX))
}
