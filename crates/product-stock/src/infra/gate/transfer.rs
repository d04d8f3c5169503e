//! Moving units between a product's stock buckets (docs/architecture.md#stock-buckets): a
//! bucket that runs dry borrows from the others in steps that are each atomic — taken out of
//! the donor (`take.lua`, kept in its `moving` counter), landed in the dry bucket (`land.lua`),
//! settled on the donor (`settle_transfer.lua`), the landing marker dropped. A crash between
//! the steps strands units in `moving`, never doubles them; [`RedisGate::settle_transfers`]
//! settles every transfer left, the landing marker deciding once whether they landed.

use deadpool_redis::redis::{self, Value};
use uuid::Uuid;

use super::buckets::{BucketState, PROBES_IN_FLIGHT};
use super::keys::validate_buckets;
use super::script::{Reply, redis_error};
use super::{At, GateError, LAND, RedisGate, ReserveOutcome, SETTLE_TRANSFER, TAKE, unknown_code};

/// What one borrowing sweep found.
enum Borrowed {
    /// Units landed in the dry bucket (or the donor emptied meanwhile): try again.
    Moved,
    /// A bucket is not loaded: the product must be rebuilt.
    NotLoaded,
    /// Nothing to lend; every bucket as the sweep read it.
    Nothing(Vec<BucketState>),
}

/// How a transfer ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransferEnd {
    /// The units landed in the receiving bucket.
    Landed,
    /// The units went back to the donor (`qty`).
    Returned(i64),
    /// From before a rebuild, or settled already: nothing moved.
    Void,
}

impl RedisGate {
    /// Given the answer of a reservation in bucket `home`: `Some(answer)` when it is final,
    /// `None` when units were borrowed (or may be on their way) and the reservation should be
    /// tried again.
    pub(super) async fn after_dry(
        &self,
        sku: &str,
        buckets: u32,
        home: u32,
        qty: i64,
        outcome: ReserveOutcome,
    ) -> Result<Option<ReserveOutcome>, GateError> {
        let need = match outcome {
            ReserveOutcome::SoldOut => qty,
            ReserveOutcome::InsufficientStock { available } => (qty - available).max(1),
            other => return Ok(Some(other)),
        };
        if buckets <= 1 {
            return Ok(Some(outcome));
        }
        match self.borrow(sku, buckets, home, need).await? {
            Borrowed::Moved => Ok(None),
            Borrowed::NotLoaded => Ok(Some(ReserveOutcome::NotLoaded)),
            Borrowed::Nothing(first) => {
                let sold_out = outcome == ReserveOutcome::SoldOut;
                if self.still_dry(sku, buckets, home, &first, sold_out).await? {
                    Ok(Some(outcome))
                } else {
                    // Units on their way between buckets land within a round trip or two.
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                    Ok(None)
                }
            }
        }
    }

    /// The counters of every bucket, read concurrently (at most [`PROBES_IN_FLIGHT`] at once);
    /// `None` when any bucket is not loaded.
    async fn probe_all(
        &self,
        sku: &str,
        buckets: u32,
    ) -> Result<Option<Vec<BucketState>>, GateError> {
        use futures_util::{StreamExt as _, TryStreamExt as _};
        let states: Vec<Option<BucketState>> = futures_util::stream::iter(0..buckets)
            .map(|b| self.bucket_state(At::new(sku, b)))
            .buffered(PROBES_IN_FLIGHT)
            .try_collect()
            .await?;
        Ok(states.into_iter().collect())
    }

    /// Reads every bucket; the one with the most units (other than `home`) lends some to
    /// `home`.
    async fn borrow(
        &self,
        sku: &str,
        buckets: u32,
        home: u32,
        need: i64,
    ) -> Result<Borrowed, GateError> {
        let Some(seen) = self.probe_all(sku, buckets).await? else {
            return Ok(Borrowed::NotLoaded);
        };
        let donor = (0..buckets)
            .filter(|b| *b != home)
            .max_by_key(|b| seen[*b as usize].available)
            .filter(|b| seen[*b as usize].available > 0);
        let Some(donor) = donor else {
            return Ok(Borrowed::Nothing(seen));
        };
        let d = self.keys_at(At::new(sku, donor))?;
        let id = Uuid::new_v4();
        let r = Reply::new(
            TAKE.run(
                &mut *self.conn().await?,
                &[
                    d.avail(),
                    d.moving(),
                    d.transfers(),
                    d.generation(),
                    d.refills(),
                ],
                &[
                    id.hyphenated().to_string(),
                    need.to_string(),
                    home.to_string(),
                    chrono::Utc::now().timestamp_millis().to_string(),
                ],
            )
            .await?,
        )?;
        match r.code()? {
            "N" => Ok(Borrowed::NotLoaded),
            // Emptied since it was read: the caller looks again.
            "E" => Ok(Borrowed::Moved),
            "T" => {
                let (qty, generation) = (r.int(1)?, r.text(2)?.to_owned());
                metrics::counter!("flashsale_gate_transfers_total").increment(1);
                self.finish_transfer(sku, donor, home, id, qty, &generation, "give")
                    .await?;
                Ok(Borrowed::Moved)
            }
            other => Err(unknown_code("take", other)),
        }
    }

