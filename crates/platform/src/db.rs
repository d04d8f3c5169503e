//! The service's own PostgreSQL database: created if missing, then connected as a pool.

use std::time::Duration;

use anyhow::Context as _;
use sea_orm::{ConnectOptions, ConnectionTrait, Database, DatabaseConnection, Statement};

use crate::settings::{DatabaseSettings, redact_url};

/// Creates the database named in `settings.url` when it does not exist yet (connecting to the
/// `postgres` maintenance database of the same server), then opens the pool.
pub async fn connect(settings: &DatabaseSettings) -> anyhow::Result<DatabaseConnection> {
    let url = with_sslmode(&settings.url)?;
    ensure_database(&url).await?;
    let mut opts = ConnectOptions::new(url);
    opts.max_connections(settings.max_connections)
        .min_connections(1)
        .connect_timeout(Duration::from_secs(5))
        .acquire_timeout(Duration::from_secs(5))
        .sqlx_logging(false);
    Database::connect(opts)
        .await
        .with_context(|| format!("connect to {}", redact_url(&settings.url)))
}

/// `url` with `sslmode=disable` when it names no `sslmode`: plain text is then what the URL
/// says, not a silent guess. `sslmode=require` (encrypted) or `verify-full` (encrypted, the
/// server's certificate checked against `sslrootcert` and its name) make TLS mandatory: a server
/// without TLS is then refused, never used in plain text. (`prefer` and `allow` may fall back.)
pub fn with_sslmode(url: &str) -> anyhow::Result<String> {
    let mut parsed = url::Url::parse(url).context("parse database.url")?;
    if !parsed.query_pairs().any(|(k, _)| k == "sslmode") {
        parsed.query_pairs_mut().append_pair("sslmode", "disable");
    }
    Ok(parsed.into())
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
            // Another replica may have created it at the same moment: it then exists already
            // (42P04) or its catalog row appears under ours (23505).
            Err(e) if created_meanwhile(&e) => {}
            Err(e) => return Err(e).context("create database"),
        }
    }
    admin.close().await.ok();
    Ok(())
}

fn created_meanwhile(e: &sea_orm::DbErr) -> bool {
    use sea_orm::{DbErr, RuntimeErr, sqlx::Error};
    match e {
        DbErr::Exec(RuntimeErr::SqlxError(s)) | DbErr::Query(RuntimeErr::SqlxError(s)) => {
            matches!(s.as_ref(), Error::Database(d) if matches!(d.code().as_deref(), Some("42P04" | "23505")))
        }
        _ => false,
    }
}

/// Fails, naming the `migrate` step, while `M` has migrations `db` has not applied: for a
/// service started with `database.migrate_on_start = false`, whose migrations a separate step
/// applies first (`flashsale-<service> migrate`, a Kubernetes init container).
pub async fn check_migrated<M: sea_orm_migration::MigratorTrait>(
    db: &DatabaseConnection,
    service: &str,
) -> anyhow::Result<()> {
    let pending = M::get_pending_migrations(db)
        .await
        .with_context(|| format!("read the {service} database's migrations"))?;
    if !pending.is_empty() {
        anyhow::bail!(
            "the {service} database has {} migration(s) not applied and database.migrate_on_start \
             is false: run `flashsale-{service} migrate` first",
            pending.len()
        );
    }
    Ok(())
}

/// How long a replica waits for another one's migrations before giving up.
const WAIT_FOR_MIGRATION_LOCK: &str = "SET lock_timeout = '300s'";

/// Applies the migrations `M` has not applied yet while holding `service`'s migration lock, and
/// returns how many it applied. Replicas starting together take turns: the first migrates, the
/// others wait (at most five minutes), then find nothing pending. The lock is a session-level
/// advisory lock on a connection of its own, taken out of the pool, so it is never left behind
/// on a pooled connection; if this process dies, the server drops the session and the lock.
pub async fn migrate<M: sea_orm_migration::MigratorTrait>(
    db: &DatabaseConnection,
    service: &str,
) -> anyhow::Result<usize> {
    use sea_orm::sqlx;
    let key = format!("flashsale/migrate/{service}");
    let mut lock = db
        .get_postgres_connection_pool()
        .acquire()
        .await
        .context("take a connection for the migration lock")?
        .detach();
    let locked = async {
        sqlx::query(WAIT_FOR_MIGRATION_LOCK)
            .execute(&mut lock)
            .await?;
        sqlx::query("SELECT pg_advisory_lock(hashtextextended($1, 0))")
            .bind(&key)
            .execute(&mut lock)
            .await
    }
    .await;
    if let Err(e) = locked {
        sea_orm::sqlx::Connection::close(lock).await.ok();
        return Err(e).with_context(|| format!("take the migration lock of {service}"));
    }
    let result = async {
        let pending = M::get_pending_migrations(db).await?.len();
        M::up(db, None).await?;
        Ok::<_, sea_orm::DbErr>(pending)
    }
    .await;
    // Closing the session releases the lock too; unlocking first says so at once.
    let _ = sqlx::query("SELECT pg_advisory_unlock(hashtextextended($1, 0))")
        .bind(&key)
        .execute(&mut lock)
        .await;
    sea_orm::sqlx::Connection::close(lock).await.ok();
    result.map_err(|e| anyhow::anyhow!("migrate {service} database: {e}"))
}

