//! Exchanges and queues: the event exchange, a consumer's work queue with its retry ladder and
//! parking lot, and holding queues for delayed messages.
//!
//! ```text
//!  exchange ──rk──▶ <q> ──handler fails (transient)──▶ <q>.retry.<i>.<ms>ms ──TTL──▶ <q>
//!                     └──permanent / out of attempts / undecodable──▶ <q>.dlq
//!  "" ──<delay queue name>──▶ <delay queue> ──TTL──▶ exchange ──target rk──▶ …
//! ```
//!
//! Every declaration is idempotent, so each service re-declares what it uses after every
//! (re)connect. The broker refuses a re-declaration with different arguments
//! (`PRECONDITION_FAILED`), so the delays that are arguments are part of the names (retry and
//! delay queues: a new `retry_base_ms` or payment timeout declares new queues); changing
//! `queue_type` needs the old queues deleted first.

use std::time::Duration;

use lapin::{
    Channel, ExchangeKind,
    options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions},
    types::{AMQPValue, FieldTable},
};

use crate::{
    broker::{BrokerError, short},
    config::{AmqpConfig, QueueType},
};

/// Deliveries of one message to a quorum work queue (crashes, lost channels) before the broker
/// dead-letters it to the parking lot. Handler failures do not count: they go through the
/// retry queues, so this only catches messages that kill or wedge their consumer.
pub const DELIVERY_LIMIT: i32 = 10;

/// Declares the durable topic exchange all events go through.
/// With `auto_delete` (test isolation) it goes away once no queue is bound to it.
pub async fn declare_exchange(
    channel: &Channel,
    exchange: &str,
    auto_delete: bool,
) -> Result<(), BrokerError> {
    channel
        .exchange_declare(
            short(exchange)?,
            ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable: true,
                auto_delete,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await?;
    Ok(())
}

/// Arguments of a queue of `queue_type`; `dead_letter` is `(exchange, routing key)`.
fn queue_args(
    queue_type: QueueType,
    ttl: Option<Duration>,
    dead_letter: Option<(&str, &str)>,
) -> Result<FieldTable, BrokerError> {
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString(queue_type.as_str().into()),
    );
    if let Some(ttl) = ttl {
        let ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        args.insert("x-message-ttl".into(), AMQPValue::LongLongInt(ms));
    }
    if let Some((exchange, routing_key)) = dead_letter {
        short(exchange)?;
        short(routing_key)?;
        args.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString(exchange.into()),
        );
        args.insert(
            "x-dead-letter-routing-key".into(),
            AMQPValue::LongString(routing_key.into()),
        );
    }
    // Only where a message over the limit is dead-lettered: on the parking lot a limit would
    // silently drop a message an admin tool failed to handle ten times.
    if queue_type == QueueType::Quorum && dead_letter.is_some() {
        args.insert(
            "x-delivery-limit".into(),
            AMQPValue::LongInt(DELIVERY_LIMIT),
        );
        // Without these two, quorum queues dead-letter at-most-once: a message could vanish
        // between the holding/retry queue and its target.
        args.insert(
            "x-dead-letter-strategy".into(),
            AMQPValue::LongString("at-least-once".into()),
        );
        args.insert(
            "x-overflow".into(),
            AMQPValue::LongString("reject-publish".into()),
        );
    }
    Ok(args)
}

async fn declare_queue(
    channel: &Channel,
    name: &str,
    mut args: FieldTable,
    expires: Option<Duration>,
) -> Result<(), BrokerError> {
    if let Some(e) = expires {
        let ms = i64::try_from(e.as_millis()).unwrap_or(i64::MAX);
        args.insert("x-expires".into(), AMQPValue::LongLongInt(ms));
    }
    channel
        .queue_declare(
            short(name)?,
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            args,
        )
        .await?;
    Ok(())
}

