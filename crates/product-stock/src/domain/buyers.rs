//! The gate's buyers of one product, as the order service's sold-out memory reads them
//! (docs/adr/0005-sold-out-memory.md).

use super::StockError;

/// Longest refills count a caller may pass back (the count is a decimal number: a rebuild's
/// microsecond clock plus the bumps since).
pub const REFILLS_MAX_LEN: usize = 32;

/// Checks a refills count a caller passes back: empty (no list read before) or at most
/// [`REFILLS_MAX_LEN`] ASCII digits.
pub fn check_known_refills(known_refills: &str) -> Result<(), StockError> {
    if known_refills.len() > REFILLS_MAX_LEN || !known_refills.bytes().all(|b| b.is_ascii_digit()) {
        return Err(StockError::invalid(
            "known_refills",
            format!("must be empty or at most {REFILLS_MAX_LEN} ASCII digits"),
        ));
    }
    Ok(())
}

/// The buyers the gate counts for one product, with its available counter and its refills
/// count, read atomically. The refills count is bumped by every change that may give units back
/// to the counter (a release, an adjustment, a repair) and started afresh by a rebuild: while
/// it stays put and the counter stays at zero, no new buyer can appear.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GateBuyers {
    /// Every user holding or having bought units through the gate.
    Listed {
        available: i64,
        users: Vec<String>,
        refills: String,
    },
    /// The refills count is still the one the caller knew: no list sent (the caller's list is
    /// still every buyer if `available` is at zero).
    Unchanged {
        available: i64,
        count: i64,
        refills: String,
    },
    /// More buyers than asked for: only how many.
    TooMany {
        available: i64,
        count: i64,
        refills: String,
    },
    /// The product's keys are missing (never loaded, or the cache was lost).
    NotLoaded,
}
