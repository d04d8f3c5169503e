//! Generated requests for property tests against a running service: the callers and strings a
//! client might send, a digest of database tables to tell that a refused request changed
//! nothing, and the dead-letter admin API every service serves (its requests, the codes its
//! contract documents, and the property itself, [`check_dead_letter_service`]).

use std::time::Duration;

use anyhow::Context as _;
use flashsale_platform::auth::Role;
use flashsale_proto::{
    admin::v1::{
        DiscardDeadLettersRequest, ListDeadLettersRequest, ReplayDeadLettersRequest,
        dead_letter_service_client::DeadLetterServiceClient,
    },
    events::v1::Envelope,
};
use proptest::{
    prelude::*,
    test_runner::{Config, TestCaseError, TestRunner},
};
use prost::Message as _;
use sea_orm::{ConnectionTrait as _, DatabaseConnection, Statement};
use tonic::Code;

use crate::grpc::{channel, token, with_token};

/// Who calls: no token, or a token of a role for a subject (possibly a bad one).
#[derive(Clone, Debug)]
pub enum Caller {
    Anonymous,
    As(Role, String),
}

impl Caller {
    /// `msg` as this caller sends it.
    pub fn request<T>(&self, msg: T) -> tonic::Request<T> {
        match self {
            Self::Anonymous => tonic::Request::new(msg),
            Self::As(role, subject) => with_token(msg, &token(subject, *role)),
        }
    }

    /// Whether this caller holds a valid admin token (a subject of 1..=128 bytes without a
    /// control character).
    pub fn is_admin(&self) -> bool {
        match self {
            Self::Anonymous => false,
            Self::As(role, subject) => {
                *role == Role::Admin
                    && (1..=flashsale_platform::auth::MAX_SUBJECT_LEN).contains(&subject.len())
                    && !subject.chars().any(char::is_control)
            }
        }
    }
}

/// Strings a client might send: plain ids, empty, arbitrary Unicode, a NUL or another control
/// character, long.
pub fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-zA-Z0-9._-]{1,12}",
        1 => Just(String::new()),
        1 => any::<String>(),
        1 => "[a-z]{0,4}\\x00[a-z]{0,4}",
        1 => "[a-z]{0,4}[\\x01-\\x1f\\x7f\\u{80}-\\u{9f}][a-z]{0,4}",
        1 => "[a-zA-Z0-9]{60,140}",
    ]
}

/// Numbers a client might send in an int32: the ends of the range, small ones, any.
pub fn int32() -> impl Strategy<Value = i32> {
    prop_oneof![Just(i32::MIN), Just(i32::MAX), -2i32..=600, any::<i32>()]
}

/// Mostly an admin (the role every admin RPC wants), sometimes a buyer or a service, sometimes
/// any role with any subject, or no token.
pub fn caller() -> impl Strategy<Value = Caller> {
    let role = prop_oneof![Just(Role::User), Just(Role::Admin), Just(Role::Service)];
    prop_oneof![
        1 => Just(Caller::Anonymous),
        5 => Just(Caller::As(Role::Admin, "root".to_owned())),
        1 => Just(Caller::As(Role::User, "alice".to_owned())),
        1 => Just(Caller::As(Role::Service, "order".to_owned())),
        2 => (role, text()).prop_map(|(r, s)| Caller::As(r, s)),
    ]
}

/// Whether any of `fields` holds a control character.
pub fn has_control(fields: &[&str]) -> bool {
    fields.iter().any(|f| f.chars().any(char::is_control))
}