async fn delete_queue(channel: &Channel, name: &str) -> Result<(), BrokerError> {
    channel
        .queue_delete(short(name)?, QueueDeleteOptions::default())
        .await?;
    Ok(())
}

/// One consumer's queues: the work queue bound to its routing keys, the retry ladder and the
/// dead-letter queue (parking lot).
#[derive(Clone, Debug)]
pub struct QueueTopology {
    exchange: String,
    queue: String,
    routing_keys: Vec<String>,
    queue_type: QueueType,
    retry_delays: Vec<Duration>,
    expires: Option<Duration>,
}

// === impl QueueTopology ===

impl QueueTopology {
    /// The queues of consumer `name` (the work queue is `<queue_prefix><name>`) bound to
    /// `routing_keys` on the configured exchange, with `max_attempts - 1` retry queues whose
    /// TTLs are `retry_base_ms * 2^(i-1)`.
    pub fn new(config: &AmqpConfig, name: &str, routing_keys: &[&str]) -> Self {
        Self {
            exchange: config.exchange.clone(),
            queue: config.queue_name(name),
            routing_keys: routing_keys.iter().map(|k| (*k).to_owned()).collect(),
            queue_type: config.queue_type,
            retry_delays: (1..config.max_attempts.max(1))
                .map(|i| config.retry_delay(i))
                .collect(),
            expires: config.queue_expiry(),
        }
    }

    /// The work queue.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// The routing keys the work queue is bound to.
    pub fn routing_keys(&self) -> &[String] {
        &self.routing_keys
    }

    /// The parking lot: `<queue>.dlq`.
    pub fn dead_letter_queue(&self) -> String {
        format!("{}.dlq", self.queue)
    }

    /// Retry queue `i` (1-based): `<queue>.retry.<i>.<ms>ms`. The delay is in the name (as in
    /// a [`DelayQueue`]'s) because it is one of the queue's arguments, which the broker refuses
    /// to change on a re-declaration: a new `retry_base_ms` declares new queues instead of
    /// stopping the service with `PRECONDITION_FAILED`. (Messages still waiting in the old ones
    /// go back to the work queue when their TTL ends; the empty queues can then be deleted.)
    pub fn retry_queue(&self, i: u32) -> String {
        let ms = self.retry_delay(i).map_or(0, |d| d.as_millis());
        format!("{}.retry.{i}.{ms}ms", self.queue)
    }

    /// How many retries the ladder has (`max_attempts - 1`).
    pub fn retries(&self) -> u32 {
        u32::try_from(self.retry_delays.len()).unwrap_or(u32::MAX)
    }

    /// The TTL of retry queue `i` (1-based).
    pub fn retry_delay(&self, i: u32) -> Option<Duration> {
        let idx = usize::try_from(i.checked_sub(1)?).ok()?;
        self.retry_delays.get(idx).copied()
    }

    /// Declares the exchange, the parking lot, the work queue with its bindings and every retry
    /// queue.
    pub async fn declare(&self, channel: &Channel) -> Result<(), BrokerError> {
        declare_exchange(channel, &self.exchange, self.expires.is_some()).await?;
        let dlq = self.dead_letter_queue();
        declare_queue(
            channel,
            &dlq,
            queue_args(self.queue_type, None, None)?,
            self.expires,
        )
        .await?;
        let work_args = queue_args(self.queue_type, None, Some(("", &dlq)))?;
        declare_queue(channel, &self.queue, work_args, self.expires).await?;
        for (i, ttl) in (1..).zip(&self.retry_delays) {
            let args = queue_args(self.queue_type, Some(*ttl), Some(("", &self.queue)))?;
            declare_queue(channel, &self.retry_queue(i), args, self.expires).await?;
        }
        for key in &self.routing_keys {
            channel
                .queue_bind(
                    short(&self.queue)?,
                    short(&self.exchange)?,
                    short(key)?,
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await?;
        }
        Ok(())
    }

    /// Deletes the work queue, its retry queues and its parking lot (messages included).
    pub async fn delete(&self, channel: &Channel) -> Result<(), BrokerError> {
        delete_queue(channel, &self.queue).await?;
        for i in 1..=self.retries() {
            delete_queue(channel, &self.retry_queue(i)).await?;
        }
        delete_queue(channel, &self.dead_letter_queue()).await
    }
}

/// A holding queue that delays messages: nobody consumes it; after `delay` the broker
/// dead-letters each message to the exchange with the target routing key.
///
/// One queue per delay: a per-message `expiration` only fires at the head of a queue, so mixed
/// delays in one queue would hold each other up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DelayQueue {
    name: String,
    exchange: String,
    routing_key: String,
    delay: Duration,
    queue_type: QueueType,
    expires: Option<Duration>,
}

