//! The transactional outbox: an event is a row written in the same transaction as the state
//! change it reports; the [`OutboxRelay`] publishes committed rows. No dual writes: a rolled-back
//! transaction leaves no event, a committed one is published at least once.

mod relay;

use std::time::Duration;

use flashsale_proto::events::v1::Envelope;
use sea_orm::{ConnectionTrait, DbErr, Statement};

pub use relay::{
    BACKLOG_ROWS, FP_AFTER_PUBLISH, FP_BEFORE_MARK, OLDEST_AGE_SECONDS, OutboxRelay,
    PUBLISH_DELAY_SECONDS, RelayOptions,
};

use crate::{envelope, topology::DelayQueue, trace};

/// Where a row goes: `exchange` `None` means the relay's configured event exchange.
struct Target<'a> {
    exchange: Option<&'a str>,
    routing_key: &'a str,
}

/// Trace propagation headers captured where an event was caused, for events written later by
/// someone else (e.g. a batch written on behalf of many callers): see
/// [`trace::current_headers`].
pub type TraceHeaders = std::collections::BTreeMap<String, String>;

/// The current span's trace context, to hand to whoever writes this caller's events later:
/// [`trace::current_headers`].
pub fn current_trace() -> TraceHeaders {
    trace::current_headers()
}

/// Writes `env` to the outbox, to be published on the event exchange with its type as routing
/// key. Call it inside the transaction that makes the state change; it captures the current
/// span's trace context.
pub async fn enqueue<C: ConnectionTrait>(conn: &C, env: &Envelope) -> Result<(), DbErr> {
    enqueue_many(conn, std::slice::from_ref(env)).await
}

/// [`enqueue`] for several envelopes in one multi-row insert.
pub async fn enqueue_many<C: ConnectionTrait>(conn: &C, envs: &[Envelope]) -> Result<(), DbErr> {
    let rows: Vec<_> = envs
        .iter()
        .map(|e| {
            let target = Target {
                exchange: None,
                routing_key: &e.r#type,
            };
            (e, target, None)
        })
        .collect();
    insert(conn, &rows).await
}

/// [`enqueue_many`] where each envelope carries the trace headers of its own cause (captured
/// with [`trace::current_headers`] in the caller's span), and
/// `delay` — when set — sends every row through that delay queue.
pub async fn enqueue_many_traced<C: ConnectionTrait>(
    conn: &C,
    envs: &[(Envelope, TraceHeaders)],
    delay: Option<&DelayQueue>,
) -> Result<(), DbErr> {
    let rows: Vec<_> = envs
        .iter()
        .map(|(e, h)| {
            let target = match delay {
                Some(q) => Target {
                    exchange: Some(""),
                    routing_key: q.name(),
                },
                None => Target {
                    exchange: None,
                    routing_key: &e.r#type,
                },
            };
            (e, target, Some(h))
        })
        .collect();
    insert(conn, &rows).await
}

/// Writes `env` to the outbox for `queue`: after the queue's delay it reaches the consumers of
/// its routing key.
pub async fn enqueue_delayed<C: ConnectionTrait>(
    conn: &C,
    env: &Envelope,
    queue: &DelayQueue,
) -> Result<(), DbErr> {
    enqueue_to(conn, env, "", queue.name()).await
}

/// Writes `env` to the outbox for an explicit `exchange` (`""` = default exchange) and
/// `routing_key`.
pub async fn enqueue_to<C: ConnectionTrait>(
    conn: &C,
    env: &Envelope,
    exchange: &str,
    routing_key: &str,
) -> Result<(), DbErr> {
    let target = Target {
        exchange: Some(exchange),
        routing_key,
    };
    insert(conn, &[(env, target, None)]).await
}

/// The outbox columns of events bound for the event exchange, as arrays, for a caller that
/// writes them inside its own statement, together with the rows they report in one round trip
/// ([`insert_keyed_sql`] is the insert; [`EventColumns::bind`] its parameters). Each carries the
/// trace context of its own cause.
#[derive(Clone, Debug, Default)]
pub struct EventColumns {
    pub message_ids: Vec<uuid::Uuid>,
    /// Also the routing key.
    pub message_types: Vec<String>,
    pub payloads: Vec<Vec<u8>>,
    /// JSON objects, as text.
    pub headers: Vec<String>,
    /// The envelopes' correlation ids (the order each event is about).
    pub correlation_ids: Vec<String>,
}