/// A multi-row `INSERT … VALUES (…), (…)` for PostgreSQL: each row's values become numbered
/// parameters, so callers never count placeholders.
#[derive(Debug)]
pub struct MultiRow {
    sql: String,
    values: Vec<sea_orm::Value>,
    rows: usize,
}

impl MultiRow {
    /// `head` is the statement up to and including `VALUES`, e.g.
    /// `"INSERT INTO inbox (consumer, message_id) VALUES"`.
    pub fn new(head: &str) -> Self {
        Self {
            sql: head.trim_end().to_owned(),
            values: Vec::new(),
            rows: 0,
        }
    }

    /// Appends one row; every row must have as many values as the statement has columns.
    pub fn row(&mut self, values: impl IntoIterator<Item = sea_orm::Value>) -> &mut Self {
        self.sql.push_str(if self.rows == 0 { " (" } else { ", (" });
        for (i, v) in values.into_iter().enumerate() {
            if i > 0 {
                self.sql.push_str(", ");
            }
            self.values.push(v);
            self.sql.push_str(&format!("${}", self.values.len()));
        }
        self.sql.push(')');
        self.rows += 1;
        self
    }

    /// Rows appended so far.
    pub fn len(&self) -> usize {
        self.rows
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// The statement, with `tail` (e.g. `"ON CONFLICT DO NOTHING"`) after the rows.
    pub fn finish(self, tail: &str) -> Statement {
        let sql = if tail.is_empty() {
            self.sql
        } else {
            format!("{} {tail}", self.sql)
        };
        Statement::from_sql_and_values(sea_orm::DatabaseBackend::Postgres, sql, self.values)
    }
}

/// Whether `e` says the database could not be reached or dropped the connection (the pool timed
/// out or is closed, the socket failed, the server is shutting down, starting up or out of
/// connections), as opposed to a query the database refused: a caller may try again later, and
/// the API answers `UNAVAILABLE` rather than `INTERNAL`.
pub fn unreachable(e: &sea_orm::DbErr) -> bool {
    use sea_orm::{DbErr, RuntimeErr};
    match e {
        DbErr::ConnectionAcquire(_) | DbErr::Conn(_) => true,
        DbErr::Exec(RuntimeErr::SqlxError(s)) | DbErr::Query(RuntimeErr::SqlxError(s)) => {
            sqlx_unreachable(s)
        }
        _ => false,
    }
}

fn sqlx_unreachable(e: &sea_orm::sqlx::Error) -> bool {
    use sea_orm::sqlx::Error;
    match e {
        Error::Io(_)
        | Error::Tls(_)
        | Error::Protocol(_)
        | Error::PoolTimedOut
        | Error::PoolClosed
        | Error::WorkerCrashed => true,
        // Class 08: connection exception; 57P01-03: admin/crash shutdown, cannot connect now;
        // 53300: too many connections.
        Error::Database(d) => d.code().is_some_and(|c| {
            c.starts_with("08") || matches!(c.as_ref(), "57P01" | "57P02" | "57P03" | "53300")
        }),
        _ => false,
    }
}

/// Whether a statement that failed with `e` may well succeed when simply tried again: the
/// database is out of reach ([`unreachable`]), or it gave the statement up for a passing reason
/// and rolled it back — cancelled (57014: `pg_cancel_backend`, `statement_timeout`), a lock it
/// could not take in time (55P03), a deadlock or serialization failure it chose this transaction
/// to lose (40P01, 40001), a commit whose outcome it cannot tell (40003), or short of a resource
/// (class 53: disk full, out of memory, too many connections). Nothing of the transaction was
/// applied; the API answers `UNAVAILABLE`, and the caller tries again later with the same key.
pub fn transient(e: &sea_orm::DbErr) -> bool {
    unreachable(e) || sqlstate(e).is_some_and(|c| transient_sqlstate(&c))
}

/// The SQLSTATE the database answered `e` with, if it answered one.
pub fn sqlstate(e: &sea_orm::DbErr) -> Option<String> {
    use sea_orm::{DbErr, RuntimeErr, sqlx::Error};
    match e {
        DbErr::Exec(RuntimeErr::SqlxError(s)) | DbErr::Query(RuntimeErr::SqlxError(s)) => {
            match s.as_ref() {
                Error::Database(d) => d.code().map(|c| c.into_owned()),
                _ => None,
            }
        }
        _ => None,
    }
}

/// The SQLSTATEs of [`transient`] (connection exceptions and shutdowns come from
/// [`unreachable`]).
fn transient_sqlstate(code: &str) -> bool {
    code.starts_with("53")
        || matches!(
            code,
            "57014" | "55P03" | "40001" | "40P01" | "40003" | "57P05"
        )
}

#[cfg(test)]
mod tests {
    use super::{MultiRow, with_sslmode};

