//! The drainer: moves parked messages from each consumer's `<queue>.dlq` into `dead_letters`.
//!
//! Each delivery is inserted, then acked; the insert of a parking already stored is a no-op, so
//! a crash between the two only costs a redelivery. Drainers on several replicas compete on the
//! same parking lots. While the database is unreachable the channel is dropped (the broker keeps
//! the messages) and the drainer comes back with backoff.

use std::{future::Future, time::Duration};

use anyhow::Context as _;
use flashsale_platform::backoff::Backoff;
use futures_util::{FutureExt as _, StreamExt as _, stream::select_all};
use lapin::{
    message::Delivery,
    options::{
        BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicQosOptions,
        QueueDeclareOptions,
    },
    types::FieldTable,
};
use sea_orm::{DatabaseConnection, DbBackend, DbErr};
use sqlx::PgPool;
use tracing::{debug, error, info, warn};

use super::{QUEUE_READY, STORED_TOTAL, parked::Parked, store};
use crate::{
    broker::{Broker, short},
    topology::QueueTopology,
};

/// Shortest interval between two reads of the parking lots' depths.
const MIN_STATS_INTERVAL: Duration = Duration::from_millis(100);
const PURGE_EVERY: Duration = Duration::from_secs(600);

/// Tuning of a [`DeadLetterDrainer`].
#[derive(Clone, Debug)]
pub struct DrainerOptions {
    /// Unacked parking-lot deliveries the drainer holds at once (over all its queues).
    pub prefetch: u16,
    /// How often the parked-messages gauge is refreshed.
    pub stats_interval: Duration,
    /// Replayed and discarded rows older than this are deleted (checked every 10 minutes).
    pub retention: Duration,
}

impl Default for DrainerOptions {
    fn default() -> Self {
        Self {
            prefetch: 32,
            stats_interval: Duration::from_secs(15),
            retention: Duration::from_secs(30 * 24 * 3600),
        }
    }
}

/// Drains the parking lots of a service's consumers into its database; run one per replica.
pub struct DeadLetterDrainer {
    broker: Broker,
    pool: PgPool,
    topologies: Vec<QueueTopology>,
    queues: Vec<String>,
    options: DrainerOptions,
}

impl std::fmt::Debug for DeadLetterDrainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeadLetterDrainer")
            .field("queues", &self.queues)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

// === impl DeadLetterDrainer ===

impl DeadLetterDrainer {
    /// A drainer of the parking lots of `topologies` into the service's PostgreSQL database
    /// (fails for another backend).
    pub fn new(
        broker: &Broker,
        db: &DatabaseConnection,
        topologies: &[QueueTopology],
    ) -> Result<Self, DbErr> {
        if db.get_database_backend() != DbBackend::Postgres {
            return Err(DbErr::Custom(
                "the dead-letter drainer needs PostgreSQL".to_owned(),
            ));
        }
        Ok(Self {
            broker: broker.clone(),
            pool: db.get_postgres_connection_pool().clone(),
            topologies: topologies.to_vec(),
            queues: topologies.iter().map(|t| t.queue().to_owned()).collect(),
            options: DrainerOptions::default(),
        })
    }

    /// Replaces the tuning.
    pub fn with_options(mut self, options: DrainerOptions) -> Self {
        self.options = options;
        self
    }

