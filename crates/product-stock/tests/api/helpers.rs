//! `spawn_app`: product-stock in-process on free ports, with its own database, Redis key prefix,
//! exchange and queues (which the broker deletes a minute after the test stops using them), and
//! a fake order service ([`FakeOrders`]) the sweeper and the gate rebuild ask about orders.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use flashsale_messaging::{Broker, Publisher, envelope};
use flashsale_platform::{auth::Role, failpoint::Failpoints, shutdown::Shutdown};
use flashsale_product_stock::{
    config::Settings,
    infra::{
        gate::RedisGate,
        orders::{OrderPort, OrderState, OrdersUnavailable, PendingOrder},
    },
};
use flashsale_proto::{
    events::v1::{Envelope, envelope::Payload},
    product::v1::{
        CreateProductRequest, DeductionPolicy, Product, ReconcileStockRequest, StockDrift,
        product_stock_service_client::ProductStockServiceClient,
    },
};
use flashsale_test_support::{
    TestDatabase, amqp_url,
    grpc::{channel, token, with_token},
    probe, redis_url, unique_name,
};
use sea_orm::{ConnectionTrait, DatabaseConnection};
use tonic::transport::Channel;
use uuid::Uuid;

pub type Client = ProductStockServiceClient<Channel>;

pub struct TestApp {
    pub grpc_port: u16,
    pub metrics_port: u16,
    pub shutdown: Shutdown,
    pub task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    pub db: TestDatabase,
    pub conn: DatabaseConnection,
    pub settings: Settings,
    pub gate: RedisGate,
    pub failpoints: Failpoints,
    /// The fake order service this app asks (unused by [`spawn_with_order_client`]).
    pub orders: Arc<FakeOrders>,
    publisher: Publisher,
    _broker: Broker,
}

pub fn test_settings(db: &TestDatabase) -> Settings {
    let mut s = Settings::default();
    s.auth.allow_development_secret = true;
    s.grpc.addr = "127.0.0.1:0".into();
    s.metrics.addr = "127.0.0.1:0".into();
    s.database.url = db.url.clone();
    s.database.max_connections = 6;
    s.redis.url = redis_url();
    s.redis.key_prefix = format!("{}:", unique_name("fs_test"));
    s.amqp.url = amqp_url();
    s.amqp.exchange = unique_name("fs_test_ex");
    s.amqp.queue_prefix = format!("{}.", unique_name("fs_test_q"));
    s.amqp.queue_expires_ms = 60_000;
    // The tests read what the service sent from its outbox.
    s.amqp.outbox_keep_published_hours = 24;
    // Quorum queues are covered by the messaging tests; dozens of parallel tests declaring
    // Raft groups would only slow the broker down.
    s.amqp.queue_type = flashsale_messaging::QueueType::Classic;
    s.amqp.retry_base_ms = 50;
    s.amqp.max_attempts = 3;
    // Tests that lose a gate want it rebuilt at once; the wait before a rebuild has its own test.
    s.stock.rebuild_settle_ms = 0;
    // The tests read as one buyer as often as they like: the read limit is off here and has its
    // own test (limits.rs).
    s.limits.read_per_sec = 0;
    s
}

pub async fn spawn_app() -> TestApp {
    let db = TestDatabase::create().await.expect("create test database");
    spawn_with(test_settings(&db), db).await
}

pub async fn spawn_with(settings: Settings, db: TestDatabase) -> TestApp {
    let orders = Arc::new(FakeOrders::default());
    let failpoints = Failpoints::default();
    let app = flashsale_product_stock::startup::build_with_orders(
        settings.clone(),
        failpoints.clone(),
        orders.clone(),
    )
    .await
    .expect("build app");
    finish(app, settings, db, failpoints, orders).await
}

/// product-stock with its real order-service client, at `settings.order_service.url`.
pub async fn spawn_with_order_client(settings: Settings, db: TestDatabase) -> TestApp {
    let failpoints = Failpoints::default();
    let app = flashsale_product_stock::startup::build_with(settings.clone(), failpoints.clone())
        .await
        .expect("build app");
    finish(app, settings, db, failpoints, Arc::default()).await
}

