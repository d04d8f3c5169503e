//! Page tokens a client might send back, and the properties every listing's tokens must have.
//!
//! A client may send anything as a `page_token`: arbitrary Unicode, bytes it turned into text,
//! control characters, or a token the server issued and something then damaged (one character
//! replaced by a multi-byte one, cut short, extended). The strategies here generate all of
//! these; [`check_decoder`] is the unit-level property of a decoder (it never panics and
//! accepts exactly the tokens its encoder writes), [`check_page_tokens`] the gRPC-level one (a
//! token the server issued is OK, anything it could not have issued is `INVALID_ARGUMENT` with
//! a `google.rpc.BadRequest` field violation naming `page_token`, no answer is another code —
//! a panicking handler reads as CANCELLED, UNKNOWN or INTERNAL — and nothing changes).

use std::{fmt::Debug, future::Future};

use flashsale_platform::{auth::Role, error::violated_fields};
use flashsale_proto::admin::v1::{
    ListDeadLettersRequest, dead_letter_service_client::DeadLetterServiceClient,
};
use proptest::{
    prelude::*,
    sample::select,
    test_runner::{Config, TestCaseError, TestRunner},
};
use sea_orm::DatabaseConnection;
use tonic::{Code, Status};

use crate::{
    generated::{settled, table_digest},
    grpc::{channel, token, with_token},
};

/// Characters a near miss puts into a token: multi-byte ones (2, 3 and 4 bytes in UTF-8),
/// digits and letters of other scripts a lenient parser might take for ASCII ones, invisible
/// ones, control characters, and the ASCII a number parser accepts besides digits (`+`, `-`,
/// an uppercase hex digit), a space and the separator.
const ODD: &[char] = &[
    'é', 'ß', '€', '😀', '٣', '３', 'Ａ', '\u{200b}', '\u{feff}', '\u{85}', '\0', '\n', '\u{7f}',
    '+', '-', ' ', 'F', '.', '0', 'a',
];

/// One odd character, or any at all.
fn odd_char() -> impl Strategy<Value = char> {
    prop_oneof![3 => select(ODD), 1 => any::<char>()]
}

/// Arbitrary Unicode: any string, strings of multi-byte and odd characters, a control
/// character among letters, and strings longer than any token.
pub fn unicode_text() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => any::<String>(),
        2 => proptest::collection::vec(odd_char(), 1..12).prop_map(String::from_iter),
        1 => "[a-z0-9.]{0,6}[\\x00-\\x1f\\x7f\\u{80}-\\u{9f}][a-z0-9.]{0,6}",
        1 => "\\PC{500,600}",
    ]
}

/// Arbitrary bytes made text the two ways a client might: as they are when they happen to be
/// UTF-8 (mostly ASCII bytes, so they often are), otherwise lossily (each bad sequence becomes
/// U+FFFD).
pub fn bytes_text() -> impl Strategy<Value = String> {
    let byte = prop_oneof![3 => 0u8..0x80, 1 => any::<u8>()];
    proptest::collection::vec(byte, 0..48).prop_map(|bytes| match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    })
}

/// What a near miss does to a token, at a character position (taken modulo the token's
/// length).
#[derive(Clone, Debug)]
pub enum Edit {
    /// The character at a position replaced by another.
    Replace(usize, char),
    /// A character inserted before a position.
    Insert(usize, char),
    /// The token cut before a position (never to nothing).
    Truncate(usize),
    /// Characters added at the end.
    Extend(String),
}

impl Edit {
    /// `token` with this edit done.
    pub fn apply(&self, token: &str) -> String {
        let mut chars: Vec<char> = token.chars().collect();
        match self {
            Self::Replace(at, c) if !chars.is_empty() => {
                let i = at % chars.len();
                chars[i] = *c;
            }
            Self::Replace(_, c) => chars.push(*c),
            Self::Insert(at, c) => {
                let i = at % (chars.len() + 1);
                chars.insert(i, *c);
            }
            Self::Truncate(at) => chars.truncate((at % chars.len().max(1)).max(1)),
            Self::Extend(tail) => chars.extend(tail.chars()),
        }
        chars.into_iter().collect()
    }

    /// Whether the edit only cut or extended the token.
    pub fn cuts_or_extends(&self) -> bool {
        matches!(self, Self::Truncate(_) | Self::Extend(_))
    }
}

