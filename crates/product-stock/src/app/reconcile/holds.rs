//! The hold sweeper: holds older than `stock.hold_ttl_ms` that the database has are marked
//! persisted (or given back, when their reservation was written long before the hold); for the
//! others the order service is asked, and a hold whose order is missing or cancelled is given
//! back (docs/architecture.md#operations).

use std::{collections::HashMap, time::Duration};

use super::*;

/// What the sweeper does with an expired hold the database does not have, given what the order
/// service said about its order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HoldVerdict {
    /// The order exists and is not cancelled: it was acknowledged, and its `order.created` is
    /// on its way (a broker outage, a backlog). Keep the hold; it is asked about again later.
    Keep,
    /// The order was cancelled: give the units back (its `order.cancelled` then finds the
    /// reservation released and changes nothing).
    Release,
    /// No such order: its CreateOrder failed before writing it, and nobody was acknowledged.
    /// Release the hold, tombstone the reservation and tell the order service.
    Expire,
    /// The order service could not be asked: give nothing away this round.
    Defer,
}

/// The sweeper's decision table.
pub(crate) fn verdict(
    answer: &Result<HashMap<uuid::Uuid, OrderState>, OrdersUnavailable>,
    order_id: uuid::Uuid,
) -> HoldVerdict {
    match answer {
        Err(_) => HoldVerdict::Defer,
        Ok(found) => match found.get(&order_id) {
            Some(OrderState::Live) => HoldVerdict::Keep,
            Some(OrderState::Cancelled) => HoldVerdict::Release,
            None => HoldVerdict::Expire,
        },
    }
}

impl Reconciler {
    fn hold_ttl_ms_i64(&self) -> i64 {
        i64::try_from(self.hold_ttl_ms).unwrap_or(i64::MAX)
    }

    /// Looks at holds reserved before `cutoff_ms` that the gate still counts as unpersisted:
    /// those the database has are marked persisted (or released, if it released them). For the
    /// others the order service is asked (docs/architecture.md#operations): a hold whose order
    /// exists is kept, one whose order was cancelled is released, one whose order does not
    /// exist is released and tombstoned so its late `order.created` is refused; if the order
    /// service cannot answer, none of them is touched. `cutoff_ms == i64::MAX` (the
    /// reconciler) only settles what the database has.
    ///
    /// Why "missing" is safe to give away: CreateOrder reserves at the gate, then writes the
    /// order and its `order.created` in one transaction, then answers the buyer. The write is
    /// bounded by its own timeout (seconds), the TTL is minutes: by the time a hold is old
    /// enough to be asked about, its order's write has committed (the order service finds it)
    /// or failed (no buyer was acknowledged). A write still in flight when the sweeper asks
    /// would need to outlive the TTL, which its timeout does not allow; and were it to commit
    /// anyway, the tombstone makes its `order.created` fail and the order is cancelled, never
    /// left PENDING.
    pub async fn settle_holds(&self, sku: &Sku, cutoff_ms: i64) -> Result<Settled, StockError> {
        let buckets = match self.terms.get(sku).await {
            Ok(t) => t.stock_buckets,
            Err(StockError::UnknownProduct(_)) => 1,
            Err(e) => return Err(e),
        };
        let mut all = Settled::default();
        for bucket in 0..buckets {
            let one = self
                .settle_bucket_holds(At::new(sku.as_str(), bucket), sku, cutoff_ms)
                .await?;
            all.expired += one.expired;
            all.kept += one.kept;
            all.deferred |= one.deferred;
        }
        Ok(all)
    }

