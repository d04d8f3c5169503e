//! The Redis stock gate (docs/architecture.md#the-stock-model,
//! docs/adr/0001-gate-in-redis-before-the-database.md): atomic Lua scripts that admit or refuse
//! buyers in one round trip, so the database only ever sees orders that already hold their units.
//!
//! # Key layout
//!
//! All keys of one stock bucket share one Redis Cluster hash tag, so every script touches one
//! slot. A product without buckets has one, bucket 0, tagged `{p:SKU}`; a product created with
//! N stock buckets (docs/architecture.md#stock-buckets, `gate/buckets.rs`) also has buckets 1..N−1,
//! tagged `{p:SKU:b}`, each with every key below (written here for bucket 0). With `P` the
//! gate's key prefix:
//!
//! | key | type | holds |
//! |---|---|---|
//! | `Pstock:{p:SKU}:avail` | string | units the gate may still hand out |
//! | `Pstock:{p:SKU}:held` | string | Σ qty of holds the database does not have yet |
//! | `Pstock:{p:SKU}:pending` | sorted set | order id → reserve time (ms) of those holds |
//! | `Pstock:{p:SKU}:users` | hash | user id → units bought through the gate, not released |
//! | `Pstock:{p:SKU}:epoch` | string | bumped by every change that follows a database change |
//! | `Pstock:{p:SKU}:refills` | string | bumped by every change that may give units back |
//! | `Pstock:{p:SKU}:generation` | string | set afresh by every load (rebuild) |
//! | `Pstock:{p:SKU}:releasing` | sorted set | order id → time (ms) of releases prepared, not settled |
//! | `Pstock:{p:SKU}:o:<order id>` | hash, TTL | the order's record: `s` state, `q` qty, `u` user, `n` first answer |
//! | `Pstock:{p:SKU}:adj:<request id>` | string, TTL | an applied restock / write-off: `A:<units applied>` |
//! | `Pstock:{p:SKU}:moving` | string | units taken out of this bucket for another, not landed yet |
//! | `Pstock:{p:SKU}:xfers` | hash | transfer id → `to:qty:generation:taken at ms` of transfers out of this bucket not settled |
//! | `Pstock:{p:SKU}:xin:<transfer id>` | string | what became of a transfer into this bucket: `G` landed (no TTL; deleted once the donor settled), `C` cancelled or `S` stale (TTL) |
//! | `Pstock:{p:SKU}:rebuild_after` | string, TTL | bucket 0 only: while the product is missing, when it may be rebuilt |
//!
//! The last three parts exist only for products with buckets (`moving` and `xfers` are created
//! by the first transfer), so a product without buckets has exactly the keys it always had. A
//! buyer's orders all live in bucket `FNV-1a(user id) mod N` ([`crate::domain::bucket_of`]).
//!
//! Order states: `H` held (not in the database yet), `P` persisted, `B` being released (the
//! database transaction releasing it is open or has just committed; `f` the state it came from,
//! `g` the generation it was prepared in), `X` released, `L` / `I` refused (user limit /
//! insufficient stock). One key per order rather than one hash of all
//! orders keeps every hash small: up to `hash-max-listpack-entries` (512 on Debian's build) a
//! hash is a flat list scanned on every access, so one hash of every order would slow each
//! reservation as the sale grows. Sold-out refusals are not recorded: a flood on a sold-out
//! product costs no writes.
//!
//! # Invariant
//!
//! `avail + held == on_hand − reserved` in the database (`== on_hand` under `COMMIT_AT_ORDER`;
//! docs/invariants.md, invariant 3); with buckets, `Σ (avail + held + moving)` over the buckets,
//! `moving` counted until the transfer lands.
//! Each script keeps it: reserve moves q from `avail` to `held`; mark-persisted takes q out of
//! `held` as the database's `reserved` grew by q; releasing a hold moves q from `held` back to
//! `avail`; releasing a persisted order adds q to `avail` as `reserved` shrank by q. A missing
//! `avail` means the gate was lost: scripts then change nothing and answer `NotLoaded`, and the
//! service rebuilds the product from the database with [`RedisGate::load`].