/// One digest per table of `tables`: its row count and an md5 of every row as text, so any
/// inserted, deleted or changed row shows. `table:col1,col2` digests only those columns — for
/// `outbox`, give `outbox:message_id,routing_key,payload`: the relay updates its bookkeeping
/// columns (published, attempts, next attempt) whenever it gets to a row, on its own schedule.
pub async fn table_digest(
    conn: &DatabaseConnection,
    tables: &[&str],
) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::with_capacity(tables.len());
    for entry in tables {
        let (table, row) = match entry.split_once(':') {
            Some((table, columns)) => (table, format!("ROW({columns})::text")),
            None => (*entry, "t::text".to_owned()),
        };
        let sql = format!(
            "SELECT (COUNT(*)::text || ':' || md5(COALESCE(string_agg({row}, '|' ORDER BY {row}), ''))) AS d \
             FROM {table} t"
        );
        let row = conn
            .query_one_raw(Statement::from_string(conn.get_database_backend(), sql))
            .await?
            .with_context(|| format!("no digest row for {table}"))?;
        let d: String = row.try_get("", "d")?;
        out.push(format!("{entry}={d}"));
    }
    Ok(out)
}

/// `snapshot` once the service stopped moving on its own: the same value six times in a row,
/// 50 ms apart (an accepted request's background work — a relay, a worker, a consumer — comes
/// to rest), or the last value after 15 s.
pub async fn settled<T, F, Fut>(mut snapshot: F) -> T
where
    T: PartialEq,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let mut last = snapshot().await;
    let mut same = 0;
    while same < 5 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = snapshot().await;
        if now == last {
            same += 1;
        } else {
            same = 0;
            last = now;
        }
    }
    last
}

/// A request of the dead-letter admin API.
#[derive(Clone, Debug)]
pub enum DeadLetterCall {
    List(ListDeadLettersRequest),
    Replay(ReplayDeadLettersRequest),
    Discard(DiscardDeadLettersRequest),
}

impl DeadLetterCall {
    /// Whether a string field of the request holds a control character.
    pub fn has_control_character(&self) -> bool {
        match self {
            Self::List(m) => has_control(&[&m.queue, &m.page_token]),
            Self::Replay(m) => {
                has_control(&[&m.queue]) || m.message_ids.iter().any(|i| has_control(&[i]))
            }
            Self::Discard(m) => {
                has_control(&[&m.queue, &m.reason])
                    || m.message_ids.iter().any(|i| has_control(&[i]))
            }
        }
    }

    /// The codes the contract documents for every RPC of the API (INVALID_ARGUMENT, NOT_FOUND),
    /// besides UNAUTHENTICATED, PERMISSION_DENIED and RESOURCE_EXHAUSTED, which any RPC may
    /// answer.
    pub fn documented() -> &'static [Code] {
        &[
            Code::InvalidArgument,
            Code::NotFound,
            Code::Unauthenticated,
            Code::PermissionDenied,
            Code::ResourceExhausted,
        ]
    }

    /// Sends the request to the service on `port` as `caller`: `Ok(())` or the refusal.
    pub async fn run(self, port: u16, caller: &Caller) -> Result<(), tonic::Status> {
        let ch = channel(port)
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let mut c = DeadLetterServiceClient::new(ch);
        match self {
            Self::List(m) => c.list_dead_letters(caller.request(m)).await.map(drop),
            Self::Replay(m) => c.replay_dead_letters(caller.request(m)).await.map(drop),
            Self::Discard(m) => c.discard_dead_letters(caller.request(m)).await.map(drop),
        }
    }
}

/// Requests of every dead-letter RPC; `queues` are the service's consumer queues and `ids` the
/// message ids parked there, so some requests reach them.
pub fn dead_letter_call(
    queues: Vec<String>,
    ids: Vec<String>,
) -> impl Strategy<Value = DeadLetterCall> {
    let queue = prop_oneof![
        3 => proptest::sample::select(queues),
        1 => Just(String::new()),
        1 => text(),
    ];
    let id = prop_oneof![
        3 => proptest::sample::select(ids),
        1 => Just(uuid::Uuid::new_v4().to_string()),
        1 => text(),
    ];
    let message_ids = proptest::collection::vec(id, 0..4);
    let reason = prop_oneof![3 => Just("checked by hand".to_owned()), 1 => text()];
    prop_oneof![
        2 => (queue.clone(), int32(), text()).prop_map(|(queue, page_size, page_token)| {
            DeadLetterCall::List(ListDeadLettersRequest {
                queue,
                page_size,
                page_token,
            })
        }),
        2 => (queue.clone(), message_ids.clone(), proptest::bool::weighted(0.2)).prop_map(
            |(queue, message_ids, all)| {
                DeadLetterCall::Replay(ReplayDeadLettersRequest {
                    queue,
                    message_ids,
                    all,
                })
            }
        ),
        2 => (queue, message_ids, proptest::bool::weighted(0.2), reason).prop_map(
            |(queue, message_ids, all, reason)| {
                DeadLetterCall::Discard(DiscardDeadLettersRequest {
                    queue,
                    message_ids,
                    all,
                    reason,
                })
            }
        ),
    ]
}

