//! One delivery: decode, run the handler in a span parented by the message's trace context,
//! then ack, retry or park. A bundle's events are each handled, retried or parked on their own;
//! the bundle is acked once all of them are settled.

use std::{panic::AssertUnwindSafe, sync::Arc};

use flashsale_platform::failpoint::Failpoints;
use futures_util::FutureExt as _;
use lapin::{
    message::Delivery,
    options::{BasicAckOptions, BasicNackOptions},
    types::{AMQPValue, FieldTable},
};
use tokio::sync::Semaphore;
use tracing::{Instrument as _, debug, error, warn};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use super::{
    CONSUMER_LAG_SECONDS, FP_AFTER_HANDLE_BEFORE_ACK, Handler, HandlerError, Incoming,
    REDELIVERED_TOTAL,
};
use crate::{
    bundle, envelope, headers,
    publisher::{OutgoingMessage, Publisher},
    topology::QueueTopology,
    trace,
};

/// What every delivery task of one consumer shares.
pub(super) struct Ctx<H> {
    pub(super) topology: QueueTopology,
    pub(super) handler: H,
    pub(super) publisher: Publisher,
    pub(super) failpoints: Failpoints,
    pub(super) max_attempts: u32,
    /// Handler runs at once: `prefetch` of them, whether their events came alone or in bundles.
    pub(super) permits: Arc<Semaphore>,
}

/// One event as it is handled: a plain delivery's body, or one event of a bundle.
struct Unit {
    /// The encoded envelope.
    data: Vec<u8>,
    hdrs: FieldTable,
    redelivered: bool,
    /// For a copy sent to a retry queue or the parking lot.
    message_id: String,
    kind: String,
    timestamp: u64,
    /// It went through a queue's dead-letter exchange (a delay or retry queue's TTL: `x-death`):
    /// it waited on purpose.
    delayed: bool,
}

fn went_through_a_delay(hdrs: Option<&FieldTable>) -> bool {
    hdrs.is_some_and(|h| h.inner().contains_key("x-death"))
}

impl Unit {
    /// A plain delivery (its body moves out of it; the delivery stays for the ack).
    fn of_delivery(delivery: &mut Delivery) -> Self {
        let p = &delivery.properties;
        Self {
            hdrs: p.headers().clone().unwrap_or_default(),
            redelivered: delivery.redelivered,
            message_id: p
                .message_id()
                .as_ref()
                .map(|s| s.to_string())
                .unwrap_or_default(),
            kind: p.kind().as_ref().map(|s| s.to_string()).unwrap_or_default(),
            timestamp: p.timestamp().unwrap_or(0),
            delayed: went_through_a_delay(p.headers().as_ref()),
            data: std::mem::take(&mut delivery.data),
        }
    }

    /// One event of a bundle delivered as `bundle`.
    fn of_bundled(event: bundle::Unbundled, bundle: &Delivery) -> Self {
        let mut hdrs = FieldTable::default();
        trace::insert_strings(&mut hdrs, &event.headers);
        Self {
            data: event.envelope,
            hdrs,
            redelivered: bundle.redelivered,
            // Filled in from the envelope once it is decoded.
            message_id: String::new(),
            kind: String::new(),
            timestamp: bundle.properties.timestamp().unwrap_or(0),
            delayed: went_through_a_delay(bundle.properties.headers().as_ref()),
        }
    }
}

/// How a [`Unit`] ended.
#[derive(Debug)]
enum Settled {
    /// Handled, or moved to a retry queue or the parking lot: its delivery may be acked.
    Done,
    /// Neither (the retry or park could not be published): its delivery goes back.
    Requeue(String),
}

pub(super) async fn process<H: Handler>(ctx: Arc<Ctx<H>>, mut delivery: Delivery) {
    if bundle::is_bundle(&delivery.properties) {
        return process_bundle(ctx, delivery).await;
    }
    let routing_key = delivery.routing_key.as_str().to_owned();
    let unit = Unit::of_delivery(&mut delivery);
    let settled = {
        let _permit = ctx.permits.acquire().await.ok();
        handle(&ctx, unit, &routing_key).await
    };
    finish(&ctx, &delivery, settled).await;
}

