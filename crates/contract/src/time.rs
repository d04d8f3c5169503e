//! Instants on the wire: `google.protobuf.Timestamp` ↔ `chrono::DateTime<Utc>`.

use chrono::{DateTime, Utc};
use prost_types::Timestamp;

/// The wire form of an instant.
pub fn to_timestamp(t: DateTime<Utc>) -> Timestamp {
    Timestamp {
        seconds: t.timestamp(),
        nanos: i32::try_from(t.timestamp_subsec_nanos()).unwrap_or(0),
    }
}

/// The instant a timestamp names, or `None` when it is out of range or its nanos are not in
/// `0..1_000_000_000`.
pub fn from_timestamp(ts: &Timestamp) -> Option<DateTime<Utc>> {
    let nanos = u32::try_from(ts.nanos)
        .ok()
        .filter(|n| *n < 1_000_000_000)?;
    DateTime::from_timestamp(ts.seconds, nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instant_round_trips_through_its_timestamp() {
        let t = DateTime::from_timestamp(1_700_000_000, 123_456_789).unwrap_or_default();
        assert_eq!(from_timestamp(&to_timestamp(t)), Some(t));
    }

    #[test]
    fn a_timestamp_out_of_range_names_no_instant() {
        let bad_nanos = Timestamp {
            seconds: 0,
            nanos: -1,
        };
        assert_eq!(from_timestamp(&bad_nanos), None);
        let too_many = Timestamp {
            seconds: 0,
            nanos: 1_000_000_000,
        };
        assert_eq!(from_timestamp(&too_many), None);
        let far = Timestamp {
            seconds: i64::MAX,
            nanos: 0,
        };
        assert_eq!(from_timestamp(&far), None);
    }
}
