//! Sends the merchant signed notifications, as unreliably as the configuration asks: late,
//! reordered, twice, or lost for the first deliveries; each is retried with backoff until the
//! merchant accepts it or `max_deliveries` is reached.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use flashsale_contract::{payment::sign, to_timestamp};
use flashsale_proto::{
    order::v1::{
        NotifyPaymentRequest, payment_notification_service_client::PaymentNotificationServiceClient,
    },
    payment::v1::{Payment, PaymentEvent, PaymentEventType},
};
use prost::Message as _;
use rand::{Rng as _, SeedableRng as _, rngs::StdRng};
use tonic::transport::Channel;

use crate::SimConfig;

/// Gap between two notifications of one payment, so they arrive in the order chosen.
const ORDER_GAP: Duration = Duration::from_millis(20);
/// The longest wait between deliveries of one notification.
const MAX_RETRY: Duration = Duration::from_secs(5);

/// What the notifier did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Notifications made (one per event).
    pub events: u64,
    /// Deliveries the merchant accepted (duplicates included).
    pub accepted: u64,
    /// Deliveries the merchant refused or that failed on the way.
    pub refused: u64,
    /// Deliveries dropped on purpose (`delivery_failures`, `drop_notifications`).
    pub lost: u64,
    /// Second deliveries of the same signed bytes.
    pub duplicates: u64,
    /// Notifications given up on after `max_deliveries`.
    pub abandoned: u64,
}

#[derive(Default)]
struct Counters {
    events: AtomicU64,
    accepted: AtomicU64,
    refused: AtomicU64,
    lost: AtomicU64,
    duplicates: AtomicU64,
    abandoned: AtomicU64,
}

type Client = PaymentNotificationServiceClient<Channel>;

/// The delivery side. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Notifier {
    config: Arc<SimConfig>,
    rng: Arc<Mutex<StdRng>>,
    clients: Arc<Mutex<HashMap<String, Client>>>,
    counters: Arc<Counters>,
}

/// One signed delivery: what goes on the wire.
#[derive(Clone)]
struct Signed {
    payload: Vec<u8>,
    signature: String,
    timestamp: i64,
}

/// W3C trace context headers (`traceparent`, `tracestate`) as a request carried them.
pub(crate) type TraceHeaders = Vec<(
    &'static str,
    tonic::metadata::MetadataValue<tonic::metadata::Ascii>,
)>;

/// The W3C trace context headers of a request, to send with what it causes later.
pub(crate) fn trace_headers(metadata: &tonic::metadata::MetadataMap) -> TraceHeaders {
    ["traceparent", "tracestate"]
        .into_iter()
        .filter_map(|k| metadata.get(k).map(|v| (k, v.clone())))
        .collect()
}

impl Notifier {
    pub(crate) fn new(config: Arc<SimConfig>) -> Self {
        Self {
            rng: Arc::new(Mutex::new(StdRng::seed_from_u64(config.seed))),
            config,
            clients: Arc::default(),
            counters: Arc::default(),
        }
    }