    /// Whether every bucket was dry in `first` and still is: nothing moving, no donor with
    /// units, no refill anywhere since (and, for a sold-out answer, `home` empty too). Each
    /// bucket's counter can only have grown through a change that bumps its refills count, so
    /// two equal reads bracket an instant at which all were empty together.
    async fn still_dry(
        &self,
        sku: &str,
        buckets: u32,
        home: u32,
        first: &[BucketState],
        sold_out: bool,
    ) -> Result<bool, GateError> {
        let dry = |b: usize, s: &BucketState| {
            s.moving == 0 && (s.available <= 0 || (b == home as usize && !sold_out))
        };
        if !first.iter().enumerate().all(|(b, s)| dry(b, s)) {
            return Ok(false);
        }
        // The second read starts once the first is complete.
        let Some(now) = self.probe_all(sku, buckets).await? else {
            return Ok(false);
        };
        Ok(now
            .iter()
            .zip(first)
            .enumerate()
            .all(|(b, (now, before))| dry(b, now) && now.refills == before.refills))
    }

    /// Lands (mode `give`) or cancels (mode `cancel`) transfer `id` of `qty` units from bucket
    /// `from` to bucket `to`, then settles it on `from`: forgotten if it landed, its units
    /// back in `from` if it never will.
    #[allow(clippy::too_many_arguments)]
    async fn finish_transfer(
        &self,
        sku: &str,
        from: u32,
        to: u32,
        id: Uuid,
        qty: i64,
        generation: &str,
        mode: &str,
    ) -> Result<TransferEnd, GateError> {
        let t = self.keys_at(At::new(sku, to))?;
        let landed = Reply::new(
            LAND.run(
                &mut *self.conn().await?,
                &[t.avail(), t.landing(id), t.generation(), t.refills()],
                &[
                    mode.to_owned(),
                    qty.to_string(),
                    generation.to_owned(),
                    self.record_ttl_ms.clone(),
                ],
            )
            .await?,
        )?;
        let how = match landed.code()? {
            "G" => "given",
            "C" | "S" => "back",
            other => return Err(unknown_code("land", other)),
        };
        let f = self.keys_at(At::new(sku, from))?;
        let settled = Reply::new(
            SETTLE_TRANSFER
                .run(
                    &mut *self.conn().await?,
                    &[
                        f.avail(),
                        f.moving(),
                        f.transfers(),
                        f.generation(),
                        f.refills(),
                    ],
                    &[id.hyphenated().to_string(), how.to_owned()],
                )
                .await?,
        )?;
        let end = match settled.code()? {
            "G" => TransferEnd::Landed,
            "B" => TransferEnd::Returned(settled.int(1)?),
            "F" | "S" => TransferEnd::Void,
            other => return Err(unknown_code("settle_transfer", other)),
        };
        if how == "given" {
            // The donor no longer records the transfer, so nothing will ask about it again:
            // the landing marker (kept without a TTL until now) can go. A crash just before
            // leaves one small key behind, never a second landing.
            let _: Value = redis::cmd("DEL")
                .arg(t.landing(id))
                .query_async(&mut *self.conn().await?)
                .await
                .map_err(redis_error)?;
        }
        Ok(end)
    }

    /// Settles every transfer between the buckets of `sku` taken before `cutoff_ms` and still
    /// recorded on its donor: one that landed is forgotten, one that did not is cancelled (so a
    /// borrower resuming late gives nothing) and its units go back to the donor. Safe while
    /// borrowers run: the landing marker decides once. Returns how many were settled and the
    /// units returned.
    pub async fn settle_transfers(
        &self,
        sku: &str,
        buckets: u32,
        cutoff_ms: i64,
    ) -> Result<(u64, i64), GateError> {
        validate_buckets(buckets)?;
        let (mut settled, mut returned) = (0, 0);
        if buckets == 1 {
            return Ok((settled, returned));
        }
        for from in 0..buckets {
            let k = self.keys_at(At::new(sku, from))?;
            let entries: Vec<(String, String)> = redis::cmd("HGETALL")
                .arg(k.transfers())
                .query_async(&mut *self.conn().await?)
                .await
                .map_err(redis_error)?;
            for (id, record) in entries {
                let parsed = Uuid::parse_str(&id).ok().and_then(|id| {
                    let mut parts = record.splitn(4, ':');
                    let to = parts.next()?.parse::<u32>().ok()?;
                    let qty = parts.next()?.parse::<i64>().ok()?;
                    let generation = parts.next()?.to_owned();
                    let taken_at = parts.next().and_then(|t| t.parse::<i64>().ok());
                    Some((id, to, qty, generation, taken_at.unwrap_or(0)))
                });
                let Some((id, to, qty, generation, taken_at)) = parsed else {
                    return Err(GateError::Script(format!(
                        "bucket {from} of {sku} records a bad transfer {id:?} = {record:?}"
                    )));
                };
                if taken_at >= cutoff_ms {
                    continue;
                }
                let end = self
                    .finish_transfer(sku, from, to, id, qty, &generation, "cancel")
                    .await?;
                settled += 1;
                if let TransferEnd::Returned(q) = end {
                    returned += q;
                }
            }
        }
        Ok((settled, returned))
    }
}
