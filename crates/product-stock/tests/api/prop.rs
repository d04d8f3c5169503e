//! Generated requests against every RPC of a running product-stock (real PostgreSQL, Redis and
//! RabbitMQ): each answer is OK or a code the contract documents for that RPC, each item of a
//! ReserveStockBatch is answered as ReserveStock would be, and a refused request (UpdateProduct
//! with a stale etag or an open sale's start included) changes nothing —
//! no row, no stock figure, no Redis key, no unit at the gate.

use std::time::Duration;

use deadpool_redis::redis;
use flashsale_platform::auth::Role;
use flashsale_proto::product::v1::{
    AdjustStockRequest, CommitReservationRequest, CreateProductRequest, DeductionPolicy,
    GetGateBuyersRequest, GetProductRequest, ListProductsRequest, Product, ReconcileStockRequest,
    ReserveStockBatchRequest, ReserveStockRequest, UpdateProductRequest,
};
use flashsale_test_support::grpc::{token, with_token};
use proptest::{
    prelude::*,
    test_runner::{Config, TestCaseError, TestRunner},
};
use tonic::Code;

use crate::helpers::{TestApp, spawn_app};

#[derive(Clone, Debug)]
enum Caller {
    Anonymous,
    As(Role, String),
}

#[derive(Clone, Debug)]
enum Call {
    Create(CreateProductRequest),
    Get(GetProductRequest),
    List(ListProductsRequest),
    Adjust(AdjustStockRequest),
    Reserve(ReserveStockRequest),
    Batch(ReserveStockBatchRequest),
    Buyers(GetGateBuyersRequest),
    Commit(CommitReservationRequest),
    Reconcile(ReconcileStockRequest),
    Update(UpdateProductRequest),
}

use Code::{
    Aborted, AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, PermissionDenied,
    ResourceExhausted, Unauthenticated,
};

/// ReserveStock's documented refusals (also each ReserveStockBatch item's).
const RESERVE: &[Code] = &[InvalidArgument, NotFound, FailedPrecondition];

/// Whether any of `fields` holds a control character.
fn has_control(fields: &[&str]) -> bool {
    fields.iter().any(|f| f.chars().any(char::is_control))
}

fn reserve_fields(m: &ReserveStockRequest) -> [&str; 3] {
    [&m.order_id, &m.user_id, &m.sku]
}

impl Call {
    /// Whether a string field of the request (a batch's items aside) holds a control character.
    fn has_control_character(&self) -> bool {
        match self {
            Self::Create(m) => has_control(&[&m.sku, &m.name]),
            Self::Get(m) => has_control(&[&m.sku]),
            Self::List(m) => has_control(&[&m.page_token]),
            Self::Adjust(m) => has_control(&[&m.request_id, &m.sku, &m.reason]),
            Self::Reserve(m) => has_control(&reserve_fields(m)),
            Self::Batch(_) => false,
            Self::Buyers(m) => has_control(&[&m.sku, &m.known_refills]),
            Self::Commit(m) => has_control(&[&m.order_id]),
            Self::Reconcile(m) => {
                has_control(&m.skus.iter().map(String::as_str).collect::<Vec<_>>())
            }
            Self::Update(m) => {
                let p = m.product.clone().unwrap_or_default();
                let paths = m.update_mask.clone().map(|u| u.paths).unwrap_or_default();
                let mut fields = vec![m.request_id.as_str(), &p.sku, &p.name, &p.etag];
                fields.extend(paths.iter().map(String::as_str));
                has_control(&fields)
            }
        }
    }

    /// The codes the contract documents for this RPC, besides UNAUTHENTICATED,
    /// PERMISSION_DENIED and RESOURCE_EXHAUSTED, which any RPC may answer.
    fn documented(&self) -> &'static [Code] {
        match self {
            Self::Create(_) => &[InvalidArgument, AlreadyExists],
            Self::Get(_) => &[InvalidArgument, NotFound],
            Self::List(_) | Self::Batch(_) => &[InvalidArgument],
            Self::Adjust(_) => &[InvalidArgument, NotFound, FailedPrecondition],
            Self::Reserve(_) => RESERVE,
            Self::Buyers(_) | Self::Reconcile(_) => &[InvalidArgument, NotFound],
            Self::Commit(_) => &[InvalidArgument, NotFound, FailedPrecondition],
            Self::Update(_) => &[InvalidArgument, NotFound, FailedPrecondition, Aborted],
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
        Just(flashsale_contract::MAX_UNITS),
        any::<i64>(),
    ]
}

