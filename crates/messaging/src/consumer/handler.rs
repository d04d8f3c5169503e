//! What a service plugs into a [`Consumer`](super::Consumer).

use std::{fmt, future::Future};

use flashsale_proto::events::v1::Envelope;
use uuid::Uuid;

/// A decoded message and where it stands in its delivery history.
#[derive(Clone, Debug)]
pub struct Incoming {
    /// The decoded, checked envelope (its `type` matches its payload).
    pub envelope: Envelope,
    /// `envelope.message_id` as a UUID: the inbox key.
    pub message_id: Uuid,
    /// 1 for the first handler run, 2 for the first retry, …
    pub attempt: u32,
    /// Whether the broker redelivered it (a consumer died or failed to ack before).
    pub redelivered: bool,
    /// The routing key it was first published with (e.g. `order.created`).
    pub routing_key: String,
    /// The work queue it came from.
    pub queue: String,
}

/// How a handler failed; decides between retrying and parking.
#[derive(Debug)]
pub enum HandlerError {
    /// Worth retrying later (database or network trouble, a dependency down): the message
    /// goes to the next retry queue, or to the parking lot after the last attempt.
    Transient(anyhow::Error),
    /// Retrying cannot help (the message is invalid for this service): park it at once.
    Permanent(anyhow::Error),
    /// The service cannot work at all right now (its database is out of reach): the message
    /// waits on the last retry queue and comes back, as often as the outage lasts, without
    /// spending an attempt, so an outage longer than the retry ladder parks nothing.
    Unavailable(anyhow::Error),
}

// === impl HandlerError ===

impl HandlerError {
    /// A failure worth retrying.
    pub fn transient(e: impl Into<anyhow::Error>) -> Self {
        Self::Transient(e.into())
    }

    /// A failure no retry can fix.
    pub fn permanent(e: impl Into<anyhow::Error>) -> Self {
        Self::Permanent(e.into())
    }

    /// A failure of the service's own footing (its database unreachable), not of the message.
    pub fn unavailable(e: impl Into<anyhow::Error>) -> Self {
        Self::Unavailable(e.into())
    }

    /// Whether the message should be parked at once.
    pub fn is_permanent(&self) -> bool {
        matches!(self, Self::Permanent(_))
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Transient(e) => write!(f, "transient: {e:#}"),
            Self::Permanent(e) => write!(f, "permanent: {e:#}"),
            Self::Unavailable(e) => write!(f, "unavailable: {e:#}"),
        }
    }
}

/// `?` on any error (a `DbErr`, an `anyhow::Error` …) makes a transient failure; use
/// [`HandlerError::permanent`] for the ones retrying cannot fix.
impl<E> From<E> for HandlerError
where
    E: Into<anyhow::Error>,
{
    fn from(e: E) -> Self {
        Self::Transient(e.into())
    }
}

/// Handles one message. Implement it for a type, or pass an `async` closure
/// `|msg: Incoming| async move { … }`.
///
/// The handler should do its work in one database transaction that starts with
/// [`inbox::claim`](crate::inbox::claim) and commits before it returns `Ok`: the consumer acks
/// only after that.
pub trait Handler: Send + Sync + 'static {
    /// Handles `msg`; `Ok` acks it.
    fn handle(&self, msg: Incoming) -> impl Future<Output = Result<(), HandlerError>> + Send;
}

impl<F, Fut> Handler for F
where
    F: Fn(Incoming) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send,
{
    fn handle(&self, msg: Incoming) -> impl Future<Output = Result<(), HandlerError>> + Send {
        self(msg)
    }
}
