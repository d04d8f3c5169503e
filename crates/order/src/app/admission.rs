//! Admission control (docs/architecture.md#admission-control): past a bound on the unfinished
//! work, CreateOrder refuses a new buyer at once, before the gate, instead of accepting orders
//! the platform cannot finish. Two backlogs are bounded: the orders waiting for the saga
//! (PENDING) and the paid orders waiting to ship (PAID). Both are counted in the database every
//! `admission.check_interval_ms` (so every replica sees every replica's orders); to the first
//! are added the orders this replica is still writing and those it wrote since the count
//! began, so a burst cannot run past the bound for a whole interval.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use sea_orm::DatabaseConnection;

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
    /// PENDING orders at the last count.
    unconfirmed: AtomicU64,
    /// PAID orders at the last count.
    unshipped: AtomicU64,
    /// Orders the gate granted on this replica whose write has not ended.
    writing: AtomicU64,
    /// Orders whose write ended on this replica and that no stored count has seen yet: counted
    /// into the unconfirmed backlog until a count that began after their write is stored (an
    /// order written during a count may be seen twice, and one whose write failed counts until
    /// the next count, which errs on the side of refusing).
    admitted: AtomicU64,
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
                unconfirmed: AtomicU64::new(0),
                unshipped: AtomicU64::new(0),
                writing: AtomicU64::new(0),
                admitted: AtomicU64::new(0),
            }),
        }
    }

    /// Lets one new order through to the gate, or refuses it with [`OrderError::Overloaded`]
    /// when a backlog is at its bound.
    pub fn admit(&self) -> Result<(), OrderError> {
        let i = &self.inner;
        let unconfirmed = i.unconfirmed.load(Ordering::Relaxed)
            + i.writing.load(Ordering::Relaxed)
            + i.admitted.load(Ordering::Relaxed);
        let unshipped = i.unshipped.load(Ordering::Relaxed);
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

    /// The gate granted units to an order let through: it counts toward the unconfirmed
    /// backlog while the returned guard lives (hold it over the order's write), then until the
    /// next count.
    pub fn granted(&self) -> Writing {
        self.inner.writing.fetch_add(1, Ordering::Relaxed);
        Writing(self.inner.clone())
    }

    /// Counts both backlogs in the database (each read up to its bound); the orders written
    /// before it began stop counting apart once it is stored.
    pub async fn count(&self) -> Result<(), OrderError> {
        let i = &self.inner;
        // The orders written before the count began are in it: they leave the tally only once
        // the count is stored, so that until then they still count beside the previous count
        // (an order may be counted twice for a moment, never not at all).
        let before = i.admitted.load(Ordering::Relaxed);
        let cap = |b: u64| if b == 0 { 0 } else { b.saturating_add(1) };
        let (unconfirmed, unshipped) =
            db::count_backlog(&i.db, cap(i.bounds.unconfirmed), cap(i.bounds.unshipped)).await?;
        i.unconfirmed.store(unconfirmed, Ordering::Relaxed);
        i.unshipped.store(unshipped, Ordering::Relaxed);
        i.admitted.fetch_sub(before, Ordering::Relaxed);
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
pub struct Writing(Arc<Inner>);

impl Drop for Writing {
    fn drop(&mut self) {
        self.0.admitted.fetch_add(1, Ordering::Relaxed);
        self.0.writing.fetch_sub(1, Ordering::Relaxed);
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
