//! A Redis connection pool from settings: one server (`redis.mode = "standalone"`) or a Redis
//! Cluster (`"cluster"`), behind one [`Conn`] type.
//!
//! In cluster mode each [`Conn`] is a redis-rs cluster connection: it routes a command by its
//! first key's slot, follows `MOVED`/`ASK`, refreshes its slot map and retries (bounded, see
//! [`cluster`]) when a master fails over. A pipeline is sent as its single commands, each
//! routed on its own (they still share each node's connection), so one may mix slots, and a
//! redirect retries only the command it hit. Commands without a key (`SCAN`, `INFO`) go to one
//! node chosen with [`Conn::query_node`]; [`Conn::masters`] lists them.
//!
//! deadpool-redis checks every connection it hands out with a round trip (`UNWATCH` + `PING`),
//! so each call of the stock gate — one pipeline for a whole batch of reservations — cost two
//! round trips instead of one. This pool hands out a connection without that check while it is
//! in steady use ([`CHECK_AFTER_IDLE`], as connection pools such as HikariCP do), still checks
//! one that sat idle, and replaces one whose last command failed in a way that leaves it
//! unusable (a dropped connection, an I/O error, a response timeout) instead of handing it out
//! again, and checks one whose last command was cut off before its answer. Connections
//! are handed out most recently used first, so the few in use under load stay warm and the rest
//! are checked before they serve again. Why, and what it costs after a Redis restart:
//! docs/adr/0006-redis-pool-ping-bypass.md.

pub mod cluster;
mod scan;

use std::{sync::Arc, time::Duration};

use anyhow::Context as _;
use deadpool::managed::{self, Metrics, QueueMode, RecycleError, RecycleResult};
use deadpool_redis::redis::{
    Cmd, Pipeline, RedisError, RedisFuture, RedisResult, Value,
    aio::{ConnectionLike, MultiplexedConnection},
    cluster_async::ClusterConnection,
};

use crate::settings::RedisSettings;

pub use cluster::{Node, key_slot, slot_tag};
pub use scan::KeyScan;

/// A connection handed out again within this long of its last hand-out is not checked first.
pub const CHECK_AFTER_IDLE: Duration = Duration::from_millis(500);

/// A pool of [`Conn`]s.
pub type Pool = managed::Pool<Manager>;
/// A connection on loan from a [`Pool`]; use it as `&mut *conn` where a `ConnectionLike` is
/// asked for.
pub type Connection = managed::Object<Manager>;

/// Runs on every connection the pool opens, before the connection serves anything; an error
/// fails that hand-out and the connection is not kept. It runs once per connection, so it costs
/// nothing on connections already open.
pub type OnConnect = Arc<dyn for<'a> Fn(&'a mut Conn) -> RedisFuture<'a, ()> + Send + Sync>;

/// A pool of `settings.pool_size` connections to `settings.url`, or to the cluster of
/// `settings.cluster_nodes` in cluster mode (connections open lazily).
pub fn pool(settings: &RedisSettings) -> anyhow::Result<Pool> {
    pool_with(settings, CHECK_AFTER_IDLE)
}

/// [`pool`], checking a connection before it serves again once it was idle for `check_after`
/// (`Duration::ZERO`: before every hand-out, as deadpool-redis does).
pub fn pool_with(settings: &RedisSettings, check_after: Duration) -> anyhow::Result<Pool> {
    pool_with_hook(settings, check_after, None)
}

/// [`pool_with`], running `on_connect` on every new connection before it is handed out.
/// Every connection of a Redis that restarted is a new one (the old ones died with it), so
/// this is where a user notices a restart before any of its commands reach the new server.
pub fn pool_with_hook(
    settings: &RedisSettings,
    check_after: Duration,
    on_connect: Option<OnConnect>,
) -> anyhow::Result<Pool> {
    let inner = if settings.is_cluster() {
        Connector::Cluster(cluster::client(settings)?)
    } else {
        Connector::Standalone(
            deadpool_redis::Manager::new(connection_info(settings)?).context("Redis URL")?,
        )
    };
    let manager = Manager {
        inner,
        check_after,
        on_connect,
    };
    let mut config = managed::PoolConfig::new(settings.pool_size);
    config.queue_mode = QueueMode::Lifo;
    Pool::builder(manager)
        .config(config)
        .runtime(deadpool::Runtime::Tokio1)
        .build()
        .context("create Redis pool")
}

/// Where and how to connect: a `rediss://` URL is TLS (never plain text), with `redis.tls`'s CA
/// instead of the system's roots and its client certificate when they are set.
pub fn connection_info(
    settings: &RedisSettings,
) -> anyhow::Result<deadpool_redis::redis::ConnectionInfo> {
    use deadpool_redis::redis::{ClientTlsConfig, IntoConnectionInfo as _, TlsCertificates};
    if !settings.tls.is_set() {
        return settings
            .url
            .as_str()
            .into_connection_info()
            .context("Redis URL");
    }
    let root_cert = settings.tls.ca("redis.tls")?;
    let client_tls = settings
        .tls
        .identity("redis.tls")?
        .map(|(client_cert, client_key)| ClientTlsConfig {
            client_cert,
            client_key,
        });
    let client = deadpool_redis::redis::Client::build_with_tls(
        settings.url.as_str(),
        TlsCertificates {
            client_tls,
            root_cert,
        },
    )
    .context("Redis TLS")?;
    Ok(client.get_connection_info().clone())
}

