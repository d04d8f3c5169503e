//! The simulator as the order service and a buyer meet it, over gRPC: the merchant's calls need
//! the API key and valid input, payments and refunds are idempotent, declined refunds are
//! declined as often as configured, and a payment's notifications reach the merchant signed —
//! late, twice, reordered or after lost deliveries, as configured, or never, when GetPayment
//! still tells the merchant where the payment is.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use flashsale_contract::payment::{DEV_PAYMENT_API_KEY, DEV_WEBHOOK_SECRET, verify};
use flashsale_payment_sim::{Running, SimConfig};
use flashsale_proto::{
    order::v1::{
        NotifyPaymentRequest, NotifyPaymentResponse,
        payment_notification_service_server::{
            PaymentNotificationService, PaymentNotificationServiceServer,
        },
    },
    payment::v1::{
        CreatePaymentRequest, GetPaymentRequest, PayCheckoutRequest, PaymentEvent,
        PaymentEventType, PaymentStatus, RefundPaymentRequest,
        payment_provider_service_client::PaymentProviderServiceClient,
    },
};
use flashsale_test_support::eventually;
use prost::Message as _;
use tonic::{Code, Request, Response, Status, transport::Channel};

/// A merchant that records every notification it accepts (after checking its signature).
#[derive(Clone, Default)]
struct Merchant {
    seen: Arc<Mutex<Vec<(PaymentEvent, NotifyPaymentRequest)>>>,
}

#[tonic::async_trait]
impl PaymentNotificationService for Merchant {
    async fn notify_payment(
        &self,
        req: Request<NotifyPaymentRequest>,
    ) -> Result<Response<NotifyPaymentResponse>, Status> {
        let r = req.into_inner();
        let now = chrono::Utc::now().timestamp();
        verify(
            DEV_WEBHOOK_SECRET.as_bytes(),
            r.timestamp,
            &r.payload,
            &r.signature,
            now,
            60,
        )
        .map_err(|e| Status::unauthenticated(e.to_string()))?;
        let ev = PaymentEvent::decode(r.payload.as_slice()).unwrap();
        self.seen.lock().unwrap().push((ev, r));
        Ok(Response::new(NotifyPaymentResponse::default()))
    }
}

async fn merchant() -> (Merchant, String) {
    let m = Merchant::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let svc = PaymentNotificationServiceServer::new(m.clone());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming(tokio_stream_of(listener)),
    );
    (m, url)
}

fn tokio_stream_of(l: tokio::net::TcpListener) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(l)
}

async fn sim(
    tune: impl FnOnce(&mut SimConfig),
) -> (Running, PaymentProviderServiceClient<Channel>) {
    let mut c = SimConfig {
        notify_delay: Duration::from_millis(10),
        retry_base: Duration::from_millis(20),
        ..SimConfig::default()
    };
    tune(&mut c);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let running = flashsale_payment_sim::start(c, listener).await.unwrap();
    let channel = flashsale_test_support::grpc::channel(running.port)
        .await
        .unwrap();
    (running, PaymentProviderServiceClient::new(channel))
}

fn merchant_call<T>(m: T) -> Request<T> {
    let mut r = Request::new(m);
    r.metadata_mut().insert(
        "authorization",
        format!("Bearer {DEV_PAYMENT_API_KEY}").parse().unwrap(),
    );
    r
}

fn create(reference: &str, amount: i64, url: &str) -> CreatePaymentRequest {
    CreatePaymentRequest {
        merchant_reference: reference.into(),
        amount_cents: amount,
        currency: "EUR".into(),
        notify_url: url.into(),
        expire_time: None,
    }
}

fn refund(payment_id: &str, amount: i64) -> RefundPaymentRequest {
    RefundPaymentRequest {
        payment_id: payment_id.into(),
        refund_id: format!("r-{payment_id}"),
        amount_cents: amount,
        currency: "EUR".into(),
    }
}