    pub(crate) fn stats(&self) -> Stats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Stats {
            events: get(&c.events),
            accepted: get(&c.accepted),
            refused: get(&c.refused),
            lost: get(&c.lost),
            duplicates: get(&c.duplicates),
            abandoned: get(&c.abandoned),
        }
    }

    fn roll(&self, fraction: f64) -> bool {
        fraction > 0.0
            && self
                .rng
                .lock()
                .map(|mut r| r.random_bool(fraction.min(1.0)))
                .unwrap_or(false)
    }

    fn jitter(&self) -> Duration {
        let max = self.config.notify_jitter.as_millis() as u64;
        if max == 0 {
            return Duration::ZERO;
        }
        let ms = self
            .rng
            .lock()
            .map(|mut r| r.random_range(0..=max))
            .unwrap_or(0);
        Duration::from_millis(ms)
    }

    fn client(&self, url: &str) -> anyhow::Result<Client> {
        let mut clients = self
            .clients
            .lock()
            .map_err(|_| anyhow::anyhow!("client cache poisoned"))?;
        if let Some(c) = clients.get(url) {
            return Ok(c.clone());
        }
        let channel = flashsale_platform::grpc::lazy_channel(
            url,
            Duration::from_secs(5),
            &self.config.notify_tls,
        )?;
        let c = PaymentNotificationServiceClient::new(channel);
        clients.insert(url.to_owned(), c.clone());
        Ok(c)
    }

    /// The buyer paid `payment`: its notifications go to `url`.
    /// Each carries `trace`, the trace context CreatePayment came with, as a provider that
    /// forwards W3C trace context does.
    pub(crate) fn payment_succeeded(&self, payment: &Payment, url: &str, trace: TraceHeaders) {
        let mut events = Vec::new();
        if self.roll(self.config.attempt_failed_fraction) {
            events.push(event(payment, PaymentEventType::AttemptFailed));
        }
        events.push(event(payment, PaymentEventType::Succeeded));
        if self.config.reorder {
            events.reverse();
        }
        let base = self.config.notify_delay + self.jitter();
        for (i, ev) in events.into_iter().enumerate() {
            self.counters.events.fetch_add(1, Ordering::Relaxed);
            let twice = self.roll(self.config.duplicate_fraction);
            let (me, url, trace) = (self.clone(), url.to_owned(), trace.clone());
            let wait = base + ORDER_GAP * u32::try_from(i).unwrap_or(u32::MAX);
            tokio::spawn(async move {
                tokio::time::sleep(wait).await;
                me.deliver(&url, ev.encode_to_vec(), &trace, twice).await;
            });
        }
    }

    async fn deliver(&self, url: &str, payload: Vec<u8>, trace: &TraceHeaders, twice: bool) {
        let cfg = &self.config;
        let mut wait = cfg.retry_base;
        if cfg.drop_notifications {
            self.counters.lost.fetch_add(1, Ordering::Relaxed);
            return;
        }
        for attempt in 1..=cfg.max_deliveries {
            let timestamp = now_secs();
            let signed = Signed {
                signature: sign(cfg.webhook_secret.as_bytes(), timestamp, &payload),
                payload: payload.clone(),
                timestamp,
            };
            if attempt <= cfg.delivery_failures {
                self.counters.lost.fetch_add(1, Ordering::Relaxed);
            } else if self.send(url, &signed, trace).await {
                if twice {
                    tokio::time::sleep(ORDER_GAP + self.jitter()).await;
                    self.counters.duplicates.fetch_add(1, Ordering::Relaxed);
                    self.send(url, &signed, trace).await;
                }
                return;
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(MAX_RETRY);
        }
        self.counters.abandoned.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(url, "notification abandoned after every delivery failed");
    }

    async fn send(&self, url: &str, s: &Signed, trace: &TraceHeaders) -> bool {
        let mut request = tonic::Request::new(NotifyPaymentRequest {
            payload: s.payload.clone(),
            signature: s.signature.clone(),
            timestamp: s.timestamp,
        });
        for (k, v) in trace {
            request.metadata_mut().insert(*k, v.clone());
        }
        let result = match self.client(url) {
            Ok(mut c) => c
                .notify_payment(request)
                .await
                .map(drop)
                .map_err(|st| format!("{:?}: {}", st.code(), st.message())),
            Err(e) => Err(e.to_string()),
        };
        match result {
            Ok(()) => {
                self.counters.accepted.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(error) => {
                self.counters.refused.fetch_add(1, Ordering::Relaxed);
                tracing::info!(url, %error, "notification not accepted; retrying");
                false
            }
        }
    }
}

fn event(p: &Payment, kind: PaymentEventType) -> PaymentEvent {
    PaymentEvent {
        event_id: format!("evt_{}", uuid::Uuid::new_v4().simple()),
        r#type: kind as i32,
        payment_id: p.payment_id.clone(),
        merchant_reference: p.merchant_reference.clone(),
        amount_cents: p.amount_cents,
        currency: p.currency.clone(),
        create_time: Some(to_timestamp(chrono::Utc::now())),
    }
}

fn now_secs() -> i64 {
    chrono::Utc::now().timestamp()
}
