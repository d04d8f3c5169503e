//! The one mapping from service errors to `tonic::Status`, following AIP-193: a canonical code,
//! a human message, and `google.rpc.ErrorInfo` (reason + domain) or `BadRequest` field
//! violations as details. Each service's own error enum converts into [`ApiError`]; internal
//! causes are logged here and never sent to the client.

use std::collections::HashMap;

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, FieldViolation, StatusExt};

/// The `ErrorInfo.domain` of every flashsale error.
pub const ERROR_DOMAIN: &str = "flashsale.dev";

/// An error as the API reports it.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Bad input: each `(field, description)` is one violation.
    #[error("invalid argument: {}", fmt_violations(.0))]
    InvalidArgument(Vec<(String, String)>),
    #[error("{0}")]
    NotFound(String),
    #[error("{message}")]
    AlreadyExists {
        reason: &'static str,
        message: String,
    },
    /// The request is valid but the system is not in a state to apply it (`reason` is the
    /// `ErrorInfo.reason`, e.g. `SOLD_OUT`).
    #[error("{message}")]
    FailedPrecondition {
        reason: &'static str,
        message: String,
        /// The `ErrorInfo.metadata` (e.g. when a sale opens); usually empty.
        metadata: Vec<(&'static str, String)>,
    },
    /// A per-user limit (`reason` `RATE_LIMITED`) or the service's own backlog bound
    /// (`OVERLOADED`): `RESOURCE_EXHAUSTED`, with a `google.rpc.RetryInfo` saying when to try
    /// again.
    #[error("{message}")]
    ResourceExhausted {
        reason: &'static str,
        message: String,
        retry_after: std::time::Duration,
    },
    /// The request was for a version of a resource that changed since (AIP-154); read it
    /// again. `reason` is the `ErrorInfo.reason`.
    #[error("{message}")]
    Aborted {
        reason: &'static str,
        message: String,
    },
    #[error("{0}")]
    Unauthenticated(String),
    #[error("{0}")]
    PermissionDenied(String),
    /// A dependency is down; the caller may retry.
    #[error("{message}")]
    Unavailable {
        reason: &'static str,
        message: String,
    },
    /// Anything else: logged in full, reported as `INTERNAL` without detail.
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

fn fmt_violations(v: &[(String, String)]) -> String {
    v.iter()
        .map(|(f, d)| format!("{f}: {d}"))
        .collect::<Vec<_>>()
        .join("; ")
}

impl ApiError {
    /// One bad field.
    pub fn invalid(field: impl Into<String>, description: impl Into<String>) -> Self {
        Self::InvalidArgument(vec![(field.into(), description.into())])
    }

    pub fn internal(e: impl Into<anyhow::Error>) -> Self {
        Self::Internal(e.into())
    }

    pub fn failed_precondition(reason: &'static str, message: impl Into<String>) -> Self {
        Self::failed_precondition_with(reason, message, Vec::new())
    }

    /// [`failed_precondition`](Self::failed_precondition) with `ErrorInfo.metadata`.
    pub fn failed_precondition_with(
        reason: &'static str,
        message: impl Into<String>,
        metadata: Vec<(&'static str, String)>,
    ) -> Self {
        Self::FailedPrecondition {
            reason,
            message: message.into(),
            metadata,
        }
    }
}

fn with_info(code: Code, message: String, reason: &str) -> Status {
    with_info_metadata(code, message, reason, Vec::new())
}

fn with_info_metadata(
    code: Code,
    message: String,
    reason: &str,
    metadata: Vec<(&'static str, String)>,
) -> Status {
    let metadata: HashMap<String, String> = metadata
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    let details = ErrorDetails::with_error_info(reason, ERROR_DOMAIN, metadata);
    Status::with_error_details(code, message, details)
}

impl From<ApiError> for Status {
    fn from(e: ApiError) -> Self {
        let message = e.to_string();
        match e {
            ApiError::InvalidArgument(violations) => {
                let fv: Vec<FieldViolation> = violations
                    .into_iter()
                    .map(|(f, d)| FieldViolation::new(f, d))
                    .collect();
                let mut details = ErrorDetails::with_bad_request(fv);
                details.set_error_info(
                    "INVALID_ARGUMENT",
                    ERROR_DOMAIN,
                    HashMap::<String, String>::new(),
                );
                Status::with_error_details(Code::InvalidArgument, message, details)
            }
            ApiError::NotFound(_) => with_info(Code::NotFound, message, "NOT_FOUND"),
            ApiError::AlreadyExists { reason, .. } => {
                with_info(Code::AlreadyExists, message, reason)
            }
            ApiError::FailedPrecondition {
                reason, metadata, ..
            } => with_info_metadata(Code::FailedPrecondition, message, reason, metadata),
            ApiError::ResourceExhausted {
                reason,
                retry_after,
                ..
            } => {
                let mut details = ErrorDetails::with_retry_info(Some(retry_after));
                details.set_error_info(reason, ERROR_DOMAIN, HashMap::<String, String>::new());
                Status::with_error_details(Code::ResourceExhausted, message, details)
            }
            ApiError::Aborted { reason, .. } => with_info(Code::Aborted, message, reason),
            ApiError::Unauthenticated(_) => {
                with_info(Code::Unauthenticated, message, "UNAUTHENTICATED")
            }
            ApiError::PermissionDenied(_) => {
                with_info(Code::PermissionDenied, message, "PERMISSION_DENIED")
            }
            ApiError::Unavailable { reason, .. } => with_info(Code::Unavailable, message, reason),
            ApiError::Internal(cause) => {
                tracing::error!(error = ?cause, "internal error");
                with_info(Code::Internal, "internal error".into(), "INTERNAL")
            }
        }
    }
}

/// The `ErrorInfo.reason` of a status, if it carries one (for clients and tests).
pub fn reason_of(status: &Status) -> Option<String> {
    status.get_details_error_info().map(|i| i.reason)
}

/// The `ErrorInfo.metadata` of a status (empty without one; for clients and tests).
pub fn info_metadata(status: &Status) -> HashMap<String, String> {
    status
        .get_details_error_info()
        .map(|i| i.metadata)
        .unwrap_or_default()
}

/// The `BadRequest` field names of a status (for clients and tests).
pub fn violated_fields(status: &Status) -> Vec<String> {
    status
        .get_details_bad_request()
        .map(|b| b.field_violations.into_iter().map(|v| v.field).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_precondition_carries_its_reason() {
        let s: Status = ApiError::failed_precondition("SOLD_OUT", "sku X is sold out").into();
        assert_eq!(s.code(), Code::FailedPrecondition);
        assert_eq!(reason_of(&s).as_deref(), Some("SOLD_OUT"));
        assert_eq!(s.message(), "sku X is sold out");
        assert!(info_metadata(&s).is_empty());
        let s: Status = ApiError::failed_precondition_with(
            "SALE_NOT_STARTED",
            "not yet",
            vec![("sale_start", "2026-12-07T20:00:00.000Z".into())],
        )
        .into();
        assert_eq!(reason_of(&s).as_deref(), Some("SALE_NOT_STARTED"));
        assert_eq!(
            info_metadata(&s).get("sale_start").map(String::as_str),
            Some("2026-12-07T20:00:00.000Z")
        );
    }

    #[test]
    fn invalid_argument_lists_field_violations() {
        let s: Status = ApiError::InvalidArgument(vec![
            ("sku".into(), "must not be empty".into()),
            ("quantity".into(), "must be > 0".into()),
        ])
        .into();
        assert_eq!(s.code(), Code::InvalidArgument);
        assert_eq!(violated_fields(&s), vec!["sku", "quantity"]);
        assert!(s.message().contains("quantity: must be > 0"));
    }

    #[test]
    fn internal_errors_hide_their_cause() {
        let s: Status = ApiError::internal(anyhow::anyhow!("password=hunter2 leaked")).into();
        assert_eq!(s.code(), Code::Internal);
        assert!(!s.message().contains("hunter2"));
    }
}
