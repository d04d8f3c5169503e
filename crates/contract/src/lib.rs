//! The rules every flashsale service and client shares, each with one home: the sku format,
//! the limits on ids, keys and quantities, the conversion between timestamps and
//! `google.protobuf.Timestamp`, the deduction policy's names, the reasons a reservation is
//! refused and every other reason a service gives ([`reason`]), each service's work queue
//! ([`queues`]), how the payment provider's notifications are signed, and the check every string
//! from a client passes (no control characters, a length limit). Pure values and checks: no I/O, no
//! tonic, no database.

mod limits;
pub mod payment;
mod policy;
pub mod queues;
pub mod reason;
mod refusal;
mod sku;
mod text;
mod time;

pub use limits::*;
pub use policy::Policy;
pub use prost_types::{FieldMask, Timestamp};
pub use refusal::Refusal;
pub use sku::{SKU_MAX_LEN, Sku, SkuError, check_sku};
pub use text::{
    FieldViolation, TextError, check_optional_text, check_text, control_character_at, violations,
};
pub use time::{
    from_timestamp, ms_to_timestamp, parse_rfc3339_ms, rfc3339_ms, timestamp_to_ms, to_timestamp,
};

/// A canonical hyphenated UUID (lowercase or uppercase); anything else, braces, URNs or the
/// simple form included, is refused so one order has one spelling.
pub fn parse_canonical_uuid(raw: &str) -> Option<uuid::Uuid> {
    let id = uuid::Uuid::try_parse(raw).ok()?;
    (id.hyphenated().to_string() == raw.to_ascii_lowercase()).then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_canonical_uuid_form_is_accepted() {
        let id = uuid::Uuid::new_v4();
        assert_eq!(parse_canonical_uuid(&id.to_string()), Some(id));
        assert_eq!(
            parse_canonical_uuid(&id.to_string().to_uppercase()),
            Some(id)
        );
        assert_eq!(parse_canonical_uuid(&id.simple().to_string()), None);
        assert_eq!(parse_canonical_uuid(&id.urn().to_string()), None);
        assert_eq!(parse_canonical_uuid("not-a-uuid"), None);
    }
}
