//! The status of a request the server cannot decode, as the contract promises it rather than as
//! tonic answers it: a message over `grpc.max_message_bytes` is `RESOURCE_EXHAUSTED` (reason
//! `MESSAGE_TOO_LARGE`; tonic says `OUT_OF_RANGE`), and one that is not valid protobuf — a
//! string field that is not UTF-8, say — is `INVALID_ARGUMENT` naming the field (tonic says
//! `INTERNAL`, which would read as the server's fault). Every other answer passes unchanged.

use std::{
    collections::HashMap,
    task::{Context, Poll},
};

use futures_util::FutureExt as _;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, FieldViolation, StatusExt as _};

use crate::error::ERROR_DOMAIN;

/// How tonic words a message over the size limit (`OUT_OF_RANGE`).
const TOO_LARGE: &str = "Error, decoded message length too large";
/// How prost words a message it cannot decode (`INTERNAL`, through tonic-prost).
const UNDECODABLE: &str = "failed to decode Protobuf message: ";

/// The layer; see the module.
#[derive(Clone, Copy, Debug, Default)]
pub struct DecodeStatusLayer;

impl<S> tower::Layer<S> for DecodeStatusLayer {
    type Service = DecodeStatus<S>;

    fn layer(&self, inner: S) -> Self::Service {
        DecodeStatus { inner }
    }
}

/// See [`DecodeStatusLayer`].
#[derive(Clone, Debug)]
pub struct DecodeStatus<S> {
    inner: S,
}

impl<S, B, ResBody> tower::Service<http::Request<B>> for DecodeStatus<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = http::Response<ResBody>;
    type Error = S::Error;
    type Future = futures_util::future::BoxFuture<'static, Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        self.inner
            .call(req)
            .map(|answer| {
                answer.map(|resp| {
                    // A status tonic answered by itself rides in the response's extensions.
                    match resp.extensions().get::<Status>().and_then(translate) {
                        Some(status) => status.into_http(),
                        None => resp,
                    }
                })
            })
            .boxed()
    }
}

/// The status the contract gives a request `status` was tonic's answer to, if it differs.
fn translate(status: &Status) -> Option<Status> {
    match status.code() {
        Code::OutOfRange if status.message().starts_with(TOO_LARGE) => {
            let details = ErrorDetails::with_error_info(
                "MESSAGE_TOO_LARGE",
                ERROR_DOMAIN,
                HashMap::<String, String>::new(),
            );
            Some(Status::with_error_details(
                Code::ResourceExhausted,
                status.message(),
                details,
            ))
        }
        Code::Internal => {
            let what = status.message().strip_prefix(UNDECODABLE)?;
            let (field, why) = undecodable_field(what);
            let mut details =
                ErrorDetails::with_bad_request(vec![FieldViolation::new(field.clone(), why)]);
            details.set_error_info(
                "INVALID_ARGUMENT",
                ERROR_DOMAIN,
                HashMap::<String, String>::new(),
            );
            let message = format!("invalid argument: the request is not valid protobuf: {what}");
            Some(Status::with_error_details(
                Code::InvalidArgument,
                message,
                details,
            ))
        }
        _ => None,
    }
}

/// The field path and the cause of prost's `Inner.field: Outer.field: cause` (innermost
/// first): `outer_field.field`, or "" when prost named no field.
fn undecodable_field(what: &str) -> (String, String) {
    let mut parts: Vec<&str> = what.split(": ").collect();
    let why = parts.pop().unwrap_or_default().to_owned();
    let path: Vec<&str> = parts
        .iter()
        .rev()
        .filter_map(|p| p.rsplit_once('.').map(|(_, field)| field))
        .collect();
    (path.join("."), why)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_undecodable_request_names_its_field_and_is_invalid_argument() {
        let tonic_said = Status::internal(
            "failed to decode Protobuf message: ReserveStockRequest.user_id: \
             ReserveStockBatchRequest.items: invalid string value: data is not UTF-8 encoded",
        );
        let s = translate(&tonic_said).expect("translated");
        assert_eq!(s.code(), Code::InvalidArgument);
        assert_eq!(crate::error::violated_fields(&s), ["items.user_id"]);
        assert!(s.message().contains("not UTF-8"), "{}", s.message());

        let no_field = Status::internal("failed to decode Protobuf message: invalid varint");
        let s = translate(&no_field).expect("translated");
        assert_eq!(s.code(), Code::InvalidArgument);
        assert_eq!(crate::error::violated_fields(&s), [""]);
    }

    #[test]
    fn an_oversized_request_is_resource_exhausted_and_other_statuses_pass() {
        let s = translate(&Status::out_of_range(
            "Error, decoded message length too large: found 2048 bytes, the limit is: 1024 bytes",
        ))
        .expect("translated");
        assert_eq!(s.code(), Code::ResourceExhausted);
        assert_eq!(
            crate::error::reason_of(&s).as_deref(),
            Some("MESSAGE_TOO_LARGE")
        );
        for unchanged in [
            Status::internal("internal error"),
            Status::out_of_range("page past the end"),
            Status::invalid_argument("x"),
        ] {
            assert!(translate(&unchanged).is_none(), "{unchanged:?}");
        }
    }
}
