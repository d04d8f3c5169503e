//! The product-stock error enum (mapped to the API in `api::grpc`, from the database in
//! `infra::db`).

use flashsale_contract::{Refusal, SkuError};

#[derive(Debug, thiserror::Error)]
pub enum StockError {
    #[error("invalid argument")]
    Invalid(Vec<(String, String)>),
    #[error("no product with sku `{0}`")]
    UnknownProduct(String),
    #[error("a product with sku `{0}` already exists")]
    DuplicateSku(String),
    #[error("no reservation for order {0}")]
    UnknownReservation(uuid::Uuid),
    #[error("{}", refusal_message(.0, *.1))]
    Refused(Refusal, i64),
    /// The product is not on sale now, by the gate's clock (`gate_ms`): its sale opens at
    /// `at_ms` ([`Refusal::SaleNotStarted`]) or closed at `at_ms` ([`Refusal::SaleEnded`]).
    #[error("{}", closed_message(*.refusal, *.at_ms, *.gate_ms))]
    Closed {
        refusal: Refusal,
        at_ms: i64,
        gate_ms: i64,
    },
    /// A write-off of more units than are free: on hand, less reserved, less the units held
    /// for orders acknowledged but not yet in the database.
    #[error(
        "only {0} units are free to write off (on hand, less units reserved or held for acknowledged orders)"
    )]
    WriteOffAboveFree(i64),
    #[error("{0} was used before with a different payload")]
    IdempotencyKeyReused(&'static str),
    /// UpdateProduct for a version of the product that is no longer its own.
    #[error("the product changed since etag {given} was read (it is {current} now): read it again")]
    EtagMismatch { given: String, current: String },
    /// UpdateProduct moving the start of a sale that has opened and not ended.
    #[error("the sale has opened: its sale_start cannot change (close it with sale_end, and give it a new window once it has ended)")]
    SaleInProgress,
    #[error("the reservation of order {0} was released")]
    ReservationReleased(uuid::Uuid),
    #[error("the stock gate is unavailable: {0}")]
    GateUnavailable(String),
    /// The product database could not be reached (worth retrying later).
    #[error("the product database is unavailable: {0}")]
    DatabaseUnavailable(String),
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

fn refusal_message(r: &Refusal, available: i64) -> String {
    match r {
        Refusal::SoldOut => "sold out".to_owned(),
        Refusal::InsufficientStock => format!("only {available} units left"),
        Refusal::UserLimitExceeded => {
            "the per-user limit of this product would be exceeded".to_owned()
        }
        Refusal::SaleNotStarted => "the sale has not started".to_owned(),
        Refusal::SaleEnded => "the sale has ended".to_owned(),
    }
}

fn closed_message(r: Refusal, at_ms: i64, gate_ms: i64) -> String {
    let at = flashsale_contract::rfc3339_ms(at_ms);
    match r {
        Refusal::SaleEnded => format!(
            "the sale ended at {at} ({} ms ago by the stock gate's clock)",
            gate_ms.saturating_sub(at_ms)
        ),
        _ => format!(
            "the sale starts at {at} (in {} ms by the stock gate's clock)",
            at_ms.saturating_sub(gate_ms)
        ),
    }
}

/// A string that is not a sku is an invalid `sku` field.
impl From<SkuError> for StockError {
    fn from(e: SkuError) -> Self {
        Self::invalid("sku", e.to_string())
    }
}

impl StockError {
    pub fn invalid(field: &str, description: impl Into<String>) -> Self {
        Self::Invalid(vec![(field.to_owned(), description.into())])
    }

    /// The field violations of an `Invalid` error (empty otherwise).
    pub fn violations(self) -> Vec<(String, String)> {
        match self {
            Self::Invalid(v) => v,
            _ => Vec::new(),
        }
    }
}
