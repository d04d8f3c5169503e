//! Generated requests against the order service's RPCs beside OrderService's buyer calls (those
//! are in `prop.rs`): the payment provider's NotifyPayment, the admin's ListRefunds and
//! RetryRefund, and the DeadLetterService — each answer OK or a documented code, and a refused
//! request changes no row.
//!
//! Notifications are generated from payment events (real payments, unknown ones, wrong amounts,
//! currencies and orders, bad types) or raw bytes, signed right, with another secret, for
//! another timestamp or not at all, at timestamps now, stale, in the future or absurd. Only a
//! notification signed with the provider's secret within the tolerance may change anything;
//! an authentic one that matches a payment this service started is always applied, and a
//! payment's success is applied once.

use std::collections::HashMap;

use flashsale_contract::payment::{DEV_WEBHOOK_SECRET, sign};
use flashsale_messaging::envelope;
use flashsale_platform::auth::Role;
use flashsale_proto::{
    events::v1::{StockReserved, envelope::Payload},
    order::v1::{ListRefundsRequest, NotifyPaymentRequest, OrderStatus, RetryRefundRequest},
    payment::v1::{PaymentEvent, PaymentEventType},
};
use flashsale_test_support::generated::{
    Caller, check_dead_letter_service, has_control, int32, park, settled, table_digest, text,
};
use proptest::{
    prelude::*,
    test_runner::{Config, TestCaseError, TestRunner},
};
use prost::Message as _;
use tonic::Code;

use crate::helpers::{TestApp, spawn_stack, spawn_stack_paying};

/// Every table of the order service a request could change.
const TABLES: [&str; 8] = [
    "orders",
    "order_status_history",
    "payments",
    "provider_payments",
    "refunds",
    "outbox:message_id,routing_key,payload",
    "inbox",
    "dead_letters",
];

/// The price of the test product, in cents (the amount of every payment).
const PRICE: i64 = 2500;
/// The service's default `payment.notification_tolerance_ms`, in seconds.
const TOLERANCE_SECS: i64 = 300;

/// How a notification is signed.
#[derive(Clone, Debug)]
enum Signature {
    /// With the provider's secret, over this timestamp and payload.
    Right,
    /// With another secret.
    OtherSecret,
    /// With the provider's secret, over another timestamp.
    OtherTimestamp,
    /// Anything: 64 hex digits, a string, empty.
    Junk(String),
}

/// When a notification says it was signed, relative to now.
#[derive(Clone, Debug)]
enum When {
    /// This many seconds from now, within the tolerance.
    Near(i64),
    /// This many seconds from now, outside the tolerance.
    Far(i64),
    /// This Unix timestamp.
    At(i64),
}

#[derive(Clone, Debug)]
enum Body {
    Event(PaymentEvent),
    Raw(Vec<u8>),
}

#[derive(Clone, Debug)]
struct Notice {
    body: Body,
    signature: Signature,
    when: When,
}

#[derive(Clone, Debug)]
enum Call {
    Notify(Notice),
    ListRefunds(ListRefundsRequest),
    RetryRefund(RetryRefundRequest),
}

impl Call {
    fn has_control_character(&self) -> bool {
        match self {
            // Refused unless authentic; authentic, refused INVALID_ARGUMENT.
            Self::Notify(n) => match &n.body {
                Body::Event(ev) => has_control(&[
                    &ev.payment_id,
                    &ev.merchant_reference,
                    &ev.event_id,
                    &ev.currency,
                ]),
                Body::Raw(_) => false,
            },
            Self::ListRefunds(m) => has_control(&[&m.page_token]),
            Self::RetryRefund(m) => has_control(&[&m.order_id]),
        }
    }

    /// The codes the contract documents for this RPC, besides UNAUTHENTICATED,
    /// PERMISSION_DENIED and RESOURCE_EXHAUSTED, which any RPC may answer.
    fn documented(&self) -> &'static [Code] {
        match self {
            Self::Notify(_) => &[
                Code::Unauthenticated,
                Code::InvalidArgument,
                Code::NotFound,
                Code::FailedPrecondition,
            ],
            Self::ListRefunds(_) => &[Code::InvalidArgument],
            Self::RetryRefund(_) => &[
                Code::InvalidArgument,
                Code::NotFound,
                Code::FailedPrecondition,
            ],
        }
    }
}

/// The payments this service started: provider payment id → order id.
type Started = HashMap<String, String>;

