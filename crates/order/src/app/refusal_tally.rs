//! Each product's refusals for the sale report (GetSaleReport): counted in memory per second
//! (by the gate's clock, as this replica knows it) and reason, and added to `sale_refusals`
//! once a second. A refusal itself writes nothing: a crowd of a hundred thousand refusals a
//! second costs each replica one small write a second.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use sea_orm::DatabaseConnection;

use crate::{domain::OrderError, infra::db};

/// How often the counts are written.
pub const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// Most (product, second, reason) counts held between two writes; beyond them refusals are
/// not counted (and `flashsale_sale_refusals_uncounted_total` says how many).
const MAX_KEYS: usize = 100_000;

type Key = (String, i64, &'static str);

/// The refusals counted since the last write. Cheap to clone; clones share the counts.
#[derive(Clone, Debug, Default)]
pub struct RefusalTally {
    counts: Arc<Mutex<HashMap<Key, i64>>>,
}

impl RefusalTally {
    /// One refusal of `sku` for `reason`, at `at_ms` (its second is counted).
    pub fn count(&self, sku: &str, at_ms: i64, reason: &'static str) {
        let second = at_ms.div_euclid(1_000) * 1_000;
        let Ok(mut counts) = self.counts.lock() else {
            return;
        };
        let key = (sku.to_owned(), second, reason);
        if let Some(n) = counts.get_mut(&key) {
            *n += 1;
        } else if counts.len() < MAX_KEYS {
            counts.insert(key, 1);
        } else {
            metrics::counter!("flashsale_sale_refusals_uncounted_total").increment(1);
        }
    }

    /// The counts since the last call, emptied.
    fn take(&self) -> HashMap<Key, i64> {
        self.counts
            .lock()
            .map(|mut c| std::mem::take(&mut *c))
            .unwrap_or_default()
    }

    /// Counts that could not be written go back, to be written next time.
    fn put_back(&self, counts: HashMap<Key, i64>) {
        if let Ok(mut c) = self.counts.lock() {
            for (k, n) in counts {
                if let Some(m) = c.get_mut(&k) {
                    *m += n;
                } else if c.len() < MAX_KEYS {
                    c.insert(k, n);
                }
            }
        }
    }

    /// Adds the counts since the last write to the database.
    pub async fn flush(&self, conn: &DatabaseConnection) -> Result<(), OrderError> {
        let counts = self.take();
        if counts.is_empty() {
            return Ok(());
        }
        let rows: Vec<(String, i64, &'static str, i64)> = counts
            .iter()
            .map(|((sku, second, reason), n)| (sku.clone(), *second, *reason, *n))
            .collect();
        if let Err(e) = db::add_refusals(conn, &rows).await {
            self.put_back(counts);
            return Err(e);
        }
        Ok(())
    }

    /// Writes the counts every [`FLUSH_EVERY`] until `shutdown`, and once more then.
    pub async fn run(
        self,
        conn: DatabaseConnection,
        shutdown: flashsale_platform::shutdown::Shutdown,
    ) -> anyhow::Result<()> {
        flashsale_platform::shutdown::every(FLUSH_EVERY, shutdown, "sale refusal counts", || {
            self.flush(&conn)
        })
        .await?;
        if let Err(e) = self.flush(&conn).await {
            tracing::warn!(error = %e, "the last sale refusal counts were not written");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_counted_per_product_second_and_reason() {
        let t = RefusalTally::default();
        t.count("A", 1_000, "SOLD_OUT");
        t.count("A", 1_999, "SOLD_OUT");
        t.count("A", 2_000, "SOLD_OUT");
        t.count("A", 1_500, "SALE_NOT_STARTED");
        t.count("B", 1_500, "SOLD_OUT");
        let counts = t.take();
        assert_eq!(counts.len(), 4);
        assert_eq!(counts[&("A".to_owned(), 1_000, "SOLD_OUT")], 2);
        assert_eq!(counts[&("A".to_owned(), 2_000, "SOLD_OUT")], 1);
        assert!(t.take().is_empty(), "taken once");
        t.count("A", 1_000, "SOLD_OUT");
        t.put_back(counts);
        assert_eq!(t.take()[&("A".to_owned(), 1_000, "SOLD_OUT")], 3);
    }
}
