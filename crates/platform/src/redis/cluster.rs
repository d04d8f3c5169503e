//! The Redis Cluster side of [`Conn`](super::Conn): the client's retry settings, pipelines sent
//! as single routed commands, the list of masters, commands sent to one node, and hash-slot
//! arithmetic.

use anyhow::Context as _;
use deadpool_redis::redis::{
    Cmd, ErrorKind, Pipeline, RedisError, RedisResult, ServerError, Value,
    aio::ConnectionLike as _,
    cluster::{ClusterClient, ClusterClientBuilder},
    cluster_async::ClusterConnection,
    cluster_routing::{RoutingInfo, SingleNodeRoutingInfo},
};

use crate::settings::RedisSettings;

/// Retries of one command after a redirect, a lost node or `CLUSTERDOWN`/`TRYAGAIN`, and the
/// wait before each (random, below `10 ms × 2^retry`, within these bounds). redis-rs's defaults
/// (16 retries, at least 1.28 s apart) would hold a request for half a minute; these span a
/// failover of a cluster with a short `cluster-node-timeout` (~3 s of waits at most) and fail a
/// longer one as `Unavailable`, which the caller retries.
pub const RETRIES: u32 = 10;
/// Shortest wait between two retries of one command (ms).
pub const MIN_RETRY_WAIT_MS: u64 = 10;
/// Longest wait between two retries of one command (ms).
pub const MAX_RETRY_WAIT_MS: u64 = 500;

/// Number of hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16_384;

/// A master of the cluster (or, on one server, that server).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// The cluster's node id (`""` for a standalone server).
    pub id: String,
    /// Where it listens (empty host for a standalone server: the connection's own).
    pub host: String,
    pub port: u16,
    /// Slot ranges it serves, inclusive.
    pub slots: Vec<(u16, u16)>,
}

impl Node {
    pub(super) fn standalone() -> Self {
        Self {
            id: String::new(),
            host: String::new(),
            port: 0,
            slots: vec![(0, SLOTS - 1)],
        }
    }

    /// `host:port`.
    pub fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// The first slot it serves.
    pub fn first_slot(&self) -> Option<u16> {
        self.slots.iter().map(|(lo, _)| *lo).min()
    }

    /// Whether it serves `slot`.
    pub fn serves(&self, slot: u16) -> bool {
        self.slots
            .iter()
            .any(|(lo, hi)| (*lo..=*hi).contains(&slot))
    }
}

/// A cluster client for `settings.cluster_nodes` (with `redis.tls`'s CA and client certificate
/// for `rediss://` nodes).
pub(super) fn client(settings: &RedisSettings) -> anyhow::Result<ClusterClient> {
    use deadpool_redis::redis::{ClientTlsConfig, TlsCertificates};
    let mut builder = ClusterClientBuilder::new(settings.cluster_nodes.iter().map(String::as_str))
        .retries(RETRIES)
        .min_retry_wait(MIN_RETRY_WAIT_MS)
        .max_retry_wait(MAX_RETRY_WAIT_MS);
    if settings.tls.is_set() {
        let root_cert = settings.tls.ca("redis.tls")?;
        let client_tls = settings
            .tls
            .identity("redis.tls")?
            .map(|(client_cert, client_key)| ClientTlsConfig {
                client_cert,
                client_key,
            });
        builder = builder.certs(TlsCertificates {
            client_tls,
            root_cert,
        });
    }
    builder.build().context("Redis cluster nodes")
}

/// Checks that the connection's background task still answers (any one node will do: the
/// connection reconnects to nodes on its own).
pub(super) async fn ping(conn: &mut ClusterConnection) -> RedisResult<()> {
    let pong = conn
        .route_command(
            deadpool_redis::redis::cmd("PING"),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        )
        .await?;
    match pong {
        Value::SimpleString(s) if s == "PONG" => Ok(()),
        Value::ServerError(e) => Err(e.into()),
        other => Err(RedisError::from((
            ErrorKind::UnexpectedReturnType,
            "PING answered something else than PONG",
            format!("{other:?}"),
        ))),
    }
}

/// A pipeline as its single commands, each routed by its own key, sent at once (each node's
/// connection is multiplexed, so they still travel together). A server error answers its own
/// command, as in a pipeline to one server; a connection error fails the whole. A transaction
/// (`MULTI`/`EXEC`) goes as one, to the slot of its keys.
pub(super) async fn pipeline(
    conn: &mut ClusterConnection,
    pipeline: &Pipeline,
    offset: usize,
    count: usize,
) -> RedisResult<Vec<Value>> {
    if pipeline.is_transaction() {
        return conn.req_packed_commands(pipeline, offset, count).await;
    }
    let calls = pipeline.cmd_iter().skip(offset).take(count).map(|cmd| {
        let mut conn = conn.clone();
        async move { conn.req_packed_command(cmd).await }
    });
    futures_util::future::join_all(calls)
        .await
        .into_iter()
        .map(|reply| match reply {
            Ok(value) => Ok(value),
            Err(e) => ServerError::try_from(e).map(Value::ServerError),
        })
        .collect()
}

