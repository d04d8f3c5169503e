//! One order's timeline as one service saw it (`flashsale.admin.v1.OrderTimelineService`): the
//! order's messages this service holds (written to its outbox, published while published rows
//! are kept, consumed by its consumers, parked) and the service's own records of the order
//! ([`OrderStory`]), merged in time order. Every service serves it for itself; a client asks
//! each one and merges their answers, so no service reads another's database.
//!
//! ```text
//! let timeline = TimelineAdmin::new(&db, "order", infra::timeline::Story::new(db.clone()))?;
//! routes.with_service(InterceptedService::new(OrderTimelineServiceServer::new(timeline), auth));
//! ```

use std::sync::Arc;

use chrono::{DateTime, Utc};
use flashsale_platform::{ApiError, auth::Role};
use flashsale_proto::admin::v1::{
    GetOrderTimelineRequest, GetOrderTimelineResponse, TimelineEntry, TimelineEntryKind,
    order_timeline_service_server::OrderTimelineService,
};
use futures_util::future::BoxFuture;
use sea_orm::{DatabaseConnection, DbBackend, DbErr};
use sqlx::{PgPool, Row as _};
use tonic::{Request, Response, Status};
use uuid::Uuid;

/// A service's own records of one order, as timeline entries (their `service` is filled in).
pub trait OrderStory: Send + Sync + 'static {
    /// The entries of `order_id`, in any order; `Ok(None)` when the service answers NOT_FOUND
    /// for an order it does not know (the order service, which owns orders). Services that
    /// only hear of an order answer `Ok(Some(..))`, empty when they never did.
    fn entries(&self, order_id: Uuid) -> BoxFuture<'_, Result<Option<Vec<TimelineEntry>>, DbErr>>;
}

/// Serves `GetOrderTimeline` for one service: admin only.
pub struct TimelineAdmin<S> {
    inner: Arc<Inner<S>>,
}

struct Inner<S> {
    pool: PgPool,
    service: &'static str,
    story: S,
}

impl<S> Clone for TimelineAdmin<S> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<S> std::fmt::Debug for TimelineAdmin<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimelineAdmin")
            .field("service", &self.inner.service)
            .finish_non_exhaustive()
    }
}

impl<S: OrderStory> TimelineAdmin<S> {
    /// The timeline of `service` ("order", "product-stock", "outbound") over its PostgreSQL
    /// database (fails for another backend), with its own records from `story`.
    pub fn new(db: &DatabaseConnection, service: &'static str, story: S) -> Result<Self, DbErr> {
        if db.get_database_backend() != DbBackend::Postgres {
            return Err(DbErr::Custom(
                "the order timeline needs PostgreSQL".to_owned(),
            ));
        }
        Ok(Self {
            inner: Arc::new(Inner {
                pool: db.get_postgres_connection_pool().clone(),
                service,
                story,
            }),
        })
    }

    /// Every entry this service holds of `order_id`, oldest first; `None`: NOT_FOUND.
    pub async fn timeline(&self, order_id: Uuid) -> Result<Option<Vec<TimelineEntry>>, ApiError> {
        let story = self.inner.story.entries(order_id).await.map_err(|e| {
            if flashsale_platform::db::unreachable(&e) {
                unavailable()
            } else {
                ApiError::internal(e)
            }
        })?;
        let Some(own) = story else {
            return Ok(None);
        };
        let found = messages(&self.inner.pool, &order_id.to_string())
            .await
            .map_err(|e| {
                if crate::dead_letter::unreachable(&e) {
                    unavailable()
                } else {
                    ApiError::internal(e)
                }
            })?;
        // One transaction stamps what it did with one instant: the event it consumed comes
        // first, then the service's own records, then the events it wrote.
        let mut entries = found.consumed;
        entries.extend(own);
        entries.extend(found.rest);
        for e in &mut entries {
            e.service = self.inner.service.to_owned();
        }
        // Stable: entries of one instant keep the order above.
        entries.sort_by_key(|e| e.time.map(|t| (t.seconds, t.nanos)));
        Ok(Some(entries))
    }
}

/// The order's messages in this service's `outbox`, `inbox` and `dead_letters`, found by their
/// correlation id.
struct Messages {
    /// Events a consumer applied: each is the cause of what its transaction changed.
    consumed: Vec<TimelineEntry>,
    /// Events written, published or parked.
    rest: Vec<TimelineEntry>,
}

