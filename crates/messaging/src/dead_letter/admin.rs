//! `flashsale.admin.v1.DeadLetterService` over the `dead_letters` table: admin only, input
//! checked before anything is touched, every action logged with who did it.

use std::sync::Arc;

use flashsale_platform::{
    ApiError,
    auth::{Caller, Role},
};
use flashsale_proto::admin::v1::{
    DeadLetter, DiscardDeadLettersRequest, DiscardDeadLettersResponse, ListDeadLettersRequest,
    ListDeadLettersResponse, ReplayDeadLettersRequest, ReplayDeadLettersResponse,
    dead_letter_service_server::DeadLetterService,
};
use sea_orm::{DatabaseConnection, DbBackend, DbErr};
use sqlx::PgPool;
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use super::{
    DISCARDED_TOTAL, DeadLetterError, REPLAYED_TOTAL,
    parked::replay_message,
    request::{self, Target},
    store::{self, Listed},
    token::{self, Cursor},
};
use crate::{publisher::Publisher, topology::QueueTopology};

/// Rows one replay transaction locks and publishes (pipelined) at a time.
const REPLAY_BATCH: i64 = 200;
/// Payload bytes one list page carries at most (at least one message, however big), so a page
/// stays well under the gRPC message limit.
const PAGE_BYTES: usize = 1024 * 1024;

/// Serves the dead-letter admin API for a service's consumer queues.
#[derive(Clone)]
pub struct DeadLetterAdmin {
    inner: Arc<Inner>,
}

struct Inner {
    pool: PgPool,
    publisher: Publisher,
    queues: Vec<String>,
}

impl std::fmt::Debug for DeadLetterAdmin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeadLetterAdmin")
            .field("queues", &self.inner.queues)
            .finish_non_exhaustive()
    }
}

// === impl DeadLetterAdmin ===

impl DeadLetterAdmin {
    /// An admin over the service's PostgreSQL database (fails for another backend) for the work
    /// queues of `topologies`; replays go out through `publisher`.
    pub fn new(
        db: &DatabaseConnection,
        publisher: Publisher,
        topologies: &[QueueTopology],
    ) -> Result<Self, DbErr> {
        if db.get_database_backend() != DbBackend::Postgres {
            return Err(DbErr::Custom(
                "the dead-letter admin needs PostgreSQL".to_owned(),
            ));
        }
        Ok(Self {
            inner: Arc::new(Inner {
                pool: db.get_postgres_connection_pool().clone(),
                publisher,
                queues: topologies.iter().map(|t| t.queue().to_owned()).collect(),
            }),
        })
    }

    /// Publishes the target's parked messages back to their work queue and marks the
    /// confirmed ones replayed, batch by batch; returns how many were replayed.
    async fn replay(&self, target: &Target, by: &str) -> Result<usize, DeadLetterError> {
        let pool = &self.inner.pool;
        let max_id = store::max_id(pool).await?;
        let mut replayed = 0;
        loop {
            let mut tx = pool.begin().await?;
            let rows = store::lock_parked(
                &mut tx,
                &target.queue,
                target.ids.as_deref(),
                max_id,
                REPLAY_BATCH,
            )
            .await?;
            if rows.is_empty() {
                tx.commit().await?;
                return Ok(replayed);
            }
            let msgs: Vec<_> = rows
                .iter()
                .map(|r| {
                    replay_message(
                        &target.queue,
                        r.message_id,
                        &r.routing_key,
                        &r.message_type,
                        &r.headers,
                        r.payload.clone(),
                    )
                })
                .collect();
            let results = self.inner.publisher.publish_batch(&msgs).await;
            let mut sent = Vec::with_capacity(rows.len());
            let mut failed = None;
            for (row, res) in rows.iter().zip(results) {
                match res {
                    Ok(()) => {
                        info!(who = by, queue = %target.queue, message_id = %row.message_id, "dead letter replayed");
                        sent.push(row.id);
                    }
                    Err(e) => {
                        warn!(who = by, queue = %target.queue, message_id = %row.message_id, error = %e, "dead letter not replayed");
                        failed.get_or_insert(e);
                    }
                }
            }
            // Rows published but not marked (the commit fails) are replayed again by a later
            // call; the handler's inbox drops the duplicate.
            store::mark_replayed(&mut tx, &sent, by).await?;
            tx.commit().await?;
            replayed += sent.len();
            metrics::counter!(REPLAYED_TOTAL, "queue" => target.queue.clone())
                .increment(sent.len() as u64);
            if let Some(source) = failed {
                return Err(DeadLetterError::Publish { replayed, source });
            }
            if rows.len() < usize::try_from(REPLAY_BATCH).unwrap_or(usize::MAX) {
                return Ok(replayed);
            }
        }
    }

