//! The `dead_letters` table (see [`CreateDeadLetters`](crate::migration::CreateDeadLetters)).

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};
use sqlx::{PgPool, Postgres, Row as _, Transaction, postgres::PgRow};
use uuid::Uuid;

use super::{PARKED_GAUGE, parked::Parked, token::Cursor};

/// A parked row as `ListDeadLetters` shows it.
#[derive(Debug)]
pub(crate) struct Listed {
    pub(crate) id: i64,
    pub(crate) queue: String,
    pub(crate) message_id: Uuid,
    pub(crate) routing_key: String,
    pub(crate) message_type: String,
    pub(crate) error: String,
    pub(crate) attempts: i32,
    pub(crate) parked_at: DateTime<Utc>,
    pub(crate) payload: Vec<u8>,
}

/// A parked row locked for a replay.
#[derive(Debug)]
pub(crate) struct Locked {
    pub(crate) id: i64,
    pub(crate) message_id: Uuid,
    pub(crate) routing_key: String,
    pub(crate) message_type: String,
    pub(crate) headers: Map<String, Value>,
    pub(crate) payload: Vec<u8>,
}

/// Whether `e` means the database cannot be reached (as opposed to a bad statement or row).
pub(crate) fn unreachable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::BeginFailed => true,
        // Connection exception, insufficient resources, operator intervention (shutdown).
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|c| c.starts_with("08") || c.starts_with("53") || c.starts_with("57")),
        _ => false,
    }
}

/// Stores `p` unless this parking is stored already (a redelivery) or the message is parked
/// already under the same id (a duplicate publish); returns the id when a row was added.
///
/// Without an id, one is derived from the queue, the parking time and the bytes, so a
/// redelivery of an undecodable message derives the same one.
pub(crate) async fn insert(pool: &PgPool, p: &Parked) -> Result<Option<Uuid>, sqlx::Error> {
    let row = sqlx::query(
        "INSERT INTO dead_letters \
             (queue, message_id, routing_key, message_type, error, attempts, parked_at, payload, headers, \
              correlation_id) \
         VALUES ($1, COALESCE($2, md5(convert_to($1 || '/' || $10, 'UTF8') || $8)::uuid), \
                 $3, $4, $5, $6, $7, $8, $9::jsonb, $11) \
         ON CONFLICT DO NOTHING \
         RETURNING message_id",
    )
    .bind(&p.queue)
    .bind(p.message_id)
    .bind(&p.routing_key)
    .bind(&p.message_type)
    .bind(&p.error)
    .bind(p.attempts)
    .bind(p.parked_at)
    .bind(&p.payload)
    .bind(Value::Object(p.headers.clone()).to_string())
    .bind(p.parked_at.timestamp_micros().to_string())
    // The order it is about, when the bytes are an envelope.
    .bind(
        crate::envelope::decode(&p.payload)
            .map(|env| env.correlation_id)
            .unwrap_or_default(),
    )
    .fetch_optional(pool)
    .await?;
    row.map(|r| r.try_get("message_id")).transpose()
}

/// Up to `limit` parked rows of `queues` after `after`, oldest first.
pub(crate) async fn list(
    pool: &PgPool,
    queues: &[String],
    after: Option<Cursor>,
    limit: i64,
) -> Result<Vec<Listed>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT id, queue, message_id, routing_key, message_type, error, attempts, parked_at, payload \
         FROM dead_letters \
         WHERE state = 'PARKED' AND queue = ANY($1) \
           AND ($2::timestamptz IS NULL OR (parked_at, id) > ($2, $3)) \
         ORDER BY parked_at, id LIMIT $4",
    )
    .bind(queues)
    .bind(after.map(|c| c.parked_at))
    .bind(after.map_or(0, |c| c.id))
    .bind(limit)
    .fetch_all(pool)
    .await?;
    rows.iter().map(listed).collect()
}

fn listed(r: &PgRow) -> Result<Listed, sqlx::Error> {
    Ok(Listed {
        id: r.try_get("id")?,
        queue: r.try_get("queue")?,
        message_id: r.try_get("message_id")?,
        routing_key: r.try_get("routing_key")?,
        message_type: r.try_get("message_type")?,
        error: r.try_get("error")?,
        attempts: r.try_get("attempts")?,
        parked_at: r.try_get("parked_at")?,
        payload: r.try_get("payload")?,
    })
}

