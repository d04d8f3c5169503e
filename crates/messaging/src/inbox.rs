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
use flashsale_proto::events::v1::Envelope;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, Statement};
use uuid::Uuid;

/// Counter: inbox rows the purger deleted.
pub const PURGED_TOTAL: &str = "flashsale_inbox_purged_total";

/// A message as the inbox records it: its id (the key) and, for an order's timeline, what it
/// was about, which delivery applied it and the trace it carried.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Claim {
    pub message_id: Uuid,
    /// The envelope's correlation id (the order id, or a sku).
    pub correlation_id: String,
    /// The event type.
    pub message_type: String,
    /// The delivery that applied it: 1 for the first.
    pub attempt: u32,
    /// The trace id (32 hex digits) the delivery carried; empty when none.
    pub trace_id: String,
}

impl Claim {
    /// The claim of `env` delivered for the `attempt`th time with trace context `trace` (the
    /// delivery's headers, or [`crate::outbox::current_trace`] in its span).
    pub fn of(
        env: &Envelope,
        attempt: u32,
        trace: &crate::outbox::TraceHeaders,
    ) -> Result<Self, crate::envelope::DecodeError> {
        Ok(Self {
            message_id: crate::envelope::message_id(env)?,
            correlation_id: env.correlation_id.clone(),
            message_type: env.r#type.clone(),
            attempt,
            trace_id: crate::trace::trace_id(trace).unwrap_or_default(),
        })
    }

    /// The claim of `env` by a handler running in the delivery's own span: its attempt is the
    /// one the consumer is running ([`current_attempt`]), its trace the span's.
    pub fn current(env: &Envelope) -> Result<Self, crate::envelope::DecodeError> {
        Self::of(env, current_attempt(), &crate::outbox::current_trace())
    }
}

/// A bare id: nothing known of the message but its key.
impl From<Uuid> for Claim {
    fn from(message_id: Uuid) -> Self {
        Self {
            message_id,
            attempt: 1,
            ..Self::default()
        }
    }
}

tokio::task_local! {
    static ATTEMPT: u32;
}

/// Runs `fut` as the handling of a message's `attempt`th delivery ([`current_attempt`] in it).
/// The consumer does it for every handler; a batch that falls back to handling its deliveries
/// one by one does it for each of them.
pub async fn with_attempt<F: std::future::Future>(attempt: u32, fut: F) -> F::Output {
    ATTEMPT.scope(attempt, fut).await
}

/// The delivery attempt being handled (1 outside [`with_attempt`]).
pub fn current_attempt() -> u32 {
    ATTEMPT.try_with(|a| *a).unwrap_or(1)
}

/// Records a message as processed by `consumer`; `false` when it already was (a duplicate).
///
/// A concurrent claim of the same id in another transaction waits for that transaction: if it
/// commits this returns `false`, if it rolls back this claim wins.
pub async fn claim<C: ConnectionTrait>(
    conn: &C,
    consumer: &str,
    message: impl Into<Claim>,
) -> Result<bool, DbErr> {
    Ok(claim_many(conn, consumer, &[message.into()]).await? == 1)
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
    messages: &[Claim],
) -> Result<usize, DbErr> {
    if messages.is_empty() {
        return Ok(0);
    }
    let mut insert = flashsale_platform::db::MultiRow::new(
        "INSERT INTO inbox (consumer, message_id, correlation_id, message_type, attempt, trace_id) \
         VALUES",
    );
    for m in messages {
        insert.row([
            consumer.into(),
            m.message_id.into(),
            m.correlation_id.clone().into(),
            m.message_type.clone().into(),
            i32::try_from(m.attempt).unwrap_or(i32::MAX).into(),
            m.trace_id.clone().into(),
        ]);
    }
    let done = conn
        .execute_raw(insert.finish("ON CONFLICT DO NOTHING"))
        .await?;
    Ok(usize::try_from(done.rows_affected()).unwrap_or(usize::MAX))
}
