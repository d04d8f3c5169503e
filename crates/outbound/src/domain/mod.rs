//! Pure outbound types: a shipment and its life (PICKING → SHIPPED | FAILED), and the backoff
//! between its attempts. No tonic,
//! sea-orm, lapin or redis here.

use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// Where a shipment is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShipmentStatus {
    Picking,
    Shipped,
    Failed,
}

impl ShipmentStatus {
    pub fn as_db(self) -> &'static str {
        match self {
            Self::Picking => "PICKING",
            Self::Shipped => "SHIPPED",
            Self::Failed => "FAILED",
        }
    }

    pub fn from_db(s: &str) -> Option<Self> {
        match s {
            "PICKING" => Some(Self::Picking),
            "SHIPPED" => Some(Self::Shipped),
            "FAILED" => Some(Self::Failed),
            _ => None,
        }
    }

    pub fn is_terminal(self) -> bool {
        !matches!(self, Self::Picking)
    }
}

/// Whether the stock is committed at shipment (retail) or was already at order (ticketing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    ReserveThenCommit,
    CommitAtOrder,
}

impl Policy {
    pub fn as_db(self) -> &'static str {
        match self {
            Self::ReserveThenCommit => "RESERVE_THEN_COMMIT",
            Self::CommitAtOrder => "COMMIT_AT_ORDER",
        }
    }

    pub fn from_db(s: &str) -> Option<Self> {
        match s {
            "RESERVE_THEN_COMMIT" => Some(Self::ReserveThenCommit),
            "COMMIT_AT_ORDER" => Some(Self::CommitAtOrder),
            _ => None,
        }
    }
}

/// One paid order's shipment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shipment {
    pub shipment_id: Uuid,
    pub order_id: Uuid,
    pub user_id: String,
    pub sku: String,
    pub quantity: i64,
    pub policy: Policy,
    pub status: ShipmentStatus,
    pub failure_reason: Option<String>,
    pub attempts: i32,
    /// Whether product-stock deducted the order's units for it (always false for
    /// COMMIT_AT_ORDER, whose units were deducted at order).
    pub stock_committed: bool,
    /// Why the last attempt was delayed; empty when none was.
    pub last_error: String,
    /// When a PICKING shipment is tried again.
    pub next_attempt_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// How long a shipment waits before attempt `attempt + 1` after `attempt` was delayed: `base`
/// doubling per attempt up to `max`, the upper half of it drawn at random (`unit` in `0.0..1.0`),
/// so shipments delayed by one outage do not all come back at once.
pub fn backoff(attempt: i32, base: Duration, max: Duration, unit: f64) -> Duration {
    let doublings = u32::try_from(attempt.saturating_sub(1))
        .unwrap_or(0)
        .min(30);
    let full = base.saturating_mul(1 << doublings).min(max);
    full / 2 + full.mul_f64(unit.clamp(0.0, 1.0) / 2.0)
}

/// What the outbound use cases can fail with.
#[derive(Debug, thiserror::Error)]
pub enum OutboundError {
    #[error("invalid argument")]
    Invalid(Vec<(String, String)>),
    #[error("no shipment for order {0}")]
    NotFound(Uuid),
    /// Worth retrying later (product-stock or the warehouse unreachable, a database hiccup).
    #[error("{0}")]
    Transient(String),
    /// The outbound database could not be reached (worth retrying later).
    #[error("the outbound database is unavailable: {0}")]
    DatabaseUnavailable(String),
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

impl OutboundError {
    pub fn invalid(field: &str, description: impl Into<String>) -> Self {
        Self::Invalid(vec![(field.to_owned(), description.into())])
    }
}

/// A canonical hyphenated UUID.
pub fn parse_uuid(field: &str, raw: &str) -> Result<Uuid, OutboundError> {
    let id = Uuid::try_parse(raw).map_err(|_| OutboundError::invalid(field, "must be a UUID"))?;
    if id.hyphenated().to_string() != raw.to_ascii_lowercase() {
        return Err(OutboundError::invalid(
            field,
            "must be a UUID in canonical hyphenated form",
        ));
    }
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_picking_is_open() {
        assert!(!ShipmentStatus::Picking.is_terminal());
        assert!(ShipmentStatus::Shipped.is_terminal() && ShipmentStatus::Failed.is_terminal());
        for s in [
            ShipmentStatus::Picking,
            ShipmentStatus::Shipped,
            ShipmentStatus::Failed,
        ] {
            assert_eq!(ShipmentStatus::from_db(s.as_db()), Some(s));
        }
    }

    #[test]
    fn backoff_doubles_up_to_its_cap_with_the_upper_half_random() {
        let (base, max) = (Duration::from_millis(200), Duration::from_secs(30));
        assert_eq!(backoff(1, base, max, 0.0), Duration::from_millis(100));
        assert_eq!(backoff(1, base, max, 1.0), Duration::from_millis(200));
        assert_eq!(backoff(4, base, max, 0.5), Duration::from_millis(1200));
        assert_eq!(backoff(40, base, max, 1.0), max);
        assert_eq!(backoff(i32::MAX, base, max, 0.0), max / 2);
        assert_eq!(
            backoff(0, base, max, 1.0),
            base,
            "a first attempt waits the base"
        );
    }

    #[test]
    fn ids_must_be_canonical_uuids() {
        let id = Uuid::new_v4();
        assert_eq!(parse_uuid("order_id", &id.to_string()).unwrap(), id);
        assert!(parse_uuid("order_id", &id.simple().to_string()).is_err());
        assert!(parse_uuid("order_id", "x").is_err());
    }
}
