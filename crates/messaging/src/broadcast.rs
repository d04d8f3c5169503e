//! Broadcast subscriptions: every replica of a service hears every event of some routing keys,
//! e.g. to keep a per-replica cache fresh. Unlike the work queues (one consumer per message
//! across replicas), each subscriber gets its own server-named, exclusive, auto-deleted queue,
//! so it lives exactly as long as the subscriber's channel and leaves nothing behind. Deliveries
//! are not acknowledged (nothing to retry: a missed event only makes a cache entry live out its
//! own short lifetime); after a lost channel the subscriber says so (`on_subscribed` runs again,
//! so the caller can drop what it may have missed) and resubscribes with backoff.

use std::future::Future;

use anyhow::Context as _;
use futures_util::{FutureExt as _, StreamExt as _};
use lapin::{
    options::{BasicConsumeOptions, QueueBindOptions, QueueDeclareOptions},
    types::FieldTable,
};
use tracing::{debug, info, warn};

use crate::{Broker, broker::short, envelope, topology::declare_exchange};
use flashsale_platform::backoff::Backoff;
use flashsale_proto::events::v1::Envelope;

/// Subscribes to `routing_keys` on the broker's exchange until `shutdown` resolves, calling
/// `on_event` for every decodable event and `on_subscribed` each time a (re)subscription is in
/// place. Undecodable messages are logged and skipped.
pub async fn run<E, R, S>(
    broker: Broker,
    routing_keys: Vec<String>,
    on_event: E,
    on_subscribed: R,
    shutdown: S,
) -> anyhow::Result<()>
where
    E: Fn(Envelope) + Send + Sync,
    R: Fn() + Send + Sync,
    S: Future<Output = ()> + Send,
{
    let shutdown = shutdown.fuse();
    futures_util::pin_mut!(shutdown);
    let mut backoff = Backoff::reconnect();
    loop {
        let started = tokio::time::Instant::now();
        let session = session(&broker, &routing_keys, &on_event, &on_subscribed);
        let wait = tokio::select! {
            _ = &mut shutdown => return Ok(()),
            res = session => {
                // A subscription that lasted is a fresh failure, not the next of a series.
                if started.elapsed() > backoff.max() {
                    backoff.reset();
                }
                let wait = backoff.next_wait();
                warn!(keys = ?routing_keys, error = format!("{:#}", res.err().unwrap_or_else(|| anyhow::anyhow!("ended"))),
                    retry_in_ms = wait.as_millis() as u64, "broadcast subscription lost, resubscribing");
                wait
            }
        };
        tokio::select! {
            _ = &mut shutdown => return Ok(()),
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// One channel's life; returns when it fails.
async fn session<E, R>(
    broker: &Broker,
    routing_keys: &[String],
    on_event: &E,
    on_subscribed: &R,
) -> anyhow::Result<()>
where
    E: Fn(Envelope) + Send + Sync,
    R: Fn() + Send + Sync,
{
    let config = broker.config();
    let channel = broker.channel().await.context("open broadcast channel")?;
    declare_exchange(&channel, &config.exchange, config.queue_expiry().is_some())
        .await
        .context("declare the exchange")?;
    let queue = channel
        .queue_declare(
            short("")?,
            QueueDeclareOptions {
                exclusive: true,
                auto_delete: true,
                durable: false,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .context("declare the broadcast queue")?;
    let name = queue.name().clone();
    for key in routing_keys {
        channel
            .queue_bind(
                name.clone(),
                short(&config.exchange)?,
                short(key)?,
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .with_context(|| format!("bind the broadcast queue to {key}"))?;
    }
    let mut deliveries = channel
        .basic_consume(
            name.clone(),
            short("")?,
            BasicConsumeOptions {
                no_ack: true,
                ..BasicConsumeOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .context("start the broadcast consumer")?;
    info!(queue = %name, keys = ?routing_keys, "broadcast subscription in place");
    on_subscribed();
    while let Some(next) = deliveries.next().await {
        let delivery = next.context("receive a broadcast")?;
        if !crate::bundle::is_bundle(&delivery.properties) {
            match envelope::decode(&delivery.data) {
                Ok(env) => on_event(env),
                Err(e) => debug!(error = %e, "skipping an undecodable broadcast"),
            }
            continue;
        }
        match crate::bundle::unpack(&delivery.data) {
            Ok(events) => {
                for event in events {
                    match envelope::decode(&event.envelope) {
                        Ok(env) => on_event(env),
                        Err(e) => debug!(error = %e, "skipping an undecodable broadcast"),
                    }
                }
            }
            Err(e) => debug!(error = %e, "skipping an undecodable broadcast bundle"),
        }
    }
    anyhow::bail!("the broker cancelled the broadcast consumer")
}
