//! Page tokens: an opaque cursor `(time, order id)` a listing hands out with a page and takes
//! back for the next one, bound to what the listing was asked (a token of one filter is refused
//! by another).

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::domain::OrderError;

/// A 64-bit FNV-1a hash of a listing's filter, carried in its tokens.
pub(super) fn filter_hash(filter: &str) -> u64 {
    filter.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The token `<kind>.<micros>.<id>.<check in hex>`.
pub(super) fn encode(kind: &str, at: DateTime<Utc>, id: Uuid, check: u64) -> String {
    format!("{kind}.{}.{}.{check:x}", at.timestamp_micros(), id.simple())
}

/// The cursor of `token` ("" = the first page), which must be a `kind` token issued with
/// `check`; anything else is `INVALID_ARGUMENT` on `page_token`, saying it was not issued `for`.
pub(super) fn decode(
    token: &str,
    kind: &str,
    check: u64,
    issued_for: &str,
) -> Result<Option<(DateTime<Utc>, Uuid)>, OrderError> {
    if token.is_empty() {
        return Ok(None);
    }
    let bad = || {
        OrderError::invalid(
            "page_token",
            format!("not a token this server issued for {issued_for}"),
        )
    };
    let mut parts = token.split('.');
    let (Some(k), Some(micros), Some(id), Some(hex), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return Err(bad());
    };
    if k != kind || u64::from_str_radix(hex, 16).ok() != Some(check) {
        return Err(bad());
    }
    let at = micros
        .parse::<i64>()
        .ok()
        .and_then(DateTime::<Utc>::from_timestamp_micros)
        .ok_or_else(bad)?;
    let id = Uuid::try_parse(id).map_err(|_| bad())?;
    Ok(Some((at, id)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_round_trips_only_for_its_kind_and_check() {
        let (at, id) = (Utc::now(), Uuid::new_v4());
        let t = encode("o1", at, id, 42);
        let (at2, id2) = decode(&t, "o1", 42, "this filter").unwrap().unwrap();
        assert_eq!((at2.timestamp_micros(), id2), (at.timestamp_micros(), id));
        assert!(decode(&t, "o1", 43, "this filter").is_err());
        assert!(decode(&t, "s1", 42, "this filter").is_err());
        assert_eq!(decode("", "o1", 42, "this filter").unwrap(), None);
    }
}