async fn finish(
    app: flashsale_platform::app::Application,
    settings: Settings,
    db: TestDatabase,
    failpoints: Failpoints,
    orders: Arc<FakeOrders>,
) -> TestApp {
    let (grpc_port, metrics_port, shutdown) = (app.grpc_port(), app.metrics_port(), app.shutdown());
    let task = tokio::spawn(app.run_until_stopped());
    let pool = flashsale_platform::redis::pool(&settings.redis).unwrap();
    let gate = RedisGate::new(
        pool,
        settings.redis.key_prefix.clone(),
        Duration::from_secs(3600),
    );
    let broker = Broker::connect(settings.amqp.clone()).await.unwrap();
    let publisher = Publisher::new(&broker);
    let conn = db.connect().await.unwrap();
    TestApp {
        grpc_port,
        metrics_port,
        shutdown,
        task: Some(task),
        db,
        conn,
        settings,
        gate,
        failpoints,
        orders,
        publisher,
        _broker: broker,
    }
}

/// What the fake order service knows of an order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FakeStatus {
    Pending,
    Paid,
    Cancelled,
}

/// An in-memory order service: the orders put into it, or unreachable while `down`.
#[derive(Default)]
pub struct FakeOrders {
    orders: Mutex<HashMap<Uuid, (String, PendingOrder, FakeStatus)>>,
    down: AtomicBool,
}

impl FakeOrders {
    pub fn put(&self, sku: &str, order_id: Uuid, user_id: &str, quantity: i64, status: FakeStatus) {
        let order = PendingOrder {
            order_id,
            user_id: user_id.to_owned(),
            quantity,
        };
        self.orders
            .lock()
            .unwrap()
            .insert(order_id, (sku.to_owned(), order, status));
    }

    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    fn check(&self) -> Result<(), OrdersUnavailable> {
        if self.down.load(Ordering::SeqCst) {
            return Err(OrdersUnavailable("the fake order service is down".into()));
        }
        Ok(())
    }
}

#[tonic::async_trait]
impl OrderPort for FakeOrders {
    async fn lookup(&self, ids: &[Uuid]) -> Result<HashMap<Uuid, OrderState>, OrdersUnavailable> {
        self.check()?;
        let orders = self.orders.lock().unwrap();
        Ok(ids
            .iter()
            .filter_map(|id| {
                let (_, _, status) = orders.get(id)?;
                let state = match status {
                    FakeStatus::Cancelled => OrderState::Cancelled,
                    _ => OrderState::Live,
                };
                Some((*id, state))
            })
            .collect())
    }

    async fn pending(&self, sku: &str) -> Result<Vec<PendingOrder>, OrdersUnavailable> {
        self.check()?;
        let orders = self.orders.lock().unwrap();
        Ok(orders
            .values()
            .filter(|(s, _, status)| s == sku && *status == FakeStatus::Pending)
            .map(|(_, o, _)| o.clone())
            .collect())
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.shutdown.trigger();
    }
}

// === impl TestApp ===

impl TestApp {
    /// ReconcileStock of one product, as an admin: its report.
    pub async fn reconcile_report(&self, sku: &str, repair: bool) -> StockDrift {
        self.client()
            .await
            .reconcile_stock(admin(ReconcileStockRequest {
                skus: vec![sku.into()],
                repair,
            }))
            .await
            .unwrap()
            .into_inner()
            .reports
            .remove(0)
    }

    pub async fn client(&self) -> Client {
        ProductStockServiceClient::new(channel(self.grpc_port).await.unwrap())
    }

