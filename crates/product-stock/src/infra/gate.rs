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
//! hash is a flat list scanned on every access, and a reserve script was measured ~35% slower
//! with 1,000 ids in one hash. Sold-out refusals are not recorded: a flood on a sold-out product
//! costs no writes.
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

mod buckets;
mod keys;
mod maintenance;
mod outcome;
mod restart;
mod script;
mod write_off;

use std::time::Duration;

use uuid::Uuid;

pub use buckets::BucketState;
pub use keys::{
    MAX_QUANTITY, MAX_SAFE_INTEGER, ProductKeys, REFILLS_MAX_LEN, SKU_MAX_LEN, bucket_tag,
    product_tag, validate_sku,
};
pub use outcome::{
    AdjustOutcome, GateBuyers, GateError, GateSnapshot, LoadOutcome, PendingHold, PrepareOutcome,
    RebuiltHold, ReleaseFrom, ReleaseOutcome, RepairOutcome, ReserveOutcome, SettleOutcome,
};
pub use restart::{RunCheck, check_redis_run, on_connect};
pub use write_off::WriteOffOutcome;

use keys::{
    REQUEST_ID_MAX_LEN, validate_amount, validate_bucket, validate_prefix, validate_qty,
    validate_user,
};
use script::{LuaScript, Reply, int};
use write_off::adjust_outcome;

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

    /// The available counter and the users the gate counts as buyers of `sku` (holding or
    /// having bought units not released), in one atomic read; at most `max` users are listed.
    /// `known_refills` is the refills count of a list read before (`""`: none): while it is
    /// still the product's, no list is sent ([`GateBuyers::Unchanged`]), since no units came
    /// back that a new buyer could have taken.
    pub async fn buyers<'a>(
        &self,
        at: impl Into<At<'a>>,
        max: u32,
        known_refills: &str,
    ) -> Result<GateBuyers, GateError> {
        let k = self.keys_at(at.into())?;
        if known_refills.len() > REFILLS_MAX_LEN {
            return Err(GateError::InvalidInput(
                "known_refills must be at most 32 bytes",
            ));
        }
        let r = Reply::new(
            BUYERS
                .run(
                    &mut *self.conn().await?,
                    &[k.avail(), k.users(), k.refills()],
                    &[max.to_string(), known_refills.to_owned()],
                )
                .await?,
        )?;
        Ok(match r.code()? {
            "B" => {
                let users = match r.get(4)? {
                    deadpool_redis::redis::Value::Array(items) => items
                        .iter()
                        .map(|v| script::text(v).map(str::to_owned))
                        .collect::<Result<Vec<_>, _>>()?,
                    other => {
                        return Err(GateError::Script(format!(
                            "buyers: wanted a list of users, got {other:?}"
                        )));
                    }
                };
                GateBuyers::Listed {
                    available: r.int(1)?,
                    users,
                    refills: r.text(3)?.to_owned(),
                }
            }
            "U" => GateBuyers::Unchanged {
                available: r.int(1)?,
                count: r.int(2)?,
                refills: r.text(3)?.to_owned(),
            },
            "T" => GateBuyers::TooMany {
                available: r.int(1)?,
                count: r.int(2)?,
                refills: r.text(3)?.to_owned(),
            },
            "N" => GateBuyers::NotLoaded,
            other => return Err(unknown_code("buyers", other)),
        })
    }

    /// Takes `qty` units for `order_id`, atomically and once: checks the order's record
    /// (replay), the counter (`NotLoaded`, `SoldOut`), the per-user limit (0 = none) and the
    /// stock, then moves the units from `avail` to `held` and records the hold.
    pub async fn reserve<'a>(
        &self,
        at: impl Into<At<'a>>,
        order_id: Uuid,
        user_id: &str,
        qty: i64,
        per_user_limit: u32,
        now_ms: i64,
    ) -> Result<ReserveOutcome, GateError> {
        let at = at.into();
        let r = ReserveArgs {
            sku: at.sku,
            bucket: at.bucket,
            order_id,
            user_id,
            qty,
            per_user_limit,
            now_ms,
        };
        let (keys, args) = self.reserve_call(&r)?;
        reserve_outcome(RESERVE.run(&mut *self.conn().await?, &keys, &args).await?)
    }

    /// [`reserve`](Self::reserve) for many orders in one Redis round trip (a pipeline; each
    /// script still runs atomically on its own). One answer per item, in order.
    pub async fn reserve_many(
        &self,
        items: &[ReserveArgs<'_>],
    ) -> Result<Vec<Result<ReserveOutcome, GateError>>, GateError> {
        let mut calls = Vec::with_capacity(items.len());
        let mut answers: Vec<Option<Result<ReserveOutcome, GateError>>> =
            Vec::with_capacity(items.len());
        for r in items {
            match self.reserve_call(r) {
                Ok(call) => {
                    calls.push(Some(call));
                    answers.push(None);
                }
                Err(e) => {
                    calls.push(None);
                    answers.push(Some(Err(e)));
                }
            }
        }
        let batch: Vec<&(Vec<String>, Vec<String>)> = calls.iter().flatten().collect();
        let mut replies = RESERVE
            .run_many(&mut *self.conn().await?, &batch)
            .await?
            .into_iter();
        for (i, call) in calls.iter().enumerate() {
            if call.is_none() {
                continue;
            }
            answers[i] = Some(match replies.next() {
                Some(Ok(value)) => reserve_outcome(value),
                Some(Err(e)) => Err(e),
                None => Err(GateError::Script("reserve pipeline: missing reply".into())),
            });
        }
        Ok(answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|| Err(GateError::Script("no answer".into()))))
            .collect())
    }

    /// The keys and arguments of one reserve script call, after checking the input.
    fn reserve_call(&self, r: &ReserveArgs<'_>) -> Result<(Vec<String>, Vec<String>), GateError> {
        let (order_id, user_id, qty, per_user_limit, now_ms) =
            (r.order_id, r.user_id, r.qty, r.per_user_limit, r.now_ms);
        let k = self.keys_at(At::new(r.sku, r.bucket))?;
        validate_user(user_id)?;
        validate_qty(qty)?;
        validate_amount(now_ms, "now_ms must be 0..=2^53-1")?;
        let keys = vec![
            k.avail(),
            k.held(),
            k.pending(),
            k.users(),
            k.order(order_id),
            k.node(),
        ];
        let args = vec![
            order_id.hyphenated().to_string(),
            user_id.to_owned(),
            qty.to_string(),
            per_user_limit.to_string(),
            now_ms.to_string(),
            self.record_ttl_ms.clone(),
        ];
        Ok((keys, args))
    }

    /// The database now holds this reservation: the hold moves from H to P and its units leave
    /// `held`. `false` when there was nothing to do (not a hold, or done before).
    pub async fn mark_persisted<'a>(
        &self,
        at: impl Into<At<'a>>,
        order_id: Uuid,
    ) -> Result<bool, GateError> {
        let k = self.keys_at(at.into())?;
        let keys = [
            k.avail(),
            k.held(),
            k.pending(),
            k.order(order_id),
            k.epoch(),
        ];
        let args = [order_id.hyphenated().to_string()];
        let value = MARK_PERSISTED
            .run(&mut *self.conn().await?, &keys, &args)
            .await?;
        Ok(int(&value)? == 1)
    }

    /// [`mark_persisted`](Self::mark_persisted) for many orders in one Redis round trip (a
    /// pipeline; each script still runs atomically on its own). One answer per item, in order;
    /// `Err` as a whole only when Redis could not be asked at all.
    pub async fn mark_persisted_many(
        &self,
        items: &[(&str, Uuid)],
    ) -> Result<Vec<Result<bool, GateError>>, GateError> {
        let items: Vec<(At<'_>, Uuid)> = items
            .iter()
            .map(|(sku, id)| (At::from(*sku), *id))
            .collect();
        self.mark_persisted_many_at(&items).await
    }

    /// [`mark_persisted_many`](Self::mark_persisted_many), each order in its stock bucket.
    pub async fn mark_persisted_many_at(
        &self,
        items: &[(At<'_>, Uuid)],
    ) -> Result<Vec<Result<bool, GateError>>, GateError> {
        let mut calls = Vec::with_capacity(items.len());
        for (at, order_id) in items {
            let k = self.keys_at(*at)?;
            let keys = vec![
                k.avail(),
                k.held(),
                k.pending(),
                k.order(*order_id),
                k.epoch(),
            ];
            calls.push((keys, vec![order_id.hyphenated().to_string()]));
        }
        let batch: Vec<&(Vec<String>, Vec<String>)> = calls.iter().collect();
        let replies = MARK_PERSISTED
            .run_many(&mut *self.conn().await?, &batch)
            .await?;
        if replies.len() != items.len() {
            return Err(GateError::Script(format!(
                "mark_persisted pipeline: {} replies for {} calls",
                replies.len(),
                items.len()
            )));
        }
        Ok(replies
            .into_iter()
            .map(|r| r.and_then(|v| Ok(int(&v)? == 1)))
            .collect())
    }

    /// Gives the order's units back, once. A hold (H) returns from `held`; a persisted order (P)
    /// or one the gate has no record of is added to `avail` (the database released it first),
    /// using the record's user and qty when there is one, `user_id` and `qty` otherwise. Only
    /// for an order whose reservation the database holds: the gate keeps no record of a refusal,
    /// so an order it refused is one it has no record of (a cancel of an order the database
    /// never got goes to [`Self::release_unpersisted`]).
    pub async fn release<'a>(
        &self,
        at: impl Into<At<'a>>,
        order_id: Uuid,
        user_id: &str,
        qty: i64,
    ) -> Result<ReleaseOutcome, GateError> {
        validate_user(user_id)?;
        validate_qty(qty)?;
        self.run_release(at.into(), order_id, user_id, qty, "any")
            .await
    }

    /// Gives back the units of a hold the database never got (H only): for an order cancelled
    /// or expired before its reservation was persisted. Anything else is `NothingHeld`.
    pub async fn release_unpersisted<'a>(
        &self,
        at: impl Into<At<'a>>,
        order_id: Uuid,
    ) -> Result<ReleaseOutcome, GateError> {
        self.run_release(at.into(), order_id, "-", 1, "hold").await
    }

    /// Forgets a hold (H only) without giving its units back: the database refused the
    /// reservation for lack of stock, so the gate had admitted units that do not exist.
    pub async fn drop_hold<'a>(
        &self,
        at: impl Into<At<'a>>,
        order_id: Uuid,
    ) -> Result<ReleaseOutcome, GateError> {
        self.run_release(at.into(), order_id, "-", 1, "drop").await
    }

    /// The first half of a release that follows a database change, called inside the database
    /// transaction that releases the order's reservation, under its stock row lock: the record
    /// moves to "being released" and no units move yet. After the commit,
    /// [`finish_release`](Self::finish_release) gives them back; if the transaction rolls back,
    /// its retry prepares again (a no-op) and the reconciler reverts what no retry finishes.
    /// Giving units back only after the commit keeps the gate from selling units the database
    /// still counts as reserved. `user_id` and `qty` serve when the gate has no record.
    pub async fn prepare_release<'a>(
        &self,
        at: impl Into<At<'a>>,
        order_id: Uuid,
        user_id: &str,
        qty: i64,
    ) -> Result<PrepareOutcome, GateError> {
        validate_user(user_id)?;
        validate_qty(qty)?;
        self.run_prepare(at.into(), order_id, user_id, qty, "any")
            .await
    }

    /// [`prepare_release`](Self::prepare_release) of a hold the database never got (H only):
    /// for a tombstone written in the transaction. Anything else is `NothingHeld`.
    pub async fn prepare_release_unpersisted<'a>(
        &self,
        at: impl Into<At<'a>>,
        order_id: Uuid,
    ) -> Result<PrepareOutcome, GateError> {
        self.run_prepare(at.into(), order_id, "-", 1, "hold").await
    }

    async fn run_prepare(
        &self,
        at: At<'_>,
        order_id: Uuid,
        user_id: &str,
        qty: i64,
        mode: &str,
    ) -> Result<PrepareOutcome, GateError> {
        let k = self.keys_at(at)?;
        let keys = [
            k.avail(),
            k.order(order_id),
            k.releasing(),
            k.generation(),
            k.pending(),
        ];
        let args = [
            order_id.hyphenated().to_string(),
            user_id.to_owned(),
            qty.to_string(),
            self.record_ttl_ms.clone(),
            mode.to_owned(),
            chrono::Utc::now().timestamp_millis().to_string(),
        ];
        let r = Reply::new(
            PREPARE_RELEASE
                .run(&mut *self.conn().await?, &keys, &args)
                .await?,
        )?;
        match r.code()? {
            "B" => Ok(PrepareOutcome::Prepared {
                from: ReleaseFrom::parse(r.text(1)?)?,
                qty: r.int(2)?,
            }),
            "X" => Ok(PrepareOutcome::AlreadyReleased),
            "F" => Ok(PrepareOutcome::NothingHeld),
            "N" => Ok(PrepareOutcome::NotLoaded),
            other => Err(unknown_code("prepare_release", other)),
        }
    }

    /// The second half of a release: the database has released the order's reservation, so
    /// its units go back to the counter, once. Nothing happens if no release was prepared (or
    /// it was settled already); a release prepared before the gate was rebuilt is settled
    /// without moving units, since the rebuild counted them from the database.
    pub async fn finish_release<'a>(
        &self,
        at: impl Into<At<'a>>,
        order_id: Uuid,
    ) -> Result<SettleOutcome, GateError> {
        self.run_settle(at.into(), order_id, "finish").await
    }

    /// Undoes a prepared release whose database transaction rolled back and was not retried:
    /// the record returns to the state it came from.
    pub async fn revert_release<'a>(
        &self,
        at: impl Into<At<'a>>,
        order_id: Uuid,
    ) -> Result<SettleOutcome, GateError> {
        self.run_settle(at.into(), order_id, "revert").await
    }

    async fn run_settle(
        &self,
        at: At<'_>,
        order_id: Uuid,
        mode: &str,
    ) -> Result<SettleOutcome, GateError> {
        let k = self.keys_at(at)?;
        let keys = [
            k.avail(),
            k.held(),
            k.pending(),
            k.users(),
            k.order(order_id),
            k.epoch(),
            k.refills(),
            k.releasing(),
            k.generation(),
        ];
        let args = [
            order_id.hyphenated().to_string(),
            mode.to_owned(),
            chrono::Utc::now().timestamp_millis().to_string(),
            self.released_ttl_ms.clone(),
        ];
        let r = Reply::new(
            SETTLE_RELEASE
                .run(&mut *self.conn().await?, &keys, &args)
                .await?,
        )?;
        match r.code()? {
            "F" => Ok(SettleOutcome::NothingPrepared),
            "S" => Ok(SettleOutcome::Stale {
                from: ReleaseFrom::parse(r.text(1)?)?,
            }),
            "R" => Ok(SettleOutcome::Reverted {
                from: ReleaseFrom::parse(r.text(1)?)?,
            }),
            code => Ok(SettleOutcome::Released {
                from: ReleaseFrom::parse(code)?,
                qty: r.int(1)?,
                available: r.int(2)?,
            }),
        }
    }

    /// Orders of `sku` whose release was prepared before `cutoff_ms` and is not settled yet
    /// (at most `limit`), oldest first.
    pub async fn releasing_older_than<'a>(
        &self,
        at: impl Into<At<'a>>,
        cutoff_ms: i64,
        limit: usize,
    ) -> Result<Vec<Uuid>, GateError> {
        let k = self.keys_at(at.into())?;
        let ids: Vec<String> = deadpool_redis::redis::cmd("ZRANGEBYSCORE")
            .arg(k.releasing())
            .arg("-inf")
            .arg(cutoff_ms)
            .arg("LIMIT")
            .arg(0)
            .arg(limit)
            .query_async(&mut *self.conn().await?)
            .await
            .map_err(script::redis_error)?;
        ids.iter()
            .map(|id| {
                Uuid::parse_str(id).map_err(|_| {
                    GateError::Script(format!("releasing set holds a bad order id {id:?}"))
                })
            })
            .collect()
    }

    async fn run_release(
        &self,
        at: At<'_>,
        order_id: Uuid,
        user_id: &str,
        qty: i64,
        mode: &str,
    ) -> Result<ReleaseOutcome, GateError> {
        let k = self.keys_at(at)?;
        let keys = [
            k.avail(),
            k.held(),
            k.pending(),
            k.users(),
            k.order(order_id),
            k.epoch(),
            k.refills(),
        ];
        let args = [
            order_id.hyphenated().to_string(),
            user_id.to_owned(),
            qty.to_string(),
            self.released_ttl_ms.clone(),
            mode.to_owned(),
        ];
        let r = Reply::new(RELEASE.run(&mut *self.conn().await?, &keys, &args).await?)?;
        let code = r.code()?;
        let released = |make: fn(i64, i64) -> ReleaseOutcome| Ok(make(r.int(1)?, r.int(2)?));
        match code {
            "H" => released(|qty, available| ReleaseOutcome::ReleasedHold { qty, available }),
            "P" => released(|qty, available| ReleaseOutcome::ReleasedPersisted { qty, available }),
            "M" => released(|qty, available| ReleaseOutcome::ReleasedUnrecorded { qty, available }),
            "D" => released(|qty, available| ReleaseOutcome::DroppedHold { qty, available }),
            "X" => Ok(ReleaseOutcome::AlreadyReleased),
            "F" => Ok(ReleaseOutcome::NothingHeld),
            "N" => Ok(ReleaseOutcome::NotLoaded),
            other => Err(unknown_code("release", other)),
        }
    }

    /// Rebuilds a product's gate after Redis lost it: sets `avail` (computed by the caller from
    /// the database), `held` = 0 and the users hash — only if `avail` is missing, atomically, so
    /// replicas rebuilding at once count the stock once. Returns whether it loaded.
    pub async fn load<'a>(
        &self,
        at: impl Into<At<'a>>,
        available: i64,
        users: &[(String, i64)],
    ) -> Result<bool, GateError> {
        let now_ms = chrono::Utc::now().timestamp_millis();
        Ok(matches!(
            self.load_with_holds(at, available, users, &[], now_ms)
                .await?,
            LoadOutcome::Loaded { .. }
        ))
    }

    /// [`load`](Self::load), with `holds`: orders acknowledged to their buyers whose
    /// reservation the database does not have yet. Each comes back as a hold reserved at
    /// `now_ms` (unless its record survived and moved on): its units leave `available`, its
    /// buyer counts them, and `order.created` marks it persisted as usual.
    pub async fn load_with_holds<'a>(
        &self,
        at: impl Into<At<'a>>,
        available: i64,
        users: &[(String, i64)],
        holds: &[RebuiltHold],
        now_ms: i64,
    ) -> Result<LoadOutcome, GateError> {
        self.load_in_generation(at.into(), available, users, holds, now_ms, "")
            .await
    }

    /// [`load_with_holds`](Self::load_with_holds) of one bucket, setting its generation to
    /// `generation` (`""`: a fresh one from the clock). Every bucket of a product loaded
    /// together gets the same generation, so transfers between them can tell a rebuild.
    pub(super) async fn load_in_generation(
        &self,
        at: At<'_>,
        available: i64,
        users: &[(String, i64)],
        holds: &[RebuiltHold],
        now_ms: i64,
        generation: &str,
    ) -> Result<LoadOutcome, GateError> {
        let k = self.keys_at(at)?;
        validate_amount(available, "available must be 0..=2^53-1")?;
        validate_amount(now_ms, "now_ms must be 0..=2^53-1")?;
        let listed: Vec<&(String, i64)> = users.iter().filter(|(_, units)| *units > 0).collect();
        let mut args = Vec::with_capacity(5 + 2 * listed.len() + 3 * holds.len());
        args.push(available.to_string());
        args.push(now_ms.to_string());
        args.push(self.record_ttl_ms.clone());
        args.push(generation.to_owned());
        args.push(listed.len().to_string());
        for (user, units) in listed {
            validate_user(user)?;
            validate_amount(*units, "units per user must be 0..=2^53-1")?;
            args.push(user.clone());
            args.push(units.to_string());
        }
        let mut keys = vec![
            k.avail(),
            k.held(),
            k.pending(),
            k.users(),
            k.epoch(),
            k.refills(),
            k.releasing(),
            k.generation(),
            k.moving(),
            k.transfers(),
            k.node(),
        ];
        for h in holds {
            validate_user(&h.user_id)?;
            validate_qty(h.qty)?;
            keys.push(k.order(h.order_id));
            args.push(h.order_id.hyphenated().to_string());
            args.push(h.user_id.clone());
            args.push(h.qty.to_string());
        }
        let r = Reply::new(LOAD.run(&mut *self.conn().await?, &keys, &args).await?)?;
        match r.int(0)? {
            1 => Ok(LoadOutcome::Loaded {
                available: r.int(1)?,
                held: r.int(2)?,
                clamped: r.int(3)? == 1,
            }),
            0 => Ok(LoadOutcome::AlreadyLoaded),
            other => Err(unknown_code("load", &other.to_string())),
        }
    }

    /// Applies a restock (+) or write-off (−) once per `request_id`. A write-off never drives
    /// the counter below zero: it is clamped and reported.
    pub async fn adjust<'a>(
        &self,
        at: impl Into<At<'a>>,
        request_id: &str,
        delta: i64,
    ) -> Result<AdjustOutcome, GateError> {
        self.adjust_in_generation(at, request_id, delta, "").await
    }

    /// [`adjust`](Self::adjust), only while the product's gate is in `generation` (as read by
    /// [`generation`](Self::generation) under the stock row lock of the transaction that
    /// adjusted the database; `""`: any): a gate rebuilt since then read the database after
    /// that commit and counted the adjustment, so it answers `Rebuilt` and changes nothing.
    pub async fn adjust_in_generation<'a>(
        &self,
        at: impl Into<At<'a>>,
        request_id: &str,
        delta: i64,
        generation: &str,
    ) -> Result<AdjustOutcome, GateError> {
        Ok(self
            .run_adjust(at.into(), request_id, delta, generation)
            .await?
            .0)
    }

    /// [`adjust_in_generation`](Self::adjust_in_generation) of one bucket; with a duplicate,
    /// what the first application changed (`None`: not recorded, or not applied then).
    pub(super) async fn run_adjust(
        &self,
        at: At<'_>,
        request_id: &str,
        delta: i64,
        generation: &str,
    ) -> Result<(AdjustOutcome, Option<i64>), GateError> {
        let r = self
            .adjust_script(at, request_id, delta, generation, "")
            .await?;
        adjust_outcome(&r)
    }

    /// Runs `adjust.lua` on one bucket; `db_free` is its ARGV 4 (`""`: apply, clamping a
    /// write-off at zero; a figure: an admin's write-off, refused unless it fits).
    async fn adjust_script(
        &self,
        at: At<'_>,
        request_id: &str,
        delta: i64,
        generation: &str,
        db_free: &str,
    ) -> Result<Reply, GateError> {
        let k = self.keys_at(at)?;
        if request_id.is_empty() || request_id.len() > REQUEST_ID_MAX_LEN {
            return Err(GateError::InvalidInput("request_id must be 1..=128 bytes"));
        }
        validate_amount(delta.saturating_abs(), "delta must be within ±(2^53-1)")?;
        if generation.len() > GENERATION_MAX_LEN {
            return Err(GateError::InvalidInput(
                "generation must be at most 32 bytes",
            ));
        }
        let keys = [
            k.avail(),
            k.adjustment(request_id),
            k.epoch(),
            k.refills(),
            k.generation(),
            k.held(),
        ];
        let args = [
            delta.to_string(),
            self.record_ttl_ms.clone(),
            generation.to_owned(),
            db_free.to_owned(),
        ];
        Reply::new(ADJUST.run(&mut *self.conn().await?, &keys, &args).await?)
    }

    /// The product's gate generation, set afresh by every load: [`NOT_LOADED_GENERATION`] when
    /// the gate has no counter for it, `""` for a gate loaded before generations existed.
    pub async fn generation<'a>(&self, at: impl Into<At<'a>>) -> Result<String, GateError> {
        let k = self.keys_at(at.into())?;
        let (avail, generation): (Option<String>, Option<String>) =
            deadpool_redis::redis::cmd("MGET")
                .arg(k.avail())
                .arg(k.generation())
                .query_async(&mut *self.conn().await?)
                .await
                .map_err(script::redis_error)?;
        Ok(match avail {
            None => NOT_LOADED_GENERATION.to_owned(),
            Some(_) => generation.unwrap_or_default(),
        })
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

/// One reservation of [`RedisGate::reserve_many`].
#[derive(Clone, Copy, Debug)]
pub struct ReserveArgs<'a> {
    pub sku: &'a str,
    /// The stock bucket to reserve in (0 for a product without buckets).
    pub bucket: u32,
    pub order_id: Uuid,
    pub user_id: &'a str,
    pub qty: i64,
    pub per_user_limit: u32,
    pub now_ms: i64,
}

