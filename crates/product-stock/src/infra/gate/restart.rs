//! Noticing that Redis came back with data from an earlier life (docs/architecture.md#operations).
//!
//! A Redis restarted from an RDB/AOF snapshot a few seconds old has every gate key back with
//! old values: nothing is missing, so no rebuild starts, yet `avail` counts units sold since the
//! snapshot. Every Redis start has a new `run_id` (`INFO server`); the gate records the one it
//! was built against, and a new connection that finds another one deletes every product's gate
//! so each rebuilds from the database like after a cache loss.

use std::sync::Arc;

use deadpool_redis::redis::{self, RedisError, RedisResult, aio::ConnectionLike};
use flashsale_platform::redis::{Conn, OnConnect, Pool};

use super::RedisGate;
use super::keys::{all_products_pattern, gate_run_key, validate_prefix};

/// Keys deleted per UNLINK (and asked for per SCAN step).
const DELETE_BATCH: usize = 1000;

/// Records `ARGV[2]` (this Redis's run id) only if the key still holds `ARGV[1]`, the earlier
/// run id this connection saw: of the connections (of every replica) that found the same stale
/// value, one wins. The deletion before it may run twice; a second one costs only a rebuild.
const CLAIM: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2])
  return 1
end
return 0
";

/// What a new connection found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunCheck {
    /// No run id recorded (a new or emptied Redis): recorded now; any missing gate rebuilds.
    Recorded,
    /// The run id recorded is this Redis's: nothing to do.
    Same,
    /// Another run id: Redis came back with data from an earlier life; every gate key under
    /// the prefix was deleted (`deleted` keys by this connection) and the run id recorded.
    Stale { deleted: u64, won: bool },
}

impl RedisGate {
    /// A pool for a gate under `key_prefix` that checks every new connection with
    /// [`check_redis_run`] before it serves (`pool_size` and URL from `settings`).
    pub fn pool(
        settings: &flashsale_platform::settings::RedisSettings,
        key_prefix: &str,
    ) -> anyhow::Result<Pool> {
        validate_prefix(key_prefix).map_err(anyhow::Error::new)?;
        flashsale_platform::redis::pool_with_hook(
            settings,
            flashsale_platform::redis::CHECK_AFTER_IDLE,
            Some(on_connect(key_prefix)),
        )
    }
}

/// The pool hook running [`check_redis_run`] on every new connection.
pub fn on_connect(key_prefix: &str) -> OnConnect {
    let prefix: Arc<str> = Arc::from(key_prefix);
    Arc::new(move |conn: &mut Conn| {
        let prefix = prefix.clone();
        Box::pin(async move {
            check_redis_run(conn, &prefix).await?;
            Ok(())
        })
    })
}

/// Compares the run id of the Redis behind `conn` with the one recorded under `key_prefix`,
/// and deletes every product's gate when they differ (see [`RunCheck`]).
pub async fn check_redis_run<C: ConnectionLike + Send>(
    conn: &mut C,
    key_prefix: &str,
) -> RedisResult<RunCheck> {
    let run_id = run_id(conn).await?;
    let key = gate_run_key(key_prefix);
    let recorded: Option<String> = redis::cmd("GET").arg(&key).query_async(conn).await?;
    let Some(recorded) = recorded else {
        // Another connection may have recorded it meanwhile: with this Redis's run id too.
        let _: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg(&run_id)
            .arg("NX")
            .query_async(conn)
            .await?;
        return Ok(RunCheck::Recorded);
    };
    if recorded == run_id {
        return Ok(RunCheck::Same);
    }
    // Delete before recording the new run id: until it is recorded, every new connection
    // (of this replica or another) deletes too, so none serves a stale gate meanwhile.
    let deleted = delete_all_gates(conn, key_prefix).await?;
    let won: i64 = redis::cmd("EVAL")
        .arg(CLAIM)
        .arg(1)
        .arg(&key)
        .arg(&recorded)
        .arg(&run_id)
        .query_async(conn)
        .await?;
    let won = won == 1;
    if won {
        tracing::warn!(
            earlier_run_id = %recorded,
            run_id = %run_id,
            deleted,
            "Redis came back with data from an earlier life (a stale snapshot): \
             every product's gate was dropped and rebuilds from the database"
        );
        metrics::counter!("flashsale_gate_stale_restarts_total").increment(1);
    }
    Ok(RunCheck::Stale { deleted, won })
}

/// The `run_id` line of `INFO server`.
async fn run_id<C: ConnectionLike + Send>(conn: &mut C) -> RedisResult<String> {
    let info: String = redis::cmd("INFO").arg("server").query_async(conn).await?;
    info.lines()
        .find_map(|line| line.strip_prefix("run_id:"))
        .map(|id| id.trim().to_owned())
        .filter(|id| !id.is_empty())
        .ok_or_else(|| {
            RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "INFO server has no run_id",
            ))
        })
}

/// SCAN + UNLINK of every key under `<prefix>stock:`, in batches; returns how many were deleted.
async fn delete_all_gates<C: ConnectionLike + Send>(
    conn: &mut C,
    key_prefix: &str,
) -> RedisResult<u64> {
    let pattern = all_products_pattern(key_prefix);
    let mut cursor: u64 = 0;
    let mut deleted = 0;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(DELETE_BATCH)
            .query_async(conn)
            .await?;
        for chunk in batch.chunks(DELETE_BATCH) {
            let n: u64 = redis::cmd("UNLINK").arg(chunk).query_async(conn).await?;
            deleted += n;
        }
        if next == 0 {
            return Ok(deleted);
        }
        cursor = next;
    }
}
