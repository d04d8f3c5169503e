//! Stock buckets (docs/architecture.md#stock-buckets): a hot product's stock split over several
//! buckets, each under its own hash tag (`{p:SKU}` for bucket 0, `{p:SKU:b}` after), so one
//! product's reservations spread over several Redis Cluster slots. Every script still runs on
//! one bucket; what spans buckets is done here, in steps that are each atomic.
//!
//! - A buyer's orders all live in one bucket, [`bucket_of`] their user id: the per-user limit
//!   is checked by the bucket's own script, and every later step of an order (persist, release,
//!   rebuild) finds its record there without asking.
//! - A bucket that runs dry borrows: units move from another bucket in steps, taken out of the
//!   donor (`take.lua`, kept in its `moving` counter), landed in the dry bucket (`land.lua`),
//!   settled on the donor (`settle_transfer.lua`), the landing marker dropped. A crash between
//!   the steps strands units in `moving`, never doubles them; the hold sweeper and the
//!   reconciler settle every transfer left ([`RedisGate::settle_transfers`]), the landing
//!   marker deciding once whether they landed.
//! - A product is sold out only when every bucket was empty, with nothing moving, at one
//!   instant: two reads of every bucket with the same refills counts in between (a bucket's
//!   counter only grows through a change that bumps its refills count).
//! - A product with one bucket uses the single-bucket calls unchanged.

use deadpool_redis::redis::{self, Value};
use uuid::Uuid;

use super::keys::{validate_amount, validate_buckets};
use super::script::{int, redis_error, text};
use super::{
    AdjustOutcome, At, GateBuyers, GateError, GateSnapshot, LoadOutcome, NOT_LOADED_GENERATION,
    RebuiltHold, RedisGate, RepairOutcome, ReserveArgs, ReserveOutcome, SaleWindow,
};
use crate::domain::{bucket_of, split_evenly};

/// Borrowing rounds a reservation may take beyond one per bucket before it answers
/// `Unavailable` (stock kept moving under it; the caller retries).
const EXTRA_BORROW_ROUNDS: u32 = 4;

/// Buckets read at once by one reservation looking for units (each read takes a connection of
/// the pool for one round trip).
pub(super) const PROBES_IN_FLIGHT: usize = 8;

/// One bucket's counters, read in one command.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BucketState {
    pub available: i64,
    pub held: i64,
    pub epoch: i64,
    /// Units taken out of this bucket by a transfer that has not landed yet.
    pub moving: i64,
    /// The bucket's refills count (see `buyers.lua`).
    pub refills: String,
}

impl RedisGate {
    /// The counters of one bucket, or `None` when it is not loaded.
    pub async fn bucket_state(&self, at: At<'_>) -> Result<Option<BucketState>, GateError> {
        let k = self.keys_at(at)?;
        let values: Vec<Value> = redis::cmd("MGET")
            .arg(k.avail())
            .arg(k.held())
            .arg(k.epoch())
            .arg(k.moving())
            .arg(k.refills())
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
        let refills = match values.get(4) {
            None | Some(Value::Nil) => String::new(),
            Some(v) => text(v)?.to_owned(),
        };
        Ok(Some(BucketState {
            available,
            held: optional(1)?.unwrap_or(0),
            epoch: optional(2)?.unwrap_or(0),
            moving: optional(3)?.unwrap_or(0),
            refills,
        }))
    }

    /// The counters of every bucket of `sku`, in bucket order.
    pub async fn bucket_states(
        &self,
        sku: &str,
        buckets: u32,
    ) -> Result<Vec<Option<BucketState>>, GateError> {
        validate_buckets(buckets)?;
        let mut out = Vec::with_capacity(buckets as usize);
        for b in 0..buckets {
            out.push(self.bucket_state(At::new(sku, b)).await?);
        }
        Ok(out)
    }

    /// The product's counters summed over its buckets (units moving between buckets are in
    /// none), or `None` when any bucket is not loaded.
    pub async fn product_snapshot(
        &self,
        sku: &str,
        buckets: u32,
    ) -> Result<Option<GateSnapshot>, GateError> {
        if buckets == 1 {
            return self.snapshot(sku).await;
        }
        let mut sum = GateSnapshot::default();
        for state in self.bucket_states(sku, buckets).await? {
            let Some(s) = state else {
                return Ok(None);
            };
            sum.available += s.available;
            sum.held += s.held;
            sum.epoch = sum.epoch.wrapping_add(s.epoch);
        }
        Ok(Some(sum))
    }

