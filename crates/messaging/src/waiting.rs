//! Messages of a saga that are waiting somewhere in this service: written to its outbox but not
//! yet published, or parked in its dead-letter store. An operator looking at a stuck order
//! (docs/architecture.md#operations) wants the event that would move it on.
//!
//! Neither table has a correlation column: the envelope's `correlation_id` (the order id) is
//! inside the stored bytes. The query narrows the rows to those whose bytes contain one of the
//! ids, then each candidate is decoded and kept only if its `correlation_id` really is that id.
//! Only unpublished outbox rows and parked dead letters are read, both normally few.

use chrono::{DateTime, Utc};
use flashsale_proto::events::v1::Envelope;
use prost::Message as _;
use sea_orm::{ConnectionTrait, DbErr, FromQueryResult, Statement, Value};
use uuid::Uuid;

/// Where a waiting message is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// In the outbox, not yet published.
    Outbox,
    /// Parked in the dead-letter store by one of this service's consumers.
    DeadLetter,
}

/// A message waiting in this service for one correlation id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiting {
    pub correlation_id: String,
    pub place: Place,
    pub message_id: Uuid,
    /// The event type (routing key), e.g. `order.paid`.
    pub message_type: String,
    /// The consumer queue it was parked from; empty for the outbox.
    pub queue: String,
    /// The last error: why the broker refused the row, or why the consumer gave up.
    pub error: String,
    pub attempts: i32,
    /// When it was written (outbox) or parked (dead letter).
    pub at: DateTime<Utc>,
}

#[derive(FromQueryResult)]
struct Row {
    candidate: String,
    message_id: Uuid,
    message_type: String,
    queue: String,
    error: String,
    attempts: i32,
    at: DateTime<Utc>,
    payload: Vec<u8>,
}

const OUTBOX: &str = "SELECT ids.c AS candidate, o.message_id, o.message_type, '' AS queue, \
     COALESCE(o.last_error, '') AS error, o.attempts, o.created_at AS at, o.payload \
     FROM outbox o JOIN unnest($1::text[]) AS ids(c) \
       ON position(convert_to(ids.c, 'UTF8') IN o.payload) > 0 \
     WHERE o.published_at IS NULL ORDER BY o.id";

const DEAD_LETTERS: &str = "SELECT ids.c AS candidate, d.message_id, d.message_type, d.queue, \
     d.error, d.attempts, d.parked_at AS at, d.payload \
     FROM dead_letters d JOIN unnest($1::text[]) AS ids(c) \
       ON position(convert_to(ids.c, 'UTF8') IN d.payload) > 0 \
     WHERE d.state = 'PARKED' ORDER BY d.parked_at, d.id";

/// Unpublished outbox rows and parked dead letters whose envelope's `correlation_id` is one of
/// `correlation_ids`, outbox rows first, each group oldest first.
pub async fn for_correlations<C: ConnectionTrait>(
    conn: &C,
    correlation_ids: &[String],
) -> Result<Vec<Waiting>, DbErr> {
    if correlation_ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut found = Vec::new();
    for (sql, place) in [(OUTBOX, Place::Outbox), (DEAD_LETTERS, Place::DeadLetter)] {
        let ids: Value = correlation_ids.to_vec().into();
        let rows = Row::find_by_statement(Statement::from_sql_and_values(
            conn.get_database_backend(),
            sql,
            [ids],
        ))
        .all(conn)
        .await?;
        found.extend(rows.into_iter().filter_map(|r| {
            // The bytes only contained the id; the envelope must say it is its saga.
            let env = Envelope::decode(r.payload.as_slice()).ok()?;
            (env.correlation_id == r.candidate).then_some(Waiting {
                correlation_id: r.candidate,
                place,
                message_id: r.message_id,
                message_type: r.message_type,
                queue: r.queue,
                error: r.error,
                attempts: r.attempts,
                at: r.at,
            })
        }));
    }
    Ok(found)
}
