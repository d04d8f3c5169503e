//! Generated requests against every RPC of a running outbound service (product-stock beside it,
//! real PostgreSQL and RabbitMQ) — OutboundService and its DeadLetterService: each answer is OK
//! or a code the contract documents for that RPC, a buyer is only ever shown their own shipment,
//! only an admin lists them, and a refused request changes no row.

use flashsale_messaging::envelope;
use flashsale_platform::auth::Role;
use flashsale_proto::{
    events::v1::{OrderPaid, envelope::Payload},
    outbound::v1::{GetShipmentRequest, ListShipmentsRequest, ShipmentStatus},
    product::v1::DeductionPolicy,
};
use flashsale_test_support::generated::{
    Caller, check_dead_letter_service, has_control, int32, settled, table_digest, text,
};
use proptest::{
    prelude::*,
    test_runner::{Config, TestCaseError, TestRunner},
};
use tonic::Code;

use crate::stack::{Stack, spawn_stack};

const RTC: DeductionPolicy = DeductionPolicy::ReserveThenCommit;

/// Every table a request could change.
const TABLES: [&str; 5] = [
    "shipments",
    "shipment_attempts",
    "outbox:message_id,routing_key,payload",
    "inbox",
    "dead_letters",
];

#[derive(Clone, Debug)]
enum Call {
    Get(GetShipmentRequest),
    List(ListShipmentsRequest),
}

impl Call {
    fn has_control_character(&self) -> bool {
        match self {
            Self::Get(m) => has_control(&[&m.order_id]),
            Self::List(m) => has_control(&[&m.page_token]),
        }
    }

    /// The codes the contract documents for this RPC, besides UNAUTHENTICATED,
    /// PERMISSION_DENIED and RESOURCE_EXHAUSTED, which any RPC may answer.
    fn documented(&self) -> &'static [Code] {
        match self {
            Self::Get(_) => &[Code::InvalidArgument, Code::NotFound],
            Self::List(_) => &[Code::InvalidArgument],
        }
    }
}

/// Mostly the two buyers and an admin, sometimes a service, any role with any subject, or no
/// token.
fn caller() -> impl Strategy<Value = Caller> {
    let role = prop_oneof![Just(Role::User), Just(Role::Admin), Just(Role::Service)];
    let buyer = prop_oneof![Just("alice".to_owned()), Just("bob".to_owned())];
    prop_oneof![
        1 => Just(Caller::Anonymous),
        4 => buyer.prop_map(|s| Caller::As(Role::User, s)),
        3 => Just(Caller::As(Role::Admin, "root".to_owned())),
        1 => Just(Caller::As(Role::Service, "order".to_owned())),
        2 => (role, text()).prop_map(|(r, s)| Caller::As(r, s)),
    ]
}

/// Requests of both RPCs; `orders` are orders with a shipment, so some requests reach them.
fn call(orders: Vec<String>) -> impl Strategy<Value = Call> {
    let order_id = prop_oneof![
        3 => proptest::sample::select(orders),
        1 => Just(uuid::Uuid::new_v4().to_string()),
        1 => text(),
    ];
    let status = prop_oneof![4 => -1i32..5, 1 => any::<i32>()];
    prop_oneof![
        1 => order_id.prop_map(|order_id| Call::Get(GetShipmentRequest { order_id })),
        1 => (status, int32(), text(), older_than_ms()).prop_map(
            |(status, page_size, page_token, older_than_ms)| {
                Call::List(ListShipmentsRequest {
                    status,
                    page_size,
                    page_token,
                    older_than_ms,
                })
            }
        ),
    ]
}

/// Ages for ListShipments: mostly none or in range, sometimes negative or past 30 days.
fn older_than_ms() -> impl Strategy<Value = i64> {
    prop_oneof![
        3 => Just(0i64),
        2 => 0i64..=2_592_000_000,
        1 => any::<i64>(),
    ]
}

