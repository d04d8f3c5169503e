//! Every gRPC server's calls counted and timed in one place, a tower layer around all of a
//! service's routes: `flashsale_rpc_server_requests_total` by method and status code, and
//! `flashsale_rpc_server_duration_seconds`, a histogram with explicit buckets
//! ([`crate::metrics::SECONDS_BUCKETS`]) by method and status code. The method is the gRPC path
//! without its leading slash (`flashsale.order.v1.OrderService/CreateOrder`); a call to a
//! method no service has (status `UNIMPLEMENTED`) counts as method `unknown`, so a caller
//! cannot mint label values.
//!
//! The status code is the response's `grpc-status` header: a refusal or an error answers in
//! headers alone (a trailers-only response); an answer with a message carries its status in
//! the trailers, and counts as `OK`.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::Instant,
};

/// Calls answered, by `method` and `code`.
pub const REQUESTS: &str = "flashsale_rpc_server_requests_total";
/// Time from the call's arrival to its answer's headers, seconds, by `method` and `code`.
pub const DURATION: &str = "flashsale_rpc_server_duration_seconds";

/// The gRPC status codes by number, as the gRPC specification names them.
const CODES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

/// The status code of a response, from its `grpc-status` header (`OK` when it has none: the
/// status then follows in the trailers of an answer with a message).
pub fn status_code(headers: &http::HeaderMap) -> &'static str {
    match headers.get("grpc-status") {
        None => CODES[0],
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.parse::<usize>().ok())
            .and_then(|n| CODES.get(n).copied())
            .unwrap_or("UNKNOWN"),
    }
}

/// The status code of a response as its number (`0` when it has none).
pub fn status_number(headers: &http::HeaderMap) -> i64 {
    let name = status_code(headers);
    CODES
        .iter()
        .position(|c| *c == name)
        .map_or(2, |n| n as i64)
}

/// The method a path names (`/pkg.Service/Method` → `pkg.Service/Method`), or `unknown` for a
/// path that is not one.
pub fn method_of(path: &str) -> &str {
    let m = path.strip_prefix('/').unwrap_or("");
    let well_formed = m.len() <= 128
        && m.split_once('/').is_some_and(|(s, n)| {
            !s.is_empty()
                && !n.is_empty()
                && !n.contains('/')
                && m.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'/'))
        });
    if well_formed { m } else { "unknown" }
}

/// The layer; see the module's documentation.
#[derive(Clone, Copy, Debug, Default)]
pub struct RpcMetricsLayer;

impl<S> tower::Layer<S> for RpcMetricsLayer {
    type Service = RpcMetrics<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RpcMetrics { inner }
    }
}

#[derive(Clone, Debug)]
pub struct RpcMetrics<S> {
    inner: S,
}

impl<S, B, R> tower::Service<http::Request<B>> for RpcMetrics<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let method = method_of(req.uri().path()).to_owned();
        let started = Instant::now();
        let answer = self.inner.call(req);
        Box::pin(async move {
            let result = answer.await;
            let code = match &result {
                Ok(response) => status_code(response.headers()),
                // The transport failed the call; no status reached the caller.
                Err(_) => "UNKNOWN",
            };
            let method = if code == "UNIMPLEMENTED" {
                "unknown".to_owned()
            } else {
                method
            };
            metrics::counter!(REQUESTS, "method" => method.clone(), "code" => code).increment(1);
            metrics::histogram!(DURATION, "method" => method, "code" => code)
                .record(started.elapsed().as_secs_f64());
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_method_is_its_path_and_anything_else_is_unknown() {
        assert_eq!(
            method_of("/flashsale.order.v1.OrderService/CreateOrder"),
            "flashsale.order.v1.OrderService/CreateOrder"
        );
        for bad in [
            "",
            "/",
            "/x",
            "/a/b/c",
            "/a/",
            "//b",
            "/a b/c",
            "/a/c%20",
            "/é/c",
            &format!("/a/{}", "m".repeat(200)),
        ] {
            assert_eq!(method_of(bad), "unknown", "{bad:?}");
        }
    }

    #[test]
    fn the_status_is_read_from_the_headers_and_none_is_ok() {
        let mut h = http::HeaderMap::new();
        assert_eq!(status_code(&h), "OK");
        h.insert("grpc-status", http::HeaderValue::from_static("8"));
        assert_eq!(status_code(&h), "RESOURCE_EXHAUSTED");
        h.insert("grpc-status", http::HeaderValue::from_static("16"));
        assert_eq!(status_code(&h), "UNAUTHENTICATED");
        for bad in ["17", "-1", "x", ""] {
            h.insert("grpc-status", http::HeaderValue::from_static(bad));
            assert_eq!(status_code(&h), "UNKNOWN", "{bad:?}");
        }
    }
}
