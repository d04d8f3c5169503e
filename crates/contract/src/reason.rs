//! The reasons (AIP-193 `ErrorInfo.reason`) a service puts on a failure or refusal that is not a
//! refusal of stock ([`crate::Refusal`] has those), each named once for the service that sends
//! it and the client that reads it. README.md ("Errors") lists what each means and whether to retry.

/// A database the service needs is out of reach or gave a write up for a passing reason:
/// retry (with the same request id).
pub const DATABASE_UNAVAILABLE: &str = "DATABASE_UNAVAILABLE";
/// The message broker is out of reach: retry.
pub const BROKER_UNAVAILABLE: &str = "BROKER_UNAVAILABLE";
/// product-stock's Redis gate is out of reach (or being rebuilt): retry.
pub const STOCK_GATE_UNAVAILABLE: &str = "STOCK_GATE_UNAVAILABLE";
/// Another flashsale service the call needs did not answer: retry.
pub const DEPENDENCY_UNAVAILABLE: &str = "DEPENDENCY_UNAVAILABLE";
/// The payment provider did not answer: retry.
pub const PAYMENT_PROVIDER_UNAVAILABLE: &str = "PAYMENT_PROVIDER_UNAVAILABLE";
/// The service sheds load: retry after the delay it gives.
pub const OVERLOADED: &str = "OVERLOADED";
/// This caller's rate limit: retry after the delay it gives.
pub const RATE_LIMITED: &str = "RATE_LIMITED";
/// A product with this sku exists already.
pub const SKU_EXISTS: &str = "SKU_EXISTS";
/// The request id was used before with another request.
pub const IDEMPOTENCY_KEY_REUSED: &str = "IDEMPOTENCY_KEY_REUSED";
/// The order's reservation was released (cancelled or expired) before this call.
pub const RESERVATION_RELEASED: &str = "RESERVATION_RELEASED";
/// The order was cancelled.
pub const ORDER_CANCELLED: &str = "ORDER_CANCELLED";
/// The order is not awaiting payment.
pub const ORDER_NOT_PAYABLE: &str = "ORDER_NOT_PAYABLE";
/// The order can no longer be cancelled.
pub const ORDER_NOT_CANCELLABLE: &str = "ORDER_NOT_CANCELLABLE";
/// The payment does not match the order.
pub const PAYMENT_MISMATCH: &str = "PAYMENT_MISMATCH";
/// The payment provider refused.
pub const PAYMENT_PROVIDER_REFUSED: &str = "PAYMENT_PROVIDER_REFUSED";
/// The refund is completed already.
pub const REFUND_COMPLETED: &str = "REFUND_COMPLETED";
/// UpdateProduct for a version of the product that changed since (AIP-154): read it again.
pub const ETAG_MISMATCH: &str = "ETAG_MISMATCH";
/// UpdateProduct moving the start of a sale that has opened.
pub const SALE_IN_PROGRESS: &str = "SALE_IN_PROGRESS";
/// The replica answering is stopping (being replaced or scaled in): call again, and another
/// replica answers. A stream (WatchOrder) ends with it rather than being cut off.
pub const SERVER_STOPPING: &str = "SERVER_STOPPING";

/// Every reason above.
pub const ALL: [&str; 19] = [
    DATABASE_UNAVAILABLE,
    BROKER_UNAVAILABLE,
    STOCK_GATE_UNAVAILABLE,
    DEPENDENCY_UNAVAILABLE,
    PAYMENT_PROVIDER_UNAVAILABLE,
    OVERLOADED,
    RATE_LIMITED,
    SKU_EXISTS,
    IDEMPOTENCY_KEY_REUSED,
    RESERVATION_RELEASED,
    ORDER_CANCELLED,
    ORDER_NOT_PAYABLE,
    ORDER_NOT_CANCELLABLE,
    PAYMENT_MISMATCH,
    PAYMENT_PROVIDER_REFUSED,
    REFUND_COMPLETED,
    SERVER_STOPPING,
    ETAG_MISMATCH,
    SALE_IN_PROGRESS,
];

/// The `ErrorInfo.metadata` keys a refusal carries besides its reason.
pub mod meta {
    /// When the product's sale opens (RFC 3339, UTC, milliseconds), on `SALE_NOT_STARTED`.
    pub const SALE_START: &str = "sale_start";
    /// When the product's sale closed (RFC 3339, UTC, milliseconds), on `SALE_ENDED`.
    pub const SALE_END: &str = "sale_end";
    /// The stock gate's clock when it decided (RFC 3339, UTC, milliseconds), on `SALE_NOT_STARTED`
    /// and `SALE_ENDED`: the sale opens and closes by this clock, not by the caller's.
    pub const GATE_TIME: &str = "gate_time";
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Refusal;

    #[test]
    fn every_reason_is_upper_snake_case_and_no_two_are_alike() {
        let refusals = Refusal::ALL.map(Refusal::reason);
        let mut seen = std::collections::HashSet::new();
        for r in ALL.iter().chain(refusals.iter()) {
            assert!(
                !r.is_empty() && r.bytes().all(|b| b.is_ascii_uppercase() || b == b'_'),
                "{r}"
            );
            assert!(seen.insert(*r), "{r} twice");
        }
    }
}