mod adjust;
mod buckets;
mod keys;
mod load;
mod maintenance;
mod outcome;
mod release;
mod reserve;
mod restart;
mod script;
mod transfer;

use std::time::Duration;

pub use adjust::WriteOffOutcome;
pub use buckets::BucketState;
pub use keys::{
    MAX_QUANTITY, MAX_SAFE_INTEGER, ProductKeys, REFILLS_MAX_LEN, SKU_MAX_LEN, bucket_tag,
    product_tag, validate_sku,
};
pub use outcome::{
    AdjustOutcome, GateBuyers, GateError, GateSnapshot, LoadOutcome, PendingHold, PrepareOutcome,
    RebuiltHold, ReleaseFrom, ReleaseOutcome, RepairOutcome, ReserveOutcome, SettleOutcome,
};
pub use reserve::{ReserveArgs, SaleWindow};
pub use restart::{RunCheck, check_redis_run, on_connect};

use keys::{validate_bucket, validate_prefix};
use script::LuaScript;

static RESERVE: LuaScript = LuaScript::new("reserve", include_str!("gate/lua/reserve.lua"));
static MARK_PERSISTED: LuaScript = LuaScript::new(
    "mark_persisted",
    include_str!("gate/lua/mark_persisted.lua"),
);
static RELEASE: LuaScript = LuaScript::new("release", include_str!("gate/lua/release.lua"));
static PREPARE_RELEASE: LuaScript = LuaScript::new(
    "prepare_release",
    include_str!("gate/lua/prepare_release.lua"),
);
static SETTLE_RELEASE: LuaScript = LuaScript::new(
    "settle_release",
    include_str!("gate/lua/settle_release.lua"),
);
static ADJUST: LuaScript = LuaScript::new("adjust", include_str!("gate/lua/adjust.lua"));
static UNDO_ADJUST: LuaScript =
    LuaScript::new("undo_adjust", include_str!("gate/lua/undo_adjust.lua"));
static LOAD: LuaScript = LuaScript::new("load", include_str!("gate/lua/load.lua"));
static REPAIR: LuaScript = LuaScript::new("repair", include_str!("gate/lua/repair.lua"));
static PENDING: LuaScript = LuaScript::new("pending", include_str!("gate/lua/pending.lua"));
static BUYERS: LuaScript = LuaScript::new("buyers", include_str!("gate/lua/buyers.lua"));
static TAKE: LuaScript = LuaScript::new("take", include_str!("gate/lua/take.lua"));
static LAND: LuaScript = LuaScript::new("land", include_str!("gate/lua/land.lua"));
static SETTLE_TRANSFER: LuaScript = LuaScript::new(
    "settle_transfer",
    include_str!("gate/lua/settle_transfer.lua"),
);

/// The generation of a product whose gate is not loaded: no load ever writes it, so an
/// adjustment committed while the gate was missing never applies to the gate rebuilt after it.
pub const NOT_LOADED_GENERATION: &str = "-";

/// Longest generation the gate accepts (a load writes 16 digits).
const GENERATION_MAX_LEN: usize = 32;

/// Shortest TTL of order records and adjustment markers: below it a replay would find nothing.
const MIN_RECORD_TTL: Duration = Duration::from_secs(1);

/// How long an order's record lives once its release is settled, unless
/// [`RedisGate::with_released_record_ttl`] says otherwise (`stock.released_record_ttl_ms`).
pub const DEFAULT_RELEASED_RECORD_TTL: Duration = Duration::from_secs(300);

/// The stock gate of every product, over a Redis connection pool. Cheap to clone.
#[derive(Clone)]
pub struct RedisGate {
    pool: flashsale_platform::redis::Pool,
    prefix: String,
    record_ttl_ms: String,
    /// The TTL of a record once its release is settled (state X): short, so a buyer ordering
    /// and cancelling in a loop does not grow Redis.
    released_ttl_ms: String,
}

