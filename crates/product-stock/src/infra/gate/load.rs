//! Building a product's gate from the database after Redis lost it ([`RedisGate::load`],
//! [`RedisGate::load_with_holds`], `load.lua`), and the generation each load sets.

use super::keys::{validate_amount, validate_qty, validate_user};
use super::script::Reply;
use super::{
    At, GateError, LOAD, LoadOutcome, NOT_LOADED_GENERATION, RebuiltHold, RedisGate, script,
    unknown_code,
};

impl RedisGate {
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
}
