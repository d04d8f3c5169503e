//! A guard for a service that is reached without a token (the payment provider's
//! NotifyPayment): anyone who reaches the port can call it, so what one peer may hold of the
//! server is bounded here, before the call reaches the service.
//!
//! - At most `per_peer` calls of the service in flight from one peer address (all its
//!   connections together); one more is refused at once with `RESOURCE_EXHAUSTED`, reason
//!   `RATE_LIMITED` and a `google.rpc.RetryInfo`, before its body is read.
//! - A deadline on receiving the request: a call whose body has not fully arrived
//!   `body_timeout` after it started is answered `DEADLINE_EXCEEDED` (reason
//!   `REQUEST_BODY_TIMEOUT`). The load-shedding slot (`crate::shed`) and this guard's count
//!   are held until the call is answered, and a unary call is answered only after its whole
//!   body arrived: without the deadline a sender that opens a call and sends its body slowly,
//!   or never, keeps both for the server's whole request timeout (`grpc.request_timeout_ms`).

use std::{
    convert::Infallible,
    net::IpAddr,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tonic::{
    Code, Status,
    body::Body,
    server::NamedService,
    transport::server::{TcpConnectInfo, TlsConnectInfo},
};
use tonic_types::{ErrorDetails, StatusExt as _};

use crate::{error::ERROR_DOMAIN, limit::StreamCap};

/// Counter of calls answered `DEADLINE_EXCEEDED` because their body arrived too slowly.
pub const BODY_TIMEOUT_TOTAL: &str = "flashsale_grpc_body_timeout_total";

/// What a peer told it has too many calls in flight is asked to wait.
const PEER_RETRY_AFTER: Duration = Duration::from_millis(100);

/// The limits of a [`PeerGuard`]; cheap to clone (clones share the counts).
#[derive(Clone, Debug)]
pub struct PeerLimits {
    in_flight: StreamCap,
    body_timeout: Duration,
}

impl PeerLimits {
    /// At most `per_peer` calls in flight per peer address; a call's body must have arrived
    /// `body_timeout` after it started. `what` names the calls in refusals (e.g.
    /// "NotifyPayment").
    pub fn new(what: &'static str, per_peer: usize, body_timeout: Duration) -> Self {
        Self {
            in_flight: StreamCap::new(what, per_peer, PEER_RETRY_AFTER),
            body_timeout,
        }
    }

    /// `service` behind these limits.
    pub fn guard<S>(&self, service: S) -> PeerGuard<S> {
        PeerGuard {
            inner: service,
            limits: self.clone(),
        }
    }

    /// Calls of `peer` in flight now.
    pub fn in_flight(&self, peer: &str) -> usize {
        self.in_flight.open_streams(peer)
    }
}

/// A service behind [`PeerLimits`]; see the module.
#[derive(Clone, Debug)]
pub struct PeerGuard<S> {
    inner: S,
    limits: PeerLimits,
}

impl<S: NamedService> NamedService for PeerGuard<S> {
    const NAME: &'static str = S::NAME;
}

/// The address of the peer that sent `req` ("unknown" when the transport does not say).
fn peer_of<B>(req: &http::Request<B>) -> String {
    let ext = req.extensions();
    let addr = ext
        .get::<TcpConnectInfo>()
        .and_then(TcpConnectInfo::remote_addr)
        .or_else(|| {
            ext.get::<TlsConnectInfo<TcpConnectInfo>>()
                .and_then(|i| i.get_ref().remote_addr())
        });
    addr.map(|a| canonical(a.ip()).to_string())
        .unwrap_or_else(|| "unknown".to_owned())
}

/// An IPv4 peer reached over an IPv6 socket counts as the IPv4 address it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

impl<S> tower::Service<http::Request<Body>> for PeerGuard<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = futures_util::future::BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let permit = match self.limits.in_flight.open(&peer_of(&req)) {
            Ok(permit) => permit,
            Err(refused) => {
                let status: Status = refused.into();
                return Box::pin(async move { Ok(status.into_http()) });
            }
        };
        let timeout = self.limits.body_timeout;
        let req = req.map(|body| Body::new(DeadlineBody::new(body, timeout)));
        // The clone that was made ready is the one called (tower's usual swap).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let answer = inner.call(req).await;
            drop(permit);
            answer
        })
    }
}

/// A request body that fails with `DEADLINE_EXCEEDED` unless it ends within its deadline.
struct DeadlineBody {
    inner: Body,
    deadline: Pin<Box<tokio::time::Sleep>>,
    timeout: Duration,
    ended: bool,
}

impl DeadlineBody {
    fn new(inner: Body, timeout: Duration) -> Self {
        Self {
            inner,
            deadline: Box::pin(tokio::time::sleep(timeout)),
            timeout,
            ended: false,
        }
    }

    fn timed_out(&self) -> Status {
        metrics::counter!(BODY_TIMEOUT_TOTAL).increment(1);
        let details = ErrorDetails::with_error_info(
            "REQUEST_BODY_TIMEOUT",
            ERROR_DOMAIN,
            std::collections::HashMap::<String, String>::new(),
        );
        Status::with_error_details(
            Code::DeadlineExceeded,
            format!(
                "the request was not received within {} ms of the call starting",
                self.timeout.as_millis()
            ),
            details,
        )
    }
}

impl HttpBody for DeadlineBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            if frame.is_none() {
                self.ended = true;
            }
            return Poll::Ready(frame);
        }
        if self.deadline.as_mut().poll(cx).is_ready() {
            self.ended = true;
            return Poll::Ready(Some(Err(self.timed_out())));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv4_peer_over_ipv6_counts_as_its_ipv4_address() {
        let mapped: IpAddr = "::ffff:10.1.2.3".parse().unwrap();
        assert_eq!(canonical(mapped), "10.1.2.3".parse::<IpAddr>().unwrap());
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        assert_eq!(canonical(v6), v6);
    }
}
