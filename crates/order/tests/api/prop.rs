//! Generated requests against every RPC of a running order service (with product-stock beside
//! it, real PostgreSQL, Redis and RabbitMQ): each answer is OK or a code the contract documents
//! for that RPC, and a request refused at the edge changes nothing — no order, history, outbox
//! or refund row, no unit at the gate, no Redis key.

use std::time::Duration;

use deadpool_redis::redis;
use flashsale_platform::auth::Role;
use flashsale_proto::order::v1::{
    CancelOrderRequest, CreateOrderRequest, GetOrderRequest, GetSaleReportRequest,
    ListOrdersRequest, ListPendingOrdersRequest, ListStuckOrdersRequest, LookupOrdersRequest,
    PayOrderRequest, WatchOrderRequest,
};
use flashsale_test_support::grpc::{token, with_token};
use proptest::{
    prelude::*,
    test_runner::{Config, TestCaseError, TestRunner},
};
use tonic::Code;

use crate::helpers::{TestApp, spawn_stack_with};

/// Who calls: no token, or a token of a role for a subject (possibly a bad one).
#[derive(Clone, Debug)]
enum Caller {
    Anonymous,
    As(Role, String),
}

#[derive(Clone, Debug)]
enum Call {
    Create(CreateOrderRequest),
    Get(GetOrderRequest),
    List(ListOrdersRequest),
    Watch(WatchOrderRequest),
    Pay(PayOrderRequest),
    Cancel(CancelOrderRequest),
    Stuck(ListStuckOrdersRequest),
    Lookup(LookupOrdersRequest),
    Pending(ListPendingOrdersRequest),
    Report(GetSaleReportRequest),
}

impl Call {
    /// Whether a string field of the request holds a control character.
    fn has_control_character(&self) -> bool {
        let fields: Vec<&str> = match self {
            Self::Create(m) => vec![&m.request_id, &m.sku],
            Self::Get(m) => vec![&m.order_id],
            Self::List(m) => vec![&m.user_id, &m.page_token],
            Self::Watch(m) => vec![&m.order_id],
            Self::Pay(m) => vec![&m.order_id, &m.payment_id],
            Self::Cancel(m) => vec![&m.order_id],
            Self::Stuck(m) => vec![&m.page_token],
            Self::Lookup(m) => m.order_ids.iter().map(String::as_str).collect(),
            Self::Pending(m) => vec![&m.sku, &m.page_token],
            Self::Report(m) => vec![&m.sku],
        };
        fields.iter().any(|f| f.chars().any(char::is_control))
    }

    /// The codes the contract documents for this RPC, besides UNAUTHENTICATED,
    /// PERMISSION_DENIED and RESOURCE_EXHAUSTED, which any RPC may answer.
    fn documented(&self) -> &'static [Code] {
        use Code::*;
        match self {
            Self::Create(_) => &[InvalidArgument, NotFound, FailedPrecondition],
            Self::Get(_) | Self::Watch(_) => &[InvalidArgument, NotFound],
            Self::List(_) => &[InvalidArgument],
            Self::Pay(_) | Self::Cancel(_) => &[InvalidArgument, NotFound, FailedPrecondition],
            Self::Stuck(_) | Self::Lookup(_) | Self::Pending(_) => &[InvalidArgument],
            Self::Report(_) => &[InvalidArgument, NotFound],
        }
    }
}

/// Strings a client might send: plain ids, empty, arbitrary Unicode, a NUL or another control
/// character, long.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-zA-Z0-9._-]{1,12}",
        1 => Just(String::new()),
        1 => any::<String>(),
        1 => "[a-z]{0,4}\\x00[a-z]{0,4}",
        1 => "[a-z]{0,4}[\\x01-\\x1f\\x7f\\u{80}-\\u{9f}][a-z]{0,4}",
        1 => "[a-zA-Z0-9]{60,140}",
    ]
}

fn int64() -> impl Strategy<Value = i64> {
    prop_oneof![
        Just(i64::MIN),
        Just(i64::MAX),
        -3i64..=5,
        2_000i64..3_000,
        any::<i64>(),
    ]
}

fn int32() -> impl Strategy<Value = i32> {
    prop_oneof![Just(i32::MIN), Just(i32::MAX), -2i32..=600, any::<i32>()]
}

