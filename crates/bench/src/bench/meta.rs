//! What a kept report must say about where it was measured: the commit, the machine (CPU
//! model, cores, memory, kernel), the servers' versions and the settings that move their
//! figures. Whatever cannot be read is `null`, never a guess.

use std::time::Duration;

use sea_orm::{ConnectionTrait, Database, Statement};
use serde_json::{Map, Value, json};

use super::amqp_version;

/// PostgreSQL settings that change what a write costs.
const PG_SETTINGS: [&str; 12] = [
    "max_connections",
    "shared_buffers",
    "work_mem",
    "synchronous_commit",
    "fsync",
    "full_page_writes",
    "wal_level",
    "wal_buffers",
    "commit_delay",
    "checkpoint_timeout",
    "max_wal_size",
    "track_counts",
];
/// Redis settings that change what a command costs.
const REDIS_SETTINGS: [&str; 5] = [
    "appendonly",
    "appendfsync",
    "save",
    "maxmemory",
    "io-threads",
];

/// [`collect`] from the servers the environment names (`FLASHSALE_BENCH_POSTGRES_URL`,
/// `FLASHSALE_BENCH_REDIS_URL`, `FLASHSALE_BENCH_AMQP_URL`), else the development ones: for
/// `flashsale sale`, which talks only to the services.
pub async fn from_env() -> Value {
    let var =
        |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_owned());
    collect(
        &var(
            "FLASHSALE_BENCH_POSTGRES_URL",
            "postgres://postgres@127.0.0.1:5432",
        ),
        &var("FLASHSALE_BENCH_REDIS_URL", "redis://127.0.0.1:6379"),
        &var(
            "FLASHSALE_BENCH_AMQP_URL",
            "amqp://guest:guest@127.0.0.1:5672/%2f",
        ),
    )
    .await
}

pub async fn collect(postgres_url: &str, redis_url: &str, amqp_url: &str) -> Value {
    let (commit, dirty) = commit();
    json!({
        "generated_at": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "commit": commit,
        "commit_dirty": dirty,
        "machine": machine(),
        "postgres": postgres(postgres_url).await,
        "redis": redis(redis_url).await,
        "rabbitmq": amqp_version::probe(amqp_url, Duration::from_secs(5)).await,
    })
}

/// The commit the bench was built from, as the script that ran it says
/// (`FLASHSALE_BENCH_COMMIT`), else as git says of the working directory; and whether the
/// tree had changes not committed (`FLASHSALE_BENCH_DIRTY`, or git).
fn commit() -> (Option<String>, Option<bool>) {
    let from_env = std::env::var("FLASHSALE_BENCH_COMMIT")
        .ok()
        .filter(|c| !c.is_empty() && c.len() <= 64 && c.bytes().all(|b| b.is_ascii_hexdigit()));
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let commit = from_env.or_else(|| git(&["rev-parse", "HEAD"]));
    let dirty = match std::env::var("FLASHSALE_BENCH_DIRTY").ok().as_deref() {
        Some("1" | "true") => Some(true),
        Some("0" | "false") => Some(false),
        _ => git(&["status", "--porcelain", "--untracked-files=no"]).map(|s| !s.is_empty()),
    };
    (commit, dirty)
}

fn machine() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok();
    let m = parse_machine(&cpuinfo, &meminfo);
    json!({
        "cpu_model": m.cpu_model,
        "cpus_online": m.cpus,
        "cores_available": std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        "memory_mib": m.memory_mib,
        "kernel": kernel.map(|k| k.trim().to_owned()),
        "os": std::env::consts::OS,
        "arch": std::env::consts::ARCH,
    })
}

/// The machine as `/proc/cpuinfo` and `/proc/meminfo` describe it.
#[derive(Debug, PartialEq)]
pub struct Machine {
    pub cpu_model: Option<String>,
    pub cpus: usize,
    pub memory_mib: Option<u64>,
}