    async fn refresh_gauge(&self) {
        if let Err(e) = store::refresh_gauge(&self.inner.pool, &self.inner.queues).await {
            warn!(error = %e, "failed to count parked messages");
        }
    }
}

/// The caller, if an admin; the call is audited (see [`flashsale_platform::auth::authorize`]).
fn admin<T: std::fmt::Debug>(req: &Request<T>) -> Result<Caller, ApiError> {
    flashsale_platform::auth::authorize(req, &[Role::Admin])
}

fn to_proto(r: Listed) -> DeadLetter {
    DeadLetter {
        message_id: r.message_id.to_string(),
        queue: r.queue,
        routing_key: r.routing_key,
        r#type: r.message_type,
        error: r.error,
        attempts: r.attempts,
        parked_time: Some(flashsale_contract::to_timestamp(r.parked_at)),
        payload: r.payload,
    }
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

#[tonic::async_trait]
impl DeadLetterService for DeadLetterAdmin {
    async fn list_dead_letters(
        &self,
        req: Request<ListDeadLettersRequest>,
    ) -> Result<Response<ListDeadLettersResponse>, Status> {
        let caller = admin(&req)?;
        let q = request::list(req.get_ref(), &self.inner.queues)?;
        let limit = i64::try_from(q.page_size)
            .unwrap_or(i64::MAX)
            .saturating_add(1);
        let rows = store::list(&self.inner.pool, &q.queues, q.after, limit)
            .await
            .map_err(DeadLetterError::from)?;
        let more = rows.len() > q.page_size;
        let mut page = Vec::new();
        let (mut bytes, mut last) = (0usize, None);
        let mut cut = false;
        for r in rows.into_iter().take(q.page_size) {
            if !page.is_empty() && bytes + r.payload.len() > PAGE_BYTES {
                cut = true;
                break;
            }
            bytes += r.payload.len();
            last = Some(Cursor {
                parked_at: r.parked_at,
                id: r.id,
            });
            page.push(to_proto(r));
        }
        let next_page_token = match last {
            Some(c) if more || cut => token::encode(&q.filter, c),
            _ => String::new(),
        };
        info!(
            who = %caller.subject,
            action = "list",
            queue = %q.filter,
            listed = page.len(),
            "dead letters listed"
        );
        Ok(Response::new(ListDeadLettersResponse {
            dead_letters: page,
            next_page_token,
        }))
    }

    async fn replay_dead_letters(
        &self,
        req: Request<ReplayDeadLettersRequest>,
    ) -> Result<Response<ReplayDeadLettersResponse>, Status> {
        let caller = admin(&req)?;
        let target = request::replay(req.get_ref(), &self.inner.queues)?;
        let result = self.replay(&target, &caller.subject).await;
        self.refresh_gauge().await;
        let replayed = match result {
            Ok(n) => n,
            Err(e) => {
                warn!(who = %caller.subject, action = "replay", queue = %target.queue, selection = %target.selection(), error = %e, "dead letter replay failed");
                return Err(e.into());
            }
        };
        info!(
            who = %caller.subject,
            action = "replay",
            queue = %target.queue,
            selection = %target.selection(),
            replayed,
            "dead letters replayed"
        );
        Ok(Response::new(ReplayDeadLettersResponse {
            replayed: count(replayed),
        }))
    }

    async fn discard_dead_letters(
        &self,
        req: Request<DiscardDeadLettersRequest>,
    ) -> Result<Response<DiscardDeadLettersResponse>, Status> {
        let caller = admin(&req)?;
        let d = request::discard(req.get_ref(), &self.inner.queues)?;
        let target = &d.target;
        let ids = store::discard(
            &self.inner.pool,
            &target.queue,
            target.ids.as_deref(),
            &caller.subject,
            &d.reason,
        )
        .await
        .map_err(DeadLetterError::from)?;
        for id in &ids {
            info!(who = %caller.subject, queue = %target.queue, message_id = %id, reason = %d.reason, "dead letter discarded");
        }
        metrics::counter!(DISCARDED_TOTAL, "queue" => target.queue.clone())
            .increment(ids.len() as u64);
        self.refresh_gauge().await;
        info!(
            who = %caller.subject,
            action = "discard",
            queue = %target.queue,
            selection = %target.selection(),
            discarded = ids.len(),
            reason = %d.reason,
            "dead letters discarded"
        );
        Ok(Response::new(DiscardDeadLettersResponse {
            discarded: count(ids.len()),
        }))
    }
}
