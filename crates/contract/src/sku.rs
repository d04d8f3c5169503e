//! The sku: the product identifier every service and the gate's Redis keys share.

use std::fmt;

/// Longest sku, in bytes.
pub const SKU_MAX_LEN: usize = 64;

/// Why a string is not a sku; its `Display` is the field violation's description.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkuError {
    Empty,
    TooLong,
    BadCharacter,
}

impl fmt::Display for SkuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Empty => "must not be empty",
            Self::TooLong => "must be at most 64 characters",
            Self::BadCharacter => "may contain only ASCII letters, digits, '-', '_' and '.'",
        })
    }
}

impl std::error::Error for SkuError {}

/// Checks the sku format: 1..=64 ASCII letters, digits, `-`, `_` or `.`. No braces, spaces,
/// colons or glob characters, so a sku sits inside a Redis Cluster hash tag (`{p:SKU}`) and a
/// key without escaping.
pub fn check_sku(raw: &str) -> Result<(), SkuError> {
    if raw.is_empty() {
        return Err(SkuError::Empty);
    }
    if raw.len() > SKU_MAX_LEN {
        return Err(SkuError::TooLong);
    }
    if !raw
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err(SkuError::BadCharacter);
    }
    Ok(())
}

/// A well-formed sku (see [`check_sku`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Sku(String);

impl Sku {
    pub fn parse(raw: &str) -> Result<Self, SkuError> {
        check_sku(raw).map(|()| Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Sku {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for Sku {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sku_is_one_to_sixty_four_safe_characters() {
        assert!(Sku::parse("WINE-1.a_b").is_ok());
        assert!(Sku::parse(&"a".repeat(64)).is_ok());
        assert_eq!(Sku::parse(""), Err(SkuError::Empty));
        assert_eq!(Sku::parse(&"a".repeat(65)), Err(SkuError::TooLong));
        for bad in ["a b", "{p}", "a:b", "a*", "é", "a\0"] {
            assert_eq!(Sku::parse(bad), Err(SkuError::BadCharacter), "{bad:?}");
        }
    }
}
