//! Refunds through the provider (docs/architecture.md#payments). A refund is recorded
//! REQUESTED in the transaction that decides it (a late payment, a failed shipment); this worker
//! then asks the provider to pay it, with the order id as the provider's idempotency key (a
//! provider that keeps to its contract pays a repeat once), and retries a refusal or an
//! unanswered call with backoff (`payment.refund_retry_base_ms`, doubling, at most ten
//! minutes). Each refund is claimed right before its call, so two replicas never send one
//! refund twice. After `payment.refund_max_attempts` calls the refund is
//! parked FAILED: counted in `flashsale_refunds_unsettled{status="FAILED"}`, listed by
//! ListRefunds, and left for a person.

use std::{sync::Arc, time::Duration};

use chrono::Utc;
use sea_orm::DatabaseConnection;
use uuid::Uuid;

use super::page;
use crate::{
    config::PaymentSettings,
    domain::{OrderError, PaymentProvider, RefundCall, RefundRecord, RefundState, refund_backoff},
    infra::payment_store::{self, Attempt, DueRefund},
};

/// Gauge: refunds not paid back yet, per status (`REQUESTED`, `FAILED`).
pub const REFUNDS_GAUGE: &str = "flashsale_refunds_unsettled";
pub const DEFAULT_REFUND_PAGE_SIZE: u64 = 50;
pub const MAX_REFUND_PAGE_SIZE: u64 = 500;
/// The longest wait between two attempts of one refund.
const MAX_BACKOFF: Duration = Duration::from_secs(600);
/// Refunds one lane sends at most in one round (the gauge is refreshed between rounds).
const LANE_ROUND: usize = 64;
/// The longest a connection to the provider takes to open (`flashsale_platform::grpc`).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Calls to the provider in flight at once: lanes, each with one claimed refund.
const IN_FLIGHT: usize = 8;

/// The refund worker and listing. Cheap to clone.
#[derive(Clone)]
pub struct Refunds {
    db: DatabaseConnection,
    provider: Arc<dyn PaymentProvider>,
    currency: String,
    max_attempts: u32,
    base: Duration,
    every: Duration,
    /// How long a claimed refund is left alone by other workers: the one call made under the
    /// claim (a connection of at most [`CONNECT_TIMEOUT`], an answer within
    /// `payment.call_timeout_ms`), its settling, and as much again to spare.
    lease: Duration,
}

/// One page of ListRefunds.
#[derive(Clone, Debug)]
pub struct RefundPage {
    pub refunds: Vec<RefundRecord>,
    pub next_page_token: String,
}

impl Refunds {
    pub fn new(
        db: DatabaseConnection,
        provider: Arc<dyn PaymentProvider>,
        settings: &PaymentSettings,
    ) -> Self {
        Self {
            db,
            provider,
            currency: settings.currency.clone(),
            max_attempts: settings.refund_max_attempts,
            base: Duration::from_millis(settings.refund_retry_base_ms),
            every: Duration::from_millis(settings.refund_sweep_interval_ms),
            lease: (Duration::from_millis(settings.call_timeout_ms) + CONNECT_TIMEOUT) * 2
                + Duration::from_secs(1),
        }
    }

    /// Calls the provider for every refund that is due; returns how many were attempted.
    ///
    /// [`IN_FLIGHT`] lanes each claim one refund right before calling the provider for it and
    /// settle it right after, so a claim's lease covers one call, never a queue of calls behind
    /// it: another replica's worker cannot take up a refund this one is still about to send.
    pub async fn attempt_due(&self) -> Result<usize, OrderError> {
        let lanes = (0..IN_FLIGHT).map(|_| self.lane());
        let counts = futures_util::future::try_join_all(lanes).await?;
        Ok(counts.into_iter().sum())
    }

    /// Claims, sends and settles refunds one at a time until none is due (or
    /// [`LANE_ROUND`] were sent).
    async fn lane(&self) -> Result<usize, OrderError> {
        let mut n = 0;
        while n < LANE_ROUND {
            let Some(r) = payment_store::claim_due(&self.db, 1, self.lease)
                .await?
                .pop()
            else {
                break;
            };
            let outcome = self.attempt(&r).await;
            payment_store::settle(&self.db, r.order_id, &outcome).await?;
            n += 1;
        }
        Ok(n)
    }