/// The `INSERT INTO outbox` of events keyed by the rows of another part of the caller's
/// statement: a data-modifying CTE `cte` returning a uuid column `key_column`. Only the events
/// whose key is among those rows are inserted (a row the statement skipped drops its event).
/// Its six parameters, from `$first` on, are [`EventColumns::bind`]'s. Build it once and keep
/// the text constant, so the statement is prepared once per connection.
pub fn insert_keyed_sql(first: usize, cte: &str, key_column: &str) -> String {
    let p = |i: usize| format!("${}", first + i);
    format!(
        "INSERT INTO outbox \
             (message_id, exchange, routing_key, message_type, payload, headers, correlation_id) \
         SELECT e.message_id, NULL, e.message_type, e.message_type, e.payload, e.headers::jsonb, \
             e.correlation_id \
         FROM unnest({}::uuid[], {}::uuid[], {}::text[], {}::bytea[], {}::text[], {}::text[]) \
             AS e(key, message_id, message_type, payload, headers, correlation_id) \
         JOIN {cte} ON {cte}.{key_column} = e.key",
        p(0),
        p(1),
        p(2),
        p(3),
        p(4),
        p(5),
    )
}

impl EventColumns {
    /// The six parameters of [`insert_keyed_sql`]: `keys[i]` is the key of event `i`.
    pub fn bind(self, keys: Vec<uuid::Uuid>) -> [sea_orm::Value; 6] {
        [
            keys.into(),
            self.message_ids.into(),
            self.message_types.into(),
            self.payloads.into(),
            self.headers.into(),
            self.correlation_ids.into(),
        ]
    }

    /// The columns of `envs`, each with the trace headers of its cause (each checked as
    /// [`enqueue`] would).
    pub fn of<'a>(
        envs: impl IntoIterator<Item = (Envelope, &'a TraceHeaders)>,
    ) -> Result<Self, DbErr> {
        let mut c = Self::default();
        for (env, headers) in envs {
            let id = envelope::check(&env).map_err(|e| DbErr::Custom(format!("outbox: {e}")))?;
            c.message_ids.push(id);
            c.message_types.push(env.r#type.clone());
            c.payloads.push(envelope::encode(&env));
            c.headers.push(headers_json(headers).to_string());
            c.correlation_ids.push(env.correlation_id);
        }
        Ok(c)
    }
}

/// Rows with `None` headers carry the current span's trace context.
async fn insert<C: ConnectionTrait>(
    conn: &C,
    rows: &[(&Envelope, Target<'_>, Option<&TraceHeaders>)],
) -> Result<(), DbErr> {
    if rows.is_empty() {
        return Ok(());
    }
    let current = headers_json(&trace::current_headers());
    let mut insert = flashsale_platform::db::MultiRow::new(
        "INSERT INTO outbox \
         (message_id, exchange, routing_key, message_type, payload, headers, correlation_id) VALUES",
    );
    for (env, target, own) in rows {
        let id = envelope::check(env).map_err(|e| DbErr::Custom(format!("outbox: {e}")))?;
        insert.row([
            id.into(),
            target.exchange.map(str::to_owned).into(),
            target.routing_key.to_owned().into(),
            env.r#type.clone().into(),
            envelope::encode(env).into(),
            own.map_or_else(|| current.clone(), headers_json).into(),
            env.correlation_id.clone().into(),
        ]);
    }
    conn.execute_raw(insert.finish("")).await?;
    Ok(())
}

/// Trace headers as the JSON object of the outbox's `headers` column.
fn headers_json(h: &TraceHeaders) -> serde_json::Value {
    serde_json::Value::Object(
        h.iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
            .collect(),
    )
}

/// Deletes rows published more than `older_than` ago; returns how many.
pub async fn purge_published<C: ConnectionTrait>(
    conn: &C,
    older_than: Duration,
) -> Result<u64, DbErr> {
    let secs = older_than.as_secs_f64();
    let stmt = Statement::from_sql_and_values(
        conn.get_database_backend(),
        "DELETE FROM outbox WHERE published_at < now() - make_interval(secs => $1)",
        [secs.into()],
    );
    Ok(conn.execute_raw(stmt).await?.rows_affected())
}

/// Rows not yet published (a health/lag gauge for operators).
pub async fn pending<C: ConnectionTrait>(conn: &C) -> Result<i64, DbErr> {
    let stmt = Statement::from_string(
        conn.get_database_backend(),
        "SELECT count(*) AS n FROM outbox WHERE published_at IS NULL",
    );
    match conn.query_one_raw(stmt).await? {
        Some(row) => row.try_get::<i64>("", "n"),
        None => Ok(0),
    }
}