/// A bundle: every event settled on its own (handled, retried or parked alone, as a plain
/// message), then one ack for the bundle — or, when some event could be neither handled nor
/// moved, the whole bundle back to the queue (its handled events are then dropped by the inbox
/// on the next delivery).
async fn process_bundle<H: Handler>(ctx: Arc<Ctx<H>>, mut delivery: Delivery) {
    let routing_key = delivery.routing_key.as_str().to_owned();
    let events = match bundle::unpack(&delivery.data) {
        Ok(events) => events,
        Err(e) => {
            warn!(queue = %ctx.topology.queue(), routing_key = %routing_key, error = %e, "undecodable bundle, parking it");
            let unit = Unit::of_delivery(&mut delivery);
            let settled = park(
                &ctx,
                &unit,
                unit.hdrs.clone(),
                1,
                &routing_key,
                &format!("undecodable bundle: {e}"),
            )
            .await;
            return finish(&ctx, &delivery, settled).await;
        }
    };
    metrics::counter!("flashsale_bundles_consumed_total", "queue" => ctx.topology.queue().to_owned())
        .increment(1);
    // Each event takes a handler slot before its handler exists and runs as a task of its own,
    // and finished tasks are reaped at once: at most about `prefetch` handler states are alive,
    // however many events the held bundles carry. (Building them up front — or keeping the
    // finished ones until the bundle's last — held a prefetch's worth of bundles' handler
    // states, ~7.5 KB per event: product-stock peaked at ~170 MiB in the big sale.)
    let mut runs = tokio::task::JoinSet::new();
    let mut settled = Settled::Done;
    let note = |settled: &mut Settled, joined: Result<Settled, tokio::task::JoinError>| match joined
    {
        Ok(Settled::Done) => {}
        Ok(requeue @ Settled::Requeue(_)) => *settled = requeue,
        Err(e) => *settled = Settled::Requeue(format!("event task failed: {e}")),
    };
    for event in events {
        let unit = Unit::of_bundled(event, &delivery);
        let permit = ctx.permits.clone().acquire_owned().await.ok();
        let (ctx, routing_key) = (ctx.clone(), routing_key.clone());
        runs.spawn(async move {
            let _permit = permit;
            handle(&ctx, unit, &routing_key).await
        });
        while let Some(joined) = runs.try_join_next() {
            note(&mut settled, joined);
        }
    }
    while let Some(joined) = runs.join_next().await {
        note(&mut settled, joined);
    }
    finish(&ctx, &delivery, settled).await;
}

/// Acks or requeues `delivery` as its events settled.
async fn finish<H>(ctx: &Ctx<H>, delivery: &Delivery, settled: Settled) {
    match settled {
        Settled::Done => ack(ctx, delivery).await,
        Settled::Requeue(why) => requeue(delivery, &why).await,
    }
}

