//! The dead-letter admin (docs/architecture.md#messaging): parked messages moved from the parking
//! lots into the service's database, where an admin lists, replays or discards them over gRPC.
//!
//! ```text
//!  <q>.dlq ──DeadLetterDrainer (insert, then ack)──▶ dead_letters (PARKED)
//!  DeadLetterAdmin: List ◀── PARKED rows, oldest first
//!                   Replay ──stored bytes──▶ "" / <q> (confirmed) ──▶ REPLAYED
//!                   Discard ──────────────────────────────────────▶ DISCARDED (+ reason)
//! ```
//!
//! A queue cannot be browsed, paged or picked from by id, so the parking lots are drained into
//! a table: the drainers of all replicas compete on each `<queue>.dlq`; a row is inserted before
//! the message is acked, and inserting the same parking twice is a no-op, so a redelivery is
//! harmless. Replays go straight to the work queue (default exchange) and the handler's inbox
//! still drops a message it has applied before. A service wires it like this:
//!
//! ```text
//! let topologies = [order_events_topology, stock_events_topology];
//! tokio::spawn(DeadLetterDrainer::new(&broker, &db, &topologies)?.run(token.cancelled_owned()));
//! let admin = DeadLetterAdmin::new(&db, Publisher::new(&broker), &topologies)?;
//! routes.with_service(InterceptedService::new(DeadLetterServiceServer::new(admin), auth));
//! // and `migration::CreateDeadLetters` in the service's migrator
//! ```

mod admin;
mod drainer;
mod parked;
mod request;
mod store;
mod token;

use flashsale_platform::ApiError;
use sea_orm::{ConnectionTrait, DbErr, Statement};

pub use admin::DeadLetterAdmin;
pub use drainer::{DeadLetterDrainer, DrainerOptions};
pub use request::{DEFAULT_PAGE_SIZE, MAX_IDS, MAX_PAGE_SIZE, MAX_REASON_CHARS};
pub(crate) use store::unreachable;

use crate::publisher::PublishError;

/// Gauge: parked messages waiting in `dead_letters`, per work queue (`queue` label).
pub const PARKED_GAUGE: &str = "flashsale_dead_letters_parked";
/// Counter: parked messages the drainer stored, per work queue.
pub const STORED_TOTAL: &str = "flashsale_dead_letters_stored_total";
/// Gauge: messages waiting in a consumer's work queue, by queue (read by the drainer; every
/// replica reads the same queue: take max).
pub const QUEUE_READY: &str = "flashsale_queue_messages_ready";
/// Counter: messages replayed, per work queue.
pub const REPLAYED_TOTAL: &str = "flashsale_dead_letters_replayed_total";
/// Counter: messages discarded, per work queue.
pub const DISCARDED_TOTAL: &str = "flashsale_dead_letters_discarded_total";

/// Parked messages of work queue `queue` waiting in `dead_letters` (for health checks and
/// tests).
pub async fn count_parked<C: ConnectionTrait>(conn: &C, queue: &str) -> Result<i64, DbErr> {
    let stmt = Statement::from_sql_and_values(
        conn.get_database_backend(),
        "SELECT count(*) AS n FROM dead_letters WHERE state = 'PARKED' AND queue = $1",
        [queue.into()],
    );
    match conn.query_one_raw(stmt).await? {
        Some(row) => row.try_get::<i64>("", "n"),
        None => Ok(0),
    }
}

/// Why a dead-letter call failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DeadLetterError {
    /// Bad input: `(field, description)` each.
    #[error("invalid argument")]
    Invalid(Vec<(String, String)>),
    /// Not one of this service's consumer queues.
    #[error("queue {0:?} is not one of this service's consumer queues")]
    UnknownQueue(String),
    #[error("dead letter store: {0}")]
    Database(#[from] sqlx::Error),
    /// The broker did not take a replayed message; the ones before it are replayed.
    #[error("replayed {replayed} message(s), then the broker refused one: {source}")]
    Publish {
        replayed: usize,
        #[source]
        source: PublishError,
    },
}

/// The one mapping from dead-letter errors to the API (AIP-193 reasons).
impl From<DeadLetterError> for ApiError {
    fn from(e: DeadLetterError) -> Self {
        let message = e.to_string();
        match e {
            DeadLetterError::Invalid(v) => ApiError::InvalidArgument(v),
            DeadLetterError::UnknownQueue(_) => ApiError::NotFound(message),
            DeadLetterError::Database(ref db) if store::unreachable(db) => ApiError::Unavailable {
                reason: flashsale_contract::reason::DATABASE_UNAVAILABLE,
                message: "the dead letter store is unreachable".to_owned(),
            },
            DeadLetterError::Database(db) => ApiError::internal(db),
            DeadLetterError::Publish {
                source: PublishError::Unroutable { .. },
                ..
            } => ApiError::failed_precondition(
                "QUEUE_MISSING",
                format!("{message}; declare the consumer queue, then retry"),
            ),
            DeadLetterError::Publish { .. } => ApiError::Unavailable {
                reason: flashsale_contract::reason::BROKER_UNAVAILABLE,
                message: format!("{message}; retrying the call is safe"),
            },
        }
    }
}

impl From<DeadLetterError> for tonic::Status {
    fn from(e: DeadLetterError) -> Self {
        ApiError::from(e).into()
    }
}
