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
    /// A write-off of more units than are free: on hand, less reserved, less the units held
    /// for orders acknowledged but not yet in the database.
    #[error(
        "only {0} units are free to write off (on hand, less units reserved or held for acknowledged orders)"
    )]
    WriteOffAboveFree(i64),
    #[error("{0} was used before with a different payload")]
    IdempotencyKeyReused(&'static str),
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
