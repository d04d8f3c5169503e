//! Why a reservation is refused: the `ErrorInfo` reasons of `FAILED_PRECONDITION` that
//! product-stock answers and the order service passes on to the buyer unchanged.

use std::fmt;

/// A refusal of the stock gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// Nothing is left.
    SoldOut,
    /// Fewer units are left than the order asks for.
    InsufficientStock,
    /// The buyer would exceed the product's per-user limit.
    UserLimitExceeded,
    /// The product's sale window has not opened yet (its `ErrorInfo` metadata names the
    /// opening, [`crate::reason::meta::SALE_START`], and the gate's clock).
    SaleNotStarted,
    /// The product's sale window has closed (its metadata names the closing,
    /// [`crate::reason::meta::SALE_END`], and the gate's clock).
    SaleEnded,
}

impl Refusal {
    pub const ALL: [Refusal; 5] = [
        Refusal::SoldOut,
        Refusal::InsufficientStock,
        Refusal::UserLimitExceeded,
        Refusal::SaleNotStarted,
        Refusal::SaleEnded,
    ];

    /// The `ErrorInfo.reason` on the wire.
    pub fn reason(self) -> &'static str {
        match self {
            Self::SoldOut => "SOLD_OUT",
            Self::InsufficientStock => "INSUFFICIENT_STOCK",
            Self::UserLimitExceeded => "USER_LIMIT_EXCEEDED",
            Self::SaleNotStarted => "SALE_NOT_STARTED",
            Self::SaleEnded => "SALE_ENDED",
        }
    }

    /// The refusal an `ErrorInfo.reason` names, or `None` for a reason this version does not
    /// know (the caller decides what an unknown refusal means).
    pub fn from_reason(reason: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.reason() == reason)
    }

    /// A refusal because of the sale window, not of the stock: the product may well have units.
    pub fn is_window(self) -> bool {
        matches!(self, Self::SaleNotStarted | Self::SaleEnded)
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.reason())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_refusal_round_trips_through_its_reason() {
        for r in Refusal::ALL {
            assert_eq!(Refusal::from_reason(r.reason()), Some(r));
        }
        assert_eq!(Refusal::from_reason("sold_out"), None);
        assert_eq!(Refusal::from_reason(""), None);
    }
}