async fn seen(m: &Merchant, n: usize) -> Vec<(PaymentEvent, NotifyPaymentRequest)> {
    eventually(Duration::from_secs(10), "notifications", || async {
        let s = m.seen.lock().unwrap().clone();
        (s.len() >= n).then_some(s)
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn merchant_calls_need_the_api_key_and_valid_input() {
    let (_sim, mut c) = sim(|_| {}).await;
    let url = "http://127.0.0.1:1";
    let none = c
        .create_payment(Request::new(create("o1", 100, url)))
        .await
        .unwrap_err();
    assert_eq!(none.code(), Code::Unauthenticated);
    let mut wrong = Request::new(create("o1", 100, url));
    wrong
        .metadata_mut()
        .insert("authorization", "Bearer not-the-key".parse().unwrap());
    assert_eq!(
        c.create_payment(wrong).await.unwrap_err().code(),
        Code::Unauthenticated
    );
    let cases = [
        (create("", 100, url), "merchant_reference"),
        (create(&"r".repeat(65), 100, url), "merchant_reference"),
        (create("o1", -1, url), "amount_cents"),
        (
            CreatePaymentRequest {
                currency: "eur".into(),
                ..create("o1", 100, url)
            },
            "currency",
        ),
        (create("o1", 100, "127.0.0.1:50052"), "notify_url"),
    ];
    for (req, field) in cases {
        let e = c.create_payment(merchant_call(req)).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{field}");
        assert_eq!(flashsale_platform::error::violated_fields(&e), [field]);
    }
    let unknown = c
        .refund_payment(merchant_call(refund("pay_nope", 100)))
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    let empty = c
        .pay_checkout(Request::new(PayCheckoutRequest::default()))
        .await
        .unwrap_err();
    assert_eq!(empty.code(), Code::InvalidArgument);
    let missing = c
        .pay_checkout(Request::new(PayCheckoutRequest {
            payment_id: "pay_nope".into(),
        }))
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
}

#[tokio::test]
async fn payments_are_idempotent_per_reference_and_notify_once_when_paid() {
    let (m, url) = merchant().await;
    let (_sim, mut c) = sim(|_| {}).await;
    let first = c
        .create_payment(merchant_call(create("o2", 2500, &url)))
        .await
        .unwrap()
        .into_inner();
    let again = c
        .create_payment(merchant_call(create("o2", 2500, &url)))
        .await
        .unwrap()
        .into_inner();
    let p = first.payment.unwrap();
    assert!(!first.replayed && again.replayed);
    assert_eq!(again.payment.unwrap().payment_id, p.payment_id);
    assert!(
        p.checkout_url
            .ends_with(&format!("/checkout/{}", p.payment_id)),
        "{p:?}"
    );
    let reused = c
        .create_payment(merchant_call(create("o2", 2400, &url)))
        .await
        .unwrap_err();
    assert_eq!(
        flashsale_platform::error::reason_of(&reused).as_deref(),
        Some("IDEMPOTENCY_KEY_REUSED")
    );
    let early = c
        .refund_payment(merchant_call(refund(&p.payment_id, 2500)))
        .await
        .unwrap_err();
    assert_eq!(
        flashsale_platform::error::reason_of(&early).as_deref(),
        Some("PAYMENT_NOT_CAPTURED")
    );
    for _ in 0..2 {
        let paid = c
            .pay_checkout(Request::new(PayCheckoutRequest {
                payment_id: p.payment_id.clone(),
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            paid.payment.unwrap().status,
            PaymentStatus::Succeeded as i32
        );
    }
    let got = seen(&m, 1).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        m.seen.lock().unwrap().len(),
        1,
        "paying twice notifies once"
    );
    let ev = &got[0].0;
    assert_eq!(
        (
            ev.r#type,
            ev.payment_id.as_str(),
            ev.merchant_reference.as_str(),
            ev.amount_cents
        ),
        (
            PaymentEventType::Succeeded as i32,
            p.payment_id.as_str(),
            "o2",
            2500
        )
    );
    let wrong = c
        .refund_payment(merchant_call(refund(&p.payment_id, 1)))
        .await
        .unwrap_err();
    assert_eq!(wrong.code(), Code::InvalidArgument);
    let r = c
        .refund_payment(merchant_call(refund(&p.payment_id, 2500)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.payment.unwrap().status, PaymentStatus::Refunded as i32);
    let r = c
        .refund_payment(merchant_call(refund(&p.payment_id, 2500)))
        .await
        .unwrap()
        .into_inner();
    assert!(r.replayed);
}

#[tokio::test]
async fn refunds_are_declined_as_often_as_configured() {
    let (_m, url) = merchant().await;
    let (_sim, mut c) = sim(|s| s.refund_failures = 2).await;
    let p = c
        .create_payment(merchant_call(create("o3", 700, &url)))
        .await
        .unwrap()
        .into_inner()
        .payment
        .unwrap();
    c.pay_checkout(Request::new(PayCheckoutRequest {
        payment_id: p.payment_id.clone(),
    }))
    .await
    .unwrap();
    for _ in 0..2 {
        let e = c
            .refund_payment(merchant_call(refund(&p.payment_id, 700)))
            .await
            .unwrap_err();
        assert_eq!(
            flashsale_platform::error::reason_of(&e).as_deref(),
            Some("REFUND_DECLINED")
        );
    }
    assert!(
        c.refund_payment(merchant_call(refund(&p.payment_id, 700)))
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn notifications_arrive_signed_despite_loss_duplicates_and_reordering() {
    let (m, url) = merchant().await;
    let (sim, mut c) = sim(|s| {
        s.delivery_failures = 2;
        s.duplicate_fraction = 1.0;
        s.attempt_failed_fraction = 1.0;
        s.reorder = true;
    })
    .await;
    let p = c
        .create_payment(merchant_call(create("o4", 900, &url)))
        .await
        .unwrap()
        .into_inner()
        .payment
        .unwrap();
    c.pay_checkout(Request::new(PayCheckoutRequest {
        payment_id: p.payment_id.clone(),
    }))
    .await
    .unwrap();
    // Two events, each delivered twice (the same signed bytes), after two lost deliveries each.
    let got = seen(&m, 4).await;
    let kinds: Vec<i32> = got.iter().map(|(e, _)| e.r#type).collect();
    assert_eq!(
        kinds[0],
        PaymentEventType::Succeeded as i32,
        "reordered: the success first, then the declined attempt: {kinds:?}"
    );
    assert!(
        kinds.contains(&(PaymentEventType::AttemptFailed as i32)),
        "{kinds:?}"
    );
    let succeeded: Vec<&NotifyPaymentRequest> = got
        .iter()
        .filter(|(e, _)| e.r#type == PaymentEventType::Succeeded as i32)
        .map(|(_, r)| r)
        .collect();
    assert_eq!(succeeded.len(), 2);
    assert_eq!(
        (succeeded[0].signature.as_str(), succeeded[0].timestamp),
        (succeeded[1].signature.as_str(), succeeded[1].timestamp),
        "a duplicate is the same signed delivery"
    );
    let stats = sim.stats();
    assert_eq!(
        (stats.events, stats.lost, stats.duplicates),
        (2, 4, 2),
        "{stats:?}"
    );
}

fn get(payment_id: &str) -> GetPaymentRequest {
    GetPaymentRequest {
        payment_id: payment_id.into(),
    }
}

#[tokio::test]
async fn get_payment_tells_the_merchant_where_a_payment_is_when_notifications_are_dropped() {
    let (m, url) = merchant().await;
    let delay = Duration::from_millis(200);
    let (sim, mut c) = sim(|s| {
        s.drop_notifications = true;
        s.refund_delay = delay;
    })
    .await;
    let p = c
        .create_payment(merchant_call(create("o9", 900, &url)))
        .await
        .unwrap()
        .into_inner()
        .payment
        .unwrap();
    let status = |c: PaymentProviderServiceClient<Channel>, id: String| async move {
        let mut c = c;
        c.get_payment(merchant_call(get(&id)))
            .await
            .unwrap()
            .into_inner()
            .payment
            .unwrap()
            .status
    };
    assert_eq!(
        status(c.clone(), p.payment_id.clone()).await,
        PaymentStatus::Pending as i32
    );
    let no_key = c.get_payment(Request::new(get(&p.payment_id))).await;
    assert_eq!(no_key.unwrap_err().code(), Code::Unauthenticated);
    let empty = c.get_payment(merchant_call(get(""))).await.unwrap_err();
    assert_eq!(empty.code(), Code::InvalidArgument);
    let unknown = c
        .get_payment(merchant_call(get("pay_nope")))
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);

    c.pay_checkout(Request::new(PayCheckoutRequest {
        payment_id: p.payment_id.clone(),
    }))
    .await
    .unwrap();
    let stats = eventually(Duration::from_secs(10), "notification dropped", || async {
        let s = sim.stats();
        (s.lost >= 1).then_some(s)
    })
    .await
    .unwrap();
    assert_eq!((stats.events, stats.lost, stats.accepted), (1, 1, 0));
    assert!(m.seen.lock().unwrap().is_empty());
    assert_eq!(
        status(c.clone(), p.payment_id.clone()).await,
        PaymentStatus::Succeeded as i32
    );

    let started = std::time::Instant::now();
    c.refund_payment(merchant_call(refund(&p.payment_id, 900)))
        .await
        .unwrap();
    assert!(
        started.elapsed() >= delay,
        "refunds answer after refund_delay"
    );
    let refund_id = format!("r-{}", p.payment_id);
    assert_eq!(sim.simulator.refund_calls(&refund_id), 1);
    assert_eq!(sim.simulator.refund_calls("r-other"), 0);
    assert_eq!(
        status(c.clone(), p.payment_id.clone()).await,
        PaymentStatus::Refunded as i32
    );
}