/// Near misses of one token: one character replaced or inserted (mostly an odd one, see
/// [`ODD`]), the token cut short, or extended.
pub fn edit() -> impl Strategy<Value = Edit> {
    let tail = prop_oneof![
        proptest::collection::vec(odd_char(), 1..4).prop_map(String::from_iter),
        "[0-9a-f]{1,4}",
    ];
    prop_oneof![
        3 => (any::<usize>(), odd_char()).prop_map(|(at, c)| Edit::Replace(at, c)),
        1 => (any::<usize>(), odd_char()).prop_map(|(at, c)| Edit::Insert(at, c)),
        1 => any::<usize>().prop_map(Edit::Truncate),
        1 => tail.prop_map(Edit::Extend),
    ]
}

/// Near misses of the tokens in `issued` (which must not be empty).
pub fn near_miss(issued: Vec<String>) -> impl Strategy<Value = String> {
    (select(issued), edit()).prop_map(|(token, edit)| edit.apply(&token))
}

/// Tokens a client might send to a listing that issued `issued` (which must not be empty):
/// those tokens themselves, near misses of them, arbitrary Unicode and bytes made text.
pub fn page_token(issued: Vec<String>) -> impl Strategy<Value = String> {
    prop_oneof![
        1 => select(issued.clone()),
        4 => near_miss(issued),
        2 => unicode_text(),
        2 => bytes_text(),
    ]
}

/// Whether no server could have issued `token`: every token a listing issues is printable
/// ASCII, so one with any other character is junk.
pub fn never_issued(token: &str) -> bool {
    token.chars().any(|c| !c.is_ascii() || c.is_ascii_control())
}

/// The unit-level property of a page-token decoder, over [`page_token`]s of `issued`, `cases`
/// times: `round_trip` (decode, then encode what was decoded; `None` for a refused token)
/// never panics, gives back exactly the token it was given when it accepts one — so it accepts
/// nothing its encoder does not write, junk or a second spelling of a real token — and accepts
/// every token of `issued`. The empty token (the first page) is the caller's to test.
pub fn check_decoder(
    issued: Vec<String>,
    cases: u32,
    round_trip: impl Fn(&str) -> Option<String>,
) -> Result<(), String> {
    for token in &issued {
        if round_trip(token).as_ref() != Some(token) {
            return Err(format!("the issued token {token:?} does not round-trip"));
        }
    }
    runner(cases)
        .run(&page_token(issued), |token| {
            if token.is_empty() {
                return Ok(());
            }
            match round_trip(&token) {
                Some(again) if again != token => Err(TestCaseError::fail(format!(
                    "{token:?} was accepted but is not how the encoder writes its cursor ({again:?})"
                ))),
                _ => Ok(()),
            }
        })
        .map_err(|e| e.to_string())
}

/// For a token that carries a check of what it holds (every listing's but ListProducts', whose
/// token is a sku any prefix of which is another sku): `accepts` refuses every near miss of
/// `token` that only cut it short or extended it, `cases` of them.
pub fn check_cut_or_extended_refused(
    token: &str,
    cases: u32,
    accepts: impl Fn(&str) -> bool,
) -> Result<(), String> {
    let edits = edit().prop_filter("cut or extended", Edit::cuts_or_extends);
    runner(cases)
        .run(&edits, |edit| {
            let near = edit.apply(token);
            if near != token && accepts(&near) {
                return Err(TestCaseError::fail(format!(
                    "{near:?}, {token:?} after {edit:?}, was accepted"
                )));
            }
            Ok(())
        })
        .map_err(|e| e.to_string())
}

/// Whether `answer` to a listing sent `token` is what the contract allows, when the server
/// issued `issued` for the same request: OK for "" (the first page) and for an issued token;
/// INVALID_ARGUMENT naming only `page_token` for a token no server could have issued; one or
/// the other for the rest; never another code.
pub fn judge(token: &str, issued: &[String], answer: &Result<(), Status>) -> Result<(), String> {
    let good = token.is_empty() || issued.iter().any(|t| t == token);
    match answer {
        Ok(()) if never_issued(token) => Err(format!(
            "{token:?} was accepted, but no server issues such a token"
        )),
        Ok(()) => Ok(()),
        Err(status) if status.code() != Code::InvalidArgument => Err(format!(
            "{token:?} was answered {:?}, not OK or INVALID_ARGUMENT: {status:?}",
            status.code()
        )),
        Err(status) if good => Err(format!(
            "{token:?}, a token the server issued, was refused: {status:?}"
        )),
        Err(status) if violated_fields(status) != ["page_token"] => Err(format!(
            "{token:?} was refused without a field violation naming only page_token: {status:?}"
        )),
        Err(_) => Ok(()),
    }
}

