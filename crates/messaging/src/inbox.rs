//! The inbox: a consumer's record of the messages whose effects it committed, so a redelivered
//! or republished message is applied once.
//!
//! Call [`claim`] first thing inside the handler's own transaction; when it returns `false`
//! the message is a duplicate: commit nothing else and return `Ok`. The claim commits (or rolls
//! back) together with the effects, so "processed" never gets ahead of "applied".

use std::time::Duration;

use sea_orm::{ConnectionTrait, DbErr, Statement};
use uuid::Uuid;

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
/// replay window); returns how many.
pub async fn purge<C: ConnectionTrait>(conn: &C, older_than: Duration) -> Result<u64, DbErr> {
    let stmt = Statement::from_sql_and_values(
        conn.get_database_backend(),
        "DELETE FROM inbox WHERE processed_at < now() - make_interval(secs => $1)",
        [older_than.as_secs_f64().into()],
    );
    Ok(conn.execute_raw(stmt).await?.rows_affected())
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
