//! The servers' own work counters, read before and after a stretch of the run: PostgreSQL's
//! transactions and tuples (`pg_stat_database` for every database, `pg_stat_user_tables`
//! summed for the databases named) and Redis's commands (`INFO commandstats`). Their difference
//! is what the servers did in between, whoever asked.
//!
//! PostgreSQL publishes a backend's counters when its transaction ends, but at most once a
//! second; a backend that goes idle with counters pending publishes them within
//! [`PG_STATS_SETTLE`]. A reading is therefore only complete that long after the work.

use std::{collections::BTreeMap, time::Duration};

use anyhow::Context as _;
use sea_orm::{ConnectionTrait, Database, DatabaseConnection, Statement};
use serde_json::{Map, Value, json};

/// How long after the last work PostgreSQL's counters are surely published (its idle flush
/// interval is 10 s).
pub const PG_STATS_SETTLE: Duration = Duration::from_secs(11);

/// The counters at one moment, by name (`pg.xact_commit`, `pg.tables.n_tup_ins`,
/// `redis.calls`, `redis.cmd.evalsha`, …).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Counters(pub BTreeMap<String, i64>);

/// Where a reading keeps one database's `pg_stat_database` counter (`pgdb/<name>/<column>`);
/// [`Counters::since`] sums their differences into `pg.<column>`.
const PER_DATABASE: &str = "pgdb/";

/// The `pg_stat_database` columns summed over every database.
const DATABASE_COLUMNS: [&str; 7] = [
    "xact_commit",
    "xact_rollback",
    "tup_returned",
    "tup_fetched",
    "tup_inserted",
    "tup_updated",
    "tup_deleted",
];
/// The `pg_stat_user_tables` columns summed over the named databases' tables.
const TABLE_COLUMNS: [&str; 6] = [
    "seq_scan",
    "idx_scan",
    "n_tup_ins",
    "n_tup_upd",
    "n_tup_del",
    "n_tup_hot_upd",
];

/// Where the counters are read.
pub struct Sources {
    /// The PostgreSQL server's `postgres` database (for `pg_stat_database`).
    pub pg_admin: DatabaseConnection,
    /// The databases whose tables are summed, by name.
    pub pg_databases: Vec<(String, DatabaseConnection)>,
    pub redis: deadpool_redis::redis::Client,
}

impl Sources {
    pub async fn connect(
        postgres_url: &str,
        databases: &[String],
        redis_url: &str,
    ) -> anyhow::Result<Self> {
        let open = |url: String| async move {
            let mut opts = sea_orm::ConnectOptions::new(url);
            opts.max_connections(1).sqlx_logging(false);
            Database::connect(opts).await
        };
        let pg_admin = open(format!("{postgres_url}/postgres"))
            .await
            .context("connect to PostgreSQL for its statistics")?;
        let mut pg_databases = Vec::new();
        for name in databases {
            let db = open(format!("{postgres_url}/{name}"))
                .await
                .with_context(|| format!("connect to database {name} for its statistics"))?;
            pg_databases.push((name.clone(), db));
        }
        let redis = deadpool_redis::redis::Client::open(redis_url)
            .context("Redis URL for its command statistics")?;
        Ok(Self {
            pg_admin,
            pg_databases,
            redis,
        })
    }

