//! Page tokens: an opaque cursor `(time, order id)` a listing hands out with a page and takes
//! back for the next one, bound to what the listing was asked (a token of one filter is refused
//! by another).

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::domain::OrderError;

/// The latest instant a token carries, the end of year 9999 in microseconds. Tokens carry
/// instants from the Unix epoch up to it: PostgreSQL's `timestamptz` holds all of these, while
/// a forged instant outside its range would fail the page's query as the server's fault.
const MAX_MICROS: i64 = 253_402_300_799_999_999;

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
        .filter(|m| (0..=MAX_MICROS).contains(m))
        .and_then(DateTime::<Utc>::from_timestamp_micros)
        .ok_or_else(bad)?;
    let id = Uuid::try_parse(id).map_err(|_| bad())?;
    // Only the spelling `encode` writes: no `+`, leading zeros, uppercase or hyphenated id.
    if encode(kind, at, id, check) != token {
        return Err(bad());
    }
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

    #[test]
    fn a_second_spelling_of_a_token_or_an_instant_outside_the_database_is_refused() {
        let id = Uuid::from_u128(0xabc7);
        let good = format!("o1.5.{}.2a", id.simple());
        assert!(decode(&good, "o1", 42, "f").unwrap().is_some());
        for junk in [
            format!("o1.+5.{}.2a", id.simple()),
            format!("o1.05.{}.2a", id.simple()),
            format!("o1.5.{}.+2a", id.simple()),
            format!("o1.5.{}.2A", id.simple()),
            format!("o1.5.{}.02a", id.simple()),
            format!("o1.5.{}.2a", id.hyphenated()),
            format!("o1.5.{}.2a", id.simple().to_string().to_uppercase()),
            format!("o1.-1.{}.2a", id.simple()),
            format!("o1.-8000000000000000000.{}.2a", id.simple()),
            format!("o1.{}.{}.2a", MAX_MICROS + 1, id.simple()),
        ] {
            assert!(decode(&junk, "o1", 42, "f").is_err(), "{junk} accepted");
        }
    }

    #[test]
    fn no_generated_token_panics_the_decoder_or_passes_unless_the_encoder_wrote_it() {
        let at = DateTime::<Utc>::from_timestamp_micros(1_700_000_000_123_456).unwrap();
        let issued = vec![
            encode("o1", at, Uuid::new_v4(), 42),
            encode("o1", at, Uuid::from_u128(1), 42),
            encode("o1", DateTime::UNIX_EPOCH, Uuid::nil(), 42),
        ];
        flashsale_test_support::page_tokens::check_decoder(issued, 2048, |t| {
            let (at, id) = decode(t, "o1", 42, "f").ok()??;
            Some(encode("o1", at, id, 42))
        })
        .unwrap();
    }

    #[test]
    fn a_token_cut_short_or_extended_is_refused() {
        let at = DateTime::<Utc>::from_timestamp_micros(1_700_000_000_123_456).unwrap();
        let check = filter_hash("alice|*");
        let token = encode("o1", at, Uuid::new_v4(), check);
        flashsale_test_support::page_tokens::check_cut_or_extended_refused(&token, 512, |t| {
            decode(t, "o1", check, "f").is_ok()
        })
        .unwrap();
    }
}
