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

/// The wire form of an instant in milliseconds since the Unix epoch (`None` out of range).
pub fn ms_to_timestamp(ms: i64) -> Option<Timestamp> {
    DateTime::from_timestamp_millis(ms).map(to_timestamp)
}

/// The milliseconds since the Unix epoch a timestamp names (finer parts dropped), or `None`
/// as for [`from_timestamp`].
pub fn timestamp_to_ms(ts: &Timestamp) -> Option<i64> {
    from_timestamp(ts).map(|t| t.timestamp_millis())
}

/// Milliseconds since the Unix epoch as RFC 3339 in UTC with milliseconds
/// (`2026-12-07T20:00:00.000Z`): how an instant travels in `ErrorInfo` metadata.
pub fn rfc3339_ms(ms: i64) -> String {
    DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// The milliseconds since the Unix epoch an RFC 3339 instant names, or `None` when it is not
/// one.
pub fn parse_rfc3339_ms(s: &str) -> Option<i64> {
    DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.timestamp_millis())
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
    fn an_instant_in_milliseconds_round_trips_through_rfc3339() {
        let ms = 1_796_745_600_123;
        assert_eq!(rfc3339_ms(ms), "2026-12-08T16:00:00.123Z");
        assert_eq!(parse_rfc3339_ms(&rfc3339_ms(ms)), Some(ms));
        assert_eq!(parse_rfc3339_ms("yesterday"), None);
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
