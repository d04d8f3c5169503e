//! Publishing with publisher confirms and `mandatory`: a message counts as sent only once the
//! broker has confirmed it and routed it to at least one queue.

use std::{sync::Arc, time::Duration};

use flashsale_proto::events::v1::Envelope;
use futures_util::future::join_all;
use lapin::{
    BasicProperties, Channel, Confirmation,
    options::{BasicPublishOptions, ConfirmSelectOptions},
    types::FieldTable,
};
use tokio::sync::Mutex;

use crate::{
    broker::{Broker, BrokerError, short},
    envelope,
    topology::{DelayQueue, declare_exchange},
    trace,
};

/// AMQP `content_type` of every flashsale event.
pub const CONTENT_TYPE: &str = "application/x-protobuf";
/// How long a batch may wait for the broker's confirms.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a message was not (known to be) accepted by the broker.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// No queue is bound for the routing key: the broker returned the message.
    #[error("unroutable: {exchange:?} / {routing_key:?} ({reply})")]
    Unroutable {
        /// Exchange published to (`""` is the default exchange).
        exchange: String,
        /// Routing key that matched no binding.
        routing_key: String,
        /// The broker's reply text (`NO_ROUTE`).
        reply: String,
    },
    /// The broker refused the message (e.g. a full queue with `reject-publish`).
    #[error("nacked by the broker: {exchange:?} / {routing_key:?}")]
    Nacked {
        /// Exchange published to.
        exchange: String,
        /// Routing key published with.
        routing_key: String,
    },
    /// No confirm arrived in time; the message may or may not have been delivered.
    #[error("no publisher confirm within {0:?}")]
    Timeout(Duration),
    /// Not sent: the channel failed on an earlier message of the same batch.
    #[error("not sent: the channel failed earlier in the batch")]
    NotSent,
    /// The envelope is not valid (its type does not match its payload, its id is no UUID).
    #[error("invalid envelope: {0}")]
    Invalid(#[from] crate::envelope::DecodeError),
    /// The channel or connection failed.
    #[error(transparent)]
    Broker(#[from] BrokerError),
}

impl From<lapin::Error> for PublishError {
    fn from(e: lapin::Error) -> Self {
        Self::Broker(BrokerError::Amqp(e))
    }
}

/// One message ready for the wire.
#[derive(Clone, Debug, Default)]
pub struct OutgoingMessage {
    /// Target exchange (`""` for the default exchange, e.g. a delay queue).
    pub exchange: String,
    /// Routing key (the queue name on the default exchange).
    pub routing_key: String,
    /// AMQP `message_id` (the envelope's id).
    pub message_id: String,
    /// AMQP `type` (the envelope's routing key, e.g. `order.created`).
    pub kind: String,
    /// AMQP `timestamp`, seconds since the epoch.
    pub timestamp: u64,
    /// Headers (`traceparent`, retry bookkeeping …).
    pub headers: FieldTable,
    /// The encoded envelope (or bundle).
    pub payload: Vec<u8>,
    /// AMQP `content_type`; empty means [`CONTENT_TYPE`] (one encoded envelope). A bundle's is
    /// [`bundle::CONTENT_TYPE`](crate::bundle::CONTENT_TYPE).
    pub content_type: String,
}

// === impl OutgoingMessage ===

impl OutgoingMessage {
    /// `envelope` for `exchange` / `routing_key`, with the current span's trace context.
    pub fn for_envelope(env: &Envelope, exchange: &str, routing_key: &str) -> Self {
        let mut headers = FieldTable::default();
        trace::insert_strings(&mut headers, &trace::current_headers());
        Self {
            exchange: exchange.to_owned(),
            routing_key: routing_key.to_owned(),
            message_id: env.message_id.clone(),
            kind: env.r#type.clone(),
            timestamp: u64::try_from(chrono::Utc::now().timestamp()).unwrap_or(0),
            headers,
            payload: envelope::encode(env),
            content_type: String::new(),
        }
    }

    fn properties(&self) -> Result<BasicProperties, BrokerError> {
        let mut props = BasicProperties::default()
            .with_content_type(if self.content_type.is_empty() {
                CONTENT_TYPE.into()
            } else {
                short(&self.content_type)?
            })
            .with_delivery_mode(2)
            .with_timestamp(self.timestamp)
            .with_headers(self.headers.clone());
        if !self.message_id.is_empty() {
            props = props.with_message_id(short(&self.message_id)?);
        }
        if !self.kind.is_empty() {
            props = props.with_type(short(&self.kind)?);
        }
        Ok(props)
    }
}

/// A confirming publisher on its own channel; cheap to clone and safe to share between tasks.
///
/// The channel is opened lazily and re-opened (exchange and delay queues re-declared) after it
/// or the connection died.
#[derive(Clone)]
pub struct Publisher {
    inner: Arc<Inner>,
}

struct Inner {
    broker: Broker,
    delay_queues: Vec<DelayQueue>,
    channel: Mutex<Option<Channel>>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("exchange", &self.inner.broker.config().exchange)
            .finish_non_exhaustive()
    }
}

// === impl Publisher ===

impl Publisher {
    /// A publisher for the broker's configured exchange.
    pub fn new(broker: &Broker) -> Self {
        Self::with_delay_queues(broker, Vec::new())
    }

    /// A publisher that also declares `delay_queues` on every channel it opens, so delayed
    /// messages (published to them directly or through the outbox) are never unroutable.
    pub fn with_delay_queues(broker: &Broker, delay_queues: Vec<DelayQueue>) -> Self {
        Self {
            inner: Arc::new(Inner {
                broker: broker.clone(),
                delay_queues,
                channel: Mutex::new(None),
            }),
        }
    }

