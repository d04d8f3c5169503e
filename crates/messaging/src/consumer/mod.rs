//! The consumer loop: one work queue, manual acks, handlers run concurrently up to `prefetch`,
//! failures moved to the retry ladder or the parking lot so a poison message never holds up the
//! messages behind it.

mod dispatch;
mod handler;

use std::{future::Future, sync::Arc, time::Duration};

use anyhow::Context as _;
use flashsale_platform::{backoff::Backoff, failpoint::Failpoints};
use futures_util::{FutureExt as _, StreamExt as _};
use lapin::{
    Channel,
    options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions},
    types::FieldTable,
};
use tokio::task::JoinSet;
use tracing::{error, info, warn};

pub use handler::{Handler, HandlerError, Incoming};

use crate::{
    broker::{Broker, short},
    publisher::Publisher,
    topology::QueueTopology,
};

/// Failpoint reached after the handler returned (and a retry or park was confirmed), right
/// before the ack; armed with `error` the delivery is requeued instead, as if the consumer
/// had died. `consumer.after_handle_before_ack:<routing key>` (say `:order.paid`) stops only a
/// delivery of that routing key.
pub const FP_AFTER_HANDLE_BEFORE_ACK: &str = "consumer.after_handle_before_ack";

/// Histogram: from an event's writing to the start of its first handling, seconds, by queue.
pub const CONSUMER_LAG_SECONDS: &str = "flashsale_consumer_lag_seconds";
/// Counter: messages the broker delivered again, by queue.
pub const REDELIVERED_TOTAL: &str = "flashsale_messages_redelivered_total";

/// How long shutdown waits for handlers in flight (less than the runner gives the consumers:
/// `platform::app::CONSUMERS_GRACE`).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(15);

/// Consumes one work queue with a [`Handler`].
pub struct Consumer<H> {
    broker: Broker,
    ctx: Arc<dispatch::Ctx<H>>,
    prefetch: u16,
}

impl<H> std::fmt::Debug for Consumer<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("queue", &self.ctx.topology.queue())
            .field("prefetch", &self.prefetch)
            .finish_non_exhaustive()
    }
}

// === impl Consumer ===

impl<H: Handler> Consumer<H> {
    /// A consumer of `topology`'s work queue; `max_attempts` and `prefetch` come from the
    /// broker's config.
    pub fn new(broker: &Broker, topology: QueueTopology, handler: H) -> Self {
        let config = broker.config();
        Self {
            broker: broker.clone(),
            prefetch: config.prefetch,
            ctx: Arc::new(dispatch::Ctx {
                max_attempts: config.max_attempts.max(1),
                publisher: Publisher::new(broker),
                failpoints: Failpoints::default(),
                permits: Arc::new(tokio::sync::Semaphore::new(usize::from(
                    config.prefetch.max(1),
                ))),
                topology,
                handler,
            }),
        }
    }

    /// Uses `failpoints` ([`FP_AFTER_HANDLE_BEFORE_ACK`]).
    pub fn with_failpoints(mut self, failpoints: Failpoints) -> Self {
        if let Some(ctx) = Arc::get_mut(&mut self.ctx) {
            ctx.failpoints = failpoints;
        }
        self
    }

    /// The queues this consumer declares and reads.
    pub fn topology(&self) -> &QueueTopology {
        &self.ctx.topology
    }

    /// Declares the topology and consumes until `shutdown` resolves; after a lost channel or
    /// connection it re-opens, re-declares and resumes (with backoff). On shutdown it stops
    /// taking deliveries and waits (up to 30 s) for the handlers in flight to finish and ack.
    pub async fn run<S>(self, shutdown: S) -> anyhow::Result<()>
    where
        S: Future<Output = ()> + Send,
    {
        let shutdown = shutdown.fuse();
        futures_util::pin_mut!(shutdown);
        let mut backoff = Backoff::reconnect();
        loop {
            let started = tokio::time::Instant::now();
            let wait = match self.session(&mut shutdown).await {
                Ok(()) => return Ok(()),
                Err(e) => {
                    // A session that lasted is a fresh failure, not the next of a series.
                    if started.elapsed() > backoff.max() {
                        backoff.reset();
                    }
                    let wait = backoff.next_wait();
                    error!(
                        queue = self.ctx.topology.queue(),
                        error = format!("{e:#}"),
                        retry_in_ms = wait.as_millis() as u64,
                        "consumer lost its channel, resuming"
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

    /// One channel's life: `Ok` on shutdown, `Err` when the channel or connection failed.
    async fn session<S>(&self, shutdown: &mut S) -> anyhow::Result<()>
    where
        S: Future<Output = ()> + Unpin + futures_util::future::FusedFuture,
    {
        let queue = self.ctx.topology.queue().to_owned();
        let tag = format!("{queue}.{}", uuid::Uuid::new_v4().simple());
        let setup = async {
            let channel = self
                .broker
                .channel()
                .await
                .context("open consumer channel")?;
            channel
                .basic_qos(self.prefetch, BasicQosOptions::default())
                .await
                .context("set prefetch")?;
            self.ctx
                .topology
                .declare(&channel)
                .await
                .context("declare consumer topology")?;
            let deliveries = channel
                .basic_consume(
                    short(&queue)?,
                    short(&tag)?,
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await
                .context("start consuming")?;
            Ok::<_, anyhow::Error>((channel, deliveries))
        };
        // While the broker is away, shutdown must not wait for it.
        let (channel, mut deliveries) = tokio::select! {
            _ = &mut *shutdown => return Ok(()),
            res = setup => res?,
        };
        info!(queue = %queue, prefetch = self.prefetch, "consuming");

        let mut tasks = JoinSet::new();
        let result = loop {
            tokio::select! {
                _ = &mut *shutdown => break Ok(()),
                Some(joined) = tasks.join_next(), if !tasks.is_empty() => {
                    if let Err(e) = joined {
                        error!(queue = %queue, error = %e, "message task failed");
                    }
                }
                next = deliveries.next() => match next {
                    Some(Ok(delivery)) => {
                        tasks.spawn(dispatch::process(self.ctx.clone(), delivery));
                    }
                    Some(Err(e)) => break Err(anyhow::Error::new(e).context("receive delivery")),
                    None => break Err(anyhow::anyhow!("the broker cancelled the consumer")),
                },
            }
        };
        match result {
            Ok(()) => {
                stop(&channel, &tag, &mut tasks, &queue).await;
                Ok(())
            }
            Err(e) => {
                // Their acks will fail on the dead channel and the broker redelivers; let
                // them finish their transactions rather than cutting them off.
                tasks.detach_all();
                Err(e)
            }
        }
    }
}

/// Stops deliveries, lets in-flight handlers finish and ack, then closes the channel.
async fn stop(channel: &Channel, tag: &str, tasks: &mut JoinSet<()>, queue: &str) {
    if let Ok(tag) = short(tag)
        && let Err(e) = channel
            .basic_cancel(tag, BasicCancelOptions::default())
            .await
    {
        warn!(queue, error = %e, "failed to cancel consumer");
    }
    let drain = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(DRAIN_TIMEOUT, drain).await.is_err() {
        warn!(
            queue,
            in_flight = tasks.len(),
            "handlers still running at shutdown, abandoning them"
        );
        tasks.abort_all();
    }
    let _ = channel.close(200, "shutdown".into()).await;
    info!(queue, "consumer stopped");
}
