//! The gate's maintenance side: reading its counters, the expiry sweep's view of unpersisted
//! holds, repairing drift from the database, and deleting a product.

use deadpool_redis::redis::{self, Value};
use flashsale_platform::redis::KeyScan;
use uuid::Uuid;

use super::script::{LuaScript, Reply, int, redis_error, text};
use super::{At, GateError, GateSnapshot, PENDING, PendingHold, REPAIR, RedisGate, RepairOutcome};
use super::{keys::validate_amount, unknown_code};

/// Most holds one `pending_older_than` call returns.
const MAX_PENDING_BATCH: usize = 10_000;

static UNMARK_PERSISTED: LuaScript =
    LuaScript::new("unmark_persisted", include_str!("lua/unmark_persisted.lua"));

impl RedisGate {
    /// The product's counters, or `None` when the gate has not loaded it.
    pub async fn snapshot<'a>(
        &self,
        at: impl Into<At<'a>>,
    ) -> Result<Option<GateSnapshot>, GateError> {
        let k = self.keys_at(at.into())?;
        let values: Vec<Value> = redis::cmd("MGET")
            .arg(k.avail())
            .arg(k.held())
            .arg(k.epoch())
            .query_async(&mut *self.conn().await?)
            .await
            .map_err(redis_error)?;
        let optional = |i: usize| match values.get(i) {
            None | Some(Value::Nil) => Ok(None),
            Some(v) => int(v).map(Some),
        };
        let Some(available) = optional(0)? else {
            return Ok(None);
        };
        Ok(Some(GateSnapshot {
            available,
            held: optional(1)?.unwrap_or(0),
            epoch: optional(2)?.unwrap_or(0),
        }))
    }

    /// How many ms a rebuild of the missing gate of `sku` must still wait: the first call after
    /// the loss starts the wait (`settle_ms` from `now_ms`), later ones count it down; 0 once it
    /// is over. [`Self::rebuild_done`] clears it, so the next loss waits again.
    pub async fn rebuild_not_before(
        &self,
        sku: &str,
        now_ms: i64,
        settle_ms: i64,
    ) -> Result<i64, GateError> {
        let k = self.keys(sku)?;
        validate_amount(now_ms, "now_ms must be 0..=2^53-1")?;
        validate_amount(settle_ms, "settle_ms must be 0..=2^53-1")?;
        let mut conn = self.conn().await?;
        // The marker outlives its wait by a minute, so a gate that nobody rebuilds is not kept
        // closed by a marker forever.
        let _: Value = redis::cmd("SET")
            .arg(k.rebuild_after())
            .arg(now_ms.saturating_add(settle_ms))
            .arg("NX")
            .arg("PX")
            .arg(settle_ms.saturating_add(60_000))
            .query_async(&mut *conn)
            .await
            .map_err(redis_error)?;
        let after: Value = redis::cmd("GET")
            .arg(k.rebuild_after())
            .query_async(&mut *conn)
            .await
            .map_err(redis_error)?;
        let after = match after {
            Value::Nil => return Ok(0),
            v => int(&v)?,
        };
        Ok((after - now_ms).max(0))
    }

    /// Clears the rebuild wait of `sku` once its gate is loaded again.
    pub async fn rebuild_done(&self, sku: &str) -> Result<(), GateError> {
        let k = self.keys(sku)?;
        let _: Value = redis::cmd("DEL")
            .arg(k.rebuild_after())
            .query_async(&mut *self.conn().await?)
            .await
            .map_err(redis_error)?;
        Ok(())
    }

    /// Holds reserved strictly before `cutoff_ms` that the database never confirmed, oldest
    /// first, at most `limit` (≤ 10,000). Entries whose record moved on or expired are pruned.
    pub async fn pending_older_than<'a>(
        &self,
        at: impl Into<At<'a>>,
        cutoff_ms: i64,
        limit: usize,
    ) -> Result<Vec<PendingHold>, GateError> {
        let at = at.into();
        let (sku, bucket) = (at.sku, at.bucket);
        let k = self.keys_at(at)?;
        if limit > MAX_PENDING_BATCH {
            return Err(GateError::InvalidInput("limit must be at most 10000"));
        }
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut conn = self.conn().await?;
        let ids: Vec<String> = redis::cmd("ZRANGEBYSCORE")
            .arg(k.pending())
            .arg("-inf")
            .arg(format!("({cutoff_ms}"))
            .arg("LIMIT")
            .arg(0)
            .arg(limit)
            .query_async(&mut *conn)
            .await
            .map_err(redis_error)?;
        let mut keys = vec![k.pending()];
        let mut args = Vec::with_capacity(ids.len());
        for id in ids {
            match Uuid::parse_str(&id) {
                Ok(order_id) => {
                    keys.push(k.order(order_id));
                    args.push(id);
                }
                Err(_) => {
                    tracing::warn!(sku, bucket, member = %id, "ignoring a pending hold that is not an order id")
                }
            }
        }
        if args.is_empty() {
            return Ok(Vec::new());
        }
        let r = Reply::new(PENDING.run(&mut conn, &keys, &args).await?)?;
        let pruned = r.int(0)?;
        if pruned > 0 {
            tracing::warn!(
                sku,
                bucket,
                pruned,
                "pruned pending holds whose order record had moved on or expired"
            );
        }
        let rows = Reply::new(r.get(1)?.clone())?;
        let mut holds = Vec::with_capacity(rows.len() / 4);
        for i in (0..rows.len() / 4).map(|i| i * 4) {
            let id = rows.text(i)?;
            let order_id = Uuid::parse_str(id)
                .map_err(|_| GateError::Script(format!("pending id {id:?} is not a uuid")))?;
            let reserved_at = text(rows.get(i + 3)?)?;
            let reserved_at_ms = reserved_at.parse::<f64>().map_err(|_| {
                GateError::Script(format!("pending score {reserved_at:?} is not a number"))
            })?;
            holds.push(PendingHold {
                order_id,
                user_id: rows.text(i + 1)?.to_owned(),
                qty: rows.int(i + 2)?,
                reserved_at_ms: reserved_at_ms as i64,
            });
        }
        Ok(holds)
    }

    /// Puts `ids` back at the end of the sweep's queue, as if reserved at `now_ms`: holds the
    /// sweeper keeps (their order exists) are asked about again one TTL later, and holds behind
    /// them are reached. An id that left the queue meanwhile (persisted, released) stays out.
    /// Returns how many were moved.
    pub async fn touch_holds<'a>(
        &self,
        at: impl Into<At<'a>>,
        ids: &[Uuid],
        now_ms: i64,
    ) -> Result<u64, GateError> {
        let k = self.keys_at(at.into())?;
        validate_amount(now_ms, "now_ms must be 0..=2^53-1")?;
        if ids.is_empty() {
            return Ok(0);
        }
        let mut cmd = redis::cmd("ZADD");
        cmd.arg(k.pending()).arg("XX").arg("CH");
        for id in ids {
            cmd.arg(now_ms).arg(id.hyphenated().to_string());
        }
        cmd.query_async(&mut *self.conn().await?)
            .await
            .map_err(redis_error)
    }

    /// Sets `avail = db_available − held`, reading `held` inside the script so reservations
    /// may flow meanwhile; a negative result sets 0 and is reported as clamped.
    ///
    /// Unconditional: a release or adjustment the database committed before `db_available`
    /// was read but whose gate follow-up lands after this repair is counted twice. Prefer
    /// [`Self::repair_if_unchanged`] with the epoch of a snapshot taken before the database read.
    pub async fn repair<'a>(
        &self,
        at: impl Into<At<'a>>,
        db_available: i64,
    ) -> Result<RepairOutcome, GateError> {
        self.run_repair(at.into(), db_available, None).await
    }

    /// [`Self::repair`], but only if the product's epoch is still `epoch` (from a
    /// [`GateSnapshot`] taken before the database was read): otherwise a change that follows
    /// the database landed in between, and this answers `Stale` without changing anything.
    pub async fn repair_if_unchanged<'a>(
        &self,
        at: impl Into<At<'a>>,
        db_available: i64,
        epoch: i64,
    ) -> Result<RepairOutcome, GateError> {
        self.run_repair(at.into(), db_available, Some(epoch)).await
    }

    pub(super) async fn run_repair(
        &self,
        at: At<'_>,
        db_available: i64,
        epoch: Option<i64>,
    ) -> Result<RepairOutcome, GateError> {
        let k = self.keys_at(at)?;
        validate_amount(db_available, "db_available must be 0..=2^53-1")?;
        let keys = [k.avail(), k.held(), k.epoch(), k.refills(), k.moving()];
        let args = [
            db_available.to_string(),
            epoch.map(|e| e.to_string()).unwrap_or_default(),
        ];
        let r = Reply::new(REPAIR.run(&mut *self.conn().await?, &keys, &args).await?)?;
        match r.code()? {
            "R" => Ok(RepairOutcome::Repaired {
                before: r.int(1)?,
                after: r.int(2)?,
                held: r.int(3)?,
                clamped: r.int(4)? == 1,
            }),
            "S" => Ok(RepairOutcome::Stale { epoch: r.int(1)? }),
            "N" => Ok(RepairOutcome::NotLoaded),
            other => Err(unknown_code("repair", other)),
        }
    }

    /// Undoes [`mark_persisted`](Self::mark_persisted) of an order whose `order.created`
    /// transaction did not commit: the record goes back from P to H and its units back into
    /// `held`. Call it under the product's stock row lock, once the database is known not to
    /// hold the order's reservation. `false` when there was nothing to undo.
    pub async fn unmark_persisted<'a>(
        &self,
        at: impl Into<At<'a>>,
        order_id: Uuid,
        now_ms: i64,
    ) -> Result<bool, GateError> {
        let k = self.keys_at(at.into())?;
        validate_amount(now_ms, "now_ms must be 0..=2^53-1")?;
        let keys = [
            k.avail(),
            k.held(),
            k.pending(),
            k.order(order_id),
            k.epoch(),
        ];
        let args = [order_id.hyphenated().to_string(), now_ms.to_string()];
        let value = UNMARK_PERSISTED
            .run(&mut *self.conn().await?, &keys, &args)
            .await?;
        Ok(int(&value)? == 1)
    }

    /// Deletes every key of the product, order records and markers included (tests, admin).
    /// Returns how many keys were deleted. Not atomic: stop traffic to the product first.
    pub async fn forget<'a>(&self, at: impl Into<At<'a>>) -> Result<u64, GateError> {
        let k = self.keys_at(at.into())?;
        let mut conn = self.conn().await?;
        // SCAN answers for one master: the product's keys are all on one, which the scan finds
        // by asking each.
        let mut scan = KeyScan::start(&mut conn, &k.pattern(), 1000)
            .await
            .map_err(redis_error)?;
        let mut deleted = 0;
        while let Some(batch) = scan.next_batch(&mut conn).await.map_err(redis_error)? {
            if !batch.is_empty() {
                let n: u64 = redis::cmd("DEL")
                    .arg(&batch)
                    .query_async(&mut *conn)
                    .await
                    .map_err(redis_error)?;
                deleted += n;
            }
        }
        Ok(deleted)
    }
}