/// Parks `env` in the service's dead-letter store for `queue`, as its drainer would, and
/// records it in the consumer's inbox (the consumer is named after its queue) as already
/// processed: a replay puts it back on the queue and the consumer drops it as a duplicate, so a
/// replay changes nothing but the parked row. Its message id.
pub async fn park(db: &DatabaseConnection, queue: &str, env: &Envelope) -> anyhow::Result<String> {
    let id = uuid::Uuid::parse_str(&env.message_id).context("envelope message_id")?;
    db.execute_raw(Statement::from_sql_and_values(
        db.get_database_backend(),
        "INSERT INTO dead_letters (queue, message_id, routing_key, message_type, error, \
         attempts, parked_at, payload) VALUES ($1, $2, $3, $3, 'handler failed', 3, now(), $4)",
        [
            queue.into(),
            id.into(),
            env.r#type.clone().into(),
            env.encode_to_vec().into(),
        ],
    ))
    .await?;
    db.execute_raw(Statement::from_sql_and_values(
        db.get_database_backend(),
        "INSERT INTO inbox (consumer, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        [queue.into(), id.into()],
    ))
    .await?;
    Ok(env.message_id.clone())
}

/// The property for one service's `DeadLetterService`, on the service at `port` whose database
/// is `db`: generated requests of every RPC, as generated callers, get OK or a documented code;
/// only a valid admin token gets OK; a request holding a control character is refused; and a
/// refused request leaves `tables` (give at least `dead_letters`, `inbox` and `outbox`, see
/// [`table_digest`]) as they were. `queues` are the service's consumer queues, `ids` the
/// messages parked there.
pub fn check_dead_letter_service(
    rt: &tokio::runtime::Runtime,
    port: u16,
    db: &DatabaseConnection,
    tables: &[&str],
    queues: Vec<String>,
    ids: Vec<String>,
    cases: u32,
) -> Result<(), String> {
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&(caller(), dead_letter_call(queues, ids)), |(caller, call)| {
        rt.block_on(async {
            let snapshot =
                || async move { table_digest(db, tables).await.map_err(|e| e.to_string()) };
            let before = settled(snapshot).await.map_err(TestCaseError::fail)?;
            let answer = call.clone().run(port, &caller).await;
            let Err(status) = answer else {
                if call.has_control_character() {
                    return Err(TestCaseError::fail(format!(
                        "{call:?} as {caller:?} holds a control character but was accepted"
                    )));
                }
                if !caller.is_admin() {
                    return Err(TestCaseError::fail(format!(
                        "{call:?} as {caller:?} was accepted without an admin token"
                    )));
                }
                return Ok(());
            };
            let code = status.code();
            if !DeadLetterCall::documented().contains(&code) {
                return Err(TestCaseError::fail(format!(
                    "{call:?} as {caller:?} answered an undocumented {code:?}: {status:?}"
                )));
            }
            if call.has_control_character()
                && caller.is_admin()
                && code != Code::InvalidArgument
            {
                return Err(TestCaseError::fail(format!(
                    "{call:?} as {caller:?} holds a control character but was answered {code:?}: {status:?}"
                )));
            }
            let after = snapshot().await.map_err(TestCaseError::fail)?;
            if after != before {
                return Err(TestCaseError::fail(format!(
                    "{call:?} as {caller:?} was refused {code:?} but changed {before:?} into {after:?}"
                )));
            }
            Ok(())
        })
    });
    result.map_err(|e| e.to_string())
}
