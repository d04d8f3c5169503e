//! Checked requests: the proto messages turned into what the admin acts on, or the
//! `INVALID_ARGUMENT` field violations / `NOT_FOUND` the contract names.

use flashsale_contract::{PAGE_TOKEN_MAX_LEN, check_optional_text, check_text};
use flashsale_proto::admin::v1::{
    DiscardDeadLettersRequest, ListDeadLettersRequest, ReplayDeadLettersRequest,
};
use uuid::Uuid;

use super::{
    DeadLetterError,
    token::{self, Cursor},
};

/// `page_size` 0 means this many.
pub const DEFAULT_PAGE_SIZE: usize = 50;
/// Larger page sizes are lowered to this.
pub const MAX_PAGE_SIZE: usize = 500;
/// Most `message_ids` one call may name.
pub const MAX_IDS: usize = 1000;
/// Longest discard reason, in characters.
pub const MAX_REASON_CHARS: usize = 500;
/// Longest queue name (AMQP's own limit, in bytes, is 255).
pub const MAX_QUEUE_CHARS: usize = 255;

/// A checked `ListDeadLetters`.
#[derive(Debug, PartialEq)]
pub(crate) struct ListQuery {
    /// The queue filter as sent ("" = all), which page tokens are bound to.
    pub(crate) filter: String,
    /// The queues to list.
    pub(crate) queues: Vec<String>,
    pub(crate) page_size: usize,
    pub(crate) after: Option<Cursor>,
}

/// Which parked messages of one queue a replay or discard acts on.
#[derive(Debug, PartialEq)]
pub(crate) struct Target {
    pub(crate) queue: String,
    /// `None` = every parked message of the queue.
    pub(crate) ids: Option<Vec<Uuid>>,
}

impl Target {
    /// For logs: `all` or the number of ids asked for.
    pub(crate) fn selection(&self) -> String {
        match &self.ids {
            None => "all".to_owned(),
            Some(ids) => format!("{} ids", ids.len()),
        }
    }
}

/// A checked `DiscardDeadLetters`.
#[derive(Debug, PartialEq)]
pub(crate) struct Discard {
    pub(crate) target: Target,
    pub(crate) reason: String,
}

type Violations = Vec<(String, String)>;

pub(crate) fn list(
    r: &ListDeadLettersRequest,
    known: &[String],
) -> Result<ListQuery, DeadLetterError> {
    let mut bad = Violations::new();
    bad.extend(check_optional_text("queue", &r.queue, MAX_QUEUE_CHARS).err());
    bad.extend(check_optional_text("page_token", &r.page_token, PAGE_TOKEN_MAX_LEN).err());
    let page_size = match usize::try_from(r.page_size) {
        Err(_) => {
            bad.push(("page_size".into(), "must not be negative".into()));
            0
        }
        Ok(0) => DEFAULT_PAGE_SIZE,
        Ok(n) => n.min(MAX_PAGE_SIZE),
    };
    let after = if r.page_token.is_empty() || !bad.is_empty() {
        None
    } else {
        let c = token::decode(&r.queue, &r.page_token);
        if c.is_none() {
            bad.push((
                "page_token".into(),
                "not a page token this server issued for this queue".into(),
            ));
        }
        c
    };
    if !bad.is_empty() {
        return Err(DeadLetterError::Invalid(bad));
    }
    let queues = if r.queue.is_empty() {
        known.to_vec()
    } else {
        vec![known_queue(&r.queue, known)?]
    };
    Ok(ListQuery {
        filter: r.queue.clone(),
        queues,
        page_size,
        after,
    })
}

pub(crate) fn replay(
    r: &ReplayDeadLettersRequest,
    known: &[String],
) -> Result<Target, DeadLetterError> {
    let mut bad = Violations::new();
    let target = target(&r.queue, &r.message_ids, r.all, &mut bad);
    if !bad.is_empty() {
        return Err(DeadLetterError::Invalid(bad));
    }
    known_queue(&r.queue, known)?;
    Ok(target)
}

pub(crate) fn discard(
    r: &DiscardDeadLettersRequest,
    known: &[String],
) -> Result<Discard, DeadLetterError> {
    let mut bad = Violations::new();
    let target = target(&r.queue, &r.message_ids, r.all, &mut bad);
    // No control character anywhere in it as sent; 1..=MAX_REASON_CHARS once trimmed.
    bad.extend(
        check_text("reason", &r.reason, usize::MAX)
            .and_then(|()| check_text("reason", r.reason.trim(), MAX_REASON_CHARS))
            .err(),
    );
    let reason = r.reason.trim();
    if !bad.is_empty() {
        return Err(DeadLetterError::Invalid(bad));
    }
    known_queue(&r.queue, known)?;
    Ok(Discard {
        target,
        reason: reason.to_owned(),
    })
}

