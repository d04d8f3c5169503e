//! The provider's signed notifications (docs/architecture.md#payments): the only way an order
//! becomes PAID. A notification is checked before anything is read — its HMAC under
//! `payment.webhook_secret` and its age — then matched against the payment PayOrder started for
//! the order (provider id, merchant reference, amount, currency). A payment's success is applied
//! once; one that arrives after the payment deadline, or for an order cancelled meanwhile, is
//! refunded through the provider.

use chrono::Utc;
use flashsale_contract::{
    check_optional_text,
    payment::{NOTIFICATION_MAX_BYTES, SignatureError, check_currency, verify},
};
use flashsale_messaging::outbox;
use flashsale_proto::payment::v1::{PaymentEvent, PaymentEventType};
use prost::Message as _;
use sea_orm::{DatabaseConnection, TransactionTrait as _};
use uuid::Uuid;

use super::checkout::{cancel_in, paid_event, refund};
use crate::{
    domain::{CancelReason, Notice, OrderError, Status},
    infra::{
        db::{self, Change},
        payment_store,
    },
};

/// A notification as it arrived: the provider's bytes, its signature and when it signed them.
#[derive(Clone, Debug)]
pub struct SignedNotice {
    pub payload: Vec<u8>,
    pub signature: String,
    pub timestamp: i64,
    /// The notification's trace context: its `order.paid` continues it.
    pub trace: flashsale_messaging::outbox::TraceHeaders,
}

/// What applying a notification did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Applied {
    pub order_id: Uuid,
    /// The payment's outcome had been applied before: nothing changed.
    pub duplicate: bool,
}

/// Applies the provider's notifications. Cheap to clone.
#[derive(Clone)]
pub struct Payments {
    pub(super) db: DatabaseConnection,
    pub(super) secret: std::sync::Arc<[u8]>,
    pub(super) tolerance_secs: i64,
}

impl Payments {
    pub fn new(db: DatabaseConnection, webhook_secret: &str, tolerance_ms: u64) -> Self {
        Self {
            db,
            secret: webhook_secret.as_bytes().into(),
            tolerance_secs: i64::try_from(tolerance_ms / 1000).unwrap_or(i64::MAX),
        }
    }

    /// Checks and applies one notification.
    #[tracing::instrument(target = "flashsale::log_scope", skip_all)]
    pub async fn notify(&self, n: &SignedNotice) -> Result<Applied, OrderError> {
        verify(
            &self.secret,
            n.timestamp,
            &n.payload,
            &n.signature,
            Utc::now().timestamp(),
            self.tolerance_secs,
        )
        .map_err(|e| {
            metrics::counter!("flashsale_payment_notifications_total", "result" => "refused")
                .increment(1);
            tracing::warn!(error = %e, "payment notification refused");
            match e {
                SignatureError::TooLarge => OrderError::invalid("payload", e.to_string()),
                _ => OrderError::Unauthenticated(e.to_string()),
            }
        })?;
        let (ev, notice) = decode(&n.payload)?;
        let (applied, result) = self.apply(&ev, notice).await?;
        metrics::counter!("flashsale_payment_notifications_total", "result" => result).increment(1);
        Ok(applied)
    }

