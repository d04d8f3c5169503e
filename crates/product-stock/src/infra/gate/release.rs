//! Giving an order's units back: at once for a hold the database never got ([`RedisGate::release`]
//! and its variants, `release.lua`), or in two halves around the database transaction that
//! releases a persisted reservation ([`RedisGate::prepare_release`], then
//! [`RedisGate::finish_release`] or [`RedisGate::revert_release`]; `prepare_release.lua`,
//! `settle_release.lua`).

use uuid::Uuid;

use super::keys::{validate_qty, validate_user};
use super::script::Reply;
use super::{
    At, GateError, PREPARE_RELEASE, PrepareOutcome, RELEASE, RedisGate, ReleaseFrom,
    ReleaseOutcome, SETTLE_RELEASE, SettleOutcome, script, unknown_code,
};

/// Which records a release may act on (`release.lua` / `prepare_release.lua` ARGV 5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReleaseMode {
    /// A hold (H), a persisted order (P) or an order with no record: the database released it.
    Any,
    /// A hold (H) only: the database never had the order.
    Hold,
    /// A hold (H) only, forgotten without giving its units back.
    Drop,
}

impl ReleaseMode {
    fn as_arg(self) -> &'static str {
        match self {
            Self::Any => "any",
            Self::Hold => "hold",
            Self::Drop => "drop",
        }
    }
}

/// The second half of a prepared release (`settle_release.lua` ARGV 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Settle {
    /// The database committed the release: the units go back.
    Finish,
    /// The database transaction rolled back: the record returns to where it was.
    Revert,
}

impl Settle {
    fn as_arg(self) -> &'static str {
        match self {
            Self::Finish => "finish",
            Self::Revert => "revert",
        }
    }
}

impl RedisGate {
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
        self.run_release(at.into(), order_id, user_id, qty, ReleaseMode::Any)
            .await
    }

    /// Gives back the units of a hold the database never got (H only): for an order cancelled
    /// or expired before its reservation was persisted. Anything else is `NothingHeld`.
    pub async fn release_unpersisted<'a>(
        &self,
        at: impl Into<At<'a>>,
        order_id: Uuid,
    ) -> Result<ReleaseOutcome, GateError> {
        self.run_release(at.into(), order_id, "-", 1, ReleaseMode::Hold)
            .await
    }

    /// Forgets a hold (H only) without giving its units back: the database refused the
    /// reservation for lack of stock, so the gate had admitted units that do not exist.
    pub async fn drop_hold<'a>(
        &self,
        at: impl Into<At<'a>>,
        order_id: Uuid,
    ) -> Result<ReleaseOutcome, GateError> {
        self.run_release(at.into(), order_id, "-", 1, ReleaseMode::Drop)
            .await
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
        self.run_prepare(at.into(), order_id, user_id, qty, ReleaseMode::Any)
            .await
    }

    /// [`prepare_release`](Self::prepare_release) of a hold the database never got (H only):
    /// for a tombstone written in the transaction. Anything else is `NothingHeld`.
    pub async fn prepare_release_unpersisted<'a>(
        &self,
        at: impl Into<At<'a>>,
        order_id: Uuid,
    ) -> Result<PrepareOutcome, GateError> {
        self.run_prepare(at.into(), order_id, "-", 1, ReleaseMode::Hold)
            .await
    }

    async fn run_prepare(
        &self,
        at: At<'_>,
        order_id: Uuid,
        user_id: &str,
        qty: i64,
        mode: ReleaseMode,
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
            mode.as_arg().to_owned(),
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
        self.run_settle(at.into(), order_id, Settle::Finish).await
    }

    /// Undoes a prepared release whose database transaction rolled back and was not retried:
    /// the record returns to the state it came from.
    pub async fn revert_release<'a>(
        &self,
        at: impl Into<At<'a>>,
        order_id: Uuid,
    ) -> Result<SettleOutcome, GateError> {
        self.run_settle(at.into(), order_id, Settle::Revert).await
    }

    async fn run_settle(
        &self,
        at: At<'_>,
        order_id: Uuid,
        mode: Settle,
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
            mode.as_arg().to_owned(),
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
        mode: ReleaseMode,
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
            mode.as_arg().to_owned(),
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
}