/// Checks queue and selection, pushing violations; the target is only meaningful without any.
fn target(queue: &str, message_ids: &[String], all: bool, bad: &mut Violations) -> Target {
    bad.extend(check_text("queue", queue, MAX_QUEUE_CHARS).err());
    let ids = match (message_ids.is_empty(), all) {
        (false, true) => {
            bad.push((
                "all".into(),
                "must be false when message_ids are given".into(),
            ));
            None
        }
        (true, false) => {
            bad.push(("message_ids".into(), "give message ids, or set all".into()));
            None
        }
        (true, true) => None,
        (false, false) if message_ids.len() > MAX_IDS => {
            bad.push(("message_ids".into(), format!("at most {MAX_IDS} per call")));
            None
        }
        (false, false) => {
            let mut ids = Vec::with_capacity(message_ids.len());
            for (i, raw) in message_ids.iter().enumerate() {
                match Uuid::parse_str(raw) {
                    Ok(id) => ids.push(id),
                    Err(_) => bad.push((format!("message_ids[{i}]"), "must be a UUID".into())),
                }
            }
            ids.sort_unstable();
            ids.dedup();
            Some(ids)
        }
    };
    Target {
        queue: queue.to_owned(),
        ids,
    }
}

fn known_queue(queue: &str, known: &[String]) -> Result<String, DeadLetterError> {
    if known.iter().any(|k| k == queue) {
        Ok(queue.to_owned())
    } else {
        Err(DeadLetterError::UnknownQueue(queue.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known() -> Vec<String> {
        vec!["a".to_owned(), "b".to_owned()]
    }

    fn fields(e: DeadLetterError) -> Vec<String> {
        match e {
            DeadLetterError::Invalid(v) => v.into_iter().map(|(f, _)| f).collect(),
            other => panic!("not invalid: {other:?}"),
        }
    }

    #[test]
    fn page_size_defaults_caps_and_refuses_negatives() {
        let q = |n| {
            list(
                &ListDeadLettersRequest {
                    page_size: n,
                    ..Default::default()
                },
                &known(),
            )
        };
        assert_eq!(q(0).unwrap().page_size, DEFAULT_PAGE_SIZE);
        assert_eq!(q(7).unwrap().page_size, 7);
        assert_eq!(q(100_000).unwrap().page_size, MAX_PAGE_SIZE);
        assert_eq!(fields(q(-1).unwrap_err()), vec!["page_size"]);
        assert_eq!(q(0).unwrap().queues, known());
    }

    #[test]
    fn invalid_input_wins_over_an_unknown_queue() {
        let r = ReplayDeadLettersRequest {
            queue: "nope".into(),
            message_ids: vec!["x".into()],
            all: true,
        };
        assert_eq!(fields(replay(&r, &known()).unwrap_err()), vec!["all"]);
        let r = ReplayDeadLettersRequest {
            queue: "nope".into(),
            all: true,
            ..Default::default()
        };
        assert!(matches!(
            replay(&r, &known()),
            Err(DeadLetterError::UnknownQueue(_))
        ));
    }

    #[test]
    fn each_bad_id_and_a_missing_reason_are_named() {
        let ok = Uuid::new_v4().to_string();
        let r = DiscardDeadLettersRequest {
            queue: "a".into(),
            message_ids: vec![ok.clone(), "nope".into(), ok],
            all: false,
            reason: "  ".into(),
        };
        assert_eq!(
            fields(discard(&r, &known()).unwrap_err()),
            vec!["message_ids[1]", "reason"]
        );
        let r = DiscardDeadLettersRequest {
            reason: "é".repeat(MAX_REASON_CHARS),
            message_ids: vec![Uuid::nil().to_string(), Uuid::nil().to_string()],
            ..r
        };
        let d = discard(&r, &known()).unwrap();
        assert_eq!(d.target.ids, Some(vec![Uuid::nil()]));
        let r = DiscardDeadLettersRequest {
            reason: "x".repeat(MAX_REASON_CHARS + 1),
            ..r
        };
        assert_eq!(fields(discard(&r, &known()).unwrap_err()), vec!["reason"]);
    }

    #[test]
    fn control_characters_are_refused_in_every_string_field() {
        let r = DiscardDeadLettersRequest {
            queue: "a\0".into(),
            all: true,
            reason: "gone\n".into(),
            ..Default::default()
        };
        assert_eq!(
            fields(discard(&r, &known()).unwrap_err()),
            vec!["queue", "reason"]
        );
        let r = ListDeadLettersRequest {
            queue: "a\u{1}".into(),
            page_token: "t\0".into(),
            ..Default::default()
        };
        assert_eq!(
            fields(list(&r, &known()).unwrap_err()),
            vec!["queue", "page_token"]
        );
        let r = ReplayDeadLettersRequest {
            queue: "b\u{7f}".into(),
            all: true,
            ..Default::default()
        };
        assert_eq!(fields(replay(&r, &known()).unwrap_err()), vec!["queue"]);
    }

    #[test]
    fn neither_ids_nor_all_and_an_empty_queue_are_invalid() {
        let r = ReplayDeadLettersRequest::default();
        assert_eq!(
            fields(replay(&r, &known()).unwrap_err()),
            vec!["queue", "message_ids"]
        );
    }
}
