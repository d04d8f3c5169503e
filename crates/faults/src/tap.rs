//! A tap on a scenario's exchange: a durable queue bound with `#` that sees every message
//! published to the exchange, so the suite counts duplicate deliveries (the same AMQP message id
//! published twice) and can publish copies or poison of its own. It reconnects after a broker
//! restart; the queue and its persistent messages survive one.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures_util::StreamExt as _;
use lapin::{
    BasicProperties, Connection, ConnectionProperties,
    options::{
        BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, QueueBindOptions,
        QueueDeclareOptions,
    },
    types::FieldTable,
};
use tokio::task::JoinHandle;

/// One message as published.
#[derive(Clone, Debug)]
pub struct Seen {
    pub routing_key: String,
    pub message_id: String,
    pub payload: Vec<u8>,
    pub properties: BasicProperties,
}

#[derive(Default)]
struct Book {
    /// Deliveries per AMQP message id.
    count: HashMap<String, u32>,
    /// The first copy of each message, for replays.
    first: Vec<Seen>,
}

/// The tap; stops consuming when dropped.
pub struct Tap {
    book: Arc<Mutex<Book>>,
    task: JoinHandle<()>,
}

impl Tap {
    pub fn start(url: String, exchange: String, queue: String) -> Self {
        let book: Arc<Mutex<Book>> = Arc::default();
        let b = book.clone();
        let task = tokio::spawn(async move {
            loop {
                let _ = consume(&url, &exchange, &queue, &b).await;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
        Self { book, task }
    }

    /// Deliveries beyond the first of each message id.
    pub fn duplicates(&self) -> u64 {
        self.book
            .lock()
            .map(|b| {
                b.count
                    .values()
                    .map(|&n| u64::from(n.saturating_sub(1)))
                    .sum()
            })
            .unwrap_or(0)
    }

    /// Messages seen so far with `routing_key`.
    pub fn with_key(&self, routing_key: &str) -> Vec<Seen> {
        self.book
            .lock()
            .map(|b| {
                b.first
                    .iter()
                    .filter(|s| s.routing_key == routing_key)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn consume(url: &str, exchange: &str, queue: &str, book: &Mutex<Book>) -> anyhow::Result<()> {
    let conn = Connection::connect(url, ConnectionProperties::default()).await?;
    let ch = conn.create_channel().await?;
    declare_exchange(&ch, exchange).await?;
    ch.queue_declare(
        queue.into(),
        QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        },
        FieldTable::default(),
    )
    .await?;
    ch.queue_bind(
        queue.into(),
        exchange.into(),
        "#".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await?;
    let mut deliveries = ch
        .basic_consume(
            queue.into(),
            "tap".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    while let Some(d) = deliveries.next().await {
        let d = d?;
        let id = d
            .properties
            .message_id()
            .as_ref()
            .map(|s| s.to_string())
            .unwrap_or_default();
        if let Ok(mut b) = book.lock() {
            let n = b.count.entry(id.clone()).or_insert(0);
            *n += 1;
            if *n == 1 {
                b.first.push(Seen {
                    routing_key: d.routing_key.to_string(),
                    message_id: id,
                    payload: d.data.clone(),
                    properties: d.properties.clone(),
                });
            }
        }
        d.ack(BasicAckOptions::default()).await?;
    }
    Ok(())
}

/// Declares the services' durable topic exchange (idempotent; the same arguments they use).
async fn declare_exchange(ch: &lapin::Channel, exchange: &str) -> anyhow::Result<()> {
    ch.exchange_declare(
        exchange.into(),
        lapin::ExchangeKind::Topic,
        lapin::options::ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await?;
    Ok(())
}

/// Publishes `payload` to `exchange` with `routing_key` and `properties`, waiting for the
/// broker's confirmation.
pub async fn publish(
    url: &str,
    exchange: &str,
    routing_key: &str,
    payload: &[u8],
    properties: BasicProperties,
) -> anyhow::Result<()> {
    let conn = Connection::connect(url, ConnectionProperties::default()).await?;
    let ch = conn.create_channel().await?;
    ch.confirm_select(Default::default()).await?;
    ch.basic_publish(
        exchange.into(),
        routing_key.into(),
        BasicPublishOptions::default(),
        payload,
        properties,
    )
    .await?
    .await?;
    let _ = conn.close(200, "done".into()).await;
    Ok(())
}

/// Ready messages in `queue` (passive declare); `None` when it does not exist or the broker
/// is unreachable.
pub async fn depth(conn: &Connection, queue: &str) -> Option<u32> {
    let ch = conn.create_channel().await.ok()?;
    let q = ch
        .queue_declare(
            queue.into(),
            QueueDeclareOptions::default().passive(),
            FieldTable::default(),
        )
        .await
        .ok()?;
    let _ = ch.close(200, "ok".into()).await;
    Some(q.message_count())
}