    /// Reserves `qty` units of `sku` for `order_id` in the buyer's bucket, borrowing units from
    /// the other buckets when it runs dry (see the module doc). A replay finds the order in the
    /// same bucket. `SoldOut` only when every bucket was empty at one instant.
    #[allow(clippy::too_many_arguments)]
    pub async fn reserve_product(
        &self,
        sku: &str,
        buckets: u32,
        order_id: Uuid,
        user_id: &str,
        qty: i64,
        per_user_limit: u32,
        now_ms: i64,
    ) -> Result<ReserveOutcome, GateError> {
        self.reserve_product_with(
            buckets,
            ReserveArgs {
                sku,
                bucket: 0,
                order_id,
                user_id,
                qty,
                per_user_limit,
                now_ms,
                window: SaleWindow::ALWAYS,
            },
        )
        .await
    }

    /// [`reserve_product`](Self::reserve_product) with every argument of the reserve script,
    /// the sale window too; `r.bucket` is ignored (the buyer's bucket is used). Each bucket
    /// judges the window by its own node's clock.
    pub async fn reserve_product_with(
        &self,
        buckets: u32,
        r: ReserveArgs<'_>,
    ) -> Result<ReserveOutcome, GateError> {
        validate_buckets(buckets)?;
        let home = bucket_of(r.user_id, buckets);
        let r = ReserveArgs { bucket: home, ..r };
        let mut outcome = self.reserve_with(&r).await?;
        if buckets == 1 {
            return Ok(outcome);
        }
        for _ in 0..buckets + EXTRA_BORROW_ROUNDS {
            outcome = match self.after_dry(r.sku, buckets, home, r.qty, outcome).await? {
                Some(final_answer) => return Ok(final_answer),
                None => self.reserve_with(&r).await?,
            };
        }
        metrics::counter!("flashsale_gate_borrow_exhausted_total").increment(1);
        Err(GateError::Unavailable(
            "stock kept moving between the product's buckets; retry".into(),
        ))
    }

    /// Loads every bucket of `sku` that is missing, splitting `available` (the database's
    /// figure) evenly over them after the holds, each hold and buyer going to their user's
    /// bucket; every bucket loaded here shares one generation. One bucket: exactly
    /// [`load_with_holds`](Self::load_with_holds).
    pub async fn load_product(
        &self,
        sku: &str,
        buckets: u32,
        available: i64,
        users: &[(String, i64)],
        holds: &[RebuiltHold],
        now_ms: i64,
    ) -> Result<LoadOutcome, GateError> {
        validate_buckets(buckets)?;
        if buckets == 1 {
            return self
                .load_with_holds(sku, available, users, holds, now_ms)
                .await;
        }
        validate_amount(available, "available must be 0..=2^53-1")?;
        let n = buckets as usize;
        let mut users_of = vec![Vec::new(); n];
        for (user, units) in users {
            users_of[bucket_of(user, buckets) as usize].push((user.clone(), *units));
        }
        let mut holds_of = vec![Vec::new(); n];
        for h in holds {
            holds_of[bucket_of(&h.user_id, buckets) as usize].push(h.clone());
        }
        let held_of: Vec<i64> = holds_of
            .iter()
            .map(|hs: &Vec<RebuiltHold>| hs.iter().map(|h| h.qty).sum())
            .collect();
        let spare = available - held_of.iter().sum::<i64>();
        let shares = split_evenly(spare.max(0), buckets);
        let generation = Uuid::new_v4().simple().to_string();
        let (mut loaded, mut sum_available, mut sum_held, mut clamped) = (false, 0, 0, spare < 0);
        for b in 0..n {
            let outcome = self
                .load_in_generation(
                    At::new(sku, b as u32),
                    shares[b] + held_of[b],
                    &users_of[b],
                    &holds_of[b],
                    now_ms,
                    &generation,
                )
                .await?;
            if let LoadOutcome::Loaded {
                available,
                held,
                clamped: c,
            } = outcome
            {
                loaded = true;
                sum_available += available;
                sum_held += held;
                clamped |= c;
            }
        }
        Ok(if loaded {
            LoadOutcome::Loaded {
                available: sum_available,
                held: sum_held,
                clamped,
            }
        } else {
            LoadOutcome::AlreadyLoaded
        })
    }

