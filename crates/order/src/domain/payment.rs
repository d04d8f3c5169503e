//! Payments through the provider (docs/architecture.md#payments): the port the use cases call
//! to create a payment, to refund one and to ask where one is, the values that cross it, and the rules of a refund's
//! retries. The adapter is `infra::payment`; nothing here does I/O.

use chrono::{DateTime, Utc};
use flashsale_contract::{REQUEST_ID_MAX_LEN, check_optional_text};
use uuid::Uuid;

use super::{OrderError, parse_order_id};

/// A payment the order service asks the provider to create for an order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewPayment {
    /// The order: the provider's merchant reference and idempotency key (one payment per order).
    pub order_id: Uuid,
    pub amount_cents: i64,
    pub currency: String,
    /// Where the provider sends the payment's notifications.
    pub notify_url: String,
    /// The order's payment deadline.
    pub expires_at: DateTime<Utc>,
}

/// A payment the provider created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderPayment {
    pub provider_payment_id: String,
    pub checkout_url: String,
    pub amount_cents: i64,
    pub currency: String,
}

/// A refund the order service asks the provider to pay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefundCall {
    pub provider_payment_id: String,
    /// The idempotency key at the provider: the order id (one refund per order).
    pub refund_id: String,
    pub amount_cents: i64,
    pub currency: String,
}

/// How a call to the provider failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// No answer, or the provider asked to try again: nothing is known to have happened.
    #[error("the payment provider is unavailable: {0}")]
    Unavailable(String),
    /// The provider answered and refused.
    #[error("the payment provider refused: {0}")]
    Refused(String),
}

/// The payment provider, as the use cases see it.
#[async_trait::async_trait]
pub trait PaymentProvider: Send + Sync + 'static {
    /// Creates the order's payment, or returns the one created before for the same order.
    async fn create_payment(&self, payment: &NewPayment) -> Result<ProviderPayment, ProviderError>;

    /// Pays a payment back in full; a repeat of the same `refund_id` changes nothing.
    async fn refund(&self, refund: &RefundCall) -> Result<(), ProviderError>;

    /// Where the payment `provider_payment_id` is at the provider now (reconciliation).
    async fn payment(&self, provider_payment_id: &str) -> Result<PaymentAtProvider, ProviderError>;
}

/// A payment as the provider reports it when asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PaymentAtProvider {
    pub provider_payment_id: String,
    /// The merchant reference: the order id.
    pub merchant_reference: String,
    pub amount_cents: i64,
    pub currency: String,
    pub state: PaymentAtProviderState,
}

/// Where a payment is at the provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PaymentAtProviderState {
    /// The buyer has not paid (yet).
    Pending,
    /// The money is taken.
    Succeeded,
    /// Taken and paid back.
    Refunded,
    /// A status this service does not know.
    Other,
}

/// A validated PayOrder: which order, and the deprecated fields' checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartPayment {
    pub order_id: Uuid,
    /// 0: the order's total; anything else must equal it.
    pub amount_cents: i64,
}

impl StartPayment {
    pub fn new(order_id: &str, payment_id: &str, amount_cents: i64) -> Result<Self, OrderError> {
        let mut bad = Vec::new();
        let id = parse_order_id(order_id)
            .map_err(|e| bad.extend(e.violations()))
            .ok();
        // Ignored since payments go through the provider, still checked like every string.
        if let Err(v) = check_optional_text("payment_id", payment_id, REQUEST_ID_MAX_LEN) {
            bad.push(v);
        }
        if amount_cents < 0 {
            bad.push(("amount_cents".to_owned(), "must not be negative".to_owned()));
        }
        match id {
            Some(order_id) if bad.is_empty() => Ok(Self {
                order_id,
                amount_cents,
            }),
            _ => Err(OrderError::Invalid(bad)),
        }
    }
}

/// Where a refund is: requested from the provider (and retried), paid, or parked after
/// too many refusals.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RefundState {
    Requested,
    Succeeded,
    Failed,
}

impl RefundState {
    pub const ALL: [RefundState; 3] = [Self::Requested, Self::Succeeded, Self::Failed];

    pub fn as_db(self) -> &'static str {
        match self {
            Self::Requested => "REQUESTED",
            Self::Succeeded => "SUCCEEDED",
            Self::Failed => "FAILED",
        }
    }

    pub fn from_db(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_db() == s)
    }
}

/// The delay before attempt `attempt + 1` of a refund after `attempt` failed ones: `base`
/// doubling each time, at most `max`.
pub fn refund_backoff(
    attempt: u32,
    base: std::time::Duration,
    max: std::time::Duration,
) -> std::time::Duration {
    let doublings = attempt.saturating_sub(1).min(30);
    base.saturating_mul(1u32 << doublings).min(max)
}

/// What a verified notification says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Notice {
    /// The money is taken.
    Succeeded,
    /// An attempt failed; the payment stays open.
    AttemptFailed,
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn refund_retries_back_off_doubling_up_to_the_cap() {
        let (base, max) = (Duration::from_millis(100), Duration::from_secs(1));
        let delays: Vec<u128> = (1..=6)
            .map(|a| refund_backoff(a, base, max).as_millis())
            .collect();
        assert_eq!(delays, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(refund_backoff(u32::MAX, base, max), max);
    }

    #[test]
    fn a_payment_start_checks_the_deprecated_fields() {
        let id = Uuid::new_v4().to_string();
        assert!(StartPayment::new(&id, "", 0).is_ok());
        assert!(StartPayment::new(&id, "old-client-key", 2500).is_ok());
        let fields =
            |e: OrderError| -> Vec<String> { e.violations().into_iter().map(|(f, _)| f).collect() };
        assert_eq!(
            fields(StartPayment::new("x", &"p".repeat(65), -1).unwrap_err()),
            ["order_id", "payment_id", "amount_cents"]
        );
    }

    #[test]
    fn refund_states_round_trip_through_their_database_names() {
        for s in RefundState::ALL {
            assert_eq!(RefundState::from_db(s.as_db()), Some(s));
        }
        assert_eq!(RefundState::from_db("RECORDED"), None);
    }
}