/// The highest row id so far: a replay of "all" stops there, so it cannot chase messages
/// parked again while it runs.
pub(crate) async fn max_id(pool: &PgPool) -> Result<i64, sqlx::Error> {
    sqlx::query("SELECT coalesce(max(id), 0) AS n FROM dead_letters")
        .fetch_one(pool)
        .await?
        .try_get("n")
}

/// Locks up to `limit` parked rows of `queue` (all of them, or those with `ids`), oldest
/// first; rows another replay holds are skipped.
pub(crate) async fn lock_parked(
    tx: &mut Transaction<'_, Postgres>,
    queue: &str,
    ids: Option<&[Uuid]>,
    max_id: i64,
    limit: i64,
) -> Result<Vec<Locked>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT id, message_id, routing_key, message_type, headers::text AS headers, payload \
         FROM dead_letters \
         WHERE state = 'PARKED' AND queue = $1 AND id <= $2 \
           AND ($3::uuid[] IS NULL OR message_id = ANY($3)) \
         ORDER BY parked_at, id LIMIT $4 \
         FOR UPDATE SKIP LOCKED",
    )
    .bind(queue)
    .bind(max_id)
    .bind(ids)
    .bind(limit)
    .fetch_all(&mut **tx)
    .await?;
    rows.iter()
        .map(|r| {
            let headers: String = r.try_get("headers")?;
            Ok(Locked {
                id: r.try_get("id")?,
                message_id: r.try_get("message_id")?,
                routing_key: r.try_get("routing_key")?,
                message_type: r.try_get("message_type")?,
                headers: serde_json::from_str(&headers).unwrap_or_default(),
                payload: r.try_get("payload")?,
            })
        })
        .collect()
}

/// Marks rows replayed by `by`.
pub(crate) async fn mark_replayed(
    tx: &mut Transaction<'_, Postgres>,
    ids: &[i64],
    by: &str,
) -> Result<(), sqlx::Error> {
    if ids.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "UPDATE dead_letters SET state = 'REPLAYED', resolved_at = now(), resolved_by = $2 \
         WHERE id = ANY($1)",
    )
    .bind(ids)
    .bind(by)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Marks the parked rows of `queue` (all, or those with `ids`) discarded by `by` for `reason`;
/// returns their message ids.
pub(crate) async fn discard(
    pool: &PgPool,
    queue: &str,
    ids: Option<&[Uuid]>,
    by: &str,
    reason: &str,
) -> Result<Vec<Uuid>, sqlx::Error> {
    let rows = sqlx::query(
        "UPDATE dead_letters \
         SET state = 'DISCARDED', resolved_at = now(), resolved_by = $3, resolved_reason = $4 \
         WHERE state = 'PARKED' AND queue = $1 AND ($2::uuid[] IS NULL OR message_id = ANY($2)) \
         RETURNING message_id",
    )
    .bind(queue)
    .bind(ids)
    .bind(by)
    .bind(reason)
    .fetch_all(pool)
    .await?;
    rows.iter().map(|r| r.try_get("message_id")).collect()
}

/// Sets the `flashsale_dead_letters_parked` gauge of each of `queues`.
pub(crate) async fn refresh_gauge(pool: &PgPool, queues: &[String]) -> Result<(), sqlx::Error> {
    let rows = sqlx::query(
        "SELECT queue, count(*) AS n FROM dead_letters \
         WHERE state = 'PARKED' AND queue = ANY($1) GROUP BY queue",
    )
    .bind(queues)
    .fetch_all(pool)
    .await?;
    for q in queues {
        let mut n = 0i64;
        for r in &rows {
            if r.try_get::<String, _>("queue")? == *q {
                n = r.try_get("n")?;
            }
        }
        // Exact below 2^53 parked messages.
        metrics::gauge!(PARKED_GAUGE, "queue" => q.clone()).set(n as f64);
    }
    Ok(())
}

/// Deletes replayed and discarded rows resolved more than `older_than` ago; returns how many.
pub(crate) async fn purge_resolved(
    pool: &PgPool,
    older_than: Duration,
) -> Result<u64, sqlx::Error> {
    let r = sqlx::query(
        "DELETE FROM dead_letters WHERE resolved_at < now() - make_interval(secs => $1)",
    )
    .bind(older_than.as_secs_f64())
    .execute(pool)
    .await?;
    Ok(r.rows_affected())
}
