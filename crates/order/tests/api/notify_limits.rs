//! NotifyPayment needs no token, so what one peer may hold of the server is bounded: a call
//! whose request has not arrived `limits.notify_body_timeout_ms` after it started is answered
//! DEADLINE_EXCEEDED and frees its place among `grpc.max_concurrent_requests`, and one peer
//! address has at most `limits.notify_in_flight_per_peer` calls in flight.

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use flashsale_proto::order::v1::{GetOrderRequest, NotifyPaymentRequest, NotifyPaymentResponse};
use flashsale_test_support::eventually;
use tonic::{
    Code, Status,
    codegen::http::uri::PathAndQuery,
    transport::{Channel, Endpoint},
};
use tonic_types::StatusExt as _;

use crate::helpers::{as_user, reason, spawn_app_with};

const NOTIFY: &str = "/flashsale.order.v1.PaymentNotificationService/NotifyPayment";

/// A connection from source address `from` (127.0.0.1 when `None`).
async fn connect(port: u16, from: Option<IpAddr>) -> Result<Channel, Status> {
    Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .local_address(from)
        .connect()
        .await
        .map_err(|e| Status::unavailable(e.to_string()))
}

/// A NotifyPayment on `channel` whose request is sent only `delay` after the call opened.
async fn notify_on(channel: Channel, delay: Duration) -> Result<NotifyPaymentResponse, Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    let body = futures_util::stream::once(async move {
        tokio::time::sleep(delay).await;
        NotifyPaymentRequest::default()
    });
    let codec = tonic_prost::ProstCodec::<NotifyPaymentRequest, NotifyPaymentResponse>::default();
    grpc.client_streaming(
        tonic::Request::new(body),
        PathAndQuery::from_static(NOTIFY),
        codec,
    )
    .await
    .map(tonic::Response::into_inner)
}

/// [`notify_on`] a new connection from `from`.
async fn notify_after(
    port: u16,
    from: Option<IpAddr>,
    delay: Duration,
) -> Result<NotifyPaymentResponse, Status> {
    notify_on(connect(port, from).await?, delay).await
}

#[tokio::test]
async fn a_notification_whose_request_never_arrives_frees_its_place_at_the_deadline() {
    let app = spawn_app_with(|s| {
        s.grpc.max_concurrent_requests = 1;
        // Far beyond the test: only the notification's own deadline can free the place.
        s.grpc.request_timeout_ms = 120_000;
        s.limits.notify_body_timeout_ms = 1_000;
    })
    .await;
    let port = app.grpc_port;
    let c = app.client().await;
    let get = || {
        let mut c = c.clone();
        let req = GetOrderRequest {
            order_id: uuid::Uuid::new_v4().to_string(),
        };
        async move { c.get_order(as_user("alice", req)).await.map(drop) }
    };
    // The slow notification takes the only place (should a GetOrder hold it at that moment,
    // the notification is shed and opened again).
    let (stalled, held_at) = loop {
        let call = tokio::spawn(notify_after(port, None, Duration::from_secs(600)));
        let held = eventually(Duration::from_secs(10), "the place taken", || async {
            if call.is_finished() {
                return Some(false);
            }
            let refused = get().await.err()?;
            (reason(&refused) == "OVERLOADED").then_some(true)
        })
        .await
        .unwrap();
        if held {
            break (call, Instant::now());
        }
    };
    // Served again once the notification's deadline freed the place.
    let served = eventually(Duration::from_secs(30), "the place freed", || async {
        match get().await {
            Err(s) if reason(&s) == "OVERLOADED" => None,
            other => Some(other),
        }
    })
    .await
    .unwrap();
    let held_for = held_at.elapsed();
    assert_eq!(served.unwrap_err().code(), Code::NotFound, "served");
    assert!(held_for < Duration::from_secs(5), "held for {held_for:?}");
    let answer = stalled.await.unwrap().unwrap_err();
    assert_eq!(answer.code(), Code::DeadlineExceeded, "{answer:?}");
    assert_eq!(reason(&answer), "REQUEST_BODY_TIMEOUT");
    println!("a notification that never sent its request held the place for {held_for:?}");
    // A notification sent in time is answered by the service (an unsigned one is refused).
    let prompt = notify_after(port, None, Duration::ZERO).await.unwrap_err();
    assert_ne!(prompt.code(), Code::Unavailable, "{prompt:?}");
    assert_ne!(prompt.code(), Code::DeadlineExceeded, "{prompt:?}");
}

#[tokio::test]
async fn one_peer_has_at_most_its_share_of_notifications_in_flight_and_another_peer_is_served() {
    let app = spawn_app_with(|s| {
        s.limits.notify_in_flight_per_peer = 2;
        s.limits.notify_body_timeout_ms = 60_000;
        s.grpc.request_timeout_ms = 120_000;
    })
    .await;
    let port = app.grpc_port;
    let here: IpAddr = "127.0.0.1".parse().unwrap();
    let elsewhere: IpAddr = "127.0.0.2".parse().unwrap();
    // Two calls that never send their request fill the peer's share (one refused because a
    // probe held a place at that moment is opened again), then a third is refused. Each opens on
    // a connection made beforehand, so it reaches the server before the probe's connection is up.
    let started = Instant::now();
    let mut stalled = Vec::new();
    let refused = loop {
        stalled.retain(|call: &tokio::task::JoinHandle<_>| !call.is_finished());
        while stalled.len() < 2 {
            let channel = connect(port, Some(here)).await.unwrap();
            stalled.push(tokio::spawn(notify_on(channel, Duration::from_secs(600))));
        }
        let probe = notify_after(port, Some(here), Duration::ZERO).await;
        if let Err(s) = probe
            && s.code() == Code::ResourceExhausted
        {
            break s;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "never refused");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(reason(&refused), "RATE_LIMITED");
    assert!(refused.get_details_retry_info().is_some(), "{refused:?}");
    let other = notify_after(port, Some(elsewhere), Duration::ZERO)
        .await
        .unwrap_err();
    assert_ne!(other.code(), Code::ResourceExhausted, "{other:?}");
    // A call that ends gives its place back.
    for call in stalled {
        call.abort();
    }
    let freed = eventually(Duration::from_secs(10), "a place given back", || async {
        let s = notify_after(port, Some(here), Duration::ZERO).await.err()?;
        (s.code() != Code::ResourceExhausted).then_some(s)
    })
    .await;
    assert!(freed.is_ok(), "the aborted calls kept their places");
}