fn event(started: &Started, orders: Vec<String>) -> impl Strategy<Value = PaymentEvent> {
    let payments: Vec<String> = started.keys().cloned().collect();
    let payment_id = prop_oneof![
        4 => proptest::sample::select(payments.clone()),
        1 => Just("pay_unknown".to_owned()),
        1 => text(),
        1 => proptest::sample::select(payments).prop_map(|p| format!("{p}\0")),
    ];
    let kind = prop_oneof![
        4 => Just(PaymentEventType::Succeeded as i32),
        1 => Just(PaymentEventType::AttemptFailed as i32),
        1 => any::<i32>(),
    ];
    // Mostly the payment's own order (filled in below), sometimes another or anything.
    let reference = prop_oneof![
        4 => Just(None),
        1 => proptest::sample::select(orders).prop_map(Some),
        1 => text().prop_map(Some),
    ];
    let amount = prop_oneof![4 => Just(PRICE), 1 => Just(PRICE - 1), 1 => any::<i64>()];
    let currency =
        prop_oneof![4 => Just("EUR".to_owned()), 1 => Just("USD".to_owned()), 1 => text()];
    let started = started.clone();
    (text(), kind, payment_id, reference, amount, currency).prop_map(
        move |(event_id, kind, payment_id, reference, amount_cents, currency)| PaymentEvent {
            event_id,
            r#type: kind,
            merchant_reference: reference
                .or_else(|| started.get(&payment_id).cloned())
                .unwrap_or_default(),
            payment_id,
            amount_cents,
            currency,
            create_time: None,
        },
    )
}

fn notice(started: &Started, orders: Vec<String>) -> impl Strategy<Value = Notice> {
    let body = prop_oneof![
        6 => event(started, orders).prop_map(Body::Event),
        1 => proptest::collection::vec(any::<u8>(), 0..64).prop_map(Body::Raw),
        1 => Just(Body::Raw(vec![b'x'; 70_000])),
    ];
    let signature = prop_oneof![
        6 => Just(Signature::Right),
        1 => Just(Signature::OtherSecret),
        1 => Just(Signature::OtherTimestamp),
        1 => "[0-9a-f]{64}".prop_map(Signature::Junk),
        1 => text().prop_map(Signature::Junk),
    ];
    let when = prop_oneof![
        6 => (-(TOLERANCE_SECS - 30)..(TOLERANCE_SECS - 30)).prop_map(When::Near),
        1 => (TOLERANCE_SECS + 60..100_000i64).prop_map(When::Far),
        1 => (TOLERANCE_SECS + 60..100_000i64).prop_map(|s| When::Far(-s)),
        1 => prop_oneof![Just(0), Just(i64::MIN), Just(i64::MAX), any::<i64>()].prop_map(When::At),
    ];
    (body, signature, when).prop_map(|(body, signature, when)| Notice {
        body,
        signature,
        when,
    })
}

impl Notice {
    /// The request, signed as generated, at `now` (Unix seconds).
    fn request(&self, now: i64) -> NotifyPaymentRequest {
        let payload = match &self.body {
            Body::Event(ev) => ev.encode_to_vec(),
            Body::Raw(bytes) => bytes.clone(),
        };
        let timestamp = match self.when {
            When::Near(d) | When::Far(d) => now + d,
            When::At(t) => t,
        };
        let signature = match &self.signature {
            Signature::Right => sign(DEV_WEBHOOK_SECRET.as_bytes(), timestamp, &payload),
            Signature::OtherSecret => sign(
                b"another-secret-another-secret-another-secret",
                timestamp,
                &payload,
            ),
            Signature::OtherTimestamp => sign(
                DEV_WEBHOOK_SECRET.as_bytes(),
                timestamp.wrapping_add(1),
                &payload,
            ),
            Signature::Junk(s) => s.clone(),
        };
        NotifyPaymentRequest {
            payload,
            signature,
            timestamp,
        }
    }

    /// Signed with the provider's secret, within the tolerance.
    fn authentic(&self) -> bool {
        matches!(self.signature, Signature::Right) && matches!(self.when, When::Near(_))
    }

