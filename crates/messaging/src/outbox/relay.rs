//! The relay: moves committed outbox rows to the broker.
//!
//! Each batch is one transaction: `SELECT … FOR UPDATE SKIP LOCKED` (so relays on several
//! replicas share the work without publishing a row twice at the same time), publish all rows
//! pipelined with confirms — rows of one routing key together, up to `amqp.bundle_max_events`
//! per message ([`crate::bundle`]) — mark the confirmed ones, commit. A crash between publish and commit
//! publishes those rows again later: delivery is at least once and consumers deduplicate
//! through the inbox.

use std::{collections::BTreeMap, future::Future, time::Duration};

use anyhow::Context as _;
use flashsale_platform::{backoff::Backoff, failpoint::Failpoints};
use futures_util::FutureExt as _;
use lapin::types::FieldTable;
use sea_orm::{DatabaseConnection, DbBackend, DbErr};
use sqlx::{PgPool, Row as _, postgres::PgListener};
use tracing::{debug, error, warn};

use crate::{
    broker::BrokerError,
    bundle,
    migration::OUTBOX_CHANNEL,
    publisher::{OutgoingMessage, PublishError, Publisher},
    trace,
};

/// Failpoint reached after a batch was published and confirmed, before anything is marked.
pub const FP_AFTER_PUBLISH: &str = "outbox.relay.after_publish";
/// Failpoint reached right before the `UPDATE` that marks rows published.
pub const FP_BEFORE_MARK: &str = "outbox.relay.before_mark";

const PURGE_EVERY: Duration = Duration::from_secs(600);
/// How often the relay reads its outbox's backlog into the gauges.
const BACKLOG_EVERY: Duration = Duration::from_secs(5);
/// Unpublished rows of this service's outbox.
pub const BACKLOG_ROWS: &str = "flashsale_outbox_backlog_rows";
/// How long the oldest unpublished row has waited, seconds (0 when none waits).
pub const OLDEST_AGE_SECONDS: &str = "flashsale_outbox_oldest_age_seconds";
/// From an event's commit (its row's `created_at`) to the broker's confirm of it, seconds.
pub const PUBLISH_DELAY_SECONDS: &str = "flashsale_outbox_publish_delay_seconds";
/// How long shutdown lets the batch in flight finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Tuning of an [`OutboxRelay`].
#[derive(Clone, Debug)]
pub struct RelayOptions {
    /// Rows per transaction (published pipelined, then confirmed together).
    pub batch_size: u32,
    /// Batches in flight at once, each its own transaction over rows the others skipped (as
    /// relays on several replicas do). A batch spends most of its time waiting for the broker's
    /// confirms; while it waits, the next ones publish. Events of different batches may reach
    /// the broker in any order, as they may from several replicas: consumers do not rely on it
    /// (docs/architecture.md#messaging). Two by default: more leave more of the relay's
    /// transactions competing with the buyers for the cores, and confirm the saga no faster
    /// (docs/benchmarks.md).
    pub batches_in_flight: u32,
    /// Poll interval when no `NOTIFY` arrives (a lost notification, a dead listener).
    pub poll_interval: Duration,
    /// How long the relay lets rows gather after a `NOTIFY` woke it. Every transaction that
    /// writes events notifies, and under a steady flow of small transactions (payments,
    /// shipments) a relay that drained at every notification would publish a few rows per
    /// batch, each batch a transaction of its own; a few milliseconds more per event make the
    /// batches several times larger.
    pub gather: Duration,
    /// Published rows older than this are deleted (checked every 10 minutes); zero deletes
    /// each row in the transaction that publishes it (`amqp.outbox_keep_published_hours`).
    pub retention: Duration,
    /// Foreground work this relay gives way to: while the foreground is busy it publishes only
    /// once the oldest due row has waited the yield's `max_lag` (then from the oldest on), so the
    /// events of a short burst go out right after it. A load that outlasts `max_lag` is
    /// sustained: from then on the relay holds nothing back until the foreground has been quiet
    /// for `max_lag`
    /// ([`flashsale_platform::pressure::Yielder`]). Every row of the outbox waits alike,
    /// whatever its event.
    pub yield_to: Option<flashsale_platform::pressure::Yield>,
}

impl Default for RelayOptions {
    fn default() -> Self {
        Self {
            batch_size: 256,
            batches_in_flight: 2,
            poll_interval: Duration::from_secs(1),
            gather: Duration::from_millis(5),
            retention: Duration::from_secs(7 * 24 * 3600),
            yield_to: None,
        }
    }
}

