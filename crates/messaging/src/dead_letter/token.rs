//! Opaque page tokens of `ListDeadLetters` (AIP-158): the position after the last message of a
//! page, bound to the queue filter it was issued for.
//!
//! The checksum only tells tokens this code issued from garbage, truncated or edited ones (and
//! from tokens of another filter). It is no signature: a caller who forges one gains nothing but
//! another starting point in a list they may read anyway.

use chrono::{DateTime, Utc};

const VERSION: u8 = 1;
const LEN: usize = 1 + 8 + 8 + 8 + 8;

/// Where the next page starts: after `(parked_at, id)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Cursor {
    pub(crate) parked_at: DateTime<Utc>,
    pub(crate) id: i64,
}

/// The token for the page after `cursor`, for list requests with queue filter `filter`.
pub(crate) fn encode(filter: &str, cursor: Cursor) -> String {
    let mut bytes = Vec::with_capacity(LEN);
    bytes.push(VERSION);
    bytes.extend_from_slice(&cursor.id.to_be_bytes());
    bytes.extend_from_slice(&cursor.parked_at.timestamp_micros().to_be_bytes());
    bytes.extend_from_slice(&fnv1a(filter.as_bytes()).to_be_bytes());
    let sum = fnv1a(&bytes);
    bytes.extend_from_slice(&sum.to_be_bytes());
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The cursor in `token`, or `None` when this code did not issue it for `filter`.
pub(crate) fn decode(filter: &str, token: &str) -> Option<Cursor> {
    if token.len() != LEN * 2 || !token.is_ascii() {
        return None;
    }
    let bytes = (0..LEN)
        .map(|i| u8::from_str_radix(token.get(2 * i..2 * i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    let (body, sum) = bytes.split_at(LEN - 8);
    if body.first() != Some(&VERSION) || fnv1a(body).to_be_bytes() != sum {
        return None;
    }
    let word = |at: usize| -> Option<[u8; 8]> { body.get(at..at + 8)?.try_into().ok() };
    if u64::from_be_bytes(word(17)?) != fnv1a(filter.as_bytes()) {
        return None;
    }
    Some(Cursor {
        id: i64::from_be_bytes(word(1)?),
        parked_at: DateTime::from_timestamp_micros(i64::from_be_bytes(word(9)?))?,
    })
}

/// 64-bit FNV-1a: a checksum, not a MAC.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cursor() -> Cursor {
        Cursor {
            parked_at: DateTime::from_timestamp_micros(1_700_000_000_123_456).unwrap(),
            id: 42,
        }
    }

    #[test]
    fn token_round_trips_for_its_filter_only() {
        let t = encode("q1", cursor());
        assert_eq!(decode("q1", &t), Some(cursor()));
        assert_eq!(decode("q2", &t), None);
        assert_eq!(decode("", &t), None);
    }

    #[test]
    fn garbage_truncated_or_edited_tokens_are_refused() {
        let t = encode("", cursor());
        assert_eq!(decode("", "garbage"), None);
        assert_eq!(decode("", &t[..t.len() - 2]), None);
        let mut edited = t.clone().into_bytes();
        edited[5] = if edited[5] == b'0' { b'1' } else { b'0' };
        assert_eq!(decode("", &String::from_utf8(edited).unwrap()), None);
        let multibyte = "é".repeat(LEN);
        assert_eq!(decode("", &multibyte), None);
    }
}