    async fn attempt(&self, r: &DueRefund) -> Attempt {
        let call = RefundCall {
            provider_payment_id: r.payment_id.clone(),
            refund_id: r.order_id.to_string(),
            amount_cents: r.amount_cents,
            currency: if r.currency.is_empty() {
                self.currency.clone()
            } else {
                r.currency.clone()
            },
        };
        let attempts = u32::try_from(r.attempts).unwrap_or(u32::MAX);
        let outcome = match self.provider.refund(&call).await {
            Ok(()) => Attempt::Succeeded,
            Err(e) if attempts >= self.max_attempts => Attempt::Park {
                error: e.to_string(),
            },
            Err(e) => {
                let wait = refund_backoff(attempts, self.base, MAX_BACKOFF);
                Attempt::Retry {
                    error: e.to_string(),
                    next_at: Utc::now()
                        + chrono::Duration::from_std(wait).unwrap_or(chrono::Duration::MAX),
                }
            }
        };
        let result = match &outcome {
            Attempt::Succeeded => {
                tracing::info!(order_id = %r.order_id, attempts, "refund paid by the provider");
                "succeeded"
            }
            Attempt::Retry { error, next_at } => {
                tracing::warn!(order_id = %r.order_id, attempts, %error, %next_at, "refund refused; retrying");
                "retried"
            }
            Attempt::Park { error } => {
                tracing::error!(
                    order_id = %r.order_id,
                    attempts,
                    %error,
                    "refund kept failing and is parked FAILED; settle it by hand (ListRefunds)"
                );
                "parked"
            }
        };
        metrics::counter!("flashsale_refund_attempts_total", "result" => result).increment(1);
        outcome
    }

    /// Sets [`REFUNDS_GAUGE`] (both statuses, 0 when none).
    pub async fn refresh_gauge(&self) -> Result<(), OrderError> {
        let found = payment_store::count_unsettled(&self.db).await?;
        for state in [RefundState::Requested, RefundState::Failed] {
            let n: i64 = found
                .iter()
                .filter(|(s, _)| *s == state)
                .map(|(_, n)| n)
                .sum();
            metrics::gauge!(REFUNDS_GAUGE, "status" => state.as_db()).set(n as f64);
        }
        Ok(())
    }

    /// Attempts what is due and refreshes the gauge every `payment.refund_sweep_interval_ms`
    /// until `shutdown`.
    pub async fn run(self, shutdown: flashsale_platform::shutdown::Shutdown) -> anyhow::Result<()> {
        let period = self.every;
        flashsale_platform::shutdown::every(period, shutdown, "refund worker", || async {
            self.attempt_due().await?;
            self.refresh_gauge().await
        })
        .await
    }

    /// Asks the provider again for a refund parked FAILED (RECORDED again, attempts reset, due
    /// now); a refund still REQUESTED is returned as it is.
    pub async fn retry(&self, order_id: Uuid) -> Result<RefundRecord, OrderError> {
        // The row as the update left it: the worker may take it up the moment it is due.
        if let Some(requeued) = payment_store::requeue_failed(&self.db, order_id).await? {
            return Ok(requeued);
        }
        let refund = payment_store::refund(&self.db, order_id)
            .await?
            .ok_or(OrderError::NotFound(order_id))?;
        match refund.state {
            RefundState::Succeeded => Err(OrderError::RefundCompleted(order_id)),
            _ => Ok(refund),
        }
    }

    /// A page of refunds (in `state`, or any), oldest first.
    pub async fn list(
        &self,
        state: Option<RefundState>,
        page_size: i32,
        page_token: &str,
    ) -> Result<RefundPage, OrderError> {
        let size = match u64::try_from(page_size) {
            Ok(0) => DEFAULT_REFUND_PAGE_SIZE,
            Ok(n) if n <= MAX_REFUND_PAGE_SIZE => n,
            _ => {
                return Err(OrderError::invalid(
                    "page_size",
                    format!("must be 0..={MAX_REFUND_PAGE_SIZE}"),
                ));
            }
        };
        let filter = state.map_or("any", RefundState::as_db);
        let check = page::filter_hash(filter);
        let after = page::decode(page_token, "r1", check, &format!("status {filter}"))?;
        let mut refunds = payment_store::list_refunds(&self.db, state, after, size + 1).await?;
        let next_page_token = if refunds.len() as u64 > size {
            refunds.truncate(size as usize);
            refunds
                .last()
                .map(|r| page::encode("r1", r.created_at, r.order_id, check))
                .unwrap_or_default()
        } else {
            String::new()
        };
        Ok(RefundPage {
            refunds,
            next_page_token,
        })
    }
}