/// Publishes committed outbox rows; run one per service replica (they cooperate).
pub struct OutboxRelay {
    pool: PgPool,
    publisher: Publisher,
    failpoints: Failpoints,
    options: RelayOptions,
}

impl std::fmt::Debug for OutboxRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxRelay")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

// === impl OutboxRelay ===

impl OutboxRelay {
    /// A relay over the service's PostgreSQL database (fails for another backend).
    pub fn new(db: &DatabaseConnection, publisher: Publisher) -> Result<Self, DbErr> {
        if db.get_database_backend() != DbBackend::Postgres {
            return Err(DbErr::Custom(
                "the outbox relay needs PostgreSQL".to_owned(),
            ));
        }
        Ok(Self {
            pool: db.get_postgres_connection_pool().clone(),
            publisher,
            failpoints: Failpoints::default(),
            options: RelayOptions::default(),
        })
    }

    /// Uses `failpoints` ([`FP_AFTER_PUBLISH`], [`FP_BEFORE_MARK`]).
    pub fn with_failpoints(mut self, failpoints: Failpoints) -> Self {
        self.failpoints = failpoints;
        self
    }

    /// Replaces the tuning.
    pub fn with_options(mut self, options: RelayOptions) -> Self {
        self.options = options;
        self
    }

    /// Runs until `shutdown` resolves (e.g. `token.cancelled_owned()` of a
    /// `tokio_util::sync::CancellationToken`, or `async move { let _ = rx.changed().await; }`
    /// on a `watch` channel). Wakes on `NOTIFY flashsale_outbox`, and polls every
    /// `poll_interval` in case a notification was missed. On shutdown the batch in flight gets up
    /// to 5 s to finish, then what is due is published for up to 5 s more (the events of the
    /// last calls and messages this process handled); rows cut off stay unpublished and go out
    /// again later, from another replica or this one restarted.
    pub async fn run<S>(self, shutdown: S) -> anyhow::Result<()>
    where
        S: Future<Output = ()> + Send,
    {
        self.relay_until(shutdown).await?;
        self.flush().await;
        Ok(())
    }

    /// Publishes what is due, batch after batch, for at most [`SHUTDOWN_GRACE`].
    async fn flush(&self) {
        let drain = async {
            loop {
                match self.relay_batches(1).await {
                    Ok(true) => {}
                    Ok(false) => return,
                    Err(e) => {
                        warn!(
                            error = format!("{e:#}"),
                            "cannot publish the outbox at shutdown"
                        );
                        return;
                    }
                }
            }
        };
        if tokio::time::timeout(SHUTDOWN_GRACE, drain).await.is_err() {
            warn!("outbox not drained at shutdown; the rest goes out later");
        }
    }

