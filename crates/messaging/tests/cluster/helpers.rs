//! What the cluster tests share: settings naming every node, a fresh database with the outbox
//! and the inbox, an idempotent handler that counts duplicates, and a task with a shutdown.

use std::{
    collections::BTreeSet,
    future::Future,
    sync::{Arc, Mutex},
    time::Duration,
};

use flashsale_messaging::{
    AmqpConfig, HandlerError, Incoming, QueueType, envelope, inbox,
    migration::{AddCorrelation, CreateOutboxAndInbox},
};
use flashsale_proto::events::v1::{Envelope, OrderCreated, envelope::Payload};
use flashsale_test_support::{TestDatabase, rabbit_cluster::RabbitCluster, unique_name};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement, TransactionTrait};
use sea_orm_migration::{MigrationTrait, MigratorTrait};
use tokio::{sync::oneshot, task::JoinHandle};
use uuid::Uuid;

/// How long the tests wait for anything to happen after a node died.
pub const WAIT: Duration = Duration::from_secs(60);

/// Settings listing every node of `cluster`, with a unique exchange and queue prefix.
pub fn config(cluster: &RabbitCluster) -> AmqpConfig {
    AmqpConfig {
        urls: cluster.urls(),
        exchange: unique_name("fs_cl_ex"),
        queue_prefix: format!("{}.", unique_name("fs_cl")),
        queue_type: QueueType::Quorum,
        prefetch: 32,
        max_attempts: 3,
        retry_base_ms: 50,
        ..AmqpConfig::default()
    }
}

struct Migrator;

impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![Box::new(CreateOutboxAndInbox), Box::new(AddCorrelation)]
    }
}

/// A fresh database with `outbox`, `inbox` and an `effects` table without a unique constraint
/// (only the inbox keeps a duplicate out of it).
pub async fn database() -> (TestDatabase, DatabaseConnection) {
    let tdb = TestDatabase::create().await.unwrap();
    let db = tdb.connect().await.unwrap();
    Migrator::up(&db, None).await.unwrap();
    db.execute_unprepared(
        "CREATE TABLE effects (id bigserial PRIMARY KEY, message_id uuid NOT NULL)",
    )
    .await
    .unwrap();
    (tdb, db)
}

/// An `order.created` envelope for order `order_id`.
pub fn order_created(order_id: &str) -> Envelope {
    let payload = Payload::OrderCreated(OrderCreated {
        order_id: order_id.to_owned(),
        quantity: 1,
        ..OrderCreated::default()
    });
    envelope::new(payload, order_id, "", "cluster")
}

/// `SELECT count(*) AS n …`.
pub async fn count(db: &DatabaseConnection, sql: &str) -> i64 {
    let row = db
        .query_one_raw(Statement::from_string(DbBackend::Postgres, sql))
        .await
        .unwrap()
        .unwrap();
    row.try_get::<i64>("", "n").unwrap()
}

/// `SELECT … AS id` as a set.
pub async fn ids(db: &DatabaseConnection, sql: &str) -> BTreeSet<Uuid> {
    db.query_all_raw(Statement::from_string(DbBackend::Postgres, sql))
        .await
        .unwrap()
        .iter()
        .map(|r| r.try_get::<Uuid>("", "id").unwrap())
        .collect()
}

/// Handler calls and the duplicates the inbox kept out.
#[derive(Clone, Default)]
pub struct Tally {
    calls: Arc<Mutex<u64>>,
    duplicates: Arc<Mutex<u64>>,
}

impl Tally {
    pub fn calls(&self) -> u64 {
        *self.calls.lock().unwrap()
    }

    pub fn duplicates(&self) -> u64 {
        *self.duplicates.lock().unwrap()
    }
}

/// Applies each message as one `effects` row, claimed in the inbox in the same transaction.
pub fn effect_handler(
    db: DatabaseConnection,
    tally: Tally,
) -> impl Fn(Incoming) -> futures_util::future::BoxFuture<'static, Result<(), HandlerError>>
+ Send
+ Sync
+ 'static {
    move |m: Incoming| {
        let (db, tally) = (db.clone(), tally.clone());
        Box::pin(async move {
            *tally.calls.lock().unwrap() += 1;
            let txn = db.begin().await?;
            if !inbox::claim(&txn, "cluster.effects", m.message_id).await? {
                *tally.duplicates.lock().unwrap() += 1;
                return Ok(());
            }
            txn.execute_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                "INSERT INTO effects (message_id) VALUES ($1)",
                [m.message_id.into()],
            ))
            .await?;
            txn.commit().await?;
            Ok(())
        })
    }
}

/// A task run with a shutdown signal; `stop` signals and waits for it.
pub struct Running {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<anyhow::Result<()>>,
}

impl Running {
    pub fn spawn<F, Fut>(run: F) -> Self
    where
        F: FnOnce(std::pin::Pin<Box<dyn Future<Output = ()> + Send>>) -> Fut,
        Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel::<()>();
        let shutdown = Box::pin(async move {
            let _ = rx.await;
        });
        Self {
            stop: Some(tx),
            task: tokio::spawn(run(shutdown)),
        }
    }

    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(WAIT, &mut self.task)
            .await
            .expect("task stops on shutdown")
            .unwrap()
            .unwrap();
    }
}
