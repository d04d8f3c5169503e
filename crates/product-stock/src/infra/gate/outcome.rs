//! What the gate's operations answer.

use uuid::Uuid;

pub use crate::domain::GateBuyers;

/// Why a gate call failed. Refusals (sold out, limits) are not errors: they are outcomes.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    /// No connection to Redis (pool exhausted or closed, I/O error, server loading or failing
    /// over); the caller answers `UNAVAILABLE` and never falls back to the database.
    #[error("redis unavailable: {0}")]
    Unavailable(String),
    /// Redis answered with an error or a reply the gate does not understand.
    #[error("gate script failed: {0}")]
    Script(String),
    /// An argument the gate refuses before calling Redis.
    #[error("invalid gate input: {0}")]
    InvalidInput(&'static str),
}

/// The answer to a reservation. A replay (same order id) of a reserved order returns its first
/// answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReserveOutcome {
    /// The units are held for the order; `remaining` is the counter after the first answer,
    /// `gate_ms` the gate's clock when it took them (`None` on a replay).
    Reserved {
        remaining: i64,
        replayed: bool,
        gate_ms: Option<i64>,
    },
    /// The product's sale opens at `start_ms`; the gate's clock read `gate_ms`. Not recorded.
    NotStarted { gate_ms: i64, start_ms: i64 },
    /// The product's sale closed at `end_ms`; the gate's clock read `gate_ms`. Not recorded.
    Ended { gate_ms: i64, end_ms: i64 },
    /// The counter is at zero. Refusals are not recorded (they write nothing), so a replay is
    /// judged afresh and may answer differently.
    SoldOut,
    /// Fewer units than asked are left. Not recorded.
    InsufficientStock { available: i64 },
    /// The user already holds `bought` units; `bought + qty` exceeds the per-user limit. Not
    /// recorded.
    UserLimitExceeded { bought: i64 },
    /// This order id was used before with another user or quantity.
    Mismatch,
    /// This order's units were already given back (or it was cancelled before it was
    /// reserved); a replay must not take them again.
    Released,
    /// The gate has no counter for the product: rebuild it from the database and retry.
    NotLoaded,
}

/// The answer to [`RedisGate::release`](super::RedisGate::release) and its variants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// An unpersisted hold went back to the counter (held → avail).
    ReleasedHold { qty: i64, available: i64 },
    /// A persisted reservation went back to the counter (the database released it first).
    ReleasedPersisted { qty: i64, available: i64 },
    /// The gate had no record of the order (expired, or the gate was rebuilt): treated as
    /// persisted with the caller's user and qty, and recorded as released.
    ReleasedUnrecorded { qty: i64, available: i64 },
    /// [`RedisGate::drop_hold`](super::RedisGate::drop_hold): the hold was forgotten and its
    /// units not returned; `available` is the unchanged counter.
    DroppedHold { qty: i64, available: i64 },
    /// Released before: nothing changed.
    AlreadyReleased,
    /// Nothing to release here: the order was refused, or (for the hold-only calls) it is
    /// persisted or unknown to the gate.
    NothingHeld,
    /// The gate has no counter for the product; nothing changed (the rebuild counts it).
    NotLoaded,
}

/// Where a release started: the state of the order's record when it was prepared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseFrom {
    /// An unpersisted hold (its units are in `held`).
    Hold,
    /// A reservation the database holds.
    Persisted,
    /// No record (it expired, or the gate was rebuilt): treated as persisted, with the
    /// caller's user and qty.
    Unrecorded,
}

impl ReleaseFrom {
    pub(super) fn parse(code: &str) -> Result<Self, GateError> {
        match code {
            "H" => Ok(Self::Hold),
            "P" => Ok(Self::Persisted),
            "M" => Ok(Self::Unrecorded),
            other => Err(GateError::Script(format!(
                "a release from unknown state {other:?}"
            ))),
        }
    }
}

/// The answer to [`RedisGate::prepare_release`](super::RedisGate::prepare_release) and
/// [`RedisGate::prepare_release_unpersisted`](super::RedisGate::prepare_release_unpersisted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrepareOutcome {
    /// The record is marked "being released" (again, for a retry); no units moved yet.
    Prepared { from: ReleaseFrom, qty: i64 },
    /// Released before: nothing changed.
    AlreadyReleased,
    /// Nothing to release here (refused, or, for the hold-only call, persisted or unknown).
    NothingHeld,
    /// The gate has no counter for the product; nothing changed (the rebuild counts it).
    NotLoaded,
}

/// The answer to [`RedisGate::finish_release`](super::RedisGate::finish_release) and
/// [`RedisGate::revert_release`](super::RedisGate::revert_release).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SettleOutcome {
    /// The units went back to the counter (`available` after).
    Released {
        from: ReleaseFrom,
        qty: i64,
        available: i64,
    },
    /// Prepared before the gate was rebuilt (or while it is missing): marked released without
    /// moving units, which the rebuild counts from the database.
    Stale { from: ReleaseFrom },
    /// The record went back to the state it came from.
    Reverted { from: ReleaseFrom },
    /// No release was prepared for the order (or it was settled already).
    NothingPrepared,
}

/// The answer to [`RedisGate::adjust`](super::RedisGate::adjust).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdjustOutcome {
    /// `applied` units were added (negative: removed); `clamped` when a write-off asked for
    /// more than the counter had.
    Applied {
        applied: i64,
        available: i64,
        clamped: bool,
    },
    /// This request id was seen before: nothing changed.
    Duplicate,
    /// The gate was rebuilt after the adjustment was committed, so it counted it already:
    /// nothing changed (and a repeat is a duplicate).
    Rebuilt,
    /// The gate has no counter for the product; nothing changed (the rebuild counts it).
    NotLoaded,
}

/// The answer to [`RedisGate::repair`](super::RedisGate::repair).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RepairOutcome {
    /// The counter went from `before` to `after` = database available − `held`; `clamped`
    /// when that was negative and the counter was set to 0 instead.
    Repaired {
        before: i64,
        after: i64,
        held: i64,
        clamped: bool,
    },
    /// [`RedisGate::repair_if_unchanged`](super::RedisGate::repair_if_unchanged) only: a
    /// change that follows the database landed since the snapshot; nothing changed.
    Stale { epoch: i64 },
    /// The gate has no counter for the product; nothing changed.
    NotLoaded,
}

/// A product's counters, read in one command.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GateSnapshot {
    pub available: i64,
    pub held: i64,
    /// Bumped by every change that follows a database change (mark persisted, release of a
    /// persisted order, adjust, repair) and reset from the clock by a rebuild.
    pub epoch: i64,
}

/// A hold the database never confirmed, for the expiry sweeper.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingHold {
    pub order_id: Uuid,
    pub user_id: String,
    pub qty: i64,
    pub reserved_at_ms: i64,
}

/// The answer to [`RedisGate::load_with_holds`](super::RedisGate::load_with_holds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadOutcome {
    /// The gate was missing and is loaded: `available` units on sale, `held` units of orders
    /// acknowledged but not yet persisted; `clamped` when those exceeded the database's figure
    /// and the counter was set to 0.
    Loaded {
        available: i64,
        held: i64,
        clamped: bool,
    },
    /// Another replica loaded it first; nothing changed.
    AlreadyLoaded,
}

/// An order to hold again when a gate is rebuilt: acknowledged to its buyer, not yet persisted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RebuiltHold {
    pub order_id: Uuid,
    pub user_id: String,
    pub qty: i64,
}