/// Mostly buyers among a few dozen (so the per-user limit is reached now and then but rarely
/// stops every CreateOrder), sometimes an operator or a service, sometimes any role with any
/// subject, or no token.
fn caller() -> impl Strategy<Value = Caller> {
    let role = prop_oneof![Just(Role::User), Just(Role::Admin), Just(Role::Service)];
    let buyer = (0..24u32).prop_map(|n| Caller::As(Role::User, format!("u{n}")));
    prop_oneof![
        1 => Just(Caller::Anonymous),
        6 => buyer,
        1 => Just(Caller::As(Role::Admin, "root".to_owned())),
        1 => Just(Caller::As(Role::Service, "product-stock".to_owned())),
        2 => (role, text()).prop_map(|(r, s)| Caller::As(r, s)),
    ]
}

/// Mostly quantities a gate judges, sometimes anything.
fn quantity() -> impl Strategy<Value = i64> {
    prop_oneof![6 => 1i64..=3, 1 => int64()]
}

/// Requests of every RPC; `orders` are ids of real orders, so some requests reach them.
fn call(orders: Vec<String>) -> impl Strategy<Value = Call> {
    let order_id = prop_oneof![
        2 => proptest::sample::select(orders),
        1 => Just(uuid::Uuid::nil().to_string()),
        1 => text(),
    ];
    let sku = prop_oneof![3 => Just("PROP".to_owned()), 1 => Just("NOPE".to_owned()), 1 => text()];
    prop_oneof![
        4 => (text(), sku.clone(), quantity()).prop_map(|(request_id, sku, quantity)| {
            Call::Create(CreateOrderRequest {
                request_id,
                sku,
                quantity,
            })
        }),
        1 => order_id
            .clone()
            .prop_map(|order_id| Call::Get(GetOrderRequest { order_id })),
        1 => (text(), -1i32..8, int32(), text()).prop_map(|(user_id, status, page_size, page_token)| {
            Call::List(ListOrdersRequest {
                user_id,
                status,
                page_size,
                page_token,
            })
        }),
        1 => order_id
            .clone()
            .prop_map(|order_id| Call::Watch(WatchOrderRequest { order_id })),
        2 => (order_id.clone(), text(), int64()).prop_map(|(order_id, payment_id, amount_cents)| {
            Call::Pay(PayOrderRequest {
                order_id,
                payment_id,
                amount_cents,
            })
        }),
        1 => order_id
            .clone()
            .prop_map(|order_id| Call::Cancel(CancelOrderRequest { order_id })),
        1 => (int64(), int32(), text()).prop_map(|(older_than_ms, page_size, page_token)| {
            Call::Stuck(ListStuckOrdersRequest {
                older_than_ms,
                page_size,
                page_token,
            })
        }),
        1 => proptest::collection::vec(order_id, 0..4)
            .prop_map(|order_ids| Call::Lookup(LookupOrdersRequest { order_ids })),
        1 => (sku.clone(), int32(), text()).prop_map(|(sku, page_size, page_token)| {
            Call::Pending(ListPendingOrdersRequest {
                sku,
                page_size,
                page_token,
            })
        }),
        1 => sku.prop_map(|sku| Call::Report(GetSaleReportRequest { sku })),
    ]
}

fn request<T>(caller: &Caller, msg: T) -> tonic::Request<T> {
    match caller {
        Caller::Anonymous => tonic::Request::new(msg),
        Caller::As(role, subject) => with_token(msg, &token(subject, *role)),
    }
}

/// What a refusal must leave as it was.
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    orders: i64,
    history: i64,
    outbox: i64,
    payments: i64,
    refunds: i64,
    gate: (i64, i64, i64),
    redis_keys: usize,
}

async fn snapshot(app: &TestApp, redis: &flashsale_platform::redis::Pool) -> Snapshot {
    let p = app.get_product("PROP").await;
    let s = app.stock_settings.as_ref().expect("spawn_stack");
    let mut conn = redis.get().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}*", s.redis.key_prefix))
        .query_async(&mut *conn)
        .await
        .unwrap();
    Snapshot {
        orders: app.count("SELECT COUNT(*) AS n FROM orders").await,
        history: app
            .count("SELECT COUNT(*) AS n FROM order_status_history")
            .await,
        outbox: app.count("SELECT COUNT(*) AS n FROM outbox").await,
        payments: app.count("SELECT COUNT(*) AS n FROM payments").await,
        refunds: app.count("SELECT COUNT(*) AS n FROM refunds").await,
        gate: (p.on_hand, p.reserved, p.gate_available),
        redis_keys: keys.len(),
    }
}

