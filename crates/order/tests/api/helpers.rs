//! `spawn_stack`: product-stock, order and the payment provider simulator in-process on free
//! ports, product-stock and order each with its own database, sharing one test exchange (their
//! own queues), as in production, each calling the other; `spawn_app` is order alone (its
//! provider does not answer).

use std::time::Duration;

use flashsale_contract::payment::{DEV_PAYMENT_API_KEY, DEV_WEBHOOK_SECRET, sign};
use flashsale_messaging::{Broker, Publisher, QueueType, envelope};
use flashsale_order::config::Settings;
use flashsale_payment_sim::{Running, SimConfig};
use flashsale_platform::{auth::Role, failpoint::Failpoints, shutdown::Shutdown};
use flashsale_proto::{
    events::v1::{Envelope, envelope::Payload},
    order::v1::{
        CreateOrderRequest, GetOrderRequest, NotifyPaymentRequest, NotifyPaymentResponse, Order,
        OrderStatus, PayOrderRequest, PayOrderResponse, order_service_client::OrderServiceClient,
        payment_notification_service_client::PaymentNotificationServiceClient,
    },
    payment::v1::{
        PayCheckoutRequest, PaymentEvent, PaymentEventType,
        payment_provider_service_client::PaymentProviderServiceClient,
    },
    product::v1::{
        CreateProductRequest, DeductionPolicy, GetProductRequest, Product,
        product_stock_service_client::ProductStockServiceClient,
    },
};
use flashsale_test_support::{
    TestDatabase, amqp_url, eventually,
    grpc::{channel, token, with_token},
    probe, redis_url, unique_name,
};
use sea_orm::DatabaseConnection;
use tonic::transport::Channel;

pub type Client = OrderServiceClient<Channel>;

pub struct TestApp {
    pub grpc_port: u16,
    pub metrics_port: u16,
    pub shutdown: Shutdown,
    pub task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    pub db: TestDatabase,
    pub conn: DatabaseConnection,
    pub settings: Settings,
    pub failpoints: Failpoints,
    pub stock_port: u16,
    /// product-stock's settings (`spawn_stack` only).
    pub stock_settings: Option<flashsale_product_stock::config::Settings>,
    stock_stop: Option<Shutdown>,
    _stock_db: Option<TestDatabase>,
    /// The payment provider (`spawn_stack` only).
    pub sim: Option<Running>,
    publisher: Publisher,
    _broker: Broker,
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.shutdown.trigger();
        if let Some(s) = &self.stock_stop {
            s.trigger();
        }
    }
}

fn amqp_for_test(exchange: &str) -> flashsale_messaging::AmqpConfig {
    flashsale_messaging::AmqpConfig {
        url: amqp_url(),
        exchange: exchange.to_owned(),
        queue_prefix: format!("{}.", unique_name("fs_test_q")),
        queue_expires_ms: 60_000,
        queue_type: QueueType::Classic,
        retry_base_ms: 50,
        max_attempts: 3,
        // The tests read what the service sent from its outbox.
        outbox_keep_published_hours: 24,
        ..Default::default()
    }
}

pub fn test_settings(db: &TestDatabase, exchange: &str, stock_port: u16) -> Settings {
    let mut s = Settings::default();
    s.auth.allow_development_secret = true;
    s.grpc.addr = "127.0.0.1:0".into();
    s.metrics.addr = "127.0.0.1:0".into();
    s.database.url = db.url.clone();
    s.database.max_connections = 8;
    s.amqp = amqp_for_test(exchange);
    s.upstream.product_stock_url = format!("http://127.0.0.1:{stock_port}");
    s.saga.sweep_interval_ms = 200;
    // Nothing answers here: `spawn_stack` points it at a simulator.
    s.payment.provider_url = "http://127.0.0.1:1".into();
    s.payment.api_key = DEV_PAYMENT_API_KEY.into();
    s.payment.webhook_secret = DEV_WEBHOOK_SECRET.into();
    s.payment.call_timeout_ms = 2_000;
    s.payment.refund_retry_base_ms = 50;
    s.payment.refund_sweep_interval_ms = 100;
    // The tests poll GetOrder every 20 ms as the buyer and cancel freely: the read and cancel
    // limits are off here and have their own tests (limits.rs).
    s.limits.read_per_sec = 0;
    s.limits.cancel_order_per_sec = 0;
    s
}

