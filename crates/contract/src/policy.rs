//! When product-stock deducts on_hand, as the database, the events and the API name it.

/// The deduction policy of a product.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Policy {
    /// Retail: reserve at order, deduct on_hand at shipment.
    ReserveThenCommit,
    /// Ticketing: deduct on_hand when the order is persisted; a cancellation puts it back.
    CommitAtOrder,
}

impl Policy {
    pub const ALL: [Policy; 2] = [Policy::ReserveThenCommit, Policy::CommitAtOrder];

    /// The name stored in the databases and carried by the events.
    pub fn as_db(self) -> &'static str {
        match self {
            Self::ReserveThenCommit => "RESERVE_THEN_COMMIT",
            Self::CommitAtOrder => "COMMIT_AT_ORDER",
        }
    }

    pub fn from_db(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_db() == s)
    }

    /// The value of `flashsale.product.v1.DeductionPolicy` (0 is `UNSPECIFIED`).
    pub fn as_proto(self) -> i32 {
        match self {
            Self::ReserveThenCommit => 1,
            Self::CommitAtOrder => 2,
        }
    }

    /// `None` for `UNSPECIFIED` (0) and for values this version does not know.
    pub fn from_proto(value: i32) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_proto() == value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_policy_round_trips_through_its_names() {
        for p in Policy::ALL {
            assert_eq!(Policy::from_db(p.as_db()), Some(p));
            assert_eq!(Policy::from_proto(p.as_proto()), Some(p));
        }
        assert_eq!(Policy::from_db("reserve_then_commit"), None);
        assert_eq!(Policy::from_proto(0), None);
        assert_eq!(Policy::from_proto(3), None);
    }
}
