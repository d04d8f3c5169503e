//! The AMQP connection: one per process, re-established with backoff when it drops, on the next
//! node of the cluster that answers.

use std::{sync::Arc, time::Duration};

use flashsale_platform::backoff::Backoff;
use futures_util::StreamExt as _;
use lapin::{Channel, Connection, ConnectionProperties, Event};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::config::{AmqpConfig, redact_url};

/// How long [`Broker::channel`] waits for a connection before it gives up.
const CHANNEL_WAIT: Duration = Duration::from_secs(10);
/// How long one connection attempt may take (TCP + AMQP handshake).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What went wrong talking to the broker.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// No connection came up within the wait (the broker is down or unreachable).
    #[error("no connection to the broker within {0:?}")]
    Unavailable(Duration),
    /// [`Broker::close`] was called.
    #[error("broker handle closed")]
    Closed,
    /// An exchange, queue or routing key name is longer than AMQP allows (255 bytes).
    #[error("amqp name too long: {0}")]
    NameTooLong(String),
    /// The broker or the client library reported an error.
    #[error("amqp: {0}")]
    Amqp(#[from] lapin::Error),
}

/// A cheap-to-clone handle on the process's AMQP connection.
///
/// A background task owns the connection; when it drops (broker restart, network cut, a cluster
/// node gone) the task reconnects: it tries every node of [`AmqpConfig::nodes`] once, starting
/// with the one after the node it lost, and waits with exponential backoff (100 ms … 5 s)
/// between rounds in which none answered. The first connection starts at a random node, so
/// the replicas of a service spread over the cluster. Channels are handed out by
/// [`Broker::channel`]; the [`Publisher`](crate::Publisher) and each
/// [`Consumer`](crate::Consumer) notice a dead channel, ask for a new one and re-declare their
/// topology on it. The task stops when the last handle is dropped or [`Broker::close`] is
/// called.
#[derive(Clone)]
pub struct Broker {
    inner: Arc<Inner>,
}

struct Inner {
    config: AmqpConfig,
    /// The current connection and the index (in [`AmqpConfig::nodes`]) of its node.
    current: watch::Receiver<Option<Current>>,
    /// Dropping it (with the last handle) or sending `true` stops the supervisor.
    stop: watch::Sender<bool>,
}

/// A live connection and the node it goes to.
#[derive(Clone)]
struct Current {
    conn: Arc<Connection>,
    node: usize,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("node", &self.node_url().map(|u| redact_url(&u)))
            .field("connected", &self.is_connected())
            .finish()
    }
}

// === impl Broker ===