/// A payment provider simulator on a free port, quick to notify.
pub async fn spawn_sim(tune: impl FnOnce(&mut SimConfig)) -> Running {
    let mut c = SimConfig {
        notify_delay: Duration::from_millis(10),
        retry_base: Duration::from_millis(50),
        ..SimConfig::default()
    };
    tune(&mut c);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    flashsale_payment_sim::start(c, listener).await.unwrap()
}

/// A port nothing listens on right now (the order service binds it next: product-stock must
/// know the order service's address before either starts).
/// A port for a server that binds it seconds later, after another has started.
fn free_port() -> u16 {
    flashsale_test_support::servers::port_outside_the_ephemeral_range().unwrap()
}

/// product-stock on a free port on `exchange`, asking the order service at `order_port`.
async fn spawn_stock(
    exchange: &str,
    order_port: u16,
    tune: impl FnOnce(&mut flashsale_product_stock::config::Settings),
) -> (
    u16,
    Shutdown,
    TestDatabase,
    flashsale_product_stock::config::Settings,
) {
    let db = TestDatabase::create().await.unwrap();
    let mut s = flashsale_product_stock::config::Settings::default();
    s.auth.allow_development_secret = true;
    s.grpc.addr = "127.0.0.1:0".into();
    s.metrics.addr = "127.0.0.1:0".into();
    s.database.url = db.url.clone();
    s.database.max_connections = 8;
    s.redis.url = redis_url();
    s.redis.key_prefix = format!("{}:", unique_name("fs_test"));
    s.amqp = amqp_for_test(exchange);
    s.order_service.url = format!("http://127.0.0.1:{order_port}");
    // A test that loses a gate wants it rebuilt at once; product-stock's own tests cover the wait.
    s.stock.rebuild_settle_ms = 0;
    tune(&mut s);
    let app = flashsale_product_stock::startup::build(s.clone())
        .await
        .unwrap();
    let (port, stop) = (app.grpc_port(), app.shutdown());
    tokio::spawn(app.run_until_stopped());
    (port, stop, db, s)
}

/// Both services; `tune` adjusts the order settings.
pub async fn spawn_stack(tune: impl FnOnce(&mut Settings)) -> TestApp {
    spawn_stack_with(tune, |_| {}).await
}

/// Both services; `tune` adjusts the order settings, `tune_stock` product-stock's (give it
/// another `amqp.exchange` and the order service's events never reach it).
pub async fn spawn_stack_with(
    tune: impl FnOnce(&mut Settings),
    tune_stock: impl FnOnce(&mut flashsale_product_stock::config::Settings),
) -> TestApp {
    spawn_stack_full(tune, tune_stock, |_| {}).await
}

/// Both services and the provider simulator; `tune_sim` adjusts the simulator.
pub async fn spawn_stack_paying(
    tune: impl FnOnce(&mut Settings),
    tune_sim: impl FnOnce(&mut SimConfig),
) -> TestApp {
    spawn_stack_full(tune, |_| {}, tune_sim).await
}

async fn spawn_stack_full(
    tune: impl FnOnce(&mut Settings),
    tune_stock: impl FnOnce(&mut flashsale_product_stock::config::Settings),
    tune_sim: impl FnOnce(&mut SimConfig),
) -> TestApp {
    let sim = spawn_sim(tune_sim).await;
    let exchange = unique_name("fs_test_ex");
    let order_port = free_port();
    let (stock_port, stock_stop, stock_db, stock_settings) =
        spawn_stock(&exchange, order_port, tune_stock).await;
    let db = TestDatabase::create().await.unwrap();
    let mut settings = test_settings(&db, &exchange, stock_port);
    settings.grpc.addr = format!("127.0.0.1:{order_port}");
    settings.payment.provider_url = sim.url();
    tune(&mut settings);
    let mut app = spawn_order(settings, db).await;
    app.sim = Some(sim);
    app.stock_stop = Some(stock_stop);
    app._stock_db = Some(stock_db);
    app.stock_settings = Some(stock_settings);
    app
}

/// The order service alone (its calls to product-stock fail UNAVAILABLE).
pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

/// The order service alone, with `tune` applied to its settings.
pub async fn spawn_app_with(tune: impl FnOnce(&mut Settings)) -> TestApp {
    let db = TestDatabase::create().await.unwrap();
    let mut settings = test_settings(&db, &unique_name("fs_test_ex"), 1);
    tune(&mut settings);
    spawn_order(settings, db).await
}