/// The gRPC-level property of one listing: `send` sends each token of `issued` (tokens the
/// server issued for the request `send` makes; not empty), the empty one, then `cases`
/// [`page_token`]s of `issued`, and each answer is as [`judge`] wants; and `snapshot` (of the
/// service's tables, say) reads the same after each answer as before the first.
pub fn check_page_tokens<S, SF, P, PF, T>(
    rt: &tokio::runtime::Runtime,
    issued: Vec<String>,
    cases: u32,
    send: S,
    snapshot: P,
) -> Result<(), String>
where
    S: Fn(String) -> SF,
    SF: Future<Output = Result<(), Status>>,
    P: Fn() -> PF,
    PF: Future<Output = anyhow::Result<T>>,
    T: PartialEq + Debug,
{
    if issued.is_empty() {
        return Err("no issued token to start from".into());
    }
    let read = || async { snapshot().await.map_err(|e| format!("{e:#}")) };
    let before = rt.block_on(settled(read))?;
    // Every issued token, and the first page, works.
    for token in issued.iter().chain([&String::new()]) {
        let answer = rt.block_on(send(token.clone()));
        judge(token, &issued, &answer)?;
    }
    runner(cases)
        .run(&page_token(issued.clone()), |token| {
            rt.block_on(async {
                let answer = send(token.clone()).await;
                judge(&token, &issued, &answer).map_err(TestCaseError::fail)?;
                let after = read().await.map_err(TestCaseError::fail)?;
                if after != before {
                    return Err(TestCaseError::fail(format!(
                        "{token:?} changed {before:?} into {after:?}"
                    )));
                }
                Ok(())
            })
        })
        .map_err(|e| e.to_string())
}

/// [`check_page_tokens`] for the `ListDeadLetters` of the service on `port` whose database is
/// `db`, filtered to `queue` (where at least two messages must be parked), as an admin; nothing
/// of `tables` (see [`table_digest`]) may change.
pub fn check_dead_letter_page_tokens(
    rt: &tokio::runtime::Runtime,
    port: u16,
    db: &DatabaseConnection,
    tables: &[&str],
    queue: &str,
    cases: u32,
) -> Result<(), String> {
    let list = |page_token: String| async move {
        let ch = channel(port)
            .await
            .map_err(|e| Status::unavailable(format!("{e:#}")))?;
        let req = ListDeadLettersRequest {
            queue: queue.to_owned(),
            page_size: 1,
            page_token,
        };
        DeadLetterServiceClient::new(ch)
            .list_dead_letters(with_token(req, &token("root", Role::Admin)))
            .await
            .map(tonic::Response::into_inner)
    };
    let issued = rt.block_on(async {
        let mut issued = Vec::new();
        let mut next = list(String::new()).await.map_err(|s| format!("{s:?}"))?;
        while !next.next_page_token.is_empty() {
            issued.push(next.next_page_token.clone());
            next = list(next.next_page_token)
                .await
                .map_err(|s| format!("{s:?}"))?;
        }
        Ok::<_, String>(issued)
    })?;
    check_page_tokens(
        rt,
        issued,
        cases,
        |t| async { list(t).await.map(drop) },
        || table_digest(db, tables),
    )
}

fn runner(cases: u32) -> TestRunner {
    TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn near_misses_edit_by_character_and_never_cut_to_nothing() {
        assert_eq!(Edit::Replace(3, '😀').apply("aé"), "a😀");
        assert_eq!(Edit::Insert(0, 'é').apply("ab"), "éab");
        assert_eq!(Edit::Truncate(0).apply("abc"), "a");
        assert_eq!(Edit::Truncate(2).apply("abc"), "ab");
        assert_eq!(Edit::Extend("é".into()).apply("ab"), "abé");
        assert!(never_issued("p1.é") && never_issued("p1.\n") && !never_issued("p1.+1"));
    }

    #[test]
    fn judge_wants_ok_for_issued_tokens_and_page_token_violations_for_junk() {
        let issued = ["p1.41".to_owned()];
        assert!(judge("p1.41", &issued, &Ok(())).is_ok());
        assert!(judge("", &issued, &Ok(())).is_ok());
        assert!(judge("p1.é", &issued, &Ok(())).is_err());
        assert!(judge("p1.41", &issued, &Err(Status::invalid_argument("x"))).is_err());
        assert!(judge("p1.é", &issued, &Err(Status::cancelled("panicked"))).is_err());
        assert!(
            judge(
                "p1.é",
                &issued,
                &Err(Status::invalid_argument("no details"))
            )
            .is_err()
        );
    }
}
