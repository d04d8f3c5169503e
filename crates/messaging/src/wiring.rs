//! The messaging side of a service, wired in one call: the broker connection, its queues
//! (declared before the service reports SERVING, so nothing published to it after start-up is
//! unroutable), the outbox relay, one consumer per queue, the dead-letter drainer, the inbox
//! purger, and a clean close on shutdown: the consumers stop first and finish what they hold,
//! the relay last, publishing what was written meanwhile, then the connection closes. Every
//! task runs on the service's [`Runner`], so a task that fails stops the service.

use anyhow::Context as _;
use flashsale_platform::{app::Runner, failpoint::Failpoints};
use sea_orm::DatabaseConnection;

use crate::{
    AmqpConfig, Broker, Consumer, DeadLetterAdmin, DeadLetterDrainer, DelayQueue, Handler,
    OutboxRelay, Publisher, QueueTopology, RelayOptions,
};

/// What [`start`] hands back.
pub struct Started {
    /// The dead-letter admin API over the service's queues.
    pub dead_letters: DeadLetterAdmin,
    /// The broker connection (e.g. for [`broadcast`](crate::broadcast) subscriptions).
    pub broker: Broker,
}

/// Starts messaging for a service whose consumer queues are `topologies` (each handled by a
/// clone of `handler`) and whose outbox may hold messages for `delay_queues`.
pub async fn start<H: Handler + Clone>(
    runner: &mut Runner,
    db: &DatabaseConnection,
    config: &AmqpConfig,
    topologies: &[QueueTopology],
    delay_queues: Vec<DelayQueue>,
    handler: H,
    failpoints: &Failpoints,
) -> anyhow::Result<Started> {
    start_with(
        runner,
        db,
        config,
        topologies,
        delay_queues,
        handler,
        failpoints,
        RelayOptions::default(),
    )
    .await
}

/// [`start`] with the outbox relay tuned by `relay` (e.g. to yield to the service's intake).
#[allow(clippy::too_many_arguments)]
pub async fn start_with<H: Handler + Clone>(
    runner: &mut Runner,
    db: &DatabaseConnection,
    config: &AmqpConfig,
    topologies: &[QueueTopology],
    delay_queues: Vec<DelayQueue>,
    handler: H,
    failpoints: &Failpoints,
    relay: RelayOptions,
) -> anyhow::Result<Started> {
    let broker = Broker::connect(config.clone())
        .await
        .context("connect to RabbitMQ")?;
    let channel = broker.channel().await.context("open AMQP channel")?;
    for t in topologies {
        t.declare(&channel)
            .await
            .with_context(|| format!("declare queue {}", t.queue()))?;
    }
    for q in &delay_queues {
        q.declare(&channel)
            .await
            .with_context(|| format!("declare delay queue {}", q.name()))?;
    }
    let shutdown = runner.shutdown();
    let stop = move || {
        let s = shutdown.clone();
        async move { s.wait().await }
    };

    let relay = OutboxRelay::new(db, Publisher::with_delay_queues(&broker, delay_queues))?
        .with_failpoints(failpoints.clone())
        .with_options(RelayOptions {
            retention: config.outbox_keep_published(),
            ..relay
        });
    // The relay stops last, after the consumers and the server, and publishes what they wrote
    // before it does; then the broker connection closes.
    let last = runner.last_to_stop();
    let closing = broker.clone();
    runner.spawn(async move {
        let relayed = relay.run(async move { last.wait().await }).await;
        // A broker that does not answer must not hold the stop up.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), closing.close()).await;
        relayed
    });
    for t in topologies {
        let consumer =
            Consumer::new(&broker, t.clone(), handler.clone()).with_failpoints(failpoints.clone());
        let s = stop.clone();
        runner.spawn_consumer(async move { consumer.run(s()).await });
    }
    let drainer = DeadLetterDrainer::new(&broker, db, topologies)?;
    let s = stop.clone();
    runner.spawn(async move { drainer.run(s()).await });
    let dead_letters = DeadLetterAdmin::new(db, Publisher::new(&broker), topologies)?;
    runner.spawn(crate::inbox::run_purger(
        db.clone(),
        config.inbox_purge(),
        runner.shutdown(),
    ));
    Ok(Started {
        dead_letters,
        broker,
    })
}