/// Mostly quantities a gate judges (within a limit of 2, over it, over the stock), sometimes
/// anything.
fn quantity() -> impl Strategy<Value = i64> {
    prop_oneof![4 => 1i64..=4, 1 => 40i64..=120, 1 => int64()]
}

fn uint32() -> impl Strategy<Value = u32> {
    prop_oneof![Just(0u32), Just(u32::MAX), 1u32..5, any::<u32>()]
}

fn caller() -> impl Strategy<Value = Caller> {
    let role = prop_oneof![Just(Role::User), Just(Role::Admin), Just(Role::Service)];
    let subject = prop_oneof![3 => Just("order".to_owned()), 1 => text()];
    let trusted = prop_oneof![Just(Role::Service), Just(Role::Admin)];
    prop_oneof![
        1 => Just(Caller::Anonymous),
        4 => (trusted, Just("order".to_owned())).prop_map(|(r, s)| Caller::As(r, s)),
        4 => (role, subject).prop_map(|(r, s)| Caller::As(r, s)),
    ]
}

fn order_id() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => (0u128..8).prop_map(|n| uuid::Uuid::from_u128(n + 1).to_string()),
        1 => text(),
    ]
}

fn sku() -> impl Strategy<Value = String> {
    prop_oneof![2 => Just("PROP".to_owned()), 1 => Just("NOPE".to_owned()), 1 => text()]
}

/// Instants a client might send: none, the past, the near or far future, out of range.
fn instant() -> impl Strategy<Value = Option<flashsale_contract::Timestamp>> {
    let now = chrono::Utc::now().timestamp();
    prop_oneof![
        2 => Just(None),
        2 => (-3_600i64..7_200).prop_map(move |d| Some(flashsale_contract::Timestamp {
            seconds: now + d,
            nanos: 0,
        })),
        1 => (any::<i64>(), any::<i32>()).prop_map(|(seconds, nanos)| Some(
            flashsale_contract::Timestamp { seconds, nanos }
        )),
    ]
}

/// An update mask: mostly fields that may change, sometimes ones that may not or do not exist.
fn mask() -> impl Strategy<Value = Option<flashsale_contract::FieldMask>> {
    let path = prop_oneof![
        6 => prop::sample::select(vec![
            "name",
            "price_cents",
            "per_user_limit",
            "sale_start",
            "sale_end",
            "sale_price_cents",
        ])
        .prop_map(str::to_owned),
        1 => Just("stock_buckets".to_owned()),
        1 => text(),
    ];
    prop_oneof![
        6 => proptest::collection::vec(path, 0..4)
            .prop_map(|paths| Some(flashsale_contract::FieldMask { paths })),
        1 => Just(None),
    ]
}

fn update() -> BoxedStrategy<UpdateProductRequest> {
    let etag = prop_oneof![2 => Just(String::new()), 2 => Just("1".to_owned()), 1 => text()];
    let sale_price = prop_oneof![1 => Just(None), 2 => int64().prop_map(Some)];
    (
        text(),
        (sku(), etag, text(), int64(), uint32()),
        (instant(), instant(), sale_price),
        mask(),
    )
        .prop_map(
            |(
                request_id,
                (sku, etag, name, price_cents, per_user_limit),
                (sale_start, sale_end, sale_price_cents),
                update_mask,
            )| UpdateProductRequest {
                request_id,
                product: Some(Product {
                    sku,
                    etag,
                    name,
                    price_cents,
                    per_user_limit,
                    sale_start,
                    sale_end,
                    sale_price_cents,
                    ..Product::default()
                }),
                update_mask,
            },
        )
        .boxed()
}

