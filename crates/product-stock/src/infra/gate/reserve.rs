//! Taking units: a hold per order ([`RedisGate::reserve`], [`RedisGate::reserve_many`],
//! `reserve.lua`), the buyers a sold-out product may still hear from ([`RedisGate::buyers`]),
//! and a hold's move to persisted once the database has its reservation
//! ([`RedisGate::mark_persisted`], `mark_persisted.lua`).

use uuid::Uuid;

use super::keys::{REFILLS_MAX_LEN, validate_amount, validate_qty, validate_user};
use super::script::{Reply, int};
use super::{
    At, BUYERS, GateBuyers, GateError, MARK_PERSISTED, RESERVE, RedisGate, ReserveOutcome, script,
    unknown_code,
};

impl RedisGate {
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
        self.reserve_with(&ReserveArgs {
            sku: at.sku,
            bucket: at.bucket,
            order_id,
            user_id,
            qty,
            per_user_limit,
            now_ms,
            window: SaleWindow::ALWAYS,
        })
        .await
    }

    /// [`reserve`](Self::reserve) with every argument, the sale window too: outside it the
    /// gate refuses by its own clock ([`ReserveOutcome::NotStarted`], [`ReserveOutcome::Ended`]).
    pub async fn reserve_with(&self, r: &ReserveArgs<'_>) -> Result<ReserveOutcome, GateError> {
        let (keys, args) = self.reserve_call(r)?;
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
        validate_amount(r.window.start_ms, "sale start must be 0..=2^53-1")?;
        validate_amount(r.window.end_ms, "sale end must be 0..=2^53-1")?;
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
            r.window.start_ms.to_string(),
            r.window.end_ms.to_string(),
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
    /// When the product is on sale, by the gate's clock.
    pub window: SaleWindow,
}

/// A product's sale window as the gate judges it: milliseconds since the Unix epoch by the
/// Redis server's clock, 0 where unset.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SaleWindow {
    /// Before it, [`ReserveOutcome::NotStarted`].
    pub start_ms: i64,
    /// From it on, [`ReserveOutcome::Ended`].
    pub end_ms: i64,
}

impl SaleWindow {
    /// No window: on sale until sold out.
    pub const ALWAYS: Self = Self {
        start_ms: 0,
        end_ms: 0,
    };
}

/// Reads the reserve script's reply.
fn reserve_outcome(value: deadpool_redis::redis::Value) -> Result<ReserveOutcome, GateError> {
    let r = Reply::new(value)?;
    Ok(match r.code()? {
        "H" => ReserveOutcome::Reserved {
            remaining: r.int(1)?,
            replayed: false,
            // A gate script older than the sale window answered without its clock.
            gate_ms: r.int(2).ok(),
        },
        "B" => ReserveOutcome::NotStarted {
            gate_ms: r.int(1)?,
            start_ms: r.int(2)?,
        },
        "E" => ReserveOutcome::Ended {
            gate_ms: r.int(1)?,
            end_ms: r.int(2)?,
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
                gate_ms: None,
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
