//! Strings from clients. Every string field of every RPC, and a token's subject, goes through
//! [`check_text`] (or [`check_optional_text`]) where it enters, so no control character reaches
//! a database, a Redis key, a log line or another service: PostgreSQL refuses a NUL in `text`,
//! and one such value in a batched write would fail every other order written with it.

use std::fmt;

/// One bad field, as the services' `INVALID_ARGUMENT` carries it: `(field, description)`.
pub type FieldViolation = (String, String);

/// Why a string is refused; its `Display` is the field violation's description.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TextError {
    /// Required and empty.
    Empty,
    /// More than `max` characters.
    TooLong { max: usize },
    /// A control character (U+0000–U+001F, U+007F–U+009F, NUL included) at this character
    /// position.
    ControlCharacter { at: usize },
}

impl fmt::Display for TextError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => f.write_str("must not be empty"),
            Self::TooLong { max } => write!(f, "must be at most {max} characters"),
            Self::ControlCharacter { at } => write!(
                f,
                "must not contain control characters (found one at character {at})"
            ),
        }
    }
}

impl std::error::Error for TextError {}

/// The position (in characters) of the first control character of `value`, if any.
pub fn control_character_at(value: &str) -> Option<usize> {
    value.chars().position(char::is_control)
}

/// What is wrong with `value` as a string field of at most `max` characters (not bytes).
fn text_error(value: &str, max: usize, required: bool) -> Option<TextError> {
    if let Some(at) = control_character_at(value) {
        return Some(TextError::ControlCharacter { at });
    }
    if required && value.is_empty() {
        return Some(TextError::Empty);
    }
    // Counting characters only when the bytes could exceed the limit keeps the common case
    // (short ASCII ids) to one pass.
    if value.len() > max && value.chars().count() > max {
        return Some(TextError::TooLong { max });
    }
    None
}

/// A required string field: 1..=`max` characters, no control characters. The violation names
/// `field`.
pub fn check_text(field: &str, value: &str, max: usize) -> Result<(), FieldViolation> {
    match text_error(value, max, true) {
        None => Ok(()),
        Some(e) => Err((field.to_owned(), e.to_string())),
    }
}

/// An optional string field (empty is fine): 0..=`max` characters, no control characters.
pub fn check_optional_text(field: &str, value: &str, max: usize) -> Result<(), FieldViolation> {
    match text_error(value, max, false) {
        None => Ok(()),
        Some(e) => Err((field.to_owned(), e.to_string())),
    }
}

/// Runs `checks` and gathers every violation, so a request learns all its bad fields at once.
pub fn violations<const N: usize>(checks: [Result<(), FieldViolation>; N]) -> Vec<FieldViolation> {
    checks.into_iter().filter_map(Result::err).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_refused_wherever_they_are() {
        for bad in [
            "a\0",
            "\0",
            "a\u{1}b",
            "tab\there",
            "line\n",
            "\u{7f}",
            "c1\u{85}",
        ] {
            let (field, why) = check_text("request_id", bad, 64).unwrap_err();
            assert_eq!(field, "request_id");
            assert!(why.contains("control characters"), "{bad:?}: {why}");
            assert!(
                check_optional_text("page_token", bad, 64).is_err(),
                "{bad:?}"
            );
        }
        assert_eq!(
            text_error("ab\0", 64, true),
            Some(TextError::ControlCharacter { at: 2 })
        );
    }

    #[test]
    fn length_counts_characters_and_empty_is_refused_only_when_required() {
        assert!(check_text("name", &"é".repeat(200), 200).is_ok());
        assert_eq!(
            check_text("name", &"é".repeat(201), 200).unwrap_err().1,
            "must be at most 200 characters"
        );
        assert_eq!(
            check_text("name", "", 200).unwrap_err().1,
            "must not be empty"
        );
        assert!(check_optional_text("page_token", "", 200).is_ok());
        // Printable non-ASCII is text like any other.
        assert!(check_text("name", "Château Flash 🍷", 200).is_ok());
    }

    #[test]
    fn every_violation_is_gathered() {
        let v = violations([
            check_text("a", "", 3),
            check_text("b", "ok", 3),
            check_optional_text("c", "x\0", 3),
        ]);
        let fields: Vec<&str> = v.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(fields, ["a", "c"]);
    }
}