    /// The payment event it carries, if it is one that matches a payment this service started
    /// (its order, amount and currency) with a type the contract knows and no control character
    /// — one it must apply.
    fn matching(&self, started: &Started) -> Option<&PaymentEvent> {
        let Body::Event(ev) = &self.body else {
            return None;
        };
        let known_type = ev.r#type == PaymentEventType::Succeeded as i32
            || ev.r#type == PaymentEventType::AttemptFailed as i32;
        (known_type
            && !has_control(&[&ev.event_id])
            && started.get(&ev.payment_id) == Some(&ev.merchant_reference)
            && ev.amount_cents == PRICE
            && ev.currency == "EUR")
            .then_some(ev)
    }
}

/// Mostly an admin or a buyer, sometimes a service, any role with any subject, or no token (a
/// notification needs none and a token must not help it).
fn caller() -> impl Strategy<Value = Caller> {
    let role = prop_oneof![Just(Role::User), Just(Role::Admin), Just(Role::Service)];
    prop_oneof![
        1 => Just(Caller::Anonymous),
        4 => Just(Caller::As(Role::Admin, "root".to_owned())),
        2 => Just(Caller::As(Role::User, "alice".to_owned())),
        1 => Just(Caller::As(Role::Service, "product-stock".to_owned())),
        2 => (role, text()).prop_map(|(r, s)| Caller::As(r, s)),
    ]
}

fn call(started: &Started, orders: Vec<String>) -> impl Strategy<Value = Call> {
    let order_id = prop_oneof![
        3 => proptest::sample::select(orders.clone()),
        1 => Just(uuid::Uuid::nil().to_string()),
        1 => text(),
    ];
    let status = prop_oneof![4 => -1i32..5, 1 => any::<i32>()];
    prop_oneof![
        6 => notice(started, orders).prop_map(Call::Notify),
        1 => (status, int32(), text()).prop_map(|(status, page_size, page_token)| {
            Call::ListRefunds(ListRefundsRequest {
                status,
                page_size,
                page_token,
            })
        }),
        1 => order_id.prop_map(|order_id| Call::RetryRefund(RetryRefundRequest { order_id })),
    ]
}

/// What a call answered: a notification's `duplicate`, or nothing.
enum Answer {
    Notified { duplicate: bool },
    Other,
}

async fn run(app: &TestApp, caller: &Caller, call: &Call) -> Result<Answer, tonic::Status> {
    let mut c = app.client().await;
    match call {
        Call::Notify(n) => {
            let req = n.request(chrono::Utc::now().timestamp());
            let mut client = flashsale_proto::order::v1::payment_notification_service_client::PaymentNotificationServiceClient::new(
                flashsale_test_support::grpc::channel(app.grpc_port).await.unwrap(),
            );
            client
                .notify_payment(caller.request(req))
                .await
                .map(|r| Answer::Notified {
                    duplicate: r.into_inner().duplicate,
                })
        }
        Call::ListRefunds(m) => c
            .list_refunds(caller.request(m.clone()))
            .await
            .map(|_| Answer::Other),
        Call::RetryRefund(m) => c
            .retry_refund(caller.request(m.clone()))
            .await
            .map(|_| Answer::Other),
    }
}

