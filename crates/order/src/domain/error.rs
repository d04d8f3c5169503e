//! The order error enum (mapped to the API in `api::grpc`).

use uuid::Uuid;

use super::{Refusal, Status};

#[derive(Debug, thiserror::Error)]
pub enum OrderError {
    #[error("invalid argument")]
    Invalid(Vec<(String, String)>),
    #[error("no order {0}")]
    NotFound(Uuid),
    #[error("no product with sku `{0}`")]
    UnknownProduct(String),
    /// The stock gate refused (the refusal and the gate's message are passed on).
    #[error("{1}")]
    Refused(Refusal, String),
    /// The product is not on sale now: its sale opens (`SaleNotStarted`) or closed
    /// (`SaleEnded`) at `at_ms`, when the gate's clock read `gate_ms` (decided by the gate, or
    /// by this replica's memory of the gate's answer).
    #[error("{message}")]
    Closed {
        refusal: Refusal,
        at_ms: i64,
        gate_ms: i64,
        message: String,
    },
    /// The gate released this order's hold already (the order was cancelled, or its hold
    /// expired before the order was written).
    #[error("{0}")]
    ReservationReleased(String),
    #[error("{0} was used before with a different payload")]
    IdempotencyKeyReused(&'static str),
    #[error("order is {0}, it cannot be paid")]
    NotPayable(Status),
    #[error("order is {0}, it cannot be cancelled")]
    NotCancellable(Status),
    #[error("the amount must equal the order total of {0} cents")]
    WrongAmount(i64),
    #[error("{0}")]
    PermissionDenied(String),
    #[error("a dependency is unavailable: {0}")]
    Unavailable(String),
    /// A notification whose signature or timestamp does not hold.
    #[error("{0}")]
    Unauthenticated(String),
    /// No payment with this provider id was started here.
    #[error("no payment {0}")]
    UnknownPayment(String),
    /// A notification that does not match the payment started for its order.
    #[error("{0}")]
    PaymentMismatch(String),
    #[error(transparent)]
    Provider(#[from] super::ProviderError),
    /// The provider paid this order's refund back already.
    #[error("the refund of order {0} was paid back already")]
    RefundCompleted(Uuid),
    /// The order database could not be reached (worth retrying later).
    #[error("the order database is unavailable: {0}")]
    DatabaseUnavailable(String),
    /// An order write dropped at its deadline (the caller's, or
    /// `saga.intake_write_deadline_ms`): nothing of it was written and nothing of it ever will
    /// be. Answered as the database being unavailable: the buyer retries.
    #[error("the order could not be written before its deadline; retry with the same request_id")]
    WriteExpired,
    /// The platform's backlog (orders waiting for the saga, or paid orders waiting to ship) is
    /// past its bound: a new buyer is refused before the gate, and told when to try again.
    #[error("{message}")]
    Overloaded {
        message: String,
        retry_after: std::time::Duration,
    },
    /// This replica is stopping: a watch ends with this so its client watches again through
    /// another replica.
    #[error("this server is stopping; watch again and another replica answers")]
    Stopping,
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

impl OrderError {
    pub fn invalid(field: &str, description: impl Into<String>) -> Self {
        Self::Invalid(vec![(field.to_owned(), description.into())])
    }

    pub fn violations(self) -> Vec<(String, String)> {
        match self {
            Self::Invalid(v) => v,
            _ => Vec::new(),
        }
    }
}
