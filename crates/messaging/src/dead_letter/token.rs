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
    let micros = i64::from_be_bytes(word(9)?);
    let cursor = Cursor {
        id: i64::from_be_bytes(word(1)?),
        parked_at: DateTime::from_timestamp_micros(micros).filter(|_| micros >= 0)?,
    };
    // Only the spelling `encode` writes: `from_str_radix` also takes `+f` and uppercase.
    (encode(filter, cursor) == token).then_some(cursor)
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

    #[test]
    fn a_second_spelling_of_a_token_or_an_instant_before_the_epoch_is_refused() {
        let t = encode("q", cursor());
        let plus = format!("+{}", &t[1..]);
        assert!(t.starts_with('0') && decode("q", &plus).is_none(), "{plus}");
        assert_eq!(decode("q", &t.to_uppercase()), None);
        let before_epoch = Cursor {
            parked_at: DateTime::from_timestamp_micros(-1).unwrap(),
            id: 1,
        };
        assert_eq!(decode("q", &encode("q", before_epoch)), None);
    }

    #[test]
    fn no_generated_token_panics_the_decoder_or_passes_unless_the_encoder_wrote_it() {
        use flashsale_test_support::page_tokens::{check_cut_or_extended_refused, check_decoder};
        for filter in ["", "q1"] {
            let issued = vec![
                encode(filter, cursor()),
                encode(
                    filter,
                    Cursor {
                        parked_at: DateTime::UNIX_EPOCH,
                        id: i64::MAX,
                    },
                ),
            ];
            check_decoder(issued.clone(), 1024, |t| {
                decode(filter, t).map(|c| encode(filter, c))
            })
            .unwrap();
            check_cut_or_extended_refused(&issued[0], 256, |t| decode(filter, t).is_some())
                .unwrap();
        }
    }
}
