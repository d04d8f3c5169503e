//! Reconciliation with the provider (docs/architecture.md#payments): a notification can be lost
//! for good (the provider gave up, an endpoint was unreachable for too long). A payment whose
//! success has not arrived `payment.reconcile_after_ms` after PayOrder started it is asked about
//! (GetPayment), and again each time its age doubles, for a day. What the provider answers is
//! applied through the path a notification takes ([`Payments`]): SUCCEEDED makes the order
//! PAID (`order.paid`), or refunds a late payment as a late notification would; PENDING leaves
//! the payment as it is. Replicas share the work: a claimed payment is stamped (`checked_at`).

use std::{sync::Arc, time::Duration};

use flashsale_proto::payment::v1::{PaymentEvent, PaymentEventType};
use futures_util::{StreamExt as _, stream};
use sea_orm::DatabaseConnection;

use super::Payments;
use crate::{
    config::PaymentSettings,
    domain::{Notice, OrderError, PaymentAtProviderState, PaymentProvider},
    infra::payment_store::{self, StoredPayment},
};

/// Payments one round claims at most.
const CLAIM_BATCH: u64 = 64;
/// Questions to the provider in flight at once.
const IN_FLIGHT: usize = 8;
/// A payment started longer ago than this is no longer asked about.
const HORIZON: Duration = Duration::from_secs(24 * 3600);

/// Counter of payments asked about, by what the answer did.
pub const RECONCILED_TOTAL: &str = "flashsale_payment_reconciliations_total";

/// What one round of reconciliation did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reconciled {
    /// Payments asked about.
    pub asked: usize,
    /// Orders made PAID.
    pub paid: usize,
    /// Late payments refunded.
    pub refunded: usize,
    /// Still pending at the provider.
    pub pending: usize,
    /// Not settled this time (no answer, or an answer that does not match the payment).
    pub failed: usize,
}

/// The reconciliation job. Cheap to clone.
#[derive(Clone)]
pub struct Reconciler {
    db: DatabaseConnection,
    provider: Arc<dyn PaymentProvider>,
    payments: Payments,
    after: Duration,
    every: Duration,
}

impl Reconciler {
    pub fn new(
        db: DatabaseConnection,
        provider: Arc<dyn PaymentProvider>,
        payments: Payments,
        settings: &PaymentSettings,
    ) -> Self {
        Self {
            db,
            provider,
            payments,
            after: Duration::from_millis(settings.reconcile_after_ms),
            every: Duration::from_millis(settings.reconcile_interval_ms),
        }
    }

    /// Asks the provider about every payment that is due a question and applies the answers.
    pub async fn reconcile_due(&self) -> Result<Reconciled, OrderError> {
        let mut done = Reconciled::default();
        loop {
            let due = payment_store::claim_unconfirmed(&self.db, CLAIM_BATCH, self.after, HORIZON)
                .await?;
            let n = due.len();
            let results: Vec<&'static str> = stream::iter(due)
                .map(|p| async move { self.reconcile(&p).await })
                .buffer_unordered(IN_FLIGHT)
                .collect()
                .await;
            for result in results {
                done.asked += 1;
                match result {
                    "paid" => done.paid += 1,
                    "refunded" => done.refunded += 1,
                    "pending" => done.pending += 1,
                    "duplicate" => {}
                    _ => done.failed += 1,
                }
                metrics::counter!(RECONCILED_TOTAL, "result" => result).increment(1);
            }
            if (n as u64) < CLAIM_BATCH {
                return Ok(done);
            }
        }
    }

    /// Asks about one payment and applies the answer; returns what that did.
    async fn reconcile(&self, stored: &StoredPayment) -> &'static str {
        let id = &stored.payment.provider_payment_id;
        let at = match self.provider.payment(id).await {
            Ok(at) => at,
            Err(e) => {
                tracing::warn!(order_id = %stored.order_id, payment_id = %id, error = %e, "could not ask the provider about a payment; asking again later");
                return "unanswered";
            }
        };
        match at.state {
            PaymentAtProviderState::Pending => return "pending",
            PaymentAtProviderState::Succeeded => {}
            PaymentAtProviderState::Refunded | PaymentAtProviderState::Other => {
                tracing::error!(order_id = %stored.order_id, payment_id = %id, state = ?at.state, "the provider reports a payment this service never saw succeed; settle it by hand");
                return "unexpected";
            }
        }
        let event = PaymentEvent {
            event_id: format!("reconcile-{id}"),
            r#type: PaymentEventType::Succeeded as i32,
            payment_id: at.provider_payment_id,
            merchant_reference: at.merchant_reference,
            amount_cents: at.amount_cents,
            currency: at.currency,
            create_time: None,
        };
        match self.payments.apply(&event, Notice::Succeeded).await {
            Ok((_, result)) => {
                tracing::info!(order_id = %stored.order_id, payment_id = %id, result, "payment reconciled with the provider");
                result
            }
            Err(e) => {
                tracing::error!(order_id = %stored.order_id, payment_id = %id, error = %e, "could not apply what the provider reports of a payment");
                "failed"
            }
        }
    }

    /// Reconciles what is due every `payment.reconcile_interval_ms` until `shutdown`.
    pub async fn run(self, shutdown: flashsale_platform::shutdown::Shutdown) -> anyhow::Result<()> {
        let period = self.every;
        flashsale_platform::shutdown::every(period, shutdown, "payment reconciliation", || async {
            self.reconcile_due().await.map(drop)
        })
        .await
    }
}