    /// [`Self::settle_holds`] in one stock bucket.
    async fn settle_bucket_holds(
        &self,
        at: At<'_>,
        sku: &Sku,
        cutoff_ms: i64,
    ) -> Result<Settled, StockError> {
        let mut settled = Settled::default();
        let holds = self
            .gate
            .pending_older_than(at, cutoff_ms, SETTLE_BATCH)
            .await
            .map_err(gate_err)?;
        if holds.is_empty() {
            return Ok(settled);
        }
        let sweeping = cutoff_ms != i64::MAX;
        let answer = if sweeping {
            let ids: Vec<uuid::Uuid> = holds.iter().map(|h| h.order_id).collect();
            let known = db::reservations_known(&self.db, &ids).await?;
            let unknown: Vec<uuid::Uuid> =
                ids.into_iter().filter(|id| !known.contains(id)).collect();
            if unknown.is_empty() {
                Ok(HashMap::new())
            } else {
                self.orders.lookup(&unknown).await
            }
        } else {
            Ok(HashMap::new())
        };
        let mut keep = Vec::new();
        for hold in holds {
            let txn = self.db.begin().await?;
            match db::reservation(&txn, hold.order_id, true).await? {
                Some(r) if r.state != ReservationState::Released => {
                    // A hold taken for an order the database had reserved long before: a
                    // replay of its CreateOrder after the gate's record of it expired
                    // (`stock.order_record_ttl_secs`), judged afresh. Its units were already
                    // counted by the reservation: they go back on sale.
                    let retaken = sweeping
                        && db::reservation_written_ms(&txn, hold.order_id)
                            .await?
                            .is_some_and(|written| {
                                written.saturating_add(self.hold_ttl_ms_i64()) < hold.reserved_at_ms
                            });
                    txn.commit().await?;
                    if retaken {
                        self.gate
                            .release_unpersisted(at, hold.order_id)
                            .await
                            .map_err(gate_err)?;
                        metrics::counter!("flashsale_holds_retaken_released_total").increment(1);
                        tracing::info!(%sku, order_id = %hold.order_id, "gave back a hold retaken by a late replay of an order reserved long before");
                    } else {
                        self.gate
                            .mark_persisted(at, hold.order_id)
                            .await
                            .map_err(gate_err)?;
                    }
                }
                Some(_) => {
                    txn.commit().await?;
                    self.gate
                        .release_unpersisted(at, hold.order_id)
                        .await
                        .map_err(gate_err)?;
                }
                None if !sweeping => txn.commit().await?, // young hold: leave it be
                None => match verdict(&answer, hold.order_id) {
                    HoldVerdict::Defer => {
                        txn.commit().await?;
                        settled.deferred = true;
                    }
                    HoldVerdict::Keep => {
                        txn.commit().await?;
                        keep.push(hold.order_id);
                    }
                    HoldVerdict::Release => {
                        if self
                            .give_back(txn, at, sku, &hold, CANCELLED_BEFORE_CREATED, false)
                            .await?
                        {
                            settled.expired += 1;
                        }
                    }
                    HoldVerdict::Expire => {
                        if self
                            .give_back(txn, at, sku, &hold, HOLD_EXPIRED, true)
                            .await?
                        {
                            settled.expired += 1;
                        }
                    }
                },
            }
        }
        if !keep.is_empty() {
            settled.kept = keep.len() as u64;
            // To the back of the queue: asked about again one TTL from now, and the holds
            // behind them are reached meanwhile.
            self.gate
                .touch_holds(at, &keep, chrono::Utc::now().timestamp_millis())
                .await
                .map_err(gate_err)?;
            metrics::counter!("flashsale_holds_kept_total").increment(settled.kept);
            tracing::info!(%sku, kept = settled.kept, "kept expired gate holds whose orders exist (their order.created is late)");
        }
        if settled.expired > 0 {
            metrics::counter!("flashsale_holds_expired_total").increment(settled.expired);
            tracing::warn!(%sku, expired = settled.expired, "released gate holds whose orders were never written or were cancelled");
        }
        Ok(settled)
    }