/// Shipped orders of alice (two) and bob (one).
async fn shipped_orders(stack: &Stack) -> Vec<String> {
    stack.product("PROP", 10, RTC).await;
    let mut orders = Vec::new();
    for user in ["alice", "alice", "bob"] {
        let order = stack.reserved_order(user, "PROP", RTC).await;
        stack.publish(&stack.paid(order, user, "PROP", RTC)).await;
        assert_eq!(
            stack.finished(order).await.status,
            ShipmentStatus::Shipped as i32
        );
        orders.push(order.to_string());
    }
    orders
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn generated_shipment_requests_get_documented_answers_and_refusals_change_nothing() {
    let rt = runtime();
    let (stack, orders) = rt.block_on(async {
        let stack = spawn_stack(|_| {}).await;
        let orders = shipped_orders(&stack).await;
        (stack, orders)
    });
    let mut runner = TestRunner::new(Config {
        cases: 128,
        failure_persistence: None,
        ..Config::default()
    });
    let generic = [
        Code::Unauthenticated,
        Code::PermissionDenied,
        Code::ResourceExhausted,
    ];
    let conn = &stack.conn;
    let result = runner.run(&(caller(), call(orders)), |(caller, call)| {
        rt.block_on(async {
            let snapshot = || async move { table_digest(conn, &TABLES).await.unwrap() };
            let before = settled(snapshot).await;
            let mut c = stack.outbound().await;
            let answer = match call.clone() {
                Call::Get(m) => c.get_shipment(caller.request(m)).await.map(|r| {
                    r.into_inner()
                        .shipment
                        .map(|s| s.user_id)
                        .unwrap_or_default()
                }),
                Call::List(m) => c.list_shipments(caller.request(m)).await.map(|_| String::new()),
            };
            let status = match answer {
                Ok(owner) => {
                    if call.has_control_character() {
                        return Err(TestCaseError::fail(format!(
                            "{call:?} as {caller:?} holds a control character but was accepted"
                        )));
                    }
                    match (&call, &caller) {
                        (Call::Get(_), Caller::As(Role::User, subject)) if &owner != subject => {
                            return Err(TestCaseError::fail(format!(
                                "{call:?} as {caller:?} was shown {owner}'s shipment"
                            )));
                        }
                        (Call::List(_), _) if !caller.is_admin() => {
                            return Err(TestCaseError::fail(format!(
                                "{call:?} as {caller:?} listed shipments without an admin token"
                            )));
                        }
                        (Call::Get(_), Caller::Anonymous | Caller::As(Role::Service, _)) => {
                            return Err(TestCaseError::fail(format!(
                                "{call:?} as {caller:?} was answered without a buyer or admin token"
                            )));
                        }
                        _ => return Ok(()),
                    }
                }
                Err(status) => status,
            };
            let code = status.code();
            if !call.documented().contains(&code) && !generic.contains(&code) {
                return Err(TestCaseError::fail(format!(
                    "{call:?} as {caller:?} answered an undocumented {code:?}: {status:?}"
                )));
            }
            if call.has_control_character()
                && code != Code::InvalidArgument
                && !generic.contains(&code)
            {
                return Err(TestCaseError::fail(format!(
                    "{call:?} as {caller:?} holds a control character but was answered {code:?}: {status:?}"
                )));
            }
            let after = snapshot().await;
            if after != before {
                return Err(TestCaseError::fail(format!(
                    "{call:?} as {caller:?} was refused {code:?} but changed {before:?} into {after:?}"
                )));
            }
            Ok(())
        })
    });
    drop(stack);
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[test]
fn generated_dead_letter_requests_get_documented_answers_and_refusals_change_nothing() {
    let rt = runtime();
    let (stack, queue, ids) = rt.block_on(async {
        let stack = spawn_stack(|_| {}).await;
        let queue = flashsale_outbound::api::amqp::topology(&stack.amqp)
            .queue()
            .to_owned();
        let mut ids = Vec::new();
        for _ in 0..6 {
            let order = uuid::Uuid::new_v4();
            let paid = OrderPaid {
                order_id: order.to_string(),
                user_id: "alice".into(),
                sku: "GONE".into(),
                quantity: 1,
                payment_id: format!("pay-{order}"),
                amount_cents: 100,
                deduction_policy: RTC as i32,
            };
            let env = envelope::new(Payload::OrderPaid(paid), order.to_string(), "", "order");
            let id = flashsale_test_support::generated::park(&stack.conn, &queue, &env)
                .await
                .unwrap();
            ids.push(id);
        }
        (stack, queue, ids)
    });
    let result = check_dead_letter_service(
        &rt,
        stack.outbound_port,
        &stack.conn,
        &TABLES,
        vec![queue],
        ids,
        96,
    );
    drop(stack);
    if let Err(e) = result {
        panic!("{e}");
    }
}
