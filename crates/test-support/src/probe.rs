//! Reading a service's database from a test: counts, waiting for a count, and the events in its
//! outbox (the producer side of the event contract).

use std::time::Duration;

use flashsale_proto::events::v1::Envelope;
use prost::Message as _;
use sea_orm::{DatabaseConnection, FromQueryResult, Statement};

/// The single `n` column of `sql` as an i64 (0 when no row).
pub async fn count(conn: &DatabaseConnection, sql: &str) -> anyhow::Result<i64> {
    #[derive(FromQueryResult)]
    struct N {
        n: i64,
    }
    Ok(N::find_by_statement(Statement::from_string(
        sea_orm::DatabaseBackend::Postgres,
        sql,
    ))
    .one(conn)
    .await?
    .map_or(0, |r| r.n))
}

/// Polls until `sql` counts `want`; the error tells the last count.
pub async fn wait_count(
    conn: &DatabaseConnection,
    sql: &str,
    want: i64,
    timeout: Duration,
) -> anyhow::Result<()> {
    let waited = crate::eventually(timeout, sql, || async {
        (count(conn, sql).await.ok() == Some(want)).then_some(())
    })
    .await;
    if waited.is_err() {
        let last = count(conn, sql).await?;
        anyhow::bail!("waited for {want} from `{sql}`; last count {last}");
    }
    Ok(())
}

/// The envelopes in the outbox whose type (or routing key) is `kind`, or all with `None`, in
/// the order they were written.
pub async fn outbox(
    conn: &DatabaseConnection,
    kind: Option<&str>,
) -> anyhow::Result<Vec<Envelope>> {
    #[derive(FromQueryResult)]
    struct Row {
        payload: Vec<u8>,
    }
    let stmt = Statement::from_sql_and_values(
        conn.get_database_backend(),
        "SELECT payload FROM outbox WHERE $1::text IS NULL OR routing_key = $1 OR message_type = $1 ORDER BY id",
        [kind.map(str::to_owned).into()],
    );
    Row::find_by_statement(stmt)
        .all(conn)
        .await?
        .into_iter()
        .map(|r| Envelope::decode(r.payload.as_slice()).map_err(anyhow::Error::new))
        .collect()
}