/// Sends `cmd` to `node`.
pub(super) async fn query_node(
    conn: &mut ClusterConnection,
    node: &Node,
    cmd: &Cmd,
) -> RedisResult<Value> {
    let reply = conn
        .route_command(
            cmd.clone(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                host: node.host.clone(),
                port: node.port,
            }),
        )
        .await?;
    match reply {
        Value::ServerError(e) => Err(e.into()),
        other => Ok(other),
    }
}

/// The masters serving slots, from `CLUSTER NODES` (asked of any node).
pub(super) async fn masters(conn: &mut ClusterConnection) -> RedisResult<Vec<Node>> {
    let text: String = deadpool_redis::redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(conn)
        .await?;
    let nodes = parse_masters(&text);
    if nodes.is_empty() {
        return Err(RedisError::from((
            ErrorKind::Server(deadpool_redis::redis::ServerErrorKind::ClusterDown),
            "CLUSTER NODES lists no master serving slots",
        )));
    }
    Ok(nodes)
}

/// Masters that serve slots and are not marked failed, from the text of `CLUSTER NODES`
/// (`<id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong> <epoch> <link> <slot>…`).
pub fn parse_masters(text: &str) -> Vec<Node> {
    let mut out = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [id, addr, flags, _, _, _, _, _, slots @ ..] = fields.as_slice() else {
            continue;
        };
        let flags: Vec<&str> = flags.split(',').collect();
        if !flags.contains(&"master") || flags.contains(&"fail") || flags.contains(&"noaddr") {
            continue;
        }
        let hostport = addr.split(['@', ',']).next().unwrap_or_default();
        let Some((host, port)) = hostport.rsplit_once(':') else {
            continue;
        };
        let Ok(port) = port.parse::<u16>() else {
            continue;
        };
        // `[slot->-id]` / `[slot-<-id]`: a slot being migrated; its owner is listed as usual.
        let slots: Vec<(u16, u16)> = slots
            .iter()
            .filter(|s| !s.starts_with('['))
            .filter_map(|s| match s.split_once('-') {
                Some((lo, hi)) => Some((lo.parse().ok()?, hi.parse().ok()?)),
                None => s.parse().ok().map(|n| (n, n)),
            })
            .collect();
        if host.is_empty() || slots.is_empty() {
            continue;
        }
        out.push(Node {
            id: (*id).to_owned(),
            host: host.to_owned(),
            port,
            slots,
        });
    }
    out.sort_by_key(Node::first_slot);
    out
}

/// The hash slot of `key`: CRC16 (XMODEM) of its hash tag (the first `{…}` with something in
/// it) or of the whole key, modulo 16384.
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = match key.iter().position(|&b| b == b'{') {
        Some(open) => match key[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    };
    crc16(hashed) % SLOTS
}

/// A hash tag (braces included) whose keys live in `slot`: `{s<n>}` for the smallest such `n`.
/// Found by trying names in order: about 16,384 tries on average, never more than a bounded
/// number (`None` past it, which no slot reaches).
pub fn slot_tag(slot: u16) -> Option<String> {
    const MAX_TRIES: u32 = 1 << 22;
    (0..MAX_TRIES)
        .map(|n| format!("s{n}"))
        .find(|name| crc16(name.as_bytes()) % SLOTS == slot % SLOTS)
        .map(|name| format!("{{{name}}}"))
}

/// CRC-16/XMODEM (polynomial 0x1021, initial 0), the checksum Redis Cluster hashes keys with.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_slots_match_the_ones_redis_computes() {
        // Values from `CLUSTER KEYSLOT` of Redis 7.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % SLOTS);
        assert_eq!(key_slot(b"fs:stock:{p:A}:avail"), key_slot(b"p:A"));
    }

    #[test]
    fn a_slot_tag_lands_in_its_slot() {
        for slot in [0, 1, 5460, 5461, 10922, 16383] {
            let tag = slot_tag(slot).unwrap();
            assert_eq!(key_slot(format!("x:{tag}:y").as_bytes()), slot, "{tag}");
        }
    }

    #[test]
    fn cluster_nodes_text_gives_the_masters_serving_slots() {
        let text = "\
a1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460
b2 127.0.0.1:7002@17002,host-b master - 0 0 2 connected 5461-10922 [5461->-c3]
c3 127.0.0.1:7003@17003 master,fail - 0 0 3 disconnected 10923-16383
d4 127.0.0.1:7004@17004 slave a1 0 0 1 connected
e5 127.0.0.1:7005@17005 master - 0 0 5 connected 10923-16000 16383
f6 127.0.0.1:7006@17006 master - 0 0 6 connected
";
        let masters = parse_masters(text);
        let addrs: Vec<String> = masters.iter().map(Node::addr).collect();
        assert_eq!(
            addrs,
            ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7005"]
        );
        assert_eq!(masters[2].slots, [(10923, 16000), (16383, 16383)]);
        assert!(masters[1].serves(10922) && !masters[1].serves(10923));
    }
}
