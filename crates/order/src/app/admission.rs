//! Admission control (docs/architecture.md#admission-control): past a bound on the unfinished
//! work, CreateOrder refuses a new buyer at once, before the gate, instead of accepting orders
//! the platform cannot finish. Two backlogs are bounded: the orders waiting for the saga
//! (PENDING) and the paid orders waiting to ship (PAID). Both are counted in the database every
//! `admission.check_interval_ms` (so every replica sees every replica's orders); to the first
//! are added the orders this replica is still writing and those it wrote that no count has
//! seen yet, so a burst cannot run past the bound for a whole interval, and no order is counted
//! twice.

use std::{
    collections::HashSet,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use sea_orm::{AccessMode, DatabaseConnection, IsolationLevel, TransactionTrait};
use uuid::Uuid;

use crate::{config::AdmissionSettings, domain::OrderError, infra::db};

/// Gauge: the backlog as last counted (`backlog` label: `unconfirmed`, `unshipped`).
pub const BACKLOG_GAUGE: &str = "flashsale_admission_backlog";

/// The admission check and its backlog counts. Cheap to clone.
#[derive(Clone)]
pub struct Admission {
    inner: Arc<Inner>,
}

struct Inner {
    db: DatabaseConnection,
    bounds: Bounds,
    every: Duration,
    retry_after: Duration,
    tally: Mutex<Tally>,
}

/// The last count and this replica's orders no count has seen yet, under one lock.
#[derive(Default)]
struct Tally {
    /// PENDING orders at the last count.
    unconfirmed: u64,
    /// PAID orders at the last count.
    unshipped: u64,
    /// Orders the gate granted on this replica whose write has not ended.
    writing: HashSet<Uuid>,
    /// Of `writing`, those a stored count already saw written (committed before its snapshot).
    writing_seen: HashSet<Uuid>,
    /// Orders whose write ended on this replica and that no stored count has seen: counted
    /// until a count sees them, or, for a write that failed, until the next count.
    ended: HashSet<Uuid>,
}

impl Tally {
    /// The unconfirmed backlog a new order finds: the last count and, once each, the orders
    /// it did not see.
    fn unconfirmed(&self) -> u64 {
        let unseen = self.writing.len().saturating_sub(self.writing_seen.len()) + self.ended.len();
        self.unconfirmed + unseen as u64
    }
}

impl Inner {
    fn tally(&self) -> MutexGuard<'_, Tally> {
        // A panic elsewhere while holding it leaves a tally that is still whole.
        self.tally
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The two bounds; 0 is no bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Bounds {
    unconfirmed: u64,
    unshipped: u64,
}

/// Which backlog is full, if one is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Full {
    Unconfirmed(u64),
    Unshipped(u64),
}

impl Bounds {
    /// The backlog a new order would find full: `unconfirmed` (counted plus admitted since) at
    /// its bound, or `unshipped` at its bound.
    fn full(self, unconfirmed: u64, unshipped: u64) -> Option<Full> {
        if self.unconfirmed > 0 && unconfirmed >= self.unconfirmed {
            Some(Full::Unconfirmed(unconfirmed))
        } else if self.unshipped > 0 && unshipped >= self.unshipped {
            Some(Full::Unshipped(unshipped))
        } else {
            None
        }
    }
}

impl Admission {
    pub fn new(db: DatabaseConnection, settings: &AdmissionSettings) -> Self {
        Self {
            inner: Arc::new(Inner {
                db,
                bounds: Bounds {
                    unconfirmed: settings.max_unconfirmed,
                    unshipped: settings.max_unshipped,
                },
                every: Duration::from_millis(settings.check_interval_ms),
                retry_after: Duration::from_millis(settings.retry_after_ms),
                tally: Mutex::new(Tally::default()),
            }),
        }
    }

    /// Lets one new order through to the gate, or refuses it with [`OrderError::Overloaded`]
    /// when a backlog is at its bound.
    pub fn admit(&self) -> Result<(), OrderError> {
        let i = &self.inner;
        let (unconfirmed, unshipped) = {
            let t = i.tally();
            (t.unconfirmed(), t.unshipped)
        };
        let Some(full) = i.bounds.full(unconfirmed, unshipped) else {
            return Ok(());
        };
        metrics::counter!("flashsale_orders_refused_total", "reason" => flashsale_contract::reason::OVERLOADED)
            .increment(1);
        let (what, n, bound) = match full {
            Full::Unconfirmed(n) => ("orders waiting to be confirmed", n, i.bounds.unconfirmed),
            Full::Unshipped(n) => ("paid orders waiting to ship", n, i.bounds.unshipped),
        };
        Err(OrderError::Overloaded {
            message: format!(
                "the platform is at capacity ({n} {what}, bound {bound}); retry in {} ms",
                i.retry_after.as_millis()
            ),
            retry_after: i.retry_after,
        })
    }

    /// The gate granted units to order `order_id`, let through: it counts toward the
    /// unconfirmed backlog while the returned guard lives (hold it over the order's write),
    /// then until a count sees it.
    pub fn granted(&self, order_id: Uuid) -> Writing {
        self.inner.tally().writing.insert(order_id);
        Writing(self.inner.clone(), order_id)
    }

    /// Counts both backlogs in the database (each read up to its bound), then stores the count
    /// and takes the orders it saw out of the tally, each order counted once.
    pub async fn count(&self) -> Result<(), OrderError> {
        let i = &self.inner;
        // Which of this replica's unseen orders the count sees written is read in its own
        // snapshot: those are in the count and stop counting apart. Those whose write ended
        // before the count began and that it does not see were never written.
        let ended_before: HashSet<Uuid> = i.tally().ended.clone();
        let cap = |b: u64| if b == 0 { 0 } else { b.saturating_add(1) };
        let txn = i
            .db
            .begin_with_config(
                Some(IsolationLevel::RepeatableRead),
                Some(AccessMode::ReadOnly),
            )
            .await?;
        let (unconfirmed, unshipped) =
            db::count_backlog(&txn, cap(i.bounds.unconfirmed), cap(i.bounds.unshipped)).await?;
        let unseen: Vec<Uuid> = {
            let t = i.tally();
            t.writing
                .iter()
                .filter(|id| !t.writing_seen.contains(*id))
                .chain(t.ended.iter())
                .copied()
                .collect()
        };
        let seen: HashSet<Uuid> = db::existing_orders(&txn, &unseen)
            .await?
            .into_iter()
            .collect();
        txn.commit().await?;
        {
            let mut t = i.tally();
            t.unconfirmed = unconfirmed;
            t.unshipped = unshipped;
            t.ended
                .retain(|id| !seen.contains(id) && !ended_before.contains(id));
            let still_writing: Vec<Uuid> = seen
                .iter()
                .filter(|id| t.writing.contains(*id))
                .copied()
                .collect();
            t.writing_seen.extend(still_writing);
        }
        metrics::gauge!(BACKLOG_GAUGE, "backlog" => "unconfirmed").set(unconfirmed as f64);
        metrics::gauge!(BACKLOG_GAUGE, "backlog" => "unshipped").set(unshipped as f64);
        Ok(())
    }

    /// Whether any bound is set (with none, nothing is counted).
    pub fn bounded(&self) -> bool {
        let b = self.inner.bounds;
        b.unconfirmed > 0 || b.unshipped > 0
    }

    /// Runs [`Self::count`] every `admission.check_interval_ms` until `shutdown`.
    pub async fn run(self, shutdown: flashsale_platform::shutdown::Shutdown) -> anyhow::Result<()> {
        if !self.bounded() {
            return Ok(());
        }
        let period = self.inner.every;
        flashsale_platform::shutdown::every(period, shutdown, "admission backlog count", || {
            self.count()
        })
        .await
    }
}

/// An order being written, counted in the unconfirmed backlog ([`Admission::granted`]).
pub struct Writing(Arc<Inner>, Uuid);

impl Drop for Writing {
    fn drop(&mut self) {
        let mut t = self.0.tally();
        t.writing.remove(&self.1);
        // Seen by a count already: it is in the count, not to be counted again.
        if !t.writing_seen.remove(&self.1) {
            t.ended.insert(self.1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_backlog_is_full_at_its_bound_and_a_zero_bound_is_none() {
        let b = Bounds {
            unconfirmed: 10,
            unshipped: 5,
        };
        assert_eq!(b.full(9, 4), None);
        assert_eq!(b.full(10, 0), Some(Full::Unconfirmed(10)));
        assert_eq!(b.full(0, 5), Some(Full::Unshipped(5)));
        assert_eq!(b.full(12, 7), Some(Full::Unconfirmed(12)));
        let none = Bounds {
            unconfirmed: 0,
            unshipped: 0,
        };
        assert_eq!(none.full(u64::MAX, u64::MAX), None);
    }
}