fn reserve() -> impl Strategy<Value = ReserveStockRequest> {
    let user = prop_oneof![2 => Just("u1".to_owned()), 1 => Just("u2".to_owned()), 1 => text()];
    (order_id(), user, sku(), quantity()).prop_map(|(order_id, user_id, sku, quantity)| {
        ReserveStockRequest {
            order_id,
            user_id,
            sku,
            quantity,
        }
    })
}

fn call() -> impl Strategy<Value = Call> {
    prop_oneof![
        1 => (
            (sku(), text(), int64(), int64(), uint32(), -1i32..4),
            (instant(), instant(), proptest::option::of(int64())),
        )
            .prop_map(
                |(
                    (sku, name, price_cents, initial_stock, per_user_limit, deduction_policy),
                    (sale_start, sale_end, sale_price_cents),
                )| {
                    Call::Create(CreateProductRequest {
                        sku,
                        name,
                        price_cents,
                        initial_stock,
                        per_user_limit,
                        deduction_policy,
                        stock_buckets: 0,
                        sale_start,
                        sale_end,
                        sale_price_cents,
                    })
                }
            )
            .boxed(),
        1 => sku().prop_map(|sku| Call::Get(GetProductRequest { sku })),
        1 => (any::<i32>(), text()).prop_map(|(page_size, page_token)| {
            Call::List(ListProductsRequest {
                page_size,
                page_token,
            })
        }),
        2 => (text(), sku(), int64(), text()).prop_map(|(request_id, sku, delta, reason)| {
            Call::Adjust(AdjustStockRequest {
                request_id,
                sku,
                delta,
                reason,
            })
        }),
        4 => reserve().prop_map(Call::Reserve),
        2 => proptest::collection::vec(reserve(), 0..4)
            .prop_map(|items| Call::Batch(ReserveStockBatchRequest { items })),
        1 => (sku(), uint32(), text()).prop_map(|(sku, max_buyers, known_refills)| {
            Call::Buyers(GetGateBuyersRequest {
                sku,
                max_buyers,
                known_refills,
            })
        }),
        1 => order_id().prop_map(|order_id| Call::Commit(CommitReservationRequest { order_id })),
        1 => (proptest::collection::vec(sku(), 0..3), any::<bool>())
            .prop_map(|(skus, repair)| Call::Reconcile(ReconcileStockRequest { skus, repair })),
        2 => update().prop_map(Call::Update),
    ]
}

fn request<T>(caller: &Caller, msg: T) -> tonic::Request<T> {
    match caller {
        Caller::Anonymous => tonic::Request::new(msg),
        Caller::As(role, subject) => with_token(msg, &token(subject, *role)),
    }
}

/// Every table's rows and stock figures, and the gate's keys and counter of PROP.
async fn snapshot(app: &TestApp, redis: &flashsale_platform::redis::Pool) -> Vec<i64> {
    let mut out = Vec::new();
    for sql in [
        "SELECT COUNT(*) AS n FROM products",
        "SELECT COALESCE(SUM(on_hand), 0)::int8 AS n FROM stock",
        "SELECT COALESCE(SUM(reserved), 0)::int8 AS n FROM stock",
        "SELECT COUNT(*) AS n FROM reservations",
        "SELECT COUNT(*) AS n FROM stock_ledger",
        "SELECT COUNT(*) AS n FROM stock_adjustments",
        "SELECT COUNT(*) AS n FROM outbox",
        "SELECT COUNT(*) AS n FROM product_updates",
        "SELECT COALESCE(SUM(version), 0)::int8 AS n FROM products",
        "SELECT COALESCE(SUM(price_cents + per_user_limit + COALESCE(sale_price_cents, 0) \
         + length(name) + COALESCE(extract(epoch FROM sale_start)::int8, 0) \
         + COALESCE(extract(epoch FROM sale_end)::int8, 0)), 0)::int8 AS n FROM products",
    ] {
        out.push(app.count(sql).await);
    }
    let mut conn = redis.get().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}*", app.settings.redis.key_prefix))
        .query_async(&mut *conn)
        .await
        .unwrap();
    let snap = app.gate.snapshot("PROP").await.unwrap().unwrap_or_default();
    out.extend([keys.len() as i64, snap.available, snap.held]);
    out
}