    /// Another replica of this service (same database, Redis keys and queues; its own ports):
    /// its gRPC port, and what stops it.
    pub async fn spawn_replica(&self) -> (u16, Shutdown) {
        let app = flashsale_product_stock::startup::build_with_orders(
            self.settings.clone(),
            Failpoints::default(),
            self.orders.clone(),
        )
        .await
        .expect("build replica");
        let (port, stop) = (app.grpc_port(), app.shutdown());
        tokio::spawn(app.run_until_stopped());
        (port, stop)
    }

    pub async fn create(
        &self,
        sku: &str,
        stock: i64,
        limit: u32,
        policy: DeductionPolicy,
    ) -> Product {
        let req = CreateProductRequest {
            sku: sku.into(),
            name: format!("{sku} bottle"),
            price_cents: 1999,
            initial_stock: stock,
            per_user_limit: limit,
            deduction_policy: policy as i32,
            stock_buckets: 0,
            ..Default::default()
        };
        self.client()
            .await
            .create_product(admin(req))
            .await
            .unwrap()
            .into_inner()
            .product
            .unwrap()
    }

    /// Publishes an event to this app's exchange, as another service's outbox relay would.
    pub async fn publish(&self, payload: Payload, correlation: &str) -> Envelope {
        let env = envelope::new(payload, correlation, "", "test");
        self.publish_envelope(&env).await;
        env
    }

    pub async fn publish_envelope(&self, env: &Envelope) {
        self.publisher.publish_envelope(env).await.unwrap();
    }

    /// Runs `sql` and returns its single `n` column as i64.
    pub async fn count(&self, sql: &str) -> i64 {
        probe::count(&self.conn, sql).await.unwrap()
    }

    /// Polls until `sql` counts `want`.
    pub async fn wait_count(&self, sql: &str, want: i64) {
        probe::wait_count(&self.conn, sql, want, Duration::from_secs(15))
            .await
            .unwrap();
    }

    /// Waits until the gate of `sku` reads `(available, held)`, then checks it still does a
    /// moment later (units come back once, not twice). A release gives its units back just
    /// after its commit, so the database shows RELEASED a moment before the gate follows.
    pub async fn wait_gate(&self, sku: &str, want: (i64, i64)) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        let mut seen = None;
        while tokio::time::Instant::now() < deadline {
            let snap = self.gate.snapshot(sku).await.unwrap();
            seen = snap.map(|s| (s.available, s.held));
            if seen == Some(want) {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let again = self.gate.snapshot(sku).await.unwrap();
                assert_eq!(
                    again.map(|s| (s.available, s.held)),
                    Some(want),
                    "{sku} moved on"
                );
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the gate of {sku} never read {want:?}; last {seen:?}");
    }

    /// Events this service wrote to its outbox, in order.
    pub async fn outbox(&self) -> Vec<Envelope> {
        probe::outbox(&self.conn, None).await.unwrap()
    }

    /// Outbox events of type `kind`.
    pub async fn outbox_of(&self, kind: &str) -> Vec<Envelope> {
        probe::outbox(&self.conn, Some(kind)).await.unwrap()
    }

    /// Messages parked from consumer queue `name` (moved into `dead_letters` by the drainer).
    pub async fn parked(&self, name: &str) -> u32 {
        let topology = flashsale_messaging::QueueTopology::new(&self.settings.amqp, name, &[]);
        let n = flashsale_messaging::dead_letter::count_parked(&self.conn, topology.queue())
            .await
            .unwrap();
        u32::try_from(n).unwrap()
    }

    pub async fn exec(&self, sql: &str) {
        self.conn.execute_unprepared(sql).await.unwrap();
    }
}

pub fn admin<T>(msg: T) -> tonic::Request<T> {
    with_token(msg, &token("root", Role::Admin))
}

pub fn service<T>(msg: T) -> tonic::Request<T> {
    with_token(msg, &token("order", Role::Service))
}

pub fn user<T>(msg: T) -> tonic::Request<T> {
    with_token(msg, &token("alice", Role::User))
}

/// The `ErrorInfo` reason of a status.
pub fn reason(s: &tonic::Status) -> String {
    flashsale_platform::error::reason_of(s).unwrap_or_default()
}