impl std::fmt::Debug for RedisGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisGate")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisGate {
    /// `key_prefix` goes in front of every key (e.g. `"fs:"`; no braces). `order_ttl` is how
    /// long order records and adjustment markers live (at least one second), i.e. how long a
    /// replay is recognised.
    pub fn new(
        pool: flashsale_platform::redis::Pool,
        key_prefix: impl Into<String>,
        order_ttl: Duration,
    ) -> Self {
        let ttl_ms = order_ttl.max(MIN_RECORD_TTL).as_millis();
        Self {
            pool,
            prefix: key_prefix.into(),
            record_ttl_ms: ttl_ms.min(MAX_SAFE_INTEGER as u128).to_string(),
            released_ttl_ms: String::new(),
        }
        .with_released_record_ttl(DEFAULT_RELEASED_RECORD_TTL.min(order_ttl))
    }

    /// How long an order's record lives once its release is settled (at least one second):
    /// within it a replay of the order's CreateOrder is answered from the record
    /// (`ORDER_CANCELLED`, or the cancelled order); after it, from the order service's database.
    pub fn with_released_record_ttl(mut self, ttl: Duration) -> Self {
        let ms = ttl.max(MIN_RECORD_TTL).as_millis();
        self.released_ttl_ms = ms.min(MAX_SAFE_INTEGER as u128).to_string();
        self
    }

    /// The keys of `sku`, after checking it and the prefix.
    pub fn keys(&self, sku: &str) -> Result<ProductKeys, GateError> {
        validate_prefix(&self.prefix)?;
        validate_sku(sku)?;
        Ok(ProductKeys::new(&self.prefix, sku))
    }

    /// The keys of one stock bucket, after checking the sku, the bucket and the prefix.
    pub fn keys_at(&self, at: At<'_>) -> Result<ProductKeys, GateError> {
        validate_prefix(&self.prefix)?;
        validate_sku(at.sku)?;
        validate_bucket(at.bucket)?;
        Ok(ProductKeys::in_bucket(&self.prefix, at.sku, at.bucket))
    }

    /// Loads every script into the server's cache; optional (scripts load on first use), but
    /// lets start-up fail early when Redis refuses scripts.
    pub async fn load_scripts(&self) -> Result<(), GateError> {
        let mut conn = self.conn().await?;
        for script in [
            &RESERVE,
            &MARK_PERSISTED,
            &RELEASE,
            &PREPARE_RELEASE,
            &SETTLE_RELEASE,
            &ADJUST,
            &UNDO_ADJUST,
            &LOAD,
            &REPAIR,
            &PENDING,
            &BUYERS,
            &TAKE,
            &LAND,
            &SETTLE_TRANSFER,
        ] {
            script.load(&mut conn).await?;
        }
        Ok(())
    }

    async fn conn(&self) -> Result<flashsale_platform::redis::Connection, GateError> {
        self.pool
            .get()
            .await
            .map_err(|e| GateError::Unavailable(format!("redis pool: {e}")))
    }
}

/// One stock bucket of a product: where a gate script runs. A plain sku means its bucket 0,
/// the only bucket of a product created without buckets, whose keys are the ones the gate
/// always used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct At<'a> {
    pub sku: &'a str,
    pub bucket: u32,
}

impl<'a> At<'a> {
    pub fn new(sku: &'a str, bucket: u32) -> Self {
        Self { sku, bucket }
    }
}

impl<'a> From<&'a str> for At<'a> {
    fn from(sku: &'a str) -> Self {
        Self { sku, bucket: 0 }
    }
}

impl<'a> From<&'a String> for At<'a> {
    fn from(sku: &'a String) -> Self {
        Self { sku, bucket: 0 }
    }
}

fn unknown_code(script: &str, code: &str) -> GateError {
    GateError::Script(format!("{script} script answered unknown code {code:?}"))
}