/// Opens multiplexed connections (or cluster connections) and decides whether one can serve
/// again.
pub struct Manager {
    inner: Connector,
    check_after: Duration,
    on_connect: Option<OnConnect>,
}

/// What a [`Manager`] opens connections with.
enum Connector {
    Standalone(deadpool_redis::Manager),
    Cluster(deadpool_redis::redis::cluster::ClusterClient),
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Standalone(m) => f.debug_tuple("Standalone").field(m).finish(),
            Self::Cluster(_) => f.write_str("Cluster"),
        }
    }
}

impl std::fmt::Debug for Manager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Manager")
            .field("inner", &self.inner)
            .field("check_after", &self.check_after)
            .field("on_connect", &self.on_connect.is_some())
            .finish()
    }
}

impl managed::Manager for Manager {
    type Type = Conn;
    type Error = RedisError;

    async fn create(&self) -> Result<Conn, RedisError> {
        let inner = match &self.inner {
            Connector::Standalone(m) => Inner::Standalone(m.create().await?),
            Connector::Cluster(client) => Inner::Cluster(client.get_async_connection().await?),
        };
        let mut conn = Conn {
            inner,
            broken: false,
            in_flight: false,
        };
        if let Some(hook) = &self.on_connect {
            hook(&mut conn).await?;
        }
        Ok(conn)
    }

    async fn recycle(&self, conn: &mut Conn, metrics: &Metrics) -> RecycleResult<RedisError> {
        if conn.broken {
            return Err(RecycleError::message(
                "its last command lost the connection",
            ));
        }
        // A command whose caller gave up before its answer (a cancelled future) says nothing
        // about the connection: check it, whatever its last use.
        if metrics.last_used() < self.check_after && !conn.in_flight {
            return Ok(());
        }
        conn.in_flight = false;
        match (&self.inner, &mut conn.inner) {
            (Connector::Standalone(m), Inner::Standalone(c)) => m.recycle(c, metrics).await,
            (_, Inner::Cluster(c)) => cluster::ping(c).await.map_err(RecycleError::Backend),
            (Connector::Cluster(_), Inner::Standalone(_)) => Err(RecycleError::message(
                "a standalone connection in a cluster pool",
            )),
        }
    }
}

/// A multiplexed connection (to one server, or to every node of a cluster) that remembers
/// whether a command failed in a way that leaves the connection unusable, and whether a command
/// was cut off before its answer.
pub struct Conn {
    inner: Inner,
    broken: bool,
    in_flight: bool,
}

enum Inner {
    Standalone(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Conn {
    /// Whether this is a connection to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.inner, Inner::Cluster(_))
    }

    /// The masters serving slots, as the cluster sees them now (`CLUSTER NODES`); on one
    /// server, that server alone (with no address: [`Conn::query_node`] sends to it).
    pub async fn masters(&mut self) -> RedisResult<Vec<Node>> {
        let result = match &mut self.inner {
            Inner::Standalone(_) => Ok(vec![Node::standalone()]),
            Inner::Cluster(c) => cluster::masters(c).await,
        };
        self.note(&result);
        result
    }

    /// Sends `cmd` to `node` (one of [`Conn::masters`]) rather than where its key routes it:
    /// for the commands without a key that answer for one node (`SCAN`, `INFO`).
    pub async fn query_node(&mut self, node: &Node, cmd: &Cmd) -> RedisResult<Value> {
        self.in_flight = true;
        let result = match &mut self.inner {
            Inner::Standalone(c) => c.req_packed_command(cmd).await,
            Inner::Cluster(c) => cluster::query_node(c, node, cmd).await,
        };
        self.note(&result);
        result
    }

    /// Whether a command failed in a way that leaves this connection unusable (the pool then
    /// replaces it).
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// Server errors (a script error, `NOSCRIPT`, a wrong type) arrive as values and leave the
    /// connection as good as it was; a dropped connection, an I/O error and a response timeout
    /// (an I/O error too: the connection may be stuck) do not. Such a connection is replaced
    /// rather than checked again: a reconnect costs about what the check would.
    fn note<T>(&mut self, result: &RedisResult<T>) {
        self.in_flight = false;
        if let Err(e) = result
            && (e.is_unrecoverable_error() || e.is_io_error())
        {
            self.broken = true;
        }
    }
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("broken", &self.broken)
            .finish_non_exhaustive()
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            self.in_flight = true;
            let result = match &mut self.inner {
                Inner::Standalone(c) => c.req_packed_command(cmd).await,
                Inner::Cluster(c) => c.req_packed_command(cmd).await,
            };
            self.note(&result);
            result
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            self.in_flight = true;
            let result = match &mut self.inner {
                Inner::Standalone(c) => c.req_packed_commands(pipeline, offset, count).await,
                Inner::Cluster(c) => cluster::pipeline(c, pipeline, offset, count).await,
            };
            self.note(&result);
            result
        })
    }

    fn get_db(&self) -> i64 {
        match &self.inner {
            Inner::Standalone(c) => c.get_db(),
            Inner::Cluster(c) => c.get_db(),
        }
    }
}