pub fn parse_machine(cpuinfo: &str, meminfo: &str) -> Machine {
    let field = |line: &str, name: &str| {
        line.split_once(':')
            .filter(|(k, _)| k.trim() == name)
            .map(|(_, v)| v.trim().to_owned())
    };
    Machine {
        cpu_model: cpuinfo.lines().find_map(|l| field(l, "model name")),
        cpus: cpuinfo
            .lines()
            .filter(|l| field(l, "processor").is_some())
            .count(),
        memory_mib: meminfo.lines().find_map(|l| {
            field(l, "MemTotal")
                .and_then(|v| v.trim_end_matches("kB").trim().parse::<u64>().ok())
                .map(|kb| kb / 1024)
        }),
    }
}

async fn postgres(url: &str) -> Value {
    let read = async {
        let db = Database::connect(format!("{url}/postgres")).await.ok()?;
        let version = db
            .query_one_raw(Statement::from_string(
                sea_orm::DatabaseBackend::Postgres,
                "SELECT current_setting('server_version') AS v",
            ))
            .await
            .ok()??
            .try_get::<String>("", "v")
            .ok();
        let names: Vec<String> = PG_SETTINGS.iter().map(|n| format!("'{n}'")).collect();
        let rows = db
            .query_all_raw(Statement::from_string(
                sea_orm::DatabaseBackend::Postgres,
                format!(
                    "SELECT name, setting || COALESCE(' ' || unit, '') AS value FROM pg_settings \
                     WHERE name IN ({}) ORDER BY name",
                    names.join(", ")
                ),
            ))
            .await
            .ok()?;
        let settings: Map<String, Value> = rows
            .iter()
            .filter_map(|r| {
                Some((
                    r.try_get::<String>("", "name").ok()?,
                    json!(r.try_get::<String>("", "value").ok()?),
                ))
            })
            .collect();
        db.close().await.ok();
        Some(json!({ "version": version, "settings": settings }))
    };
    read.await.unwrap_or(Value::Null)
}

async fn redis(url: &str) -> Value {
    let read = async {
        let client = deadpool_redis::redis::Client::open(url).ok()?;
        let mut conn = client.get_multiplexed_async_connection().await.ok()?;
        let info: String = deadpool_redis::redis::cmd("INFO")
            .arg("server")
            .query_async(&mut conn)
            .await
            .ok()?;
        let version = info
            .lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .map(|v| v.trim().to_owned());
        let mut settings = Map::new();
        for name in REDIS_SETTINGS {
            // CONFIG may be renamed or refused on a managed server: the setting is then null.
            let pair: Option<Vec<String>> = deadpool_redis::redis::cmd("CONFIG")
                .arg("GET")
                .arg(name)
                .query_async(&mut conn)
                .await
                .ok();
            let value = pair.and_then(|p| p.get(1).cloned());
            settings.insert(name.to_owned(), json!(value));
        }
        Some(json!({ "version": version, "settings": settings }))
    };
    read.await.unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_machine_is_read_from_cpuinfo_and_meminfo() {
        let cpuinfo = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t: fpu\n\nprocessor\t: 1\nmodel name\t: AMD EPYC 7B13\n";
        let meminfo = "MemTotal:       24634804 kB\nMemFree:        1 kB\n";
        assert_eq!(
            parse_machine(cpuinfo, meminfo),
            Machine {
                cpu_model: Some("AMD EPYC 7B13".into()),
                cpus: 2,
                memory_mib: Some(24_057),
            }
        );
        assert_eq!(
            parse_machine("", "garbage"),
            Machine {
                cpu_model: None,
                cpus: 0,
                memory_mib: None
            }
        );
    }

    #[tokio::test]
    async fn the_servers_report_their_versions_and_settings() {
        let pg = std::env::var("FLASHSALE_TEST_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into());
        let redis_url = std::env::var("FLASHSALE_TEST_REDIS_URL")
            .unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
        let p = postgres(&pg).await;
        assert!(p["version"].as_str().is_some_and(|v| !v.is_empty()), "{p}");
        assert!(p["settings"]["max_connections"].as_str().is_some(), "{p}");
        let r = redis(&redis_url).await;
        assert!(r["version"].as_str().is_some_and(|v| !v.is_empty()), "{r}");
        // An unreachable server is null, not an error.
        assert_eq!(
            postgres("postgres://postgres@127.0.0.1:1").await,
            Value::Null
        );
    }
}