async fn spawn_order(settings: Settings, db: TestDatabase) -> TestApp {
    let failpoints = Failpoints::default();
    let app = flashsale_order::startup::build_with(settings.clone(), failpoints.clone())
        .await
        .unwrap();
    let (grpc_port, metrics_port, shutdown) = (app.grpc_port(), app.metrics_port(), app.shutdown());
    let task = tokio::spawn(app.run_until_stopped());
    let broker = Broker::connect(settings.amqp.clone()).await.unwrap();
    let stock_port = settings
        .upstream
        .product_stock_url
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    TestApp {
        grpc_port,
        metrics_port,
        shutdown,
        task: Some(task),
        conn: db.connect().await.unwrap(),
        db,
        settings,
        failpoints,
        stock_port,
        stock_settings: None,
        stock_stop: None,
        _stock_db: None,
        sim: None,
        publisher: Publisher::new(&broker),
        _broker: broker,
    }
}

/// A client of the order service listening on `port`.
pub async fn client_at(port: u16) -> Client {
    OrderServiceClient::new(channel(port).await.unwrap())
}

pub fn as_user<T>(user: &str, msg: T) -> tonic::Request<T> {
    with_token(msg, &token(user, Role::User))
}

pub fn as_admin<T>(msg: T) -> tonic::Request<T> {
    with_token(msg, &token("root", Role::Admin))
}

pub fn reason(s: &tonic::Status) -> String {
    flashsale_platform::error::reason_of(s).unwrap_or_default()
}

pub fn create_req(request_id: &str, sku: &str, quantity: i64) -> CreateOrderRequest {
    CreateOrderRequest {
        request_id: request_id.into(),
        sku: sku.into(),
        quantity,
    }
}

/// Another replica of a [`TestApp`]'s order service: same database, queues and upstream; its
/// own ports. Stops when dropped.
pub struct Replica {
    pub grpc_port: u16,
    shutdown: Shutdown,
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.shutdown.trigger();
    }
}

impl Replica {
    pub async fn client(&self) -> Client {
        OrderServiceClient::new(channel(self.grpc_port).await.unwrap())
    }
}

// === impl TestApp ===

impl TestApp {
    /// A second replica of this order service.
    pub async fn spawn_replica(&self) -> Replica {
        self.spawn_replica_with(Failpoints::default()).await
    }

    /// [`Self::spawn_replica`] with `failpoints` armed (a clock that runs fast, say).
    pub async fn spawn_replica_with(&self, failpoints: Failpoints) -> Replica {
        let mut settings = self.settings.clone();
        settings.grpc.addr = "127.0.0.1:0".into();
        settings.metrics.addr = "127.0.0.1:0".into();
        let app = flashsale_order::startup::build_with(settings, failpoints)
            .await
            .unwrap();
        let (grpc_port, shutdown) = (app.grpc_port(), app.shutdown());
        tokio::spawn(app.run_until_stopped());
        Replica {
            grpc_port,
            shutdown,
        }
    }

    pub async fn client(&self) -> Client {
        OrderServiceClient::new(channel(self.grpc_port).await.unwrap())
    }

    /// PayOrder as `user`: the payment started at the provider.
    pub async fn start_payment(
        &self,
        user: &str,
        order_id: &str,
    ) -> Result<PayOrderResponse, tonic::Status> {
        let req = PayOrderRequest {
            order_id: order_id.into(),
            ..Default::default()
        };
        self.client()
            .await
            .pay_order(as_user(user, req))
            .await
            .map(tonic::Response::into_inner)
    }

    /// The buyer pays `payment_id` on the provider's checkout (`spawn_stack` only).
    pub async fn buyer_pays(&self, payment_id: &str) {
        let port = self.sim.as_ref().expect("spawn_stack").port;
        PaymentProviderServiceClient::new(channel(port).await.unwrap())
            .pay_checkout(tonic::Request::new(PayCheckoutRequest {
                payment_id: payment_id.into(),
            }))
            .await
            .unwrap();
    }

    /// Pays the order through the provider, as its buyer, and waits until it is PAID.
    pub async fn pay(&self, user: &str, order_id: &str) -> Order {
        let started = self.start_payment(user, order_id).await.unwrap();
        self.buyer_pays(&started.checkout.unwrap().provider_payment_id)
            .await;
        self.wait_status(user, order_id, OrderStatus::Paid).await
    }

    /// NotifyPayment on this service, with `token` as a bearer if given.
    pub async fn notify(
        &self,
        req: NotifyPaymentRequest,
        token: Option<&str>,
    ) -> Result<NotifyPaymentResponse, tonic::Status> {
        let mut client =
            PaymentNotificationServiceClient::new(channel(self.grpc_port).await.unwrap());
        let req = match token {
            Some(t) => with_token(req, t),
            None => tonic::Request::new(req),
        };
        client
            .notify_payment(req)
            .await
            .map(tonic::Response::into_inner)
    }