    pub async fn read(&self) -> anyhow::Result<Counters> {
        let mut out = BTreeMap::new();
        // Per database: a database dropped between two readings (another client's) must not
        // take its counts out of the sum; `since` pairs them database by database.
        let cols: Vec<String> = DATABASE_COLUMNS
            .iter()
            .map(|c| format!("{c}::bigint AS {c}"))
            .collect();
        let rows = self
            .pg_admin
            .query_all_raw(Statement::from_string(
                sea_orm::DatabaseBackend::Postgres,
                format!(
                    "SELECT datname, {} FROM pg_stat_database WHERE datname IS NOT NULL",
                    cols.join(", ")
                ),
            ))
            .await?;
        for row in rows {
            let db: String = row.try_get("", "datname")?;
            for c in DATABASE_COLUMNS {
                out.insert(
                    format!("{PER_DATABASE}{db}/{c}"),
                    row.try_get::<i64>("", c)?,
                );
            }
        }
        let sums: Vec<String> = TABLE_COLUMNS
            .iter()
            .map(|c| format!("COALESCE(sum({c}), 0)::bigint AS {c}"))
            .collect();
        let sql = format!("SELECT {} FROM pg_stat_user_tables", sums.join(", "));
        for c in TABLE_COLUMNS {
            out.insert(format!("pg.tables.{c}"), 0);
        }
        for (name, db) in &self.pg_databases {
            let row = db
                .query_one_raw(Statement::from_string(
                    sea_orm::DatabaseBackend::Postgres,
                    sql.clone(),
                ))
                .await
                .with_context(|| format!("pg_stat_user_tables of {name}"))?
                .context("pg_stat_user_tables answered no row")?;
            for c in TABLE_COLUMNS {
                *out.entry(format!("pg.tables.{c}")).or_default() += row.try_get::<i64>("", c)?;
            }
        }
        let mut conn = self
            .redis
            .get_multiplexed_async_connection()
            .await
            .context("connect to Redis for its command statistics")?;
        let info: String = deadpool_redis::redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await
            .context("INFO commandstats")?;
        out.extend(parse_commandstats(&info));
        out.extend(self.statements().await);
        Ok(Counters(out))
    }

    /// `pg_stat_statements` per database, where the server has it loaded: the statements run
    /// (`pgss/<db>/calls`) and their execution time (`pgss/<db>/exec_us`) by everyone but the
    /// bench's own role ([`PROBE_ROLE`]), whose statements are `pgss_probe/<db>/calls`. Nothing
    /// when the view is missing.
    async fn statements(&self) -> BTreeMap<String, i64> {
        let sql = format!(
            "SELECT d.datname, COALESCE(r.rolname = '{PROBE_ROLE}', false) AS probe, \
                    sum(s.calls)::bigint AS calls, \
                    (sum(s.total_exec_time) * 1000)::bigint AS exec_us \
             FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid \
             LEFT JOIN pg_roles r ON r.oid = s.userid GROUP BY 1, 2"
        );
        let Ok(rows) = self
            .pg_admin
            .query_all_raw(Statement::from_string(
                sea_orm::DatabaseBackend::Postgres,
                sql,
            ))
            .await
        else {
            return BTreeMap::new();
        };
        let mut out = BTreeMap::new();
        out.insert(STATEMENTS_AVAILABLE.to_owned(), 1);
        for row in rows {
            let (Ok(db), Ok(probe), Ok(calls), Ok(exec_us)) = (
                row.try_get::<String>("", "datname"),
                row.try_get::<bool>("", "probe"),
                row.try_get::<i64>("", "calls"),
                row.try_get::<i64>("", "exec_us"),
            ) else {
                continue;
            };
            if probe {
                out.insert(format!("{PROBE_STATEMENTS}{db}/calls"), calls);
            } else {
                out.insert(format!("{STATEMENTS}{db}/calls"), calls);
                out.insert(format!("{STATEMENTS}{db}/exec_us"), exec_us);
            }
        }
        out
    }
}

impl Sources {
    /// Empties `pg_stat_statements` (the bench's private server only: the statements of a
    /// window are then what [`Self::top_statements`] lists). Nothing where it is missing.
    pub async fn reset_statements(&self) {
        let _ = self
            .pg_admin
            .execute_unprepared("SELECT pg_stat_statements_reset()")
            .await;
    }