    /// Closes every bucket of `sku` (deletes its counter; records stay) so the next load
    /// rebuilds them all together: a product some of whose buckets were lost is rebuilt whole.
    pub async fn unload_product(&self, sku: &str, buckets: u32) -> Result<(), GateError> {
        validate_buckets(buckets)?;
        for b in 0..buckets {
            let k = self.keys_at(At::new(sku, b))?;
            let _: Value = redis::cmd("DEL")
                .arg(k.avail())
                .query_async(&mut *self.conn().await?)
                .await
                .map_err(redis_error)?;
        }
        Ok(())
    }

    /// The generation of the product's gate ([`generation`](Self::generation)): its buckets'
    /// (one load gives all of them one; bucket 0's should they differ), or
    /// [`NOT_LOADED_GENERATION`] when any bucket is not loaded.
    pub async fn product_generation(&self, sku: &str, buckets: u32) -> Result<String, GateError> {
        validate_buckets(buckets)?;
        let mut first = None;
        for b in 0..buckets {
            let g = self.generation(At::new(sku, b)).await?;
            if g == NOT_LOADED_GENERATION {
                return Ok(g);
            }
            first.get_or_insert(g);
        }
        Ok(first.unwrap_or_default())
    }

    /// [`adjust_in_generation`](Self::adjust_in_generation) of a product: a restock is split
    /// evenly over the buckets, a write-off takes from the buckets in order; each bucket applies
    /// its part once per `request_id`, so a replay after a partial application completes it.
    pub async fn adjust_product(
        &self,
        sku: &str,
        buckets: u32,
        request_id: &str,
        delta: i64,
        generation: &str,
    ) -> Result<AdjustOutcome, GateError> {
        validate_buckets(buckets)?;
        if buckets == 1 {
            return self
                .adjust_in_generation(sku, request_id, delta, generation)
                .await;
        }
        let (mut applied, mut touched, mut duplicates, mut rebuilt, mut not_loaded) =
            (0, 0, 0, 0, false);
        let mut tally = |outcome: AdjustOutcome, before: Option<i64>| match outcome {
            AdjustOutcome::Applied { applied: a, .. } => {
                applied += a;
                touched += 1;
                a
            }
            AdjustOutcome::Duplicate => {
                duplicates += 1;
                before.unwrap_or(0)
            }
            AdjustOutcome::Rebuilt => {
                rebuilt += 1;
                0
            }
            AdjustOutcome::NotLoaded => {
                not_loaded = true;
                0
            }
        };
        let mut remaining = delta;
        if delta > 0 {
            for (b, share) in split_evenly(delta, buckets).into_iter().enumerate() {
                if share > 0 {
                    let (o, before) = self
                        .run_adjust(At::new(sku, b as u32), request_id, share, generation)
                        .await?;
                    remaining -= tally(o, before.or(Some(share)));
                }
            }
        } else {
            for b in 0..buckets {
                if remaining >= 0 {
                    break;
                }
                let (o, before) = self
                    .run_adjust(At::new(sku, b), request_id, remaining, generation)
                    .await?;
                remaining -= tally(o, before);
            }
        }
        if touched == 0 {
            return Ok(if not_loaded {
                AdjustOutcome::NotLoaded
            } else if rebuilt > 0 {
                AdjustOutcome::Rebuilt
            } else if duplicates > 0 {
                AdjustOutcome::Duplicate
            } else {
                AdjustOutcome::Applied {
                    applied: 0,
                    available: 0,
                    clamped: delta < 0,
                }
            });
        }
        let available = self
            .product_snapshot(sku, buckets)
            .await?
            .map_or(0, |s| s.available);
        Ok(AdjustOutcome::Applied {
            applied,
            available,
            clamped: delta < 0 && remaining < 0,
        })
    }

