//! One replica at a time: a background job that must not run on two replicas at once (it works
//! outside any row lock, or asks another service about the same rows) runs its critical section
//! under a [`Singleton`]. Every replica keeps ticking; on each tick the one that takes the lock
//! runs the job and the others skip that tick.
//!
//! The lock is a PostgreSQL transaction-level advisory lock (`pg_try_advisory_xact_lock`) held
//! by a transaction that stays open while the job runs, on the service's own database: it needs
//! no table and no clock, and it is gone the moment its holder commits, crashes or loses its
//! connection, so a dead replica never keeps the others waiting.

use std::future::Future;

use sea_orm::{
    ConnectionTrait as _, DatabaseConnection, DbBackend, DbErr, Statement, TransactionTrait as _,
};

/// A named job that runs on at most one replica at a time. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Singleton {
    db: DatabaseConnection,
    key: String,
}

impl Singleton {
    /// The singleton `name` (e.g. `"product-stock/hold-sweep"`) over `db`; replicas sharing the
    /// database and the name exclude each other.
    pub fn new(db: DatabaseConnection, name: &str) -> Self {
        Self {
            db,
            key: format!("flashsale/singleton/{name}"),
        }
    }

    /// Runs `job` unless another holder of this singleton is running it right now: `Some` with
    /// its result, or `None` when the job was skipped. An error means the lock could not be
    /// asked for (the job did not run). While `job` runs, one pooled connection sits idle in the
    /// transaction that holds the lock.
    pub async fn run<F, Fut, T>(&self, job: F) -> Result<Option<T>, DbErr>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = T>,
    {
        let txn = self.db.begin().await?;
        let locked = txn
            .query_one_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                "SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0)) AS locked",
                [self.key.clone().into()],
            ))
            .await?
            .map(|row| row.try_get::<bool>("", "locked"))
            .transpose()?
            .unwrap_or(false);
        if !locked {
            txn.rollback().await.ok();
            metrics::counter!("flashsale_singleton_skips_total", "job" => self.key.clone())
                .increment(1);
            return Ok(None);
        }
        let out = job().await;
        // Ending the transaction releases the lock; if the connection broke meanwhile, the
        // server released it already.
        if let Err(e) = txn.commit().await {
            tracing::debug!(error = %e, job = %self.key, "singleton lock released with its connection");
        }
        Ok(Some(out))
    }
}