    /// The `n` statements run most often in each of `dbs` (`(owner, database)`), by everyone
    /// but the bench's own role, since the last reset: `(owner, calls, query)`, the query's
    /// text cut at 160 characters. Empty where `pg_stat_statements` is missing.
    pub async fn top_statements(
        &self,
        dbs: &[(String, String)],
        n: usize,
    ) -> Vec<(String, i64, String)> {
        let mut out = Vec::new();
        for (owner, db) in dbs {
            let sql = format!(
                "SELECT s.calls::bigint AS calls, left(regexp_replace(s.query, '\\s+', ' ', 'g'), 160) AS query \
                 FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid \
                 LEFT JOIN pg_roles r ON r.oid = s.userid \
                 WHERE d.datname = $1 AND r.rolname IS DISTINCT FROM '{PROBE_ROLE}' \
                 ORDER BY s.calls DESC LIMIT {n}"
            );
            let Ok(rows) = self
                .pg_admin
                .query_all_raw(Statement::from_sql_and_values(
                    sea_orm::DatabaseBackend::Postgres,
                    sql,
                    [db.clone().into()],
                ))
                .await
            else {
                continue;
            };
            for row in rows {
                if let (Ok(calls), Ok(query)) = (
                    row.try_get::<i64>("", "calls"),
                    row.try_get::<String>("", "query"),
                ) {
                    out.push((owner.clone(), calls, query));
                }
            }
        }
        out
    }
}

/// The role the bench's own reads of the services' databases run as (scripts/bench.sh creates
/// it on its private server): the statement counts leave its statements out.
pub const PROBE_ROLE: &str = "flashsale_bench_probe";
/// Where a reading keeps one database's statement counts (`pgss/<db>/calls`, `…/exec_us`).
pub const STATEMENTS: &str = "pgss/";
/// The bench's own statements per database (`pgss_probe/<db>/calls`).
pub const PROBE_STATEMENTS: &str = "pgss_probe/";
/// Present (1) in a reading taken where `pg_stat_statements` could be read.
pub const STATEMENTS_AVAILABLE: &str = "pgss.available";

/// `redis.calls` (every command) and `redis.cmd.<name>` from `INFO commandstats`
/// (`cmdstat_get:calls=12,usec=…`); lines it does not understand are left out.
pub fn parse_commandstats(info: &str) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    let mut total = 0;
    for line in info.lines() {
        let Some((name, fields)) = line
            .trim()
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        let calls = fields
            .split(',')
            .find_map(|f| f.strip_prefix("calls="))
            .and_then(|n| n.parse::<i64>().ok());
        if let Some(calls) = calls {
            total += calls;
            out.insert(format!("redis.cmd.{name}"), calls);
        }
    }
    out.insert("redis.calls".into(), total);
    out
}

impl Counters {
    /// `self - before`, counter by counter (a counter missing before counts from 0), with each
    /// database's `pg_stat_database` differences summed into `pg.<column>` over the databases
    /// in `self` (one dropped in between is left out; one created counts from 0).
    pub fn since(&self, before: &Counters) -> Counters {
        let mut out = BTreeMap::new();
        for c in DATABASE_COLUMNS {
            out.insert(format!("pg.{c}"), 0);
        }
        for (k, v) in &self.0 {
            let d = v - before.0.get(k).copied().unwrap_or(0);
            match k
                .strip_prefix(PER_DATABASE)
                .and_then(|rest| rest.rsplit_once('/'))
            {
                Some((_, column)) => *out.entry(format!("pg.{column}")).or_default() += d,
                None => {
                    out.insert(k.clone(), d);
                }
            }
        }
        Counters(out)
    }

    /// What a stretch did beyond the background of an equally long quiet stretch: `self -
    /// background`, counter by counter.
    pub fn beyond(&self, background: &Counters) -> Counters {
        let mut keys: Vec<&String> = self.0.keys().chain(background.0.keys()).collect();
        keys.sort();
        keys.dedup();
        Counters(
            keys.into_iter()
                .map(|k| {
                    let v = self.0.get(k).copied().unwrap_or(0)
                        - background.0.get(k).copied().unwrap_or(0);
                    (k.clone(), v)
                })
                .collect(),
        )
    }

    pub fn get(&self, name: &str) -> i64 {
        self.0.get(name).copied().unwrap_or(0)
    }

