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
}

impl Refusal {
    pub const ALL: [Refusal; 3] = [
        Refusal::SoldOut,
        Refusal::InsufficientStock,
        Refusal::UserLimitExceeded,
    ];

    /// The `ErrorInfo.reason` on the wire.
    pub fn reason(self) -> &'static str {
        match self {
            Self::SoldOut => "SOLD_OUT",
            Self::InsufficientStock => "INSUFFICIENT_STOCK",
            Self::UserLimitExceeded => "USER_LIMIT_EXCEEDED",
        }
    }

    /// The refusal an `ErrorInfo.reason` names, or `None` for a reason this version does not
    /// know (the caller decides what an unknown refusal means).
    pub fn from_reason(reason: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.reason() == reason)
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
