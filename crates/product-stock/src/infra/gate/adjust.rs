//! Restocks and write-offs against the gate ([`RedisGate::adjust`], `adjust.lua`), once per
//! request id. An admin's write-off may take only the units that are free, never the
//! units held for orders acknowledged to their buyers whose `order.created` the database does
//! not have yet (taking them would cancel those orders once it arrives).
//!
//! - One bucket: `adjust.lua` checks and applies in one step, reading `held` itself, so a
//!   reservation racing the write-off either took its units first (and the write-off sees
//!   fewer free) or finds them gone.
//! - Several buckets: a first read refuses what is plainly too much without touching the
//!   gate. Otherwise the write-off takes from the buckets in order, each taking at most its
//!   counter (`adjust.lua`, never below zero, never touching `held`) and recording what it
//!   took; if reservations took units meanwhile and the buckets had too little, every part is
//!   given back (`undo_adjust.lua`) and the write-off is refused. Buckets are visited in the
//!   order the `stock.adjusted` event's replay visits them, so the replay finds every part
//!   recorded and changes nothing.

use super::keys::{REQUEST_ID_MAX_LEN, validate_amount, validate_buckets};
use super::script::Reply;
use super::{
    ADJUST, AdjustOutcome, At, GENERATION_MAX_LEN, GateError, RedisGate, UNDO_ADJUST, unknown_code,
};

/// The answer to [`RedisGate::write_off_product`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteOffOutcome {
    /// The units left the gate (or had left it in an earlier attempt of the same request).
    Applied,
    /// More than the `free` units were asked for: the gate is as it was.
    Refused { free: i64 },
    /// A bucket has no counter: the gate is as it was (rebuild it, then retry).
    NotLoaded,
    /// The gate was rebuilt since its generation was read: the gate is as it was.
    Rebuilt,
}

impl RedisGate {
    /// Takes `units` (> 0) out of the gate of `sku` for the admin write-off `request_id`, only
    /// if they are free: at most the available counters and at most `db_free` (the database's
    /// on_hand − reserved, read under the stock row lock) less the unpersisted holds and the
    /// units moving between buckets. See the module doc.
    pub async fn write_off_product(
        &self,
        sku: &str,
        buckets: u32,
        request_id: &str,
        units: i64,
        generation: &str,
        db_free: i64,
    ) -> Result<WriteOffOutcome, GateError> {
        validate_buckets(buckets)?;
        if units <= 0 {
            return Err(GateError::InvalidInput(
                "a write-off takes at least one unit",
            ));
        }
        if buckets == 1 {
            let r = self
                .adjust_script(
                    At::new(sku, 0),
                    request_id,
                    -units,
                    generation,
                    &db_free.to_string(),
                )
                .await?;
            if r.code()? == "R" {
                return Ok(WriteOffOutcome::Refused { free: r.int(1)? });
            }
            return Ok(match adjust_outcome(&r)?.0 {
                AdjustOutcome::Applied { .. } | AdjustOutcome::Duplicate => {
                    WriteOffOutcome::Applied
                }
                AdjustOutcome::Rebuilt => WriteOffOutcome::Rebuilt,
                AdjustOutcome::NotLoaded => WriteOffOutcome::NotLoaded,
            });
        }
        let Some(free) = self.free_units(sku, buckets, db_free).await? else {
            return Ok(WriteOffOutcome::NotLoaded);
        };
        if units > free {
            // Parts an earlier attempt of this request took before its commit failed go back
            // too: the database never had that write-off.
            self.undo_write_off(sku, buckets, request_id).await?;
            return Ok(WriteOffOutcome::Refused { free });
        }
        let mut remaining = -units;
        let mut failed = None;
        for b in 0..buckets {
            if remaining >= 0 {
                break;
            }
            let (outcome, before) = self
                .run_adjust(At::new(sku, b), request_id, remaining, generation)
                .await?;
            match outcome {
                AdjustOutcome::Applied { applied, .. } => remaining -= applied,
                AdjustOutcome::Duplicate => remaining -= before.unwrap_or(0),
                AdjustOutcome::Rebuilt => failed = Some(WriteOffOutcome::Rebuilt),
                AdjustOutcome::NotLoaded => failed = Some(WriteOffOutcome::NotLoaded),
            }
            if failed.is_some() {
                break;
            }
        }
        if failed.is_none() && remaining >= 0 {
            return Ok(WriteOffOutcome::Applied);
        }
        self.undo_write_off(sku, buckets, request_id).await?;
        Ok(match failed {
            Some(outcome) => outcome,
            None => {
                metrics::counter!("flashsale_write_offs_raced_total").increment(1);
                WriteOffOutcome::Refused {
                    free: self.free_units(sku, buckets, db_free).await?.unwrap_or(0),
                }
            }
        })
    }

    /// The units of `sku` free for a write-off: the available counters summed, and at most
    /// `db_free` less the unpersisted holds and the units moving between buckets; `None` when a
    /// bucket is not loaded.
    pub async fn free_units(
        &self,
        sku: &str,
        buckets: u32,
        db_free: i64,
    ) -> Result<Option<i64>, GateError> {
        let (mut available, mut committed) = (0, 0);
        for state in self.bucket_states(sku, buckets).await? {
            let Some(s) = state else {
                return Ok(None);
            };
            available += s.available.max(0);
            committed += s.held + s.moving;
        }
        Ok(Some(available.min(db_free - committed).max(0)))
    }

    /// Gives back every part of write-off `request_id` the buckets of `sku` applied, and
    /// forgets its markers.
    async fn undo_write_off(
        &self,
        sku: &str,
        buckets: u32,
        request_id: &str,
    ) -> Result<(), GateError> {
        for b in 0..buckets {
            let k = self.keys_at(At::new(sku, b))?;
            let keys = [k.avail(), k.adjustment(request_id), k.epoch(), k.refills()];
            UNDO_ADJUST
                .run(&mut *self.conn().await?, &keys, &[] as &[String])
                .await?;
        }
        Ok(())
    }
}

/// Reads the adjust script's reply (every code but an admin's refusal); with a duplicate, what
/// the first application changed (`None`: not recorded, or not applied then).
pub(super) fn adjust_outcome(r: &Reply) -> Result<(AdjustOutcome, Option<i64>), GateError> {
    match r.code()? {
        "G" => Ok((AdjustOutcome::Rebuilt, None)),
        "A" => Ok((
            AdjustOutcome::Applied {
                applied: r.int(1)?,
                available: r.int(2)?,
                clamped: r.int(3)? == 1,
            },
            None,
        )),
        "D" => {
            let applied = if r.len() > 1 {
                r.text(1)?
                    .strip_prefix("A:")
                    .and_then(|n| n.parse::<i64>().ok())
            } else {
                None
            };
            Ok((AdjustOutcome::Duplicate, applied))
        }
        "N" => Ok((AdjustOutcome::NotLoaded, None)),
        other => Err(unknown_code("adjust", other)),
    }
}

impl RedisGate {
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
}