    /// [`repair`](Self::repair) of a product: the counters of its buckets are set to an even
    /// split of `db_available` minus the holds and the units moving between buckets (each
    /// bucket's script reads its own holds and moving units again, so reservations and
    /// transfers may run meanwhile).
    pub async fn repair_product(
        &self,
        sku: &str,
        buckets: u32,
        db_available: i64,
    ) -> Result<RepairOutcome, GateError> {
        if buckets == 1 {
            return self.repair(sku, db_available).await;
        }
        validate_amount(db_available, "db_available must be 0..=2^53-1")?;
        let mut states = Vec::with_capacity(buckets as usize);
        for s in self.bucket_states(sku, buckets).await? {
            match s {
                Some(s) => states.push(s),
                None => return Ok(RepairOutcome::NotLoaded),
            }
        }
        let held: i64 = states.iter().map(|s| s.held).sum();
        let moving: i64 = states.iter().map(|s| s.moving).sum();
        let spare = db_available - held - moving;
        let shares = split_evenly(spare.max(0), buckets);
        let (mut before, mut after, mut clamped) = (0, 0, spare < 0);
        for (b, s) in states.iter().enumerate() {
            let figure = s.held + s.moving + shares[b];
            match self
                .run_repair(At::new(sku, b as u32), figure, None)
                .await?
            {
                RepairOutcome::Repaired {
                    before: x,
                    after: y,
                    clamped: c,
                    ..
                } => {
                    before += x;
                    after += y;
                    clamped |= c;
                }
                RepairOutcome::NotLoaded => return Ok(RepairOutcome::NotLoaded),
                RepairOutcome::Stale { epoch } => return Ok(RepairOutcome::Stale { epoch }),
            }
        }
        Ok(RepairOutcome::Repaired {
            before,
            after,
            held,
            clamped,
        })
    }

    /// [`buyers`](Self::buyers) of a product: the buyers of every bucket (each buyer is in one)
    /// and the available counters summed. The refills count handed out is the sum of the
    /// buckets' counts: each only grows, so the sum moves whenever any bucket may have got
    /// units back.
    pub async fn product_buyers(
        &self,
        sku: &str,
        buckets: u32,
        max: u32,
        known_refills: &str,
    ) -> Result<GateBuyers, GateError> {
        validate_buckets(buckets)?;
        if buckets == 1 {
            return self.buyers(sku, max, known_refills).await;
        }
        let (mut available, mut count, mut users, mut refills) = (0, 0, Vec::new(), 0_i128);
        let mut too_many = false;
        for b in 0..buckets {
            let (a, n, r) = match self.buyers(At::new(sku, b), max, "").await? {
                GateBuyers::Listed {
                    available,
                    users: listed,
                    refills,
                } => {
                    let n = listed.len() as i64;
                    users.extend(listed);
                    (available, n, refills)
                }
                GateBuyers::TooMany {
                    available,
                    count,
                    refills,
                } => {
                    too_many = true;
                    (available, count, refills)
                }
                GateBuyers::Unchanged { .. } => {
                    return Err(GateError::Script(
                        "buyers answered unchanged to a first read".into(),
                    ));
                }
                GateBuyers::NotLoaded => return Ok(GateBuyers::NotLoaded),
            };
            available += a;
            count += n;
            refills += r.parse::<i128>().unwrap_or(0);
        }
        let refills = refills.to_string();
        Ok(if !known_refills.is_empty() && known_refills == refills {
            GateBuyers::Unchanged {
                available,
                count,
                refills,
            }
        } else if too_many || count > i64::from(max) {
            GateBuyers::TooMany {
                available,
                count,
                refills,
            }
        } else {
            GateBuyers::Listed {
                available,
                users,
                refills,
            }
        })
    }

    /// [`forget`](Self::forget) of every bucket of `sku`.
    pub async fn forget_product(&self, sku: &str, buckets: u32) -> Result<u64, GateError> {
        validate_buckets(buckets)?;
        let mut deleted = 0;
        for b in 0..buckets {
            deleted += self.forget(At::new(sku, b)).await?;
        }
        Ok(deleted)
    }
}