    async fn relay_until<S>(&self, shutdown: S) -> anyhow::Result<()>
    where
        S: Future<Output = ()> + Send,
    {
        let shutdown = shutdown.fuse();
        futures_util::pin_mut!(shutdown);
        let mut listener: Option<PgListener> = None;
        let mut backoff = Backoff::reconnect();
        let mut failed_wait = backoff.step();
        let mut last_purge = tokio::time::Instant::now();
        let mut last_backlog: Option<tokio::time::Instant> = None;
        let mut yielder = self
            .options
            .yield_to
            .clone()
            .map(flashsale_platform::pressure::Yielder::new);
        let mut notified = false;
        loop {
            if listener.is_none() {
                listener = self.listen().await;
            }
            if notified && !self.options.gather.is_zero() {
                tokio::select! {
                    _ = tokio::time::sleep(self.options.gather) => {}
                    _ = &mut shutdown => return Ok(()),
                }
                // The rows notified meanwhile are taken by this drain.
                if let Some(l) = &mut listener {
                    while l.next_buffered().is_some() {}
                }
            }
            notified = false;
            // Drain: batches until one comes back short. The first batch runs alone: when it
            // comes back short there was nothing for a second one, whose transaction would
            // find every row locked or taken; after a full one, `batches_in_flight` at once.
            let mut failed = false;
            let mut in_flight = 1;
            loop {
                if let Some(y) = &mut yielder {
                    let held = tokio::time::Instant::now();
                    loop {
                        if y.hold(None).is_none() {
                            break;
                        }
                        let oldest = tokio::select! {
                            age = self.oldest_due_age() => age,
                            _ = &mut shutdown => return Ok(()),
                        };
                        let Some(wait) = y.hold(oldest) else { break };
                        tokio::select! {
                            _ = tokio::time::sleep(wait) => {}
                            _ = &mut shutdown => return Ok(()),
                        }
                    }
                    let waited = held.elapsed();
                    if !waited.is_zero() {
                        metrics::counter!("flashsale_outbox_yielded_ms_total")
                            .increment(u64::try_from(waited.as_millis()).unwrap_or(u64::MAX));
                    }
                }
                let batch = self.relay_batches(in_flight);
                in_flight = self.options.batches_in_flight.max(1);
                futures_util::pin_mut!(batch);
                let res = tokio::select! {
                    res = &mut batch => res,
                    _ = &mut shutdown => {
                        // Let healthy batches finish and mark their rows; a stuck one (broker
                        // gone) is dropped, its transaction rolled back and its rows kept.
                        let _ = tokio::time::timeout(SHUTDOWN_GRACE, batch).await;
                        return Ok(());
                    }
                };
                match res {
                    // Every batch came back full: there may be more.
                    Ok(full) if full => {
                        backoff.reset();
                    }
                    Ok(_) => {
                        backoff.reset();
                        break;
                    }
                    Err(e) => {
                        failed_wait = backoff.next_wait();
                        error!(
                            error = format!("{e:#}"),
                            retry_in_ms = failed_wait.as_millis() as u64,
                            "failed to publish outbox batch"
                        );
                        failed = true;
                        break;
                    }
                }
            }
            if last_backlog.is_none_or(|t| t.elapsed() >= BACKLOG_EVERY) {
                last_backlog = Some(tokio::time::Instant::now());
                if let Err(e) = self.backlog().await {
                    debug!(error = %e, "cannot read the outbox's backlog");
                }
            }
            if last_purge.elapsed() >= PURGE_EVERY {
                last_purge = tokio::time::Instant::now();
                self.purge().await;
            }
            let wait = if failed {
                failed_wait
            } else {
                self.options.poll_interval
            };
            tokio::select! {
                _ = &mut shutdown => return Ok(()),
                _ = tokio::time::sleep(wait) => {}
                res = recv(&mut listener), if !failed => {
                    match res {
                        Ok(()) => notified = true,
                        Err(e) => {
                            warn!(error = %e, "outbox listener failed, polling until it is back");
                            listener = None;
                        }
                    }
                }
            }
        }
    }

    /// `n` batches at once; whether every one of them came back full (so more rows may be
    /// due). The first error, once every batch has finished.
    async fn relay_batches(&self, n: u32) -> anyhow::Result<bool> {
        let results = futures_util::future::join_all((0..n).map(|_| self.relay_batch())).await;
        let mut full = true;
        for r in results {
            full &= r? >= self.batch_size() as usize;
        }
        Ok(full)
    }