async fn messages(pool: &PgPool, correlation_id: &str) -> Result<Messages, sqlx::Error> {
    let (mut out, mut consumed) = (Vec::new(), Vec::new());
    let rows = sqlx::query(
        "SELECT message_id, message_type, created_at, published_at, attempts, \
                COALESCE(last_error, '') AS last_error, \
                COALESCE(headers->>'traceparent', '') AS traceparent \
         FROM outbox WHERE correlation_id = $1 ORDER BY id",
    )
    .bind(correlation_id)
    .fetch_all(pool)
    .await?;
    for r in rows {
        let message_id: Uuid = r.try_get("message_id")?;
        let message_type: String = r.try_get("message_type")?;
        let published_at: Option<DateTime<Utc>> = r.try_get("published_at")?;
        let attempts: i32 = r.try_get("attempts")?;
        let trace_id = crate::trace::traceparent_trace_id(r.try_get("traceparent")?);
        let base = TimelineEntry {
            message_id: message_id.to_string(),
            event_type: message_type.clone(),
            attempts,
            trace_id: trace_id.unwrap_or_default(),
            ..TimelineEntry::default()
        };
        let waits = if published_at.is_some() {
            String::new()
        } else {
            ", waiting to be published".to_owned()
        };
        out.push(TimelineEntry {
            time: Some(flashsale_contract::to_timestamp(r.try_get("created_at")?)),
            kind: TimelineEntryKind::EventWritten.into(),
            summary: format!("{message_type} written to the outbox{waits}"),
            detail: r.try_get("last_error")?,
            ..base.clone()
        });
        if let Some(at) = published_at {
            out.push(TimelineEntry {
                time: Some(flashsale_contract::to_timestamp(at)),
                kind: TimelineEntryKind::EventPublished.into(),
                summary: format!("{message_type} published"),
                ..base
            });
        }
    }

    let rows = sqlx::query(
        "SELECT consumer, message_id, message_type, processed_at, attempt, trace_id \
         FROM inbox WHERE correlation_id = $1",
    )
    .bind(correlation_id)
    .fetch_all(pool)
    .await?;
    for r in rows {
        let message_id: Uuid = r.try_get("message_id")?;
        let message_type: String = r.try_get("message_type")?;
        let consumer: String = r.try_get("consumer")?;
        let attempt: i32 = r.try_get("attempt")?;
        let retried = match attempt {
            ..=1 => String::new(),
            n => format!(" (delivery {n}: retried {} time(s))", n - 1),
        };
        consumed.push(TimelineEntry {
            time: Some(flashsale_contract::to_timestamp(r.try_get("processed_at")?)),
            kind: TimelineEntryKind::EventConsumed.into(),
            summary: format!("{message_type} consumed{retried}"),
            detail: consumer,
            message_id: message_id.to_string(),
            event_type: message_type,
            attempts: attempt,
            trace_id: r.try_get("trace_id")?,
            ..TimelineEntry::default()
        });
    }

    let rows = sqlx::query(
        "SELECT queue, message_id, message_type, error, attempts, parked_at, state, \
                COALESCE(resolved_by, '') AS resolved_by, \
                COALESCE(headers->>'traceparent', '') AS traceparent \
         FROM dead_letters WHERE correlation_id = $1 ORDER BY id",
    )
    .bind(correlation_id)
    .fetch_all(pool)
    .await?;
    for r in rows {
        let message_id: Uuid = r.try_get("message_id")?;
        let message_type: String = r.try_get("message_type")?;
        let queue: String = r.try_get("queue")?;
        let state: String = r.try_get("state")?;
        let by: String = r.try_get("resolved_by")?;
        let now = match state.as_str() {
            "PARKED" => "still parked".to_owned(),
            "REPLAYED" => format!("since replayed by {by}"),
            _ => format!("since discarded by {by}"),
        };
        let error: String = r.try_get("error")?;
        out.push(TimelineEntry {
            time: Some(flashsale_contract::to_timestamp(r.try_get("parked_at")?)),
            kind: TimelineEntryKind::EventParked.into(),
            summary: format!("{message_type} parked from {queue}, {now}"),
            detail: error,
            message_id: message_id.to_string(),
            event_type: message_type,
            attempts: r.try_get("attempts")?,
            trace_id: crate::trace::traceparent_trace_id(r.try_get("traceparent")?)
                .unwrap_or_default(),
            ..TimelineEntry::default()
        });
    }
    Ok(Messages {
        consumed,
        rest: out,
    })
}

fn unavailable() -> ApiError {
    ApiError::Unavailable {
        reason: flashsale_contract::reason::DATABASE_UNAVAILABLE,
        message: "the database is unreachable".to_owned(),
    }
}

/// `order_id` as a UUID, or the field violation that names it.
fn order_id(raw: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(raw).map_err(|_| {
        ApiError::InvalidArgument(vec![(
            "order_id".to_owned(),
            format!("{raw:?} is not an order id (a UUID)"),
        )])
    })
}

#[tonic::async_trait]
impl<S: OrderStory> OrderTimelineService for TimelineAdmin<S> {
    async fn get_order_timeline(
        &self,
        req: Request<GetOrderTimelineRequest>,
    ) -> Result<Response<GetOrderTimelineResponse>, Status> {
        let caller = flashsale_platform::auth::authorize(&req, &[Role::Admin])?;
        let id = order_id(&req.get_ref().order_id)?;
        let Some(entries) = self.timeline(id).await? else {
            return Err(ApiError::NotFound(format!("no order {id}")).into());
        };
        tracing::info!(who = %caller.subject, order_id = %id, entries = entries.len(), "order timeline read");
        let trace_id = entries
            .iter()
            .find(|e| !e.trace_id.is_empty())
            .map(|e| e.trace_id.clone())
            .unwrap_or_default();
        Ok(Response::new(GetOrderTimelineResponse {
            service: self.inner.service.to_owned(),
            entries,
            trace_id,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_order_id_that_is_not_a_uuid_is_named() {
        for bad in [
            "",
            "42",
            "not-a-uuid",
            "00000000-0000-0000-0000-00000000000g",
        ] {
            match order_id(bad) {
                Err(ApiError::InvalidArgument(v)) => assert_eq!(v[0].0, "order_id", "{bad}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
        let id = Uuid::new_v4();
        assert_eq!(order_id(&id.to_string()).ok(), Some(id));
    }
}