    pub async fn stock(&self) -> ProductStockServiceClient<Channel> {
        ProductStockServiceClient::new(channel(self.stock_port).await.unwrap())
    }

    pub async fn product(&self, sku: &str, stock: i64, limit: u32) -> Product {
        self.product_in_buckets(sku, stock, limit, 1).await
    }

    /// [`Self::product`] with its stock split into `buckets` stock buckets.
    pub async fn product_in_buckets(
        &self,
        sku: &str,
        stock: i64,
        limit: u32,
        buckets: u32,
    ) -> Product {
        let req = CreateProductRequest {
            sku: sku.into(),
            name: format!("{sku} bottle"),
            price_cents: 2500,
            initial_stock: stock,
            per_user_limit: limit,
            deduction_policy: DeductionPolicy::ReserveThenCommit as i32,
            stock_buckets: buckets,
            ..Default::default()
        };
        self.stock()
            .await
            .create_product(as_admin(req))
            .await
            .unwrap()
            .into_inner()
            .product
            .unwrap()
    }

    /// A product of `stock` units priced 2500, on sale at 1999 from `start_ms` until `end_ms`
    /// (milliseconds since the Unix epoch), `limit` units per buyer.
    pub async fn product_on_sale(
        &self,
        sku: &str,
        stock: i64,
        limit: u32,
        start_ms: i64,
        end_ms: i64,
    ) -> Product {
        let req = CreateProductRequest {
            sku: sku.into(),
            name: format!("{sku} bottle"),
            price_cents: 2500,
            initial_stock: stock,
            per_user_limit: limit,
            deduction_policy: DeductionPolicy::ReserveThenCommit as i32,
            sale_start: flashsale_contract::ms_to_timestamp(start_ms),
            sale_end: flashsale_contract::ms_to_timestamp(end_ms),
            sale_price_cents: Some(1999),
            ..Default::default()
        };
        self.stock()
            .await
            .create_product(as_admin(req))
            .await
            .unwrap()
            .into_inner()
            .product
            .unwrap()
    }

    pub async fn get_product(&self, sku: &str) -> Product {
        let req = GetProductRequest { sku: sku.into() };
        self.stock()
            .await
            .get_product(as_admin(req))
            .await
            .unwrap()
            .into_inner()
            .product
            .unwrap()
    }

    pub async fn order(
        &self,
        user: &str,
        request_id: &str,
        sku: &str,
        q: i64,
    ) -> Result<Order, tonic::Status> {
        self.client()
            .await
            .create_order(as_user(user, create_req(request_id, sku, q)))
            .await
            .map(|r| r.into_inner().order.unwrap())
    }

    pub async fn get(&self, user: &str, order_id: &str) -> Order {
        self.client()
            .await
            .get_order(as_user(
                user,
                GetOrderRequest {
                    order_id: order_id.into(),
                },
            ))
            .await
            .unwrap()
            .into_inner()
            .order
            .unwrap()
    }

    /// Polls until the order reaches `status`.
    pub async fn wait_status(&self, user: &str, order_id: &str, status: OrderStatus) -> Order {
        let found = eventually(Duration::from_secs(20), "order status", || async {
            let o = self.get(user, order_id).await;
            (o.status == status as i32).then_some(o)
        })
        .await;
        match found {
            Ok(o) => o,
            Err(_) => panic!(
                "order {order_id} never reached {status:?}: {:?}",
                self.get(user, order_id).await
            ),
        }
    }

    pub async fn count(&self, sql: &str) -> i64 {
        probe::count(&self.conn, sql).await.unwrap()
    }

    pub async fn wait_count(&self, sql: &str, want: i64) {
        probe::wait_count(&self.conn, sql, want, Duration::from_secs(20))
            .await
            .unwrap();
    }

    pub async fn exec(&self, sql: &str) {
        sea_orm::ConnectionTrait::execute_unprepared(&self.conn, sql)
            .await
            .unwrap();
    }

    /// product-stock's stock gate (`spawn_stack` only).
    pub fn stock_gate(&self) -> flashsale_product_stock::testing::Gate {
        let s = self.stock_settings.as_ref().expect("spawn_stack");
        flashsale_product_stock::testing::Gate::connect(&s.redis, Duration::from_secs(3600))
            .unwrap()
    }