/// Decodes one event and runs the handler in a span parented by its trace context.
async fn handle<H: Handler>(ctx: &Ctx<H>, mut unit: Unit, delivered_with: &str) -> Settled {
    let queue = ctx.topology.queue().to_owned();
    let attempt = attempt_of(&unit.hdrs);
    let routing_key = trace::header_str(&unit.hdrs, headers::ORIGINAL_ROUTING_KEY)
        .unwrap_or(delivered_with)
        .to_owned();

    let env = match envelope::decode(&unit.data) {
        Ok(env) => {
            if unit.message_id.is_empty() {
                unit.message_id.clone_from(&env.message_id);
                unit.kind.clone_from(&env.r#type);
            }
            env
        }
        Err(e) => {
            warn!(queue = %queue, routing_key = %routing_key, error = %e, "undecodable message, parking it");
            let hdrs = unit.hdrs.clone();
            return park(
                ctx,
                &unit,
                hdrs,
                attempt,
                &routing_key,
                &format!("undecodable: {e}"),
            )
            .await;
        }
    };
    // `decode` checked the id already.
    let Ok(message_id) = envelope::message_id(&env) else {
        let hdrs = unit.hdrs.clone();
        return park(
            ctx,
            &unit,
            hdrs,
            attempt,
            &routing_key,
            "undecodable: bad message_id",
        )
        .await;
    };
    observe_lag(&queue, &env, attempt, &unit);
    // Named and attributed as OpenTelemetry's messaging conventions say: `process <type>`, a
    // consumer span, child of the span that wrote the event.
    let span = tracing::info_span!(
        "consume",
        otel.name = %format_args!("process {}", env.r#type),
        otel.kind = "consumer",
        messaging.system = "rabbitmq",
        messaging.operation.type = "process",
        messaging.operation.name = "process",
        messaging.destination.name = %queue,
        messaging.rabbitmq.destination.routing_key = %routing_key,
        messaging.message.id = %message_id,
        messaging.message.conversation_id = %env.correlation_id,
        queue = %queue,
        message_id = %message_id,
        r#type = %env.r#type,
        correlation_id = %env.correlation_id,
        attempt,
    );
    // Without an OpenTelemetry layer there is no parent to set; the span still logs.
    let _ = span.set_parent(trace::extract(Some(&unit.hdrs)));
    let msg = Incoming {
        envelope: env,
        message_id,
        attempt,
        redelivered: unit.redelivered,
        routing_key,
        queue,
    };
    settle(ctx, unit, msg).instrument(span).await
}

/// Runs the handler, then settles: done, a retry scheduled, or parked.
async fn settle<H: Handler>(ctx: &Ctx<H>, unit: Unit, msg: Incoming) -> Settled {
    let (attempt, routing_key, queue) = (msg.attempt, msg.routing_key.clone(), msg.queue.clone());
    // The call itself inside the guarded future too: a closure may panic before it returns one.
    let outcome = AssertUnwindSafe(crate::inbox::with_attempt(attempt, async {
        ctx.handler.handle(msg).await
    }))
    .catch_unwind()
    .await
    .unwrap_or_else(|_| Err(HandlerError::transient(anyhow::anyhow!("handler panicked"))));
    match outcome {
        Ok(()) => {
            metrics::counter!("flashsale_messages_consumed_total", "queue" => queue).increment(1);
            Settled::Done
        }
        // Waits out the outage on the ladder's longest queue; the attempt is not spent.
        Err(HandlerError::Unavailable(e)) if ctx.topology.retries() > 0 => {
            let retry_queue = ctx.topology.retry_queue(ctx.topology.retries());
            warn!(error = format!("{e:#}"), retry_queue = %retry_queue, "service unavailable, the message waits");
            let mut hdrs = unit.hdrs.clone();
            set(
                &mut hdrs,
                headers::ATTEMPT,
                AMQPValue::LongLongInt(i64::from(attempt)),
            );
            set_str(&mut hdrs, headers::ORIGINAL_ROUTING_KEY, &routing_key);
            let out = forward(&unit, hdrs, retry_queue);
            match ctx.publisher.publish(&out).await {
                Ok(()) => {
                    metrics::counter!("flashsale_messages_waiting_total", "queue" => queue)
                        .increment(1);
                    Settled::Done
                }
                Err(pe) => Settled::Requeue(format!("cannot put the message to wait: {pe}")),
            }
        }
        Err(HandlerError::Transient(e) | HandlerError::Unavailable(e))
            if attempt < ctx.max_attempts =>
        {
            let retry_queue = ctx.topology.retry_queue(attempt);
            warn!(error = format!("{e:#}"), retry_queue = %retry_queue, "handler failed, retrying later");
            let mut hdrs = unit.hdrs.clone();
            set(
                &mut hdrs,
                headers::ATTEMPT,
                AMQPValue::LongLongInt(i64::from(attempt) + 1),
            );
            set_str(&mut hdrs, headers::ORIGINAL_ROUTING_KEY, &routing_key);
            let out = forward(&unit, hdrs, retry_queue);
            match ctx.publisher.publish(&out).await {
                Ok(()) => {
                    metrics::counter!("flashsale_messages_retried_total", "queue" => queue)
                        .increment(1);
                    Settled::Done
                }
                Err(pe) => Settled::Requeue(format!("cannot schedule retry: {pe}")),
            }
        }
        Err(e) => {
            error!(error = %e, "handler gave up on the message, parking it");
            let hdrs = unit.hdrs.clone();
            park(ctx, &unit, hdrs, attempt, &routing_key, &e.to_string()).await
        }
    }
}

/// Moves the event to the parking lot with its error.
async fn park<H>(
    ctx: &Ctx<H>,
    unit: &Unit,
    mut hdrs: FieldTable,
    attempt: u32,
    routing_key: &str,
    reason: &str,
) -> Settled {
    let mut reason = reason.to_owned();
    if reason.len() > headers::MAX_ERROR_LEN {
        let mut cut = headers::MAX_ERROR_LEN;
        while !reason.is_char_boundary(cut) {
            cut -= 1;
        }
        reason.truncate(cut);
    }
    let now_ms = chrono::Utc::now().timestamp_millis();
    set_str(&mut hdrs, headers::ERROR, &reason);
    set(
        &mut hdrs,
        headers::ATTEMPT,
        AMQPValue::LongLongInt(i64::from(attempt)),
    );
    set_str(&mut hdrs, headers::ORIGINAL_ROUTING_KEY, routing_key);
    set_str(&mut hdrs, headers::ORIGINAL_QUEUE, ctx.topology.queue());
    set(
        &mut hdrs,
        headers::PARKED_AT_MS,
        AMQPValue::LongLongInt(now_ms),
    );
    let msg = forward(unit, hdrs, ctx.topology.dead_letter_queue());
    match ctx.publisher.publish(&msg).await {
        Ok(()) => {
            metrics::counter!("flashsale_messages_parked_total", "queue" => ctx.topology.queue().to_owned()).increment(1);
            Settled::Done
        }
        Err(e) => Settled::Requeue(format!("cannot park message: {e}")),
    }
}

async fn ack<H>(ctx: &Ctx<H>, delivery: &Delivery) {
    // The plain name stops at the first consumer to ack; `<name>:<routing key>` at one kind.
    let keyed = format!(
        "{FP_AFTER_HANDLE_BEFORE_ACK}:{}",
        delivery.routing_key.as_str()
    );
    for name in [FP_AFTER_HANDLE_BEFORE_ACK, keyed.as_str()] {
        if let Err(e) = ctx.failpoints.hit(name).await {
            requeue(delivery, &e.to_string()).await;
            return;
        }
    }
    if let Err(e) = delivery.ack(BasicAckOptions::default()).await {
        // The channel is gone: the broker redelivers it and the inbox drops the duplicate.
        debug!(error = %e, "ack failed");
    }
}

/// Gives the message back to the broker for another delivery.
async fn requeue(delivery: &Delivery, why: &str) {
    warn!(reason = why, "requeueing message");
    let opts = BasicNackOptions {
        requeue: true,
        ..BasicNackOptions::default()
    };
    if let Err(e) = delivery.nack(opts).await {
        debug!(error = %e, "nack failed");
    }
}

/// A copy of `unit` as a plain message for the default exchange and `queue`, with `hdrs`.
fn forward(unit: &Unit, hdrs: FieldTable, queue: String) -> OutgoingMessage {
    OutgoingMessage {
        exchange: String::new(),
        routing_key: queue,
        message_id: unit.message_id.clone(),
        kind: unit.kind.clone(),
        timestamp: unit.timestamp,
        headers: hdrs,
        payload: unit.data.clone(),
        content_type: String::new(),
    }
}

/// How far this consumer runs behind: from the event's `occurred_at` (when its producer wrote
/// it) to the start of its first handling here, for events that came straight from their
/// producer — not a retry, nor one that waited in a delay queue on purpose (a payment timeout,
/// a message sent to wait out an outage), whose wait is chosen, not lag. Counts redeliveries.
fn observe_lag(
    queue: &str,
    env: &flashsale_proto::events::v1::Envelope,
    attempt: u32,
    unit: &Unit,
) {
    if unit.redelivered {
        metrics::counter!(REDELIVERED_TOTAL, "queue" => queue.to_owned()).increment(1);
    }
    if attempt != 1 || unit.delayed {
        return;
    }
    let Some(at) = env.occurred_at else {
        return;
    };
    let at_ms = at
        .seconds
        .saturating_mul(1_000)
        .saturating_add(i64::from(at.nanos / 1_000_000));
    let lag_ms = chrono::Utc::now()
        .timestamp_millis()
        .saturating_sub(at_ms)
        .max(0);
    #[allow(clippy::cast_precision_loss)] // milliseconds: far below 2^52
    metrics::histogram!(CONSUMER_LAG_SECONDS, "queue" => queue.to_owned())
        .record(lag_ms as f64 / 1_000.0);
}

fn attempt_of(hdrs: &FieldTable) -> u32 {
    let n = match hdrs.inner().get(headers::ATTEMPT) {
        Some(AMQPValue::LongLongInt(n)) => *n,
        Some(AMQPValue::LongInt(n)) => i64::from(*n),
        Some(AMQPValue::LongUInt(n)) => i64::from(*n),
        Some(AMQPValue::ShortInt(n)) => i64::from(*n),
        _ => 1,
    };
    u32::try_from(n.max(1)).unwrap_or(u32::MAX)
}

fn set(hdrs: &mut FieldTable, key: &'static str, value: AMQPValue) {
    hdrs.insert(key.into(), value);
}

fn set_str(hdrs: &mut FieldTable, key: &'static str, value: &str) {
    set(hdrs, key, AMQPValue::LongString(value.into()));
}