impl Broker {
    /// Connects to the first node that answers, trying each once from a random one (failing
    /// fast when none is reachable at start-up), then keeps the connection alive in the
    /// background.
    pub async fn connect(config: AmqpConfig) -> Result<Self, BrokerError> {
        let nodes = config.nodes();
        let start = random_index(nodes.len());
        let (conn, node) = open_any(&config, &nodes, start).await?;
        info!(url = %redact_url(&nodes[node]), node, nodes = nodes.len(), "connected to the broker");
        let (tx, rx) = watch::channel(Some(Current {
            conn: Arc::new(conn),
            node,
        }));
        let (stop_tx, stop_rx) = watch::channel(false);
        tokio::spawn(supervise(config.clone(), tx, stop_rx));
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                current: rx,
                stop: stop_tx,
            }),
        })
    }

    /// Like [`Broker::connect`], but keeps trying (with backoff) for up to `patience` — for
    /// start-ups that race the broker's own (a RabbitMQ node takes seconds to accept).
    pub async fn connect_within(
        config: AmqpConfig,
        patience: Duration,
    ) -> Result<Self, BrokerError> {
        let deadline = tokio::time::Instant::now() + patience;
        let mut backoff = Backoff::reconnect();
        loop {
            match Self::connect(config.clone()).await {
                Ok(b) => return Ok(b),
                Err(e) => {
                    let wait = backoff.next_wait();
                    if tokio::time::Instant::now() + wait >= deadline {
                        return Err(e);
                    }
                    warn!(error = %e, retry_in_ms = wait.as_millis() as u64, "broker not reachable yet");
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    /// The settings this broker was opened with.
    pub fn config(&self) -> &AmqpConfig {
        &self.inner.config
    }

    /// Whether a live connection is up right now.
    pub fn is_connected(&self) -> bool {
        self.inner
            .current
            .borrow()
            .as_ref()
            .is_some_and(|c| c.conn.status().connected())
    }

    /// The URL of the node the live connection goes to (password included: redact before
    /// showing it), or `None` while reconnecting.
    pub fn node_url(&self) -> Option<String> {
        let node = self
            .inner
            .current
            .borrow()
            .as_ref()
            .filter(|c| c.conn.status().connected())
            .map(|c| c.node)?;
        self.inner.config.nodes().get(node).cloned()
    }

    /// Opens a new channel, waiting up to 10 s for a connection while one is being re-established.
    pub async fn channel(&self) -> Result<Channel, BrokerError> {
        if *self.inner.stop.borrow() {
            return Err(BrokerError::Closed);
        }
        let mut rx = self.inner.current.clone();
        let conn = {
            let wait = rx.wait_for(|c| c.as_ref().is_some_and(|c| c.conn.status().connected()));
            match tokio::time::timeout(CHANNEL_WAIT, wait).await {
                Ok(Ok(guard)) => guard.clone(),
                Ok(Err(_)) => return Err(BrokerError::Closed),
                Err(_) => return Err(BrokerError::Unavailable(CHANNEL_WAIT)),
            }
        };
        match conn {
            Some(current) => Ok(current.conn.create_channel().await?),
            None => Err(BrokerError::Unavailable(CHANNEL_WAIT)),
        }
    }

    /// Closes the connection and stops reconnecting; channels already handed out die with it.
    pub async fn close(&self) {
        self.inner.stop.send_replace(true);
        let current = self.inner.current.borrow().clone();
        if let Some(current) = current {
            let _ = current.conn.close(200, "bye".into()).await;
        }
    }
}

/// A number in `0..n` (0 when `n` is 0), different from process to process.
fn random_index(n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    let r = uuid::Uuid::new_v4().as_u128() % (n as u128);
    usize::try_from(r).unwrap_or(0)
}

/// Tries `nodes` once each, from `start` on (wrapping), and returns the first connection that
/// opens with the index of its node, or the last error.
async fn open_any(
    config: &AmqpConfig,
    nodes: &[String],
    start: usize,
) -> Result<(Connection, usize), BrokerError> {
    let mut last = BrokerError::Unavailable(CONNECT_TIMEOUT);
    for i in 0..nodes.len() {
        let node = (start + i) % nodes.len();
        match open(config, &nodes[node]).await {
            Ok(conn) => return Ok((conn, node)),
            Err(e) => {
                if nodes.len() > 1 {
                    warn!(url = %redact_url(&nodes[node]), error = %e, "broker node not reachable");
                }
                last = e;
            }
        }
    }
    Err(last)
}

async fn open(config: &AmqpConfig, url: &str) -> Result<Connection, BrokerError> {
    let props = ConnectionProperties::default().with_connection_name("flashsale".into());
    let connect = async {
        let runtime = lapin::runtime::default_runtime()?;
        Connection::connect_with_config(url, props, tls_config(config)?, runtime).await
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
        Ok(conn) => Ok(conn?),
        Err(_) => Err(BrokerError::Unavailable(CONNECT_TIMEOUT)),
    }
}

/// `amqp.tls`'s CA and client certificate, for an `amqps://` URL (which is TLS whatever this
/// holds: the system's roots without a CA file, never plain text).
fn tls_config(config: &AmqpConfig) -> Result<lapin::tcp::OwnedTLSConfig, lapin::Error> {
    let unreadable = |e: flashsale_platform::config::ConfigError| {
        lapin::Error::from(std::io::Error::other(e.to_string()))
    };
    let cert_chain = config
        .tls
        .ca("amqp.tls")
        .map_err(unreadable)?
        .map(|pem| String::from_utf8_lossy(&pem).into_owned());
    let identity = config
        .tls
        .identity("amqp.tls")
        .map_err(unreadable)?
        .map(|(pem, key)| lapin::tcp::OwnedIdentity::PKCS8 { pem, key });
    Ok(lapin::tcp::OwnedTLSConfig {
        identity,
        cert_chain,
    })
}

/// Watches the current connection; when it dies, replaces it with one to the next node that
/// answers.
async fn supervise(
    config: AmqpConfig,
    tx: watch::Sender<Option<Current>>,
    mut stop: watch::Receiver<bool>,
) {
    let nodes = config.nodes();
    let mut next = 0;
    loop {
        let current = tx.borrow().clone();
        if let Some(current) = current {
            next = current.node + 1;
            tokio::select! {
                _ = stopped(&mut stop) => {
                    let _ = current.conn.close(200, "bye".into()).await;
                    return;
                }
                reason = lost(&current.conn) => {
                    warn!(url = %redact_url(&nodes[current.node]), reason = %reason,
                        "broker connection lost, reconnecting");
                }
            }
        }
        tx.send_replace(None);
        let mut backoff = Backoff::reconnect();
        loop {
            let wait = tokio::select! {
                _ = stopped(&mut stop) => return,
                res = open_any(&config, &nodes, next % nodes.len().max(1)) => match res {
                    Ok((conn, node)) => {
                        info!(url = %redact_url(&nodes[node]), node, "reconnected to the broker");
                        tx.send_replace(Some(Current { conn: Arc::new(conn), node }));
                        break;
                    }
                    Err(e) => {
                        let wait = backoff.next_wait();
                        warn!(error = %e, retry_in_ms = wait.as_millis() as u64, "broker reconnect failed");
                        wait
                    }
                },
            };
            tokio::select! {
                _ = stopped(&mut stop) => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }
}

/// Resolves when `close` was called or every [`Broker`] handle is gone.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Resolves when the connection stops being connected.
async fn lost(conn: &Connection) -> String {
    let mut events = conn.events_listener();
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            ev = events.next() => match ev {
                // Channel errors arrive here too; only a dead connection counts.
                Some(Event::Error(e)) if !conn.status().connected() => return e.to_string(),
                Some(_) => {}
                None => return "connection event stream ended".to_owned(),
            },
            _ = tick.tick() => {
                if !conn.status().connected() {
                    return "connection no longer connected".to_owned();
                }
            }
        }
    }
}

/// `s` as an AMQP short string, or an error when it is longer than 255 bytes.
pub(crate) fn short(s: &str) -> Result<lapin::types::ShortString, BrokerError> {
    lapin::types::ShortString::try_new(s).map_err(|_| BrokerError::NameTooLong(s.to_owned()))
}