    /// Publishes one batch of due rows; returns how many rows it took (published or not).
    pub async fn relay_batch(&self) -> anyhow::Result<usize> {
        let mut tx = self
            .pool
            .begin()
            .await
            .context("begin outbox transaction")?;
        let rows = sqlx::query(
            "SELECT id, message_id, exchange, routing_key, message_type, payload, \
                    headers::text AS headers, created_at \
             FROM outbox \
             WHERE published_at IS NULL AND next_attempt_at <= now() \
             ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED",
        )
        .bind(i64::from(self.batch_size()))
        .fetch_all(&mut *tx)
        .await
        .context("select outbox rows")?;
        if rows.is_empty() {
            tx.commit().await.context("commit empty outbox batch")?;
            return Ok(0);
        }
        let mut ids = Vec::with_capacity(rows.len());
        let mut msgs = Vec::with_capacity(rows.len());
        let mut traces = Vec::with_capacity(rows.len());
        let mut created = Vec::with_capacity(rows.len());
        for row in &rows {
            ids.push(row.try_get::<i64, _>("id").context("read outbox id")?);
            created.push(
                row.try_get::<chrono::DateTime<chrono::Utc>, _>("created_at")
                    .context("read outbox created_at")?,
            );
            let (msg, trace) = self.message(row).context("read outbox row")?;
            msgs.push(msg);
            traces.push(trace);
        }
        // Rows of one routing key travel together, up to `amqp.bundle_max_events` per message.
        let plan = bundle::plan(&msgs, self.publisher.bundle_max_events());
        let outgoing: Vec<OutgoingMessage> = plan
            .iter()
            .map(|group| match group.as_slice() {
                [one] => std::mem::take(&mut msgs[*one]),
                many => bundle::pack(
                    &many
                        .iter()
                        .map(|&i| (&msgs[i], &traces[i]))
                        .collect::<Vec<_>>(),
                ),
            })
            .collect();
        let bundles = plan.iter().filter(|g| g.len() > 1).count();
        let results = self.publisher.publish_batch(&outgoing).await;
        self.failpoints.hit(FP_AFTER_PUBLISH).await?;

        let mut sent = Vec::new();
        let (mut refused_ids, mut refused_errs) = (Vec::new(), Vec::new());
        for ((group, msg), res) in plan.iter().zip(&outgoing).zip(results) {
            let group_ids = group.iter().map(|&i| ids[i]);
            match res {
                Ok(()) => {
                    // From the event's commit to the broker's confirm.
                    let now = chrono::Utc::now();
                    for &i in group {
                        let delay = (now - created[i]).to_std().unwrap_or_default();
                        metrics::histogram!(PUBLISH_DELAY_SECONDS).record(delay.as_secs_f64());
                    }
                    sent.extend(group_ids);
                }
                Err(PublishError::Unroutable {
                    ref routing_key, ..
                }) if crate::envelope::keys::NOTIFICATIONS.contains(&routing_key.as_str()) => {
                    debug!(rows = group.len(), %routing_key, "notification with no subscriber");
                    metrics::counter!("flashsale_outbox_unsubscribed_total", "routing_key" => routing_key.clone())
                        .increment(group.len() as u64);
                    sent.extend(group_ids);
                }
                // Refused for this message alone: back off on its rows, go on with the others.
                Err(
                    e @ (PublishError::Unroutable { .. }
                    | PublishError::Nacked { .. }
                    | PublishError::Invalid(_)
                    | PublishError::Broker(BrokerError::NameTooLong(_))),
                ) => {
                    warn!(rows = group.len(), message_id = %msg.message_id, error = %e, "broker refused outbox message");
                    for id in group_ids {
                        refused_ids.push(id);
                        refused_errs.push(e.to_string());
                    }
                }
                // Channel or connection trouble: mark what was confirmed, retry the rest soon.
                Err(e) => {
                    debug!(rows = group.len(), error = %e, "outbox message not confirmed");
                }
            }
        }
        self.failpoints.hit(FP_BEFORE_MARK).await?;
        if !sent.is_empty() {
            // Deleted outright unless published rows are kept: an update would write a new
            // version of every row (and of its index entries) only for the purge to delete it.
            let mark = if self.options.retention.is_zero() {
                "DELETE FROM outbox WHERE id = ANY($1)"
            } else {
                "UPDATE outbox SET published_at = now(), attempts = attempts + 1, last_error = NULL \
                 WHERE id = ANY($1)"
            };
            sqlx::query(mark)
                .bind(&sent)
                .execute(&mut *tx)
                .await
                .context("mark outbox rows published")?;
        }
        if !refused_ids.is_empty() {
            sqlx::query(
                "UPDATE outbox o SET attempts = o.attempts + 1, last_error = f.err, \
                     next_attempt_at = now() + make_interval(secs => least(power(2, o.attempts), 300)) \
                 FROM unnest($1::bigint[], $2::text[]) AS f(id, err) WHERE o.id = f.id",
            )
            .bind(&refused_ids)
            .bind(&refused_errs)
            .execute(&mut *tx)
            .await
            .context("record refused outbox rows")?;
        }
        tx.commit().await.context("commit outbox batch")?;
        metrics::counter!("flashsale_outbox_published_total").increment(sent.len() as u64);
        metrics::counter!("flashsale_outbox_bundles_total").increment(bundles as u64);
        metrics::counter!("flashsale_outbox_refused_total").increment(refused_ids.len() as u64);
        let unconfirmed = rows.len() - sent.len() - refused_ids.len();
        if unconfirmed > 0 {
            anyhow::bail!(
                "{unconfirmed} of {} outbox messages not confirmed",
                rows.len()
            );
        }
        Ok(rows.len())
    }