// === impl DelayQueue ===

impl DelayQueue {
    /// The holding queue `<queue_prefix>delay.<routing_key>.<ms>ms` that releases messages to
    /// `routing_key` on the configured exchange after `delay`.
    pub fn new(config: &AmqpConfig, routing_key: &str, delay: Duration) -> Self {
        let ms = delay.as_millis();
        Self {
            name: config.queue_name(&format!("delay.{routing_key}.{ms}ms")),
            exchange: config.exchange.clone(),
            routing_key: routing_key.to_owned(),
            delay,
            queue_type: config.queue_type,
            expires: config.queue_expiry(),
        }
    }

    /// The queue's name, which is also the routing key to publish to on the default exchange.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The routing key messages are released to.
    pub fn routing_key(&self) -> &str {
        &self.routing_key
    }

    /// How long each message is held.
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// Declares the exchange and the holding queue.
    pub async fn declare(&self, channel: &Channel) -> Result<(), BrokerError> {
        declare_exchange(channel, &self.exchange, self.expires.is_some()).await?;
        let args = queue_args(
            self.queue_type,
            Some(self.delay),
            Some((&self.exchange, &self.routing_key)),
        )?;
        declare_queue(channel, &self.name, args, self.expires).await
    }

    /// Deletes the holding queue (and the messages it holds).
    pub async fn delete(&self, channel: &Channel) -> Result<(), BrokerError> {
        delete_queue(channel, &self.name).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ladder_has_max_attempts_minus_one_doubling_queues() {
        let c = AmqpConfig {
            queue_prefix: "t_".into(),
            max_attempts: 4,
            retry_base_ms: 50,
            ..AmqpConfig::default()
        };
        let t = QueueTopology::new(&c, "orders", &["order.created"]);
        assert_eq!(t.queue(), "t_orders");
        assert_eq!(t.retries(), 3);
        assert_eq!(t.retry_queue(2), "t_orders.retry.2.100ms");
        assert_eq!(t.retry_delay(3), Some(Duration::from_millis(200)));
        assert_eq!(t.retry_delay(4), None);
        assert_eq!(t.dead_letter_queue(), "t_orders.dlq");
    }

    #[test]
    fn quorum_dead_lettering_is_at_least_once() {
        let args = queue_args(
            QueueType::Quorum,
            Some(Duration::from_millis(5)),
            Some(("", "q")),
        )
        .unwrap();
        let m = args.inner();
        assert_eq!(m.get("x-message-ttl"), Some(&AMQPValue::LongLongInt(5)));
        assert!(m.contains_key("x-delivery-limit"));
        assert_eq!(
            m.get("x-dead-letter-strategy"),
            Some(&AMQPValue::LongString("at-least-once".into()))
        );
        let classic = queue_args(QueueType::Classic, None, Some(("", "q"))).unwrap();
        assert!(!classic.inner().contains_key("x-delivery-limit"));
        let parking_lot = queue_args(QueueType::Quorum, None, None).unwrap();
        assert!(!parking_lot.inner().contains_key("x-delivery-limit"));
    }
}
