//! Per-test isolation: a unique exchange and queue prefix on the real broker (deleted on drop),
//! a fresh database with the outbox/inbox migration, and a small recorder for handler calls.

use std::{
    future::Future,
    sync::{Arc, Mutex},
    time::Duration,
};

use flashsale_messaging::{
    AmqpConfig, Broker, DelayQueue, QueueTopology, QueueType, envelope,
    migration::{AddCorrelation, CreateOutboxAndInbox},
};
use flashsale_proto::events::v1::{Envelope, OrderCreated, envelope::Payload};
use flashsale_test_support::{TestDatabase, amqp_url, unique_name};
use lapin::{
    Channel, Connection, ConnectionProperties,
    message::BasicGetMessage,
    options::{BasicGetOptions, ExchangeDeleteOptions, QueueDeclareOptions, QueueDeleteOptions},
    types::FieldTable,
};
use sea_orm::{ConnectionTrait, DatabaseConnection};
use sea_orm_migration::{MigrationTrait, MigratorTrait};
use tokio::{sync::oneshot, task::JoinHandle};

pub const WAIT: Duration = Duration::from_secs(15);

/// Installs a layer-less registry as the process-wide subscriber, once. `tracing` caches per
/// callsite whether it is enabled, computed against the first thread that reaches it; without
/// a global subscriber a test running without one would disable the `consume` span for the
/// trace test's thread-local subscriber too.
fn global_subscriber() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry());
    });
}

/// Settings with a unique exchange and queue prefix, and a fast retry ladder.
pub fn config() -> AmqpConfig {
    global_subscriber();
    AmqpConfig {
        url: amqp_url(),
        exchange: unique_name("fs_it_ex"),
        queue_prefix: format!("{}.", unique_name("fs_it")),
        prefetch: 16,
        max_attempts: 3,
        retry_base_ms: 20,
        queue_type: QueueType::Quorum,
        // These tests delete what they declare on drop (and check that nothing is left).
        queue_expires_ms: 0,
        bundle_max_events: 64,
        ..AmqpConfig::default()
    }
}

/// A broker connection plus an admin channel; deletes the test's queues and exchange on drop.
pub struct Amqp {
    pub config: AmqpConfig,
    pub broker: Broker,
    pub admin: Channel,
    queues: Arc<Mutex<Vec<String>>>,
}

impl Amqp {
    pub async fn new(config: AmqpConfig) -> Self {
        let broker = Broker::connect(config.clone()).await.unwrap();
        let admin = broker.channel().await.unwrap();
        Self {
            config,
            broker,
            admin,
            queues: Arc::default(),
        }
    }

    /// Declares `topology` now and deletes its queues at the end.
    pub async fn topology(&self, name: &str, keys: &[&str]) -> QueueTopology {
        let t = QueueTopology::new(&self.config, name, keys);
        t.declare(&self.admin).await.unwrap();
        self.delete_later(&t);
        t
    }

    /// Deletes `topology`'s queues (declared by the test itself) at the end.
    pub fn delete_later(&self, t: &QueueTopology) {
        let mut q = self.queues.lock().unwrap();
        q.push(t.queue().to_owned());
        q.push(t.dead_letter_queue());
        q.extend((1..=t.retries()).map(|i| t.retry_queue(i)));
    }

    /// Deletes `queue` at the end.
    pub fn forget_later(&self, dq: &DelayQueue) {
        self.queues.lock().unwrap().push(dq.name().to_owned());
    }

    /// Ready messages in `queue`.
    pub async fn count(&self, queue: &str) -> u32 {
        self.admin
            .queue_declare(
                queue.into(),
                QueueDeclareOptions::default().passive(),
                FieldTable::default(),
            )
            .await
            .unwrap()
            .message_count()
    }

    /// Takes one message off `queue` (acked).
    pub async fn get(&self, queue: &str) -> Option<BasicGetMessage> {
        self.admin
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
    }
}

impl Drop for Amqp {
    fn drop(&mut self) {
        let queues = std::mem::take(&mut *self.queues.lock().unwrap());
        let exchange = self.config.exchange.clone();
        // Drop may run while the test's runtime shuts down: clean up from a thread of its own.
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                let Ok(conn) =
                    Connection::connect(&amqp_url(), ConnectionProperties::default()).await
                else {
                    return;
                };
                if let Ok(ch) = conn.create_channel().await {
                    for q in queues {
                        let _ = ch
                            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                            .await;
                    }
                    let _ = ch
                        .exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
                        .await;
                }
                let _ = conn.close(200, "bye".into()).await;
            });
        })
        .join();
    }
}

struct Migrator;

impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![Box::new(CreateOutboxAndInbox), Box::new(AddCorrelation)]
    }
}

/// A fresh database with `outbox`, `inbox` and an `effects` table without unique constraints
/// (so only the inbox can keep a duplicate out).
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
    envelope::new(payload, order_id, "", "it")
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

/// A shared log of what handlers saw.
#[derive(Clone)]
pub struct Recorder<T>(Arc<Mutex<Vec<T>>>);

impl<T> Default for Recorder<T> {
    fn default() -> Self {
        Self(Arc::default())
    }
}

impl<T: Clone> Recorder<T> {
    pub fn push(&self, v: T) {
        self.0.lock().unwrap().push(v);
    }

    pub fn all(&self) -> Vec<T> {
        self.0.lock().unwrap().clone()
    }

    pub fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}