    /// The unpublished rows and how long the oldest of them has waited (zero when there is
    /// none), also exported as `flashsale_outbox_backlog_rows` and
    /// `flashsale_outbox_oldest_age_seconds` (one outbox per service database: a dashboard
    /// takes `max` over a service's replicas).
    pub async fn backlog(&self) -> anyhow::Result<(i64, Duration)> {
        let (rows, secs): (i64, Option<f64>) = sqlx::query_as(
            "SELECT COUNT(*), EXTRACT(EPOCH FROM now() - MIN(created_at))::float8 FROM outbox \
             WHERE published_at IS NULL",
        )
        .fetch_one(&self.pool)
        .await
        .context("read the outbox's backlog")?;
        let age =
            Duration::try_from_secs_f64(secs.unwrap_or(0.0).max(0.0)).unwrap_or(Duration::MAX);
        metrics::gauge!(BACKLOG_ROWS).set(rows as f64);
        metrics::gauge!(OLDEST_AGE_SECONDS).set(age.as_secs_f64());
        Ok((rows, age))
    }

    /// How long the oldest due unpublished row has waited (`None`: there is none, or it could
    /// not be read — the relay then goes ahead as if nothing held it back).
    async fn oldest_due_age(&self) -> Option<Duration> {
        let secs: Option<f64> = sqlx::query_scalar(
            "SELECT EXTRACT(EPOCH FROM now() - created_at)::float8 FROM outbox \
             WHERE published_at IS NULL AND next_attempt_at <= now() ORDER BY id LIMIT 1",
        )
        .fetch_optional(&self.pool)
        .await
        .unwrap_or_else(|e| {
            warn!(error = %e, "cannot read the outbox's oldest row; publishing without waiting");
            Some(f64::MAX)
        });
        secs.map(|s| Duration::try_from_secs_f64(s.max(0.0)).unwrap_or(Duration::MAX))
    }

    fn batch_size(&self) -> u32 {
        self.options.batch_size.max(1)
    }

    /// The row as a message, and its trace headers (for a bundle).
    fn message(
        &self,
        row: &sqlx::postgres::PgRow,
    ) -> anyhow::Result<(OutgoingMessage, BTreeMap<String, String>)> {
        let exchange: Option<String> = row.try_get("exchange")?;
        let created: chrono::DateTime<chrono::Utc> = row.try_get("created_at")?;
        let headers_json: String = row.try_get("headers")?;
        let headers: BTreeMap<String, String> =
            serde_json::from_str::<serde_json::Map<_, _>>(&headers_json)
                .unwrap_or_default()
                .into_iter()
                .filter_map(|(k, v)| match v {
                    serde_json::Value::String(s) => Some((k, s)),
                    _ => None,
                })
                .collect();
        let mut table = FieldTable::default();
        trace::insert_strings(&mut table, &headers);
        let msg = OutgoingMessage {
            exchange: exchange.unwrap_or_else(|| self.publisher.exchange().to_owned()),
            routing_key: row.try_get("routing_key")?,
            message_id: row.try_get::<uuid::Uuid, _>("message_id")?.to_string(),
            kind: row.try_get("message_type")?,
            timestamp: u64::try_from(created.timestamp()).unwrap_or(0),
            headers: table,
            payload: row.try_get("payload")?,
            content_type: String::new(),
        };
        Ok((msg, headers))
    }

    async fn listen(&self) -> Option<PgListener> {
        let res = async {
            let mut l = PgListener::connect_with(&self.pool).await?;
            l.listen(OUTBOX_CHANNEL).await?;
            Ok::<_, sqlx::Error>(l)
        }
        .await;
        match res {
            Ok(l) => Some(l),
            Err(e) => {
                warn!(error = %e, "cannot listen for outbox notifications, polling");
                None
            }
        }
    }

    async fn purge(&self) {
        let secs = self.options.retention.as_secs_f64();
        let res = sqlx::query(
            "DELETE FROM outbox WHERE published_at < now() - make_interval(secs => $1)",
        )
        .bind(secs)
        .execute(&self.pool)
        .await;
        match res {
            Ok(r) if r.rows_affected() > 0 => {
                debug!(rows = r.rows_affected(), "purged published outbox rows")
            }
            Ok(_) => {}
            Err(e) => warn!(error = %e, "failed to purge published outbox rows"),
        }
    }
}

/// The next notification, or never when there is no listener (the poll timer wakes us).
async fn recv(listener: &mut Option<PgListener>) -> Result<(), sqlx::Error> {
    match listener {
        Some(l) => {
            l.recv().await?;
            // Coalesce a burst of notifications into one wake-up.
            while l.next_buffered().is_some() {}
            Ok(())
        }
        None => std::future::pending().await,
    }
}