    /// Applies what the provider says of a payment — from a notification, or from asking it
    /// (reconciliation) — once: returns what it did (`paid`, `refunded`, `duplicate`,
    /// `attempt_failed`).
    pub(super) async fn apply(
        &self,
        ev: &PaymentEvent,
        notice: Notice,
    ) -> Result<(Applied, &'static str), OrderError> {
        let txn = self.db.begin().await?;
        let stored = payment_store::payment_locked(&txn, &ev.payment_id)
            .await?
            .ok_or_else(|| OrderError::UnknownPayment(ev.payment_id.clone()))?;
        let p = &stored.payment;
        let mismatch = if ev.merchant_reference != stored.order_id.to_string() {
            Some(format!(
                "payment {} is for order {}, not `{}`",
                p.provider_payment_id, stored.order_id, ev.merchant_reference
            ))
        } else if ev.amount_cents != p.amount_cents || ev.currency != p.currency {
            Some(format!(
                "payment {} was started for {} {}, the notification says {} {}",
                p.provider_payment_id, p.amount_cents, p.currency, ev.amount_cents, ev.currency
            ))
        } else {
            None
        };
        if let Some(why) = mismatch {
            tracing::warn!(payment_id = %p.provider_payment_id, %why, "payment notification refused");
            return Err(OrderError::PaymentMismatch(why));
        }
        let applied = Applied {
            order_id: stored.order_id,
            duplicate: stored.succeeded,
        };
        if notice == Notice::AttemptFailed || stored.succeeded {
            txn.commit().await?;
            let result = if stored.succeeded {
                "duplicate"
            } else {
                "attempt_failed"
            };
            return Ok((applied, result));
        }
        let order = db::order(&txn, stored.order_id, true)
            .await?
            .ok_or(OrderError::NotFound(stored.order_id))?;
        payment_store::mark_succeeded(&txn, &p.provider_payment_id).await?;
        let overdue = order.payment_deadline.is_some_and(|d| d <= Utc::now());
        let result = match order.status {
            Status::AwaitingPayment if !overdue => {
                let change = Change {
                    payment_id: Some(&p.provider_payment_id),
                    note: "payment.succeeded",
                    ..Change::default()
                };
                if !db::transition(
                    &txn,
                    order.order_id,
                    Status::AwaitingPayment,
                    Status::Paid,
                    change,
                )
                .await?
                {
                    return Err(OrderError::Internal(anyhow::anyhow!(
                        "order changed under its row lock"
                    )));
                }
                super::saga::reached("paid", [order.created_at]);
                outbox::enqueue(
                    &txn,
                    &paid_event(&order, &p.provider_payment_id, p.amount_cents),
                )
                .await?;
                "paid"
            }
            Status::AwaitingPayment => {
                // Too late: the deadline is strict, even if the timeout's message is not here yet.
                cancel_in(&txn, &order, CancelReason::PaymentTimeout, None).await?;
                let reason = CancelReason::PaymentTimeout;
                refund(
                    &txn,
                    &order,
                    &p.provider_payment_id,
                    p.amount_cents,
                    reason,
                    None,
                )
                .await?;
                "refunded"
            }
            Status::Cancelled => {
                // The payment lost the race (timeout, cancel): the money goes back, once per order.
                let reason = order.cancel_reason.unwrap_or(CancelReason::PaymentTimeout);
                refund(
                    &txn,
                    &order,
                    &p.provider_payment_id,
                    p.amount_cents,
                    reason,
                    None,
                )
                .await?;
                "refunded"
            }
            other => {
                return Err(OrderError::Internal(anyhow::anyhow!(
                    "payment {} succeeded for order {} in {other}",
                    p.provider_payment_id,
                    order.order_id
                )));
            }
        };
        txn.commit().await?;
        if result == "paid" {
            metrics::counter!("flashsale_orders_paid_total").increment(1);
        }
        tracing::info!(order_id = %order.order_id, payment_id = %p.provider_payment_id, result, "payment outcome applied");
        Ok((applied, result))
    }
}

/// The verified payload as an event, with what it says.
pub(super) fn decode(payload: &[u8]) -> Result<(PaymentEvent, Notice), OrderError> {
    let ev = PaymentEvent::decode(payload)
        .map_err(|e| OrderError::invalid("payload", format!("not a PaymentEvent: {e}")))?;
    let mut bad = Vec::new();
    if ev.payment_id.is_empty() {
        bad.push(("payload.payment_id".to_owned(), "must be set".to_owned()));
    }
    if let Err(why) = check_currency(&ev.currency) {
        bad.push(("payload.currency".to_owned(), why.to_owned()));
    }
    // Signed or not, no control character reaches the database (PostgreSQL refuses a NUL in
    // `text`) or a log line.
    for (field, value) in [
        ("payload.payment_id", &ev.payment_id),
        ("payload.merchant_reference", &ev.merchant_reference),
        ("payload.event_id", &ev.event_id),
    ] {
        bad.extend(check_optional_text(field, value, NOTIFICATION_MAX_BYTES).err());
    }
    let notice = match PaymentEventType::try_from(ev.r#type) {
        Ok(PaymentEventType::Succeeded) => Some(Notice::Succeeded),
        Ok(PaymentEventType::AttemptFailed) => Some(Notice::AttemptFailed),
        _ => {
            bad.push((
                "payload.type".to_owned(),
                "must be SUCCEEDED or ATTEMPT_FAILED".to_owned(),
            ));
            None
        }
    };
    match notice {
        Some(notice) if bad.is_empty() => Ok((ev, notice)),
        _ => Err(OrderError::Invalid(bad)),
    }
}