/// A snapshot once the service stopped moving on its own (an accepted adjustment's event, say,
/// comes back to it).
async fn settled(app: &TestApp, redis: &flashsale_platform::redis::Pool) -> Vec<i64> {
    let mut last = snapshot(app, redis).await;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = snapshot(app, redis).await;
        if now == last {
            return now;
        }
        last = now;
    }
    last
}

/// Runs `call` as `caller`: the refusal, if any, and the code of each item of a batch (0 for
/// one reserved).
async fn run(app: &TestApp, caller: &Caller, call: Call) -> (Result<(), tonic::Status>, Vec<i32>) {
    let mut c = app.client().await;
    let answer = match call {
        Call::Create(m) => c.create_product(request(caller, m)).await.map(drop),
        Call::Get(m) => c.get_product(request(caller, m)).await.map(drop),
        Call::List(m) => c.list_products(request(caller, m)).await.map(drop),
        Call::Adjust(m) => c.adjust_stock(request(caller, m)).await.map(drop),
        Call::Reserve(m) => c.reserve_stock(request(caller, m)).await.map(drop),
        Call::Batch(m) => {
            return match c.reserve_stock_batch(request(caller, m)).await {
                Ok(r) => (
                    Ok(()),
                    r.into_inner()
                        .outcomes
                        .into_iter()
                        .map(|o| if o.reserved.is_some() { 0 } else { o.code })
                        .collect(),
                ),
                Err(s) => (Err(s), Vec::new()),
            };
        }
        Call::Buyers(m) => c.get_gate_buyers(request(caller, m)).await.map(drop),
        Call::Commit(m) => c.commit_reservation(request(caller, m)).await.map(drop),
        Call::Reconcile(m) => c.reconcile_stock(request(caller, m)).await.map(drop),
        Call::Update(m) => c.update_product(request(caller, m)).await.map(drop),
    };
    (answer, Vec::new())
}

#[test]
fn generated_requests_get_documented_answers_and_refusals_change_nothing() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (app, redis) = rt.block_on(async {
        let app = spawn_app().await;
        app.create("PROP", 50, 2, DeductionPolicy::ReserveThenCommit)
            .await;
        let redis = flashsale_platform::redis::pool(&app.settings.redis).unwrap();
        (app, redis)
    });
    let generic = [Unauthenticated, PermissionDenied, ResourceExhausted];
    let mut runner = TestRunner::new(Config {
        cases: 64,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&(caller(), call()), |(caller, call)| {
        rt.block_on(async {
            let before = settled(&app, &redis).await;
            let (answer, items) = run(&app, &caller, call.clone()).await;
            if let Call::Batch(batch) = &call {
                for (item, &code) in batch.items.iter().zip(&items) {
                    let code = Code::from(code);
                    if has_control(&reserve_fields(item)) && code != InvalidArgument {
                        return Err(TestCaseError::fail(format!(
                            "{item:?} in a batch as {caller:?} holds a control character but was answered {code:?}"
                        )));
                    }
                    if code != Code::Ok && !RESERVE.contains(&code) {
                        return Err(TestCaseError::fail(format!(
                            "{item:?} in a batch as {caller:?} answered an undocumented {code:?}"
                        )));
                    }
                }
            }
            let Err(status) = answer else {
                if call.has_control_character() {
                    return Err(TestCaseError::fail(format!(
                        "{call:?} as {caller:?} holds a control character but was accepted"
                    )));
                }
                return Ok(());
            };
            let code = status.code();
            // A control character anywhere is refused at the edge (or the call never got that
            // far: no valid token, a role that may not call it).
            if call.has_control_character() && code != InvalidArgument && !generic.contains(&code) {
                return Err(TestCaseError::fail(format!(
                    "{call:?} as {caller:?} holds a control character but was answered {code:?}: {status:?}"
                )));
            }
            if !call.documented().contains(&code) && !generic.contains(&code) {
                return Err(TestCaseError::fail(format!(
                    "{call:?} as {caller:?} answered an undocumented {code:?}: {status:?}"
                )));
            }
            let after = snapshot(&app, &redis).await;
            if after != before {
                return Err(TestCaseError::fail(format!(
                    "{call:?} as {caller:?} was refused {code:?} but changed {before:?} into {after:?}"
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
