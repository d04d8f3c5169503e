//! The payment provider's signed notifications and the rules both ends share: how a
//! notification is signed and verified (HMAC-SHA256 over `<timestamp>.<payload>`, lowercase
//! hex), how old one may be, and what a currency code looks like. The provider simulator signs
//! with [`sign`]; the order service checks with [`verify`].

use hmac::{Hmac, KeyInit as _, Mac as _};
use sha2::Sha256;

/// Largest notification payload accepted, in bytes.
pub const NOTIFICATION_MAX_BYTES: usize = 64 * 1024;
/// Length of a signature: 32 bytes of HMAC-SHA256 in hex.
pub const SIGNATURE_LEN: usize = 64;
/// Shortest secret accepted for signing notifications or as an API key, in bytes.
pub const PAYMENT_SECRET_MIN_LEN: usize = 32;
/// The development secret `config/default.toml` carries and the simulator starts with: public
/// on purpose, it only suits a laptop (the order service warns loudly when it runs with it).
pub const DEV_WEBHOOK_SECRET: &str = "flashsale-payment-sim-development-webhook-secret";
/// The development API key `config/default.toml` carries and the simulator starts with.
pub const DEV_PAYMENT_API_KEY: &str = "flashsale-payment-sim-development-api-key";

type HmacSha256 = Hmac<Sha256>;

fn mac(secret: &[u8], timestamp: i64, payload: &[u8]) -> HmacSha256 {
    // HMAC takes a key of any length; `new_from_slice` cannot fail for it.
    let mut mac = match HmacSha256::new_from_slice(secret) {
        Ok(m) => m,
        Err(_) => unreachable!("HMAC accepts keys of every length"),
    };
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(payload);
    mac
}

/// The signature of `payload` signed at `timestamp` (seconds since the epoch) under `secret`.
pub fn sign(secret: &[u8], timestamp: i64, payload: &[u8]) -> String {
    hex::encode(mac(secret, timestamp, payload).finalize().into_bytes())
}

/// Why a notification's signature is not accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SignatureError {
    /// No signature at all.
    Missing,
    /// Not 64 lowercase hex characters.
    Malformed,
    /// Well formed but not made with the shared secret over these bytes and this timestamp.
    Mismatch,
    /// Signed further than the tolerance from now (a replay, or a clock far off).
    Stale { age_secs: i64 },
    /// Larger than [`NOTIFICATION_MAX_BYTES`].
    TooLarge,
}

impl std::fmt::Display for SignatureError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Missing => f.write_str("the notification is not signed"),
            Self::Malformed => write!(
                f,
                "the signature must be {SIGNATURE_LEN} lowercase hex characters"
            ),
            Self::Mismatch => f.write_str("the signature does not match the notification"),
            Self::Stale { age_secs } => write!(
                f,
                "the notification was signed {age_secs} s from now, outside the accepted window"
            ),
            Self::TooLarge => write!(f, "the notification is over {NOTIFICATION_MAX_BYTES} bytes"),
        }
    }
}

impl std::error::Error for SignatureError {}

/// Checks that `signature` signs `payload` at `timestamp` under `secret` (in constant time), and
/// that `timestamp` lies within `tolerance_secs` of `now_secs`.
pub fn verify(
    secret: &[u8],
    timestamp: i64,
    payload: &[u8],
    signature: &str,
    now_secs: i64,
    tolerance_secs: i64,
) -> Result<(), SignatureError> {
    if payload.len() > NOTIFICATION_MAX_BYTES {
        return Err(SignatureError::TooLarge);
    }
    if signature.is_empty() {
        return Err(SignatureError::Missing);
    }
    let lower_hex = signature.len() == SIGNATURE_LEN
        && signature
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    let bytes = match hex::decode(signature) {
        Ok(b) if lower_hex => b,
        _ => return Err(SignatureError::Malformed),
    };
    mac(secret, timestamp, payload)
        .verify_slice(&bytes)
        .map_err(|_| SignatureError::Mismatch)?;
    let age = now_secs.saturating_sub(timestamp);
    if age.saturating_abs() > tolerance_secs {
        return Err(SignatureError::Stale { age_secs: age });
    }
    Ok(())
}

/// An ISO 4217 currency code: three capital ASCII letters.
pub fn check_currency(code: &str) -> Result<(), &'static str> {
    if code.len() == 3 && code.bytes().all(|b| b.is_ascii_uppercase()) {
        Ok(())
    } else {
        Err("must be an ISO 4217 code: three capital letters, e.g. EUR")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

    #[test]
    fn a_signed_notification_verifies_and_any_change_does_not() {
        let sig = sign(KEY, 1_000, b"body");
        assert_eq!(sig.len(), SIGNATURE_LEN);
        assert_eq!(verify(KEY, 1_000, b"body", &sig, 1_010, 300), Ok(()));
        assert_eq!(
            verify(KEY, 1_000, b"bodY", &sig, 1_010, 300),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify(KEY, 1_001, b"body", &sig, 1_010, 300),
            Err(SignatureError::Mismatch),
            "the timestamp is signed too"
        );
        assert_eq!(
            verify(
                b"another secret entirely, 32 bytes",
                1_000,
                b"body",
                &sig,
                1_010,
                300
            ),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn stale_missing_and_malformed_signatures_are_refused() {
        let sig = sign(KEY, 1_000, b"body");
        assert_eq!(
            verify(KEY, 1_000, b"body", &sig, 1_301, 300),
            Err(SignatureError::Stale { age_secs: 301 })
        );
        assert_eq!(
            verify(KEY, 1_000, b"body", &sig, 699, 300),
            Err(SignatureError::Stale { age_secs: -301 })
        );
        assert_eq!(
            verify(KEY, 1_000, b"body", "", 1_000, 300),
            Err(SignatureError::Missing)
        );
        for bad in [
            &sig[..63],
            &sig.to_uppercase(),
            &format!("{}zz", &sig[..62]),
        ] {
            assert_eq!(
                verify(KEY, 1_000, b"body", bad, 1_000, 300),
                Err(SignatureError::Malformed),
                "{bad}"
            );
        }
        let big = vec![0u8; NOTIFICATION_MAX_BYTES + 1];
        let sig = sign(KEY, 1_000, &big);
        assert_eq!(
            verify(KEY, 1_000, &big, &sig, 1_000, 300),
            Err(SignatureError::TooLarge)
        );
    }

    #[test]
    fn currencies_are_three_capital_letters() {
        assert!(check_currency("EUR").is_ok());
        for bad in ["", "eur", "EURO", "E1R", "€UR"] {
            assert!(check_currency(bad).is_err(), "{bad}");
        }
    }
}