    /// The exchange events are published to.
    pub fn exchange(&self) -> &str {
        &self.inner.broker.config().exchange
    }

    /// Most events one bundle may carry (`amqp.bundle_max_events`; 1: no bundles).
    pub fn bundle_max_events(&self) -> usize {
        usize::from(self.inner.broker.config().bundle_max_events.max(1))
    }

    /// Publishes `env` to the exchange with its type as routing key, and waits for the confirm.
    pub async fn publish_envelope(&self, env: &Envelope) -> Result<(), PublishError> {
        envelope::check(env)?;
        let msg = OutgoingMessage::for_envelope(env, self.exchange(), &env.r#type);
        self.publish(&msg).await
    }

    /// Publishes `env` into `queue`, which releases it to its routing key after its delay.
    pub async fn publish_delayed(
        &self,
        queue: &DelayQueue,
        env: &Envelope,
    ) -> Result<(), PublishError> {
        envelope::check(env)?;
        let msg = OutgoingMessage::for_envelope(env, "", queue.name());
        self.publish(&msg).await
    }

    /// Publishes one message and waits for its confirm.
    pub async fn publish(&self, msg: &OutgoingMessage) -> Result<(), PublishError> {
        self.publish_batch(std::slice::from_ref(msg))
            .await
            .pop()
            .unwrap_or(Ok(()))
    }

    /// Publishes every message, then waits for all confirms at once (pipelined); returns one
    /// result per message, in order.
    pub async fn publish_batch(&self, msgs: &[OutgoingMessage]) -> Vec<Result<(), PublishError>> {
        let channel = match self.channel().await {
            Ok(c) => c,
            Err(e) => {
                let e = Arc::new(e);
                return msgs.iter().map(|_| Err(shared(&e))).collect();
            }
        };
        let mut pending = Vec::with_capacity(msgs.len());
        let mut failed = false;
        for msg in msgs {
            if failed {
                pending.push(None);
                continue;
            }
            match publish_one(&channel, msg).await {
                Ok(confirm) => pending.push(Some(Ok(confirm))),
                Err(e) => {
                    // The channel is most likely dead: do not push the rest into it.
                    failed = matches!(e, PublishError::Broker(BrokerError::Amqp(_)));
                    pending.push(Some(Err(e)));
                }
            }
        }
        let waits = pending.into_iter().zip(msgs).map(|(p, msg)| async move {
            match p {
                None => Err(PublishError::NotSent),
                Some(Err(e)) => Err(e),
                Some(Ok(confirm)) => match confirm.await {
                    Ok(c) => confirmation(c, msg),
                    Err(e) => Err(e.into()),
                },
            }
        });
        match tokio::time::timeout(CONFIRM_TIMEOUT, join_all(waits)).await {
            Ok(results) => {
                // A nack gets a fresh channel too: a channel opened on a cluster node while a
                // quorum queue elected a new leader (its old one's node just died) goes on
                // nacking every message for that queue, while a new channel's are taken.
                if failed
                    || results.iter().any(|r| {
                        matches!(
                            r,
                            Err(PublishError::Broker(_) | PublishError::Nacked { .. })
                        )
                    })
                {
                    self.reset().await;
                }
                results
            }
            Err(_) => {
                self.reset().await;
                msgs.iter()
                    .map(|_| Err(PublishError::Timeout(CONFIRM_TIMEOUT)))
                    .collect()
            }
        }
    }

    /// The current channel, or a freshly opened and prepared one.
    async fn channel(&self) -> Result<Channel, BrokerError> {
        let mut slot = self.inner.channel.lock().await;
        if let Some(ch) = slot.as_ref()
            && ch.status().connected()
        {
            return Ok(ch.clone());
        }
        let ch = self.inner.broker.channel().await?;
        ch.confirm_select(ConfirmSelectOptions::default()).await?;
        let config = self.inner.broker.config();
        declare_exchange(&ch, &config.exchange, config.queue_expiry().is_some()).await?;
        for q in &self.inner.delay_queues {
            q.declare(&ch).await?;
        }
        *slot = Some(ch.clone());
        Ok(ch)
    }

    async fn reset(&self) {
        *self.inner.channel.lock().await = None;
    }
}

async fn publish_one(
    channel: &Channel,
    msg: &OutgoingMessage,
) -> Result<lapin::PublisherConfirm, PublishError> {
    let confirm = channel
        .basic_publish(
            short(&msg.exchange)?,
            short(&msg.routing_key)?,
            BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            },
            &msg.payload,
            msg.properties()?,
        )
        .await?;
    Ok(confirm)
}

fn confirmation(c: Confirmation, msg: &OutgoingMessage) -> Result<(), PublishError> {
    match c {
        Confirmation::Ack(None) => Ok(()),
        Confirmation::Ack(Some(returned)) => Err(PublishError::Unroutable {
            exchange: msg.exchange.clone(),
            routing_key: msg.routing_key.clone(),
            reply: returned.reply_text.to_string(),
        }),
        Confirmation::Nack(_) | Confirmation::NotRequested => Err(PublishError::Nacked {
            exchange: msg.exchange.clone(),
            routing_key: msg.routing_key.clone(),
        }),
    }
}

/// A copy of a channel-opening error for each message of the batch.
fn shared(e: &Arc<BrokerError>) -> PublishError {
    match e.as_ref() {
        BrokerError::Unavailable(d) => PublishError::Broker(BrokerError::Unavailable(*d)),
        BrokerError::Closed => PublishError::Broker(BrokerError::Closed),
        BrokerError::NameTooLong(n) => PublishError::Broker(BrokerError::NameTooLong(n.clone())),
        BrokerError::Amqp(e) => PublishError::Broker(BrokerError::Amqp(e.clone())),
    }
}