    /// The counters, leaving out the per-command ones that did not move.
    pub fn to_json(&self) -> Value {
        Value::Object(
            self.0
                .iter()
                .filter(|(k, v)| !k.starts_with("redis.cmd.") || **v != 0)
                .map(|(k, v)| (k.clone(), json!(v)))
                .collect::<Map<_, _>>(),
        )
    }

    /// Each counter divided by `n` (per refused request, say).
    pub fn per(&self, n: usize) -> Value {
        let n = n.max(1) as f64;
        Value::Object(
            self.0
                .iter()
                .filter(|(k, v)| !k.starts_with("redis.cmd.") || **v != 0)
                .map(|(k, v)| {
                    (
                        k.clone(),
                        json!((*v as f64 / n * 10_000.0).round() / 10_000.0),
                    )
                })
                .collect::<Map<_, _>>(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commandstats_are_counted_per_command_and_in_total() {
        let info = "# Commandstats\r\ncmdstat_get:calls=12,usec=30,usec_per_call=2.50,rejected_calls=0,failed_calls=0\r\n\
                    cmdstat_evalsha:calls=3,usec=90,usec_per_call=30.00\r\ncmdstat_bad:usec=1\r\ngarbage\r\n";
        let c = parse_commandstats(info);
        assert_eq!(c["redis.cmd.get"], 12);
        assert_eq!(c["redis.cmd.evalsha"], 3);
        assert_eq!(c["redis.calls"], 15);
        assert!(!c.contains_key("redis.cmd.bad"));
    }

    #[test]
    fn a_stretch_beyond_its_background_is_the_difference_of_the_differences() {
        let at = |pairs: &[(&str, i64)]| {
            Counters(pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect())
        };
        let a = at(&[("pg.xact_commit", 100), ("redis.calls", 10)]);
        let b = at(&[("pg.xact_commit", 130), ("redis.calls", 1_010)]);
        let c = at(&[("pg.xact_commit", 160), ("redis.calls", 1_012)]);
        let net = b.since(&a).beyond(&c.since(&b));
        assert_eq!(net.get("pg.xact_commit"), 0);
        assert_eq!(net.get("redis.calls"), 998);
        assert_eq!(net.per(1_000)["redis.calls"], json!(0.998));
    }

    #[test]
    fn a_database_dropped_between_two_readings_leaves_the_sum_alone() {
        let at = |pairs: &[(&str, i64)]| {
            Counters(pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect())
        };
        let before = at(&[
            ("pgdb/a/xact_commit", 100),
            ("pgdb/gone/xact_commit", 5_000),
        ]);
        let after = at(&[("pgdb/a/xact_commit", 103), ("pgdb/new/xact_commit", 2)]);
        let d = after.since(&before);
        assert_eq!(d.get("pg.xact_commit"), 5);
        assert_eq!(d.get("pg.tup_inserted"), 0);
        assert!(d.0.keys().all(|k| !k.starts_with(PER_DATABASE)), "{d:?}");
    }

    #[tokio::test]
    async fn the_servers_counters_move_with_work_done_on_them() -> anyhow::Result<()> {
        let pg = std::env::var("FLASHSALE_TEST_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into());
        let redis = std::env::var("FLASHSALE_TEST_REDIS_URL")
            .unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
        let sources = Sources::connect(&pg, &["postgres".into()], &redis).await?;
        let before = sources.read().await?;
        let mut conn = sources.redis.get_multiplexed_async_connection().await?;
        for _ in 0..5 {
            let _: Option<String> = deadpool_redis::redis::cmd("GET")
                .arg(format!("fs_counters_test:{}", uuid::Uuid::new_v4()))
                .query_async(&mut conn)
                .await?;
        }
        // The reading's own transaction publishes when it ends; the statistics of this
        // backend are flushed on demand.
        sources
            .pg_admin
            .execute_unprepared("SELECT pg_stat_force_next_flush()")
            .await?;
        let after = sources.read().await?;
        let d = after.since(&before);
        assert!(d.get("redis.cmd.get") >= 5, "{d:?}");
        assert!(d.get("pg.xact_commit") >= 1, "{d:?}");
        Ok(())
    }
}