    #[test]
    fn a_url_without_sslmode_says_plain_text_and_one_with_it_is_kept() {
        assert_eq!(
            with_sslmode("postgres://u@h:5432/db").unwrap(),
            "postgres://u@h:5432/db?sslmode=disable"
        );
        let tls = "postgres://u@h/db?sslmode=verify-full&sslrootcert=%2Fca.pem";
        assert_eq!(with_sslmode(tls).unwrap(), tls);
    }

    #[test]
    fn rows_are_numbered_in_order() {
        let mut m = MultiRow::new("INSERT INTO t (a, b) VALUES ");
        m.row([1i64.into(), "x".into()])
            .row([2i64.into(), "y".into()]);
        assert_eq!(m.len(), 2);
        let s = m.finish("ON CONFLICT DO NOTHING");
        assert_eq!(
            s.sql,
            "INSERT INTO t (a, b) VALUES ($1, $2), ($3, $4) ON CONFLICT DO NOTHING"
        );
        assert_eq!(s.values.map(|v| v.0.len()), Some(4));
    }

    fn test_url() -> String {
        let base = std::env::var("FLASHSALE_TEST_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".to_owned());
        format!("{}/postgres", base.trim_end_matches('/'))
    }

    async fn one_connection() -> sea_orm::DatabaseConnection {
        let mut opts = sea_orm::ConnectOptions::new(test_url());
        opts.max_connections(1)
            .min_connections(1)
            .sqlx_logging(false);
        sea_orm::Database::connect(opts)
            .await
            .expect("connect to the test PostgreSQL")
    }

    #[tokio::test]
    async fn a_refused_query_is_not_unreachable_but_a_dropped_connection_is() {
        use sea_orm::ConnectionTrait as _;
        let db = one_connection().await;
        let refused = db
            .execute_unprepared("SELECT * FROM no_such_table_here")
            .await
            .expect_err("the query must fail");
        assert!(!super::unreachable(&refused), "{refused:?}");
        // The server ends this very session mid-statement, as an operator's
        // pg_terminate_backend would.
        let dropped = db
            .execute_unprepared("SELECT pg_terminate_backend(pg_backend_pid())")
            .await
            .expect_err("the session was terminated");
        assert!(super::unreachable(&dropped), "{dropped:?}");
    }

    #[test]
    fn passing_failures_are_transient_and_refusals_are_not() {
        for code in [
            "57014", "55P03", "40001", "40P01", "40003", "53000", "53100", "53200", "53300",
            "53400", "57P05",
        ] {
            assert!(super::transient_sqlstate(code), "{code} is transient");
        }
        // A constraint, a syntax error, a missing table, a read-only transaction, a dropped
        // database: the same statement fails the same way again.
        for code in [
            "23505", "23514", "42601", "42P01", "25006", "57P04", "22003", "XX000",
        ] {
            assert!(!super::transient_sqlstate(code), "{code} is not transient");
        }
        assert!(!super::transient(&sea_orm::DbErr::Custom("a bug".into())));
        let pool_timeout =
            sea_orm::DbErr::ConnectionAcquire(sea_orm::error::ConnAcquireErr::Timeout);
        assert!(
            super::transient(&pool_timeout),
            "unreachable is transient too"
        );
    }

    #[tokio::test]
    async fn a_cancelled_statement_is_transient_but_a_refused_query_is_not() {
        use sea_orm::ConnectionTrait as _;
        let db = one_connection().await;
        let cancelled = db
            .execute_unprepared("SET statement_timeout = '10ms'; SELECT pg_sleep(5)")
            .await
            .expect_err("the statement times out");
        assert_eq!(super::sqlstate(&cancelled).as_deref(), Some("57014"));
        assert!(super::transient(&cancelled), "{cancelled:?}");
        assert!(!super::unreachable(&cancelled), "{cancelled:?}");
        db.execute_unprepared("RESET statement_timeout")
            .await
            .expect("reset the timeout");
        let refused = db
            .execute_unprepared("SELECT * FROM no_such_table_here")
            .await
            .expect_err("the query must fail");
        assert_eq!(super::sqlstate(&refused).as_deref(), Some("42P01"));
        assert!(!super::transient(&refused), "{refused:?}");
    }

    #[tokio::test]
    async fn a_server_that_is_not_there_is_unreachable() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut opts =
            sea_orm::ConnectOptions::new(format!("postgres://postgres@127.0.0.1:{port}/postgres"));
        opts.connect_timeout(std::time::Duration::from_secs(2))
            .sqlx_logging(false);
        let e = sea_orm::Database::connect(opts)
            .await
            .expect_err("nothing listens there");
        assert!(super::unreachable(&e), "{e:?}");
        let pool_timeout =
            sea_orm::DbErr::ConnectionAcquire(sea_orm::error::ConnAcquireErr::Timeout);
        assert!(super::unreachable(&pool_timeout));
        assert!(!super::unreachable(&sea_orm::DbErr::Custom("a bug".into())));
    }
}