    /// Declares the topologies and drains until `shutdown` resolves; after a lost channel, a
    /// lost connection or an unreachable database it starts over (with backoff). Messages not
    /// yet stored at shutdown stay in their parking lot.
    pub async fn run<S>(self, shutdown: S) -> anyhow::Result<()>
    where
        S: Future<Output = ()> + Send,
    {
        let shutdown = shutdown.fuse();
        futures_util::pin_mut!(shutdown);
        let mut backoff = Backoff::reconnect();
        let mut last_purge = tokio::time::Instant::now();
        loop {
            let started = tokio::time::Instant::now();
            let wait = match self.session(&mut shutdown, &mut last_purge).await {
                Ok(()) => return Ok(()),
                Err(e) => {
                    // A session that lasted is a fresh failure, not the next of a series.
                    if started.elapsed() > backoff.max() {
                        backoff.reset();
                    }
                    let wait = backoff.next_wait();
                    error!(
                        queues = ?self.queues,
                        error = format!("{e:#}"),
                        retry_in_ms = wait.as_millis() as u64,
                        "dead-letter drainer failed, resuming"
                    );
                    wait
                }
            };
            tokio::select! {
                _ = &mut shutdown => return Ok(()),
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// One channel's life: `Ok` on shutdown, `Err` when the channel, the connection or the
    /// database failed.
    async fn session<S>(
        &self,
        shutdown: &mut S,
        last_purge: &mut tokio::time::Instant,
    ) -> anyhow::Result<()>
    where
        S: Future<Output = ()> + Unpin + futures_util::future::FusedFuture,
    {
        let setup = async {
            let channel = self
                .broker
                .channel()
                .await
                .context("open drainer channel")?;
            channel
                .basic_qos(self.options.prefetch.max(1), BasicQosOptions::default())
                .await
                .context("set prefetch")?;
            let mut streams = Vec::with_capacity(self.topologies.len());
            let mut tags = Vec::with_capacity(self.topologies.len());
            for (i, t) in self.topologies.iter().enumerate() {
                t.declare(&channel)
                    .await
                    .context("declare consumer topology")?;
                let dlq = t.dead_letter_queue();
                let tag = format!("{dlq}.drainer.{}", uuid::Uuid::new_v4().simple());
                let deliveries = channel
                    .basic_consume(
                        short(&dlq)?,
                        short(&tag)?,
                        BasicConsumeOptions::default(),
                        FieldTable::default(),
                    )
                    .await
                    .with_context(|| format!("consume {dlq}"))?;
                streams.push(deliveries.map(move |d| (i, d)));
                tags.push(tag);
            }
            Ok::<_, anyhow::Error>((channel, select_all(streams), tags))
        };
        let (channel, mut deliveries, tags) = tokio::select! {
            _ = &mut *shutdown => return Ok(()),
            res = setup => res?,
        };
        info!(queues = ?self.queues, "draining parking lots");
        let mut tick = tokio::time::interval(self.options.stats_interval.max(MIN_STATS_INTERVAL));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let result = loop {
            tokio::select! {
                _ = &mut *shutdown => break Ok(()),
                _ = tick.tick() => self.housekeeping(last_purge).await,
                next = deliveries.next(), if !self.topologies.is_empty() => match next {
                    Some((i, Ok(delivery))) => {
                        if let Some(t) = self.topologies.get(i)
                            && let Err(e) = self.store(t, delivery).await
                        {
                            break Err(e);
                        }
                    }
                    Some((_, Err(e))) => break Err(anyhow::Error::new(e).context("receive parked message")),
                    None => break Err(anyhow::anyhow!("the broker cancelled the drainer")),
                },
            }
        };
        for tag in &tags {
            if let Ok(tag) = short(tag) {
                let _ = channel
                    .basic_cancel(tag, BasicCancelOptions::default())
                    .await;
            }
        }
        // Unacked deliveries go back to their parking lot.
        let _ = channel.close(200, "drainer stopped".into()).await;
        result
    }

    /// Inserts one parked message, then acks it. `Err` only when the database is unreachable;
    /// a message the database refuses stays unacked (so it is kept) and is tried again on the
    /// next channel.
    async fn store(&self, topology: &QueueTopology, delivery: Delivery) -> anyhow::Result<()> {
        let queue = topology.queue();
        let parked = Parked::read(
            queue,
            &delivery.properties,
            delivery.routing_key.as_str(),
            &delivery.data,
            chrono::Utc::now(),
        );
        match store::insert(&self.pool, &parked).await {
            Ok(Some(id)) => {
                info!(
                    queue,
                    message_id = %id,
                    routing_key = %parked.routing_key,
                    attempts = parked.attempts,
                    error = %parked.error,
                    "parked message stored"
                );
                metrics::counter!(STORED_TOTAL, "queue" => queue.to_owned()).increment(1);
            }
            Ok(None) => debug!(queue, "parked message was stored already"),
            Err(e) if store::unreachable(&e) => {
                return Err(anyhow::Error::new(e).context("store parked message"));
            }
            Err(e) => {
                error!(queue, error = %e, "cannot store parked message, leaving it in the parking lot");
                return Ok(());
            }
        }
        if let Err(e) = delivery.ack(BasicAckOptions::default()).await {
            // The channel is gone: the broker redelivers it and the insert is a no-op.
            debug!(queue, error = %e, "ack failed");
        }
        Ok(())
    }

    async fn housekeeping(&self, last_purge: &mut tokio::time::Instant) {
        if let Err(e) = store::refresh_gauge(&self.pool, &self.queues).await {
            warn!(error = %e, "failed to count parked messages");
        }
        if let Err(e) = self.read_queue_depths().await {
            debug!(
                error = format!("{e:#}"),
                "failed to read the work queues' depths"
            );
        }
        if last_purge.elapsed() >= PURGE_EVERY {
            *last_purge = tokio::time::Instant::now();
            match store::purge_resolved(&self.pool, self.options.retention).await {
                Ok(0) => {}
                Ok(n) => debug!(rows = n, "purged resolved dead letters"),
                Err(e) => warn!(error = %e, "failed to purge resolved dead letters"),
            }
        }
    }

    /// Sets [`QUEUE_READY`] for each consumer's work queue: the messages waiting for a
    /// consumer, as the broker counts them (a passive declare, on a channel of its own so a
    /// queue deleted meanwhile closes only that one).
    async fn read_queue_depths(&self) -> anyhow::Result<()> {
        if self.topologies.is_empty() {
            return Ok(());
        }
        let channel = self.broker.channel().await.context("open a channel")?;
        for t in &self.topologies {
            let q = channel
                .queue_declare(
                    short(t.queue())?,
                    QueueDeclareOptions {
                        passive: true,
                        ..QueueDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await
                .with_context(|| format!("read the depth of {}", t.queue()))?;
            metrics::gauge!(QUEUE_READY, "queue" => t.queue().to_owned())
                .set(f64::from(q.message_count()));
        }
        let _ = channel.close(200, "depths read".into()).await;
        Ok(())
    }
}
