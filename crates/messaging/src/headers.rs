//! AMQP header names flashsale sets on retried and parked messages (read them in the
//! dead-letter admin).

/// Which attempt the delivery is (1 for the first delivery); a long integer.
pub const ATTEMPT: &str = "x-flashsale-attempt";
/// The last error a consumer gave up with (parked messages); a long string.
pub const ERROR: &str = "x-flashsale-error";
/// The routing key the message was first published with; a long string.
pub const ORIGINAL_ROUTING_KEY: &str = "x-flashsale-original-routing-key";
/// The consumer queue the message was parked from; a long string.
pub const ORIGINAL_QUEUE: &str = "x-flashsale-original-queue";
/// When the message was parked, milliseconds since the epoch; a long integer.
pub const PARKED_AT_MS: &str = "x-flashsale-parked-at-ms";

/// Longest error text kept in [`ERROR`].
pub(crate) const MAX_ERROR_LEN: usize = 2000;

/// How many events a bundle carries (`bundle::CONTENT_TYPE` messages only); a long string, for
/// operators looking at a queue.
pub const BUNDLE_SIZE: &str = "x-flashsale-bundle-size";
