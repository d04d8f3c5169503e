//! Noticing that Redis came back with data from an earlier life (docs/architecture.md#operations).
//!
//! A Redis restarted from an RDB/AOF snapshot a few seconds old has every gate key back with
//! old values: nothing is missing, so no rebuild starts, yet `avail` counts units sold since the
//! snapshot. Every Redis start has a new `run_id` (`INFO server`); the gate records the one it
//! was built against, and a new connection that finds another one deletes every product's gate
//! so each rebuilds from the database like after a cache loss.
//!
//! On a Redis Cluster the same holds per master: each master's run id is recorded in a key that
//! lives on that master (a hash tag of its first slot), next to the gates it serves. A master
//! restarted from a stale snapshot, and a replica promoted after its master failed (its own run
//! id; replication is asynchronous, so it may miss the master's last writes), both answer with
//! another run id than the one recorded: the gates on that master are deleted and rebuild from
//! the database and the order service's acknowledged orders, the other masters' gates stay.
//! A cluster connection reconnects to a new master on its own, without a new pool connection,
//! so in cluster mode the check also runs periodically ([`RedisGate::watch_redis_runs`]).

use std::{sync::Arc, time::Duration};

use deadpool_redis::redis::{self, FromRedisValue as _, RedisError, RedisResult};
use flashsale_platform::redis::{Conn, KeyScan, Node, OnConnect, Pool};

use super::RedisGate;
use super::keys::{all_products_pattern, gate_run_key, node_run_key, validate_prefix};

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

/// What a new connection found (on a cluster: over every master).
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

impl RunCheck {
    /// One answer for several masters: any stale one makes it stale.
    fn and(self, other: Self) -> Self {
        match (self, other) {
            (Self::Stale { deleted: a, won: x }, Self::Stale { deleted: b, won: y }) => {
                Self::Stale {
                    deleted: a + b,
                    won: x || y,
                }
            }
            (stale @ Self::Stale { .. }, _) | (_, stale @ Self::Stale { .. }) => stale,
            (Self::Recorded, _) | (_, Self::Recorded) => Self::Recorded,
            (Self::Same, Self::Same) => Self::Same,
        }
    }
}

impl RedisGate {
    /// A pool for a gate under `key_prefix` that checks every new connection with
    /// [`check_redis_run`] before it serves (pool size, URL or cluster nodes from `settings`).
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

    /// Runs [`check_redis_run`] every `period` until `shutdown`, on a connection of the pool.
    /// For a cluster, where a failover reaches existing connections without a new one.
    pub async fn watch_redis_runs(
        self,
        period: Duration,
        shutdown: flashsale_platform::shutdown::Shutdown,
    ) -> anyhow::Result<()> {
        flashsale_platform::shutdown::every(period, shutdown, "redis run check", || async {
            let mut conn = self.conn().await.map_err(anyhow::Error::new)?;
            check_redis_run(&mut conn, &self.prefix)
                .await
                .map_err(anyhow::Error::new)
        })
        .await
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

/// Compares the run id of the Redis behind `conn` (of each master, on a cluster) with the one
/// recorded under `key_prefix`, and deletes every product's gate (on that master) when they
/// differ (see [`RunCheck`]).
pub async fn check_redis_run(conn: &mut Conn, key_prefix: &str) -> RedisResult<RunCheck> {
    let masters = conn.masters().await?;
    let cluster = conn.is_cluster();
    let mut found = RunCheck::Same;
    for node in &masters {
        let key = if cluster {
            let Some(key) = node
                .first_slot()
                .and_then(|slot| node_run_key(key_prefix, slot))
            else {
                continue;
            };
            key
        } else {
            gate_run_key(key_prefix)
        };
        found = found.and(check_node(conn, node, &key, key_prefix).await?);
    }
    Ok(found)
}

/// [`check_redis_run`] of one master, whose run id is recorded under `key` (a key it serves).
async fn check_node(
    conn: &mut Conn,
    node: &Node,
    key: &str,
    key_prefix: &str,
) -> RedisResult<RunCheck> {
    let run_id = run_id(conn, node).await?;
    let recorded: Option<String> = redis::cmd("GET").arg(key).query_async(conn).await?;
    let Some(recorded) = recorded else {
        // Another connection may have recorded it meanwhile: with this Redis's run id too.
        let _: Option<String> = redis::cmd("SET")
            .arg(key)
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
    let deleted = delete_all_gates(conn, node, key_prefix).await?;
    let won: i64 = redis::cmd("EVAL")
        .arg(CLAIM)
        .arg(1)
        .arg(key)
        .arg(&recorded)
        .arg(&run_id)
        .query_async(conn)
        .await?;
    let won = won == 1;
    if won {
        tracing::warn!(
            earlier_run_id = %recorded,
            run_id = %run_id,
            node = %node.addr(),
            deleted,
            "Redis came back with data from an earlier life (a stale snapshot, or a replica \
             promoted after a failover): every product's gate it served was dropped and \
             rebuilds from the database"
        );
        metrics::counter!("flashsale_gate_stale_restarts_total").increment(1);
    }
    Ok(RunCheck::Stale { deleted, won })
}

/// The `run_id` line of `INFO server` of `node`.
async fn run_id(conn: &mut Conn, node: &Node) -> RedisResult<String> {
    let reply = conn
        .query_node(node, redis::cmd("INFO").arg("server"))
        .await?;
    let info = String::from_redis_value(reply)?;
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

/// SCAN (of `node`) + UNLINK of every key under `<prefix>stock:`, in batches; returns how many
/// were deleted.
async fn delete_all_gates(conn: &mut Conn, node: &Node, key_prefix: &str) -> RedisResult<u64> {
    let pattern = all_products_pattern(key_prefix);
    let mut scan = KeyScan::on(std::slice::from_ref(node), &pattern, DELETE_BATCH);
    let mut deleted = 0;
    while let Some(batch) = scan.next_batch(conn).await? {
        for chunk in batch.chunks(DELETE_BATCH) {
            // On a cluster the client splits it by slot.
            let n: u64 = redis::cmd("UNLINK").arg(chunk).query_async(conn).await?;
            deleted += n;
        }
    }
    Ok(deleted)
}
