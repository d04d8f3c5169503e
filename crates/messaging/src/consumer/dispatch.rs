//! One delivery: decode, run the handler in a span parented by the message's trace context,
//! then ack, retry or park.

use std::{panic::AssertUnwindSafe, sync::Arc};

use flashsale_platform::failpoint::Failpoints;
use futures_util::FutureExt as _;
use lapin::{
    message::Delivery,
    options::{BasicAckOptions, BasicNackOptions},
    types::{AMQPValue, FieldTable},
};
use tracing::{Instrument as _, debug, error, warn};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use super::{FP_AFTER_HANDLE_BEFORE_ACK, Handler, HandlerError, Incoming};
use crate::{
    envelope, headers,
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
}

pub(super) async fn process<H: Handler>(ctx: Arc<Ctx<H>>, delivery: Delivery) {
    let queue = ctx.topology.queue().to_owned();
    let hdrs = delivery.properties.headers().clone().unwrap_or_default();
    let attempt = attempt_of(&hdrs);
    let routing_key = trace::header_str(&hdrs, headers::ORIGINAL_ROUTING_KEY)
        .unwrap_or(delivery.routing_key.as_str())
        .to_owned();

    let env = match envelope::decode(&delivery.data) {
        Ok(env) => env,
        Err(e) => {
            warn!(queue = %queue, routing_key = %routing_key, error = %e, "undecodable message, parking it");
            park(
                &ctx,
                delivery,
                hdrs,
                attempt,
                &routing_key,
                &format!("undecodable: {e}"),
            )
            .await;
            return;
        }
    };
    // `decode` checked the id already.
    let Ok(message_id) = envelope::message_id(&env) else {
        return park(
            &ctx,
            delivery,
            hdrs,
            attempt,
            &routing_key,
            "undecodable: bad message_id",
        )
        .await;
    };
    let span = tracing::info_span!(
        "consume",
        queue = %queue,
        message_id = %message_id,
        r#type = %env.r#type,
        correlation_id = %env.correlation_id,
        attempt,
    );
    // Without an OpenTelemetry layer there is no parent to set; the span still logs.
    let _ = span.set_parent(trace::extract(Some(&hdrs)));
    let msg = Incoming {
        envelope: env,
        message_id,
        attempt,
        redelivered: delivery.redelivered,
        routing_key: routing_key.clone(),
        queue: queue.clone(),
    };
    settle(&ctx, delivery, hdrs, msg).instrument(span).await;
}

/// Runs the handler, then acks, schedules a retry or parks.
async fn settle<H: Handler>(ctx: &Ctx<H>, delivery: Delivery, hdrs: FieldTable, msg: Incoming) {
    let (attempt, routing_key, queue) = (msg.attempt, msg.routing_key.clone(), msg.queue.clone());
    // The call itself inside the guarded future too: a closure may panic before it returns one.
    let outcome = AssertUnwindSafe(async { ctx.handler.handle(msg).await })
        .catch_unwind()
        .await
        .unwrap_or_else(|_| Err(HandlerError::transient(anyhow::anyhow!("handler panicked"))));
    match outcome {
        Ok(()) => {
            metrics::counter!("flashsale_messages_consumed_total", "queue" => queue).increment(1);
            ack(ctx, &delivery).await;
        }
        Err(HandlerError::Transient(e)) if attempt < ctx.max_attempts => {
            let retry_queue = ctx.topology.retry_queue(attempt);
            warn!(error = format!("{e:#}"), retry_queue = %retry_queue, "handler failed, retrying later");
            let mut hdrs = hdrs;
            set(
                &mut hdrs,
                headers::ATTEMPT,
                AMQPValue::LongLongInt(i64::from(attempt) + 1),
            );
            set_str(&mut hdrs, headers::ORIGINAL_ROUTING_KEY, &routing_key);
            let out = forward(&delivery, hdrs, retry_queue);
            match ctx.publisher.publish(&out).await {
                Ok(()) => {
                    metrics::counter!("flashsale_messages_retried_total", "queue" => queue)
                        .increment(1);
                    ack(ctx, &delivery).await;
                }
                Err(pe) => requeue(&delivery, &format!("cannot schedule retry: {pe}")).await,
            }
        }
        Err(e) => {
            error!(error = %e, "handler gave up on the message, parking it");
            park(ctx, delivery, hdrs, attempt, &routing_key, &e.to_string()).await;
        }
    }
}

/// Moves the message to the parking lot with its error, then acks it.
async fn park<H>(
    ctx: &Ctx<H>,
    delivery: Delivery,
    mut hdrs: FieldTable,
    attempt: u32,
    routing_key: &str,
    reason: &str,
) {
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
    let msg = forward(&delivery, hdrs, ctx.topology.dead_letter_queue());
    match ctx.publisher.publish(&msg).await {
        Ok(()) => {
            metrics::counter!("flashsale_messages_parked_total", "queue" => ctx.topology.queue().to_owned()).increment(1);
            ack(ctx, &delivery).await;
        }
        Err(e) => requeue(&delivery, &format!("cannot park message: {e}")).await,
    }
}

async fn ack<H>(ctx: &Ctx<H>, delivery: &Delivery) {
    if let Err(e) = ctx.failpoints.hit(FP_AFTER_HANDLE_BEFORE_ACK).await {
        requeue(delivery, &e.to_string()).await;
        return;
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

/// A copy of `delivery` for the default exchange and `queue`, with `hdrs`.
fn forward(delivery: &Delivery, hdrs: FieldTable, queue: String) -> OutgoingMessage {
    let p = &delivery.properties;
    OutgoingMessage {
        exchange: String::new(),
        routing_key: queue,
        message_id: p
            .message_id()
            .as_ref()
            .map(|s| s.to_string())
            .unwrap_or_default(),
        kind: p.kind().as_ref().map(|s| s.to_string()).unwrap_or_default(),
        timestamp: p.timestamp().unwrap_or(0),
        headers: hdrs,
        payload: delivery.data.clone(),
    }
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
