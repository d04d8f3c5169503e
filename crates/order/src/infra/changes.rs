//! The feed of changed orders WatchOrder follows: PostgreSQL `LISTEN` on the channel a trigger
//! `NOTIFY`s every changed order id on, fanned out to this replica's watchers.

use std::time::Duration;

use sea_orm::DatabaseConnection;
use tokio::sync::broadcast;
use uuid::Uuid;

/// The `NOTIFY` channel carrying the ids of changed orders (the schema defines the trigger
/// that sends them).
pub use crate::migration::m0001_orders::ORDER_CHANGES_CHANNEL;

/// Fans out the ids of changed orders to the watchers of this replica. Cheap to clone.
#[derive(Clone, Debug)]
pub struct OrderChanges {
    tx: broadcast::Sender<Uuid>,
}

impl Default for OrderChanges {
    fn default() -> Self {
        Self::new()
    }
}

impl OrderChanges {
    pub fn new() -> Self {
        Self {
            tx: broadcast::channel(4096).0,
        }
    }

    /// The ids of orders changed from now on (a lagging receiver has missed some).
    pub fn subscribe(&self) -> broadcast::Receiver<Uuid> {
        self.tx.subscribe()
    }

    /// Listens for order changes until `shutdown`; reconnects after errors.
    pub async fn run(
        self,
        db: DatabaseConnection,
        shutdown: flashsale_platform::shutdown::Shutdown,
    ) -> anyhow::Result<()> {
        loop {
            tokio::select! {
                () = shutdown.wait() => return Ok(()),
                e = self.listen(&db) => {
                    tracing::warn!(error = %e, "order change listener lost; reconnecting");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }

    /// Forwards notifications until the connection fails; returns why.
    async fn listen(&self, db: &DatabaseConnection) -> sqlx::Error {
        let mut listener =
            match sqlx::postgres::PgListener::connect_with(db.get_postgres_connection_pool()).await
            {
                Ok(l) => l,
                Err(e) => return e,
            };
        if let Err(e) = listener.listen(ORDER_CHANGES_CHANNEL).await {
            return e;
        }
        loop {
            let n = match listener.recv().await {
                Ok(n) => n,
                Err(e) => return e,
            };
            // One id, or the ids a statement changed joined by commas.
            for id in n
                .payload()
                .split(',')
                .filter_map(|s| s.parse::<Uuid>().ok())
            {
                let _ = self.tx.send(id);
            }
        }
    }
}