/// Reads the reserve script's reply.
fn reserve_outcome(value: deadpool_redis::redis::Value) -> Result<ReserveOutcome, GateError> {
    let r = Reply::new(value)?;
    Ok(match r.code()? {
        "H" => ReserveOutcome::Reserved {
            remaining: r.int(1)?,
            replayed: false,
        },
        "S" => ReserveOutcome::SoldOut,
        "L" => ReserveOutcome::UserLimitExceeded { bought: r.int(1)? },
        "I" => ReserveOutcome::InsufficientStock {
            available: r.int(1)?,
        },
        "N" => ReserveOutcome::NotLoaded,
        "C" => ReserveOutcome::Mismatch,
        "R" => match r.text(1)? {
            "H" | "P" => ReserveOutcome::Reserved {
                remaining: r.int(2)?,
                replayed: true,
            },
            "L" => ReserveOutcome::UserLimitExceeded { bought: r.int(2)? },
            "I" => ReserveOutcome::InsufficientStock {
                available: r.int(2)?,
            },
            "X" | "B" => ReserveOutcome::Released,
            other => {
                return Err(GateError::Script(format!(
                    "order record in unknown state {other:?}"
                )));
            }
        },
        other => return Err(unknown_code("reserve", other)),
    })
}
fn unknown_code(script: &str, code: &str) -> GateError {
    GateError::Script(format!("{script} script answered unknown code {code:?}"))
}