    /// Releases an unpersisted hold and tombstones its reservation (`cause`) in `txn`, telling
    /// the order service with `stock.reservation_failed` when `tell`. `false` when
    /// `order.created` persisted it at this very moment (then it is marked persisted instead).
    async fn give_back(
        &self,
        txn: sea_orm::DatabaseTransaction,
        at: At<'_>,
        sku: &Sku,
        hold: &PendingHold,
        cause: &str,
        tell: bool,
    ) -> Result<bool, StockError> {
        let policy = self.terms.get(sku).await?.policy;
        let tombstone = Reservation {
            order_id: hold.order_id,
            sku: sku.clone(),
            user_id: hold.user_id.clone(),
            quantity: 0,
            state: ReservationState::Released,
            policy,
        };
        if !db::insert_reservation(&txn, &tombstone, cause).await? {
            txn.commit().await?;
            self.gate
                .mark_persisted(at, hold.order_id)
                .await
                .map_err(gate_err)?;
            return Ok(false);
        }
        if tell {
            // The order was never written, so nobody is waiting for it; were it written after
            // all, the order service cancels it with HOLD_EXPIRED.
            let failed = StockReservationFailed {
                order_id: hold.order_id.to_string(),
                sku: sku.to_string(),
                quantity: hold.qty,
                reason: ReservationFailureReason::OrderCancelled as i32,
                detail: "the stock hold expired before the order reached the database".into(),
            };
            let env = envelope::new(
                Payload::StockReservationFailed(failed),
                hold.order_id.to_string(),
                "",
                crate::app::PRODUCER,
            );
            outbox::enqueue(&txn, &env).await?;
        }
        // Units go back once the tombstone is committed (see `StockSaga`'s release); the stock
        // row lock, taken after the insert as `order.created` does, serialises this with the
        // settling of prepared releases.
        db::product(&txn, sku, true).await?;
        self.gate
            .prepare_release_unpersisted(at, hold.order_id)
            .await
            .map_err(gate_err)?;
        txn.commit().await?;
        self.gate
            .finish_release(at, hold.order_id)
            .await
            .map_err(gate_err)?;
        Ok(true)
    }

    /// One sweep over every product: settle holds older than `stock.hold_ttl_ms`. Returns how
    /// many were released. When the order service cannot be asked, nothing that needed its
    /// answer is released this round; that is logged once and counted in
    /// `flashsale_hold_sweeps_deferred_total`.
    pub async fn sweep_expired_holds(&self) -> Result<u64, StockError> {
        let ttl = i64::try_from(self.hold_ttl_ms).unwrap_or(i64::MAX);
        let cutoff = chrono::Utc::now().timestamp_millis().saturating_sub(ttl);
        let (mut total, mut deferred) = (0, Vec::new());
        self.settle_stale_releases().await?;
        self.settle_stale_transfers().await?;
        for sku in db::all_skus(&self.db).await? {
            let settled = self.settle_holds(&sku, cutoff).await?;
            total += settled.expired;
            if settled.deferred {
                deferred.push(sku);
            }
        }
        if !deferred.is_empty() {
            metrics::counter!("flashsale_hold_sweeps_deferred_total").increment(1);
            tracing::warn!(
                products = deferred.len(),
                first = %deferred[0],
                "hold sweep deferred: the order service cannot say whether expired holds' orders exist; none given away"
            );
        }
        Ok(total)
    }

    /// Runs [`Self::sweep_expired_holds`] every `stock.sweep_interval_ms` until `shutdown`, on
    /// one replica at a time: a sweep asks the order service about holds and changes the gate
    /// outside any row lock, so two replicas sweeping the same holds at once would ask twice and
    /// race each other's gate changes. A replica whose tick finds another sweeping skips it.
    pub async fn run_sweeper(
        self,
        shutdown: flashsale_platform::shutdown::Shutdown,
    ) -> anyhow::Result<()> {
        let period = Duration::from_millis(self.sweep_interval_ms);
        let singleton = Singleton::new(self.db.clone(), HOLD_SWEEP);
        flashsale_platform::shutdown::every(period, shutdown, "hold sweep", || async {
            singleton
                .run(|| self.sweep_expired_holds())
                .await
                .map_err(StockError::from)?
                .transpose()
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sweeper_gives_away_only_holds_whose_order_is_missing_or_cancelled() {
        let (live, cancelled, missing) = (
            uuid::Uuid::new_v4(),
            uuid::Uuid::new_v4(),
            uuid::Uuid::new_v4(),
        );
        let answer = Ok(HashMap::from([
            (live, OrderState::Live),
            (cancelled, OrderState::Cancelled),
        ]));
        assert_eq!(verdict(&answer, live), HoldVerdict::Keep);
        assert_eq!(verdict(&answer, cancelled), HoldVerdict::Release);
        assert_eq!(verdict(&answer, missing), HoldVerdict::Expire);
        let down = Err(OrdersUnavailable("connection refused".into()));
        for id in [live, cancelled, missing] {
            assert_eq!(verdict(&down, id), HoldVerdict::Defer);
        }
    }
}
