//! `SCAN` over every master: on a Redis Cluster each master answers only for its own keys, so a
//! scan visits each in turn (one server: that server).

use deadpool_redis::redis::{self, FromRedisValue, RedisResult};

use super::{Conn, Node};

/// A `SCAN … MATCH pattern` over every master the cluster had when it started. Keys written
/// meanwhile may or may not be seen (as with `SCAN` on one server); a slot that moves to another
/// master mid-scan may be missed or seen twice.
#[derive(Debug)]
pub struct KeyScan {
    pattern: String,
    count: usize,
    nodes: Vec<Node>,
    node: usize,
    cursor: u64,
}

impl KeyScan {
    /// Starts a scan of the keys matching `pattern`, asking for about `count` per step.
    pub async fn start(conn: &mut Conn, pattern: &str, count: usize) -> RedisResult<Self> {
        Ok(Self {
            pattern: pattern.to_owned(),
            count: count.max(1),
            nodes: conn.masters().await?,
            node: 0,
            cursor: 0,
        })
    }

    /// A scan of `nodes` only (e.g. one master of [`Conn::masters`]).
    pub fn on(nodes: &[Node], pattern: &str, count: usize) -> Self {
        Self {
            pattern: pattern.to_owned(),
            count: count.max(1),
            nodes: nodes.to_vec(),
            node: 0,
            cursor: 0,
        }
    }

    /// The next batch of keys (possibly empty), or `None` once every master was scanned.
    pub async fn next_batch(&mut self, conn: &mut Conn) -> RedisResult<Option<Vec<String>>> {
        let Some(node) = self.nodes.get(self.node) else {
            return Ok(None);
        };
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(self.cursor)
            .arg("MATCH")
            .arg(&self.pattern)
            .arg("COUNT")
            .arg(self.count);
        let reply = conn.query_node(node, &cmd).await?;
        let (next, batch): (u64, Vec<String>) = FromRedisValue::from_redis_value(reply)?;
        if next == 0 {
            self.node += 1;
        }
        self.cursor = next;
        Ok(Some(batch))
    }
}