/// An order of `user` awaiting payment, with its payment started at the provider.
async fn started_payment(app: &TestApp, user: &str, key: &str) -> (String, String) {
    let o = app.order(user, key, "PROP", 1).await.unwrap();
    app.wait_status(user, &o.order_id, OrderStatus::AwaitingPayment)
        .await;
    let payment = app
        .start_payment(user, &o.order_id)
        .await
        .unwrap()
        .checkout
        .unwrap()
        .provider_payment_id;
    (o.order_id, payment)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn generated_notifications_and_refund_requests_get_documented_answers_and_refusals_change_nothing()
{
    let rt = runtime();
    // The provider declines every refund and a refund is tried once: a refund parks FAILED at
    // once, so the service comes to rest quickly after each request.
    let (app, started, orders) = rt.block_on(async {
        let app = spawn_stack_paying(
            |s| {
                s.saga.payment_timeout_ms = 3_600_000;
                s.saga.sweep_interval_ms = 3_600_000;
                s.payment.refund_max_attempts = 1;
                s.payment.refund_retry_base_ms = 20;
                s.payment.refund_sweep_interval_ms = 50;
            },
            |s| s.refund_failures = u32::MAX,
        )
        .await;
        app.product("PROP", 20, 0).await;
        let mut started = Started::new();
        let mut orders = Vec::new();
        // Awaiting payment: two of alice's, one of bob's whose deadline has passed (its
        // payment, when notified, is refunded).
        for (user, key) in [("alice", "a"), ("alice", "b"), ("bob", "late")] {
            let (order, payment) = started_payment(&app, user, key).await;
            started.insert(payment, order.clone());
            orders.push(order);
        }
        app.exec(&format!(
            "UPDATE orders SET payment_deadline = now() - interval '1 second' WHERE order_id = '{}'",
            orders[2]
        ))
        .await;
        // Paid too late at the provider: cancelled, its refund declined and parked FAILED.
        let (parked, payment) = started_payment(&app, "carol", "parked").await;
        app.exec(&format!(
            "UPDATE orders SET payment_deadline = now() - interval '1 second' WHERE order_id = '{parked}'"
        ))
        .await;
        app.buyer_pays(&payment).await;
        app.wait_count(
            "SELECT COUNT(*) AS n FROM refunds WHERE status = 'FAILED'",
            1,
        )
        .await;
        started.insert(payment, parked.clone());
        orders.push(parked);
        // Awaiting payment, no payment started.
        let fresh = app.order("dave", "d", "PROP", 1).await.unwrap().order_id;
        app.wait_status("dave", &fresh, OrderStatus::AwaitingPayment)
            .await;
        orders.push(fresh);
        (app, started, orders)
    });
    let generic = [
        Code::Unauthenticated,
        Code::PermissionDenied,
        Code::ResourceExhausted,
    ];
    // Payments whose success was applied (answered `duplicate = false`).
    let applied: std::cell::RefCell<Vec<String>> = std::cell::RefCell::default();
    let mut runner = TestRunner::new(Config {
        cases: 160,
        failure_persistence: None,
        ..Config::default()
    });
    let conn = &app.conn;
    let result = runner.run(&(caller(), call(&started, orders)), |(caller, call)| {
        rt.block_on(async {
            let snapshot = || async move { table_digest(conn, &TABLES).await.unwrap() };
            let before = settled(snapshot).await;
            let answer = run(&app, &caller, &call).await;
            let status = match answer {
                Ok(answer) => {
                    if call.has_control_character() {
                        return Err(TestCaseError::fail(format!(
                            "{call:?} as {caller:?} holds a control character but was accepted"
                        )));
                    }
                    match (&call, answer) {
                        (Call::Notify(n), Answer::Notified { duplicate }) => {
                            if !n.authentic() {
                                return Err(TestCaseError::fail(format!(
                                    "{n:?} is not signed with the provider's secret within the tolerance but was accepted"
                                )));
                            }
                            if let Body::Event(ev) = &n.body
                                && ev.r#type == PaymentEventType::Succeeded as i32
                                && !duplicate
                            {
                                let mut applied = applied.borrow_mut();
                                if applied.contains(&ev.payment_id) {
                                    return Err(TestCaseError::fail(format!(
                                        "the success of {} was applied twice",
                                        ev.payment_id
                                    )));
                                }
                                applied.push(ev.payment_id.clone());
                            }
                        }
                        _ if !caller.is_admin() => {
                            return Err(TestCaseError::fail(format!(
                                "{call:?} as {caller:?} was accepted without an admin token"
                            )));
                        }
                        _ => {}
                    }
                    return Ok(());
                }
                Err(status) => status,
            };
            let code = status.code();
            if let Call::Notify(n) = &call
                && n.authentic()
                && let Some(ev) = n.matching(&started)
            {
                return Err(TestCaseError::fail(format!(
                    "an authentic notification of {ev:?} was refused: {status:?}"
                )));
            }
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
    drop(app);
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[test]
fn generated_dead_letter_requests_get_documented_answers_and_refusals_change_nothing() {
    let rt = runtime();
    let (app, queue, ids) = rt.block_on(async {
        let app = spawn_stack(|_| {}).await;
        let queue = flashsale_order::api::amqp::topology(&app.settings.amqp)
            .queue()
            .to_owned();
        let mut ids = Vec::new();
        for _ in 0..6 {
            let order = uuid::Uuid::new_v4().to_string();
            let reserved = Payload::StockReserved(StockReserved {
                order_id: order.clone(),
                sku: "GONE".into(),
                quantity: 1,
                ..Default::default()
            });
            let env = envelope::new(reserved, order, "", "product-stock");
            ids.push(park(&app.conn, &queue, &env).await.unwrap());
        }
        (app, queue, ids)
    });
    let result =
        check_dead_letter_service(&rt, app.grpc_port, &app.conn, &TABLES, vec![queue], ids, 96);
    drop(app);
    if let Err(e) = result {
        panic!("{e}");
    }
}