    /// Counts on product-stock's database: `sql`'s single `n` column (`spawn_stack` only).
    pub async fn stock_count(&self, sql: &str) -> i64 {
        let url = &self._stock_db.as_ref().expect("spawn_stack").url;
        let conn = sea_orm::Database::connect(url.as_str()).await.unwrap();
        let n = probe::count(&conn, sql).await.unwrap();
        conn.close().await.unwrap();
        n
    }

    /// Runs `sql` on product-stock's database (`spawn_stack` only).
    pub async fn stock_exec(&self, sql: &str) {
        let url = &self._stock_db.as_ref().expect("spawn_stack").url;
        let conn = sea_orm::Database::connect(url.as_str()).await.unwrap();
        sea_orm::ConnectionTrait::execute_unprepared(&conn, sql)
            .await
            .unwrap();
        conn.close().await.unwrap();
    }

    pub async fn outbox_of(&self, kind: &str) -> Vec<Envelope> {
        probe::outbox(&self.conn, Some(kind)).await.unwrap()
    }

    pub async fn publish(&self, payload: Payload, correlation: &str) -> Envelope {
        let env = envelope::new(payload, correlation, "", "test");
        self.publisher.publish_envelope(&env).await.unwrap();
        env
    }

    pub async fn publish_envelope(&self, env: &Envelope) {
        self.publisher.publish_envelope(env).await.unwrap();
    }

    /// Messages parked from the order service's consumer queue (in `dead_letters`).
    pub async fn parked(&self) -> u32 {
        let t = flashsale_order::api::amqp::topology(&self.settings.amqp);
        let n = flashsale_messaging::dead_letter::count_parked(&self.conn, t.queue())
            .await
            .unwrap();
        u32::try_from(n).unwrap()
    }
}

/// A fresh, migrated order database of its own (keep the first value alive for the test's
/// length).
pub async fn migrated_orders_db() -> (
    flashsale_test_support::TestDatabase,
    sea_orm::DatabaseConnection,
) {
    use sea_orm_migration::MigratorTrait as _;
    let db = flashsale_test_support::TestDatabase::create()
        .await
        .unwrap();
    let conn = db.connect().await.unwrap();
    flashsale_order::migration::Migrator::up(&conn, None)
        .await
        .unwrap();
    (db, conn)
}

/// A SUCCEEDED event of `payment_id` for `order_id`.
pub fn succeeded(payment_id: &str, order_id: &str, amount: i64, currency: &str) -> PaymentEvent {
    PaymentEvent {
        event_id: format!("evt_{}", uuid::Uuid::new_v4().simple()),
        r#type: PaymentEventType::Succeeded as i32,
        payment_id: payment_id.into(),
        merchant_reference: order_id.into(),
        amount_cents: amount,
        currency: currency.into(),
        create_time: None,
    }
}

/// `ev` signed with `secret` at `timestamp`, as the provider sends it.
pub fn signed(ev: &PaymentEvent, secret: &str, timestamp: i64) -> NotifyPaymentRequest {
    use prost::Message as _;
    let payload = ev.encode_to_vec();
    NotifyPaymentRequest {
        signature: sign(secret.as_bytes(), timestamp, &payload),
        payload,
        timestamp,
    }
}

/// `ev` signed now with the test provider's secret.
pub fn signed_now(ev: &PaymentEvent) -> NotifyPaymentRequest {
    signed(ev, DEV_WEBHOOK_SECRET, chrono::Utc::now().timestamp())
}

/// `user`'s order (one unit of `SKU` at 100 cents), confirmed by `saga`: awaiting payment.
pub async fn confirmed_order(
    conn: &sea_orm::DatabaseConnection,
    saga: &flashsale_order::app::Saga,
    user: &str,
) -> uuid::Uuid {
    let p = flashsale_order::domain::PlaceOrder::new(user, "k", "SKU", 1, 10).unwrap();
    flashsale_order::app::write_pending(
        conn,
        &p,
        100,
        flashsale_order::domain::Policy::ReserveThenCommit,
    )
    .await
    .unwrap();
    let order = p.order_id();
    let env = flashsale_messaging::envelope::new(
        flashsale_proto::events::v1::envelope::Payload::StockReserved(
            flashsale_proto::events::v1::StockReserved {
                order_id: order.to_string(),
                sku: "SKU".into(),
                quantity: 1,
                deduction_policy: 1,
            },
        ),
        order.to_string(),
        "",
        "product-stock",
    );
    let item = flashsale_order::app::Reserved {
        consumer: "order.saga-events".into(),
        env,
        order_id: order.to_string(),
        trace: Default::default(),
        attempt: 1,
    };
    assert!(saga.confirm_reserved(vec![item]).await[0].is_ok());
    order
}