/// Runs `call` as `caller`: `Ok(())` or the refusal.
async fn run(app: &TestApp, caller: &Caller, call: Call) -> Result<(), tonic::Status> {
    let mut c = app.client().await;
    match call {
        Call::Create(m) => c.create_order(request(caller, m)).await.map(drop),
        Call::Get(m) => c.get_order(request(caller, m)).await.map(drop),
        Call::List(m) => c.list_orders(request(caller, m)).await.map(drop),
        Call::Watch(m) => {
            let mut stream = c.watch_order(request(caller, m)).await?.into_inner();
            // The first message is the order as it is; the stream is dropped after it.
            tokio::time::timeout(Duration::from_secs(5), stream.message())
                .await
                .map_err(|_| tonic::Status::deadline_exceeded("no first message"))?
                .map(drop)
        }
        Call::Pay(m) => c.pay_order(request(caller, m)).await.map(drop),
        Call::Cancel(m) => c.cancel_order(request(caller, m)).await.map(drop),
        Call::Stuck(m) => c.list_stuck_orders(request(caller, m)).await.map(drop),
        Call::Lookup(m) => c.lookup_orders(request(caller, m)).await.map(drop),
        Call::Pending(m) => c.list_pending_orders(request(caller, m)).await.map(drop),
        Call::Report(m) => c.get_sale_report(request(caller, m)).await.map(drop),
    }
}

/// Refusals that happen before any use case acts: they must change nothing at all.
const EDGE_REFUSALS: [Code; 5] = [
    Code::InvalidArgument,
    Code::Unauthenticated,
    Code::PermissionDenied,
    Code::NotFound,
    Code::ResourceExhausted,
];

#[test]
fn generated_requests_get_documented_answers_and_refusals_change_nothing() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // product-stock on an exchange of its own: the saga does not move orders in the
    // background, so any change between two snapshots is the request's.
    let (app, redis, orders) = rt.block_on(async {
        let app = spawn_stack_with(
            |s| {
                s.limits.create_order_per_sec = 0;
                s.limits.pay_order_per_sec = 0;
            },
            |s| s.amqp.exchange = flashsale_test_support::unique_name("fs_test_ex"),
        )
        .await;
        app.product("PROP", 500, 5).await;
        let mut orders = Vec::new();
        for (user, key) in [("u1", "a"), ("u1", "b"), ("u2", "a")] {
            orders.push(app.order(user, key, "PROP", 1).await.unwrap().order_id);
        }
        let s = app.stock_settings.as_ref().expect("spawn_stack");
        let redis = flashsale_platform::redis::pool(&s.redis).unwrap();
        (app, redis, orders)
    });
    let mut runner = TestRunner::new(Config {
        cases: 128,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&(caller(), call(orders)), |(caller, call)| {
        rt.block_on(async {
            let before = snapshot(&app, &redis).await;
            let documented = call.documented();
            let answer = run(&app, &caller, call.clone()).await;
            let Err(status) = answer else {
                if call.has_control_character() {
                    return Err(TestCaseError::fail(format!(
                        "{call:?} as {caller:?} holds a control character but was accepted"
                    )));
                }
                return Ok(());
            };
            let code = status.code();
            let generic = [
                Code::Unauthenticated,
                Code::PermissionDenied,
                Code::ResourceExhausted,
            ];
            // A control character anywhere is refused at the edge (or the call never got that
            // far: no valid token, a role that may not call it, a user over their rate).
            if call.has_control_character() && !generic.contains(&code) && code != Code::InvalidArgument {
                return Err(TestCaseError::fail(format!(
                    "{call:?} as {caller:?} holds a control character but was answered {code:?}: {status:?}"
                )));
            }
            if !documented.contains(&code) && !generic.contains(&code) {
                return Err(TestCaseError::fail(format!(
                    "{call:?} as {caller:?} answered an undocumented {code:?}: {status:?}"
                )));
            }
            let after = snapshot(&app, &redis).await;
            if EDGE_REFUSALS.contains(&code) && after != before {
                return Err(TestCaseError::fail(format!(
                    "{call:?} as {caller:?} was refused {code:?} but changed {before:?} into {after:?}"
                )));
            }
            // Whatever else was refused, no order was written.
            if after.orders != before.orders {
                return Err(TestCaseError::fail(format!(
                    "{call:?} as {caller:?} was refused {code:?} but wrote an order"
                )));
            }
            Ok(())
        })
    });
    drop(app);
    if let Err(e) = result {
        panic!("{e}");
    }
}
