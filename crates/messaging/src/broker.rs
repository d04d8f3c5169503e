//! The AMQP connection: one per process, re-established with backoff when it drops.

use std::{sync::Arc, time::Duration};

use futures_util::StreamExt as _;
use lapin::{Channel, Connection, ConnectionProperties, Event};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::config::{AmqpConfig, redact_url};

/// How long [`Broker::channel`] waits for a connection before it gives up.
const CHANNEL_WAIT: Duration = Duration::from_secs(10);
/// How long one connection attempt may take (TCP + AMQP handshake).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

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
/// A background task owns the connection; when it drops (broker restart, network cut) the task
/// reconnects with exponential backoff (100 ms … 5 s). Channels are handed out by
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
    current: watch::Receiver<Option<Arc<Connection>>>,
    /// Dropping it (with the last handle) or sending `true` stops the supervisor.
    stop: watch::Sender<bool>,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("url", &redact_url(&self.inner.config.url))
            .field("connected", &self.is_connected())
            .finish()
    }
}

// === impl Broker ===

impl Broker {
    /// Connects once (failing fast when the broker is unreachable at start-up), then keeps the
    /// connection alive in the background.
    pub async fn connect(config: AmqpConfig) -> Result<Self, BrokerError> {
        let conn = open(&config).await?;
        info!(url = %redact_url(&config.url), "connected to the broker");
        let (tx, rx) = watch::channel(Some(Arc::new(conn)));
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
        let mut backoff = BACKOFF_MIN;
        loop {
            match Self::connect(config.clone()).await {
                Ok(b) => return Ok(b),
                Err(e) if tokio::time::Instant::now() + backoff >= deadline => return Err(e),
                Err(e) => {
                    warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "broker not reachable yet");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
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
            .is_some_and(|c| c.status().connected())
    }

    /// Opens a new channel, waiting up to 10 s for a connection while one is being re-established.
    pub async fn channel(&self) -> Result<Channel, BrokerError> {
        if *self.inner.stop.borrow() {
            return Err(BrokerError::Closed);
        }
        let mut rx = self.inner.current.clone();
        let conn = {
            let wait = rx.wait_for(|c| c.as_ref().is_some_and(|c| c.status().connected()));
            match tokio::time::timeout(CHANNEL_WAIT, wait).await {
                Ok(Ok(guard)) => guard.clone(),
                Ok(Err(_)) => return Err(BrokerError::Closed),
                Err(_) => return Err(BrokerError::Unavailable(CHANNEL_WAIT)),
            }
        };
        match conn {
            Some(conn) => Ok(conn.create_channel().await?),
            None => Err(BrokerError::Unavailable(CHANNEL_WAIT)),
        }
    }

    /// Closes the connection and stops reconnecting; channels already handed out die with it.
    pub async fn close(&self) {
        self.inner.stop.send_replace(true);
        let conn = self.inner.current.borrow().clone();
        if let Some(conn) = conn {
            let _ = conn.close(200, "bye".into()).await;
        }
    }
}

async fn open(config: &AmqpConfig) -> Result<Connection, BrokerError> {
    let props = ConnectionProperties::default().with_connection_name("flashsale".into());
    let connect = async {
        let runtime = lapin::runtime::default_runtime()?;
        Connection::connect_with_config(&config.url, props, tls_config(config)?, runtime).await
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

/// Watches the current connection; when it dies, replaces it with a new one.
async fn supervise(
    config: AmqpConfig,
    tx: watch::Sender<Option<Arc<Connection>>>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let conn = tx.borrow().clone();
        if let Some(conn) = conn {
            tokio::select! {
                _ = stopped(&mut stop) => {
                    let _ = conn.close(200, "bye".into()).await;
                    return;
                }
                reason = lost(&conn) => {
                    warn!(reason = %reason, "broker connection lost, reconnecting");
                }
            }
        }
        tx.send_replace(None);
        let mut backoff = BACKOFF_MIN;
        loop {
            tokio::select! {
                _ = stopped(&mut stop) => return,
                res = open(&config) => match res {
                    Ok(conn) => {
                        info!(url = %redact_url(&config.url), "reconnected to the broker");
                        tx.send_replace(Some(Arc::new(conn)));
                        break;
                    }
                    Err(e) => {
                        warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "broker reconnect failed");
                    }
                },
            }
            tokio::select! {
                _ = stopped(&mut stop) => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
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
