//! The limits of the contract's fields. Every service checks its input against these, so a
//! value one service accepts is never refused by the next one on the saga's path.

/// Longest idempotency key a client sends (`request_id`, `payment_id`): the order service counts
/// characters, product-stock's `AdjustStock` counts bytes (its key ends up in a Redis key).
pub const REQUEST_ID_MAX_LEN: usize = 64;
/// Longest user id (a token's subject), in bytes.
pub const USER_ID_MAX_LEN: usize = 128;
/// Longest product name, in characters.
pub const NAME_MAX_LEN: usize = 200;
/// Longest free-text reason (an adjustment's, a cancellation's), in characters.
pub const REASON_MAX_LEN: usize = 200;
/// Largest stock figure accepted anywhere: well inside the exact-integer range of a Lua number
/// (a double), so the gate's arithmetic never rounds.
pub const MAX_UNITS: i64 = 1_000_000_000;
/// Largest quantity of one order.
pub const MAX_QUANTITY: i64 = 1_000_000;
/// Largest price, in cents.
pub const MAX_PRICE_CENTS: i64 = MAX_UNITS * 100;
/// Largest integer a Lua number holds exactly: 2^53 − 1.
pub const MAX_SAFE_INTEGER: i64 = 9_007_199_254_740_991;
/// Longest page token a client passes back (the services issue far shorter ones).
pub const PAGE_TOKEN_MAX_LEN: usize = 512;
