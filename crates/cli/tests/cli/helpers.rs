//! Running the real binary, and the services it talks to in-process: `product_stock` alone, or
//! a `Stack` of product-stock and order (with the payment provider simulator), each with its
//! own database and queues, sharing one test exchange as in production.

use std::{process::Stdio, time::Duration};

use flashsale_messaging::{AmqpConfig, QueueType};
use flashsale_platform::{auth::Role, shutdown::Shutdown};
use flashsale_proto::order::v1::{
    GetOrderRequest, Order, OrderStatus, order_service_client::OrderServiceClient,
};
use flashsale_test_support::{
    TestDatabase, amqp_url, eventually,
    grpc::{channel, token, with_token},
    redis_url, unique_name,
};

const BIN: &str = env!("CARGO_BIN_EXE_flashsale");

pub struct Run {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Stdout as one JSON document; panics with stderr when the command failed.
    pub fn json(&self) -> serde_json::Value {
        assert!(self.ok, "command failed: {}", self.stderr);
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.stdout))
    }
}

/// The binary with `args`, taking neither token nor secret from this environment.
pub fn command(args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.args(args)
        .env_remove("FLASHSALE_TOKEN")
        .env_remove("FLASHSALE_USER_SECRET")
        .env_remove("FLASHSALE_SERVICE_SECRET")
        .kill_on_drop(true);
    cmd
}

pub async fn output(mut cmd: tokio::process::Command) -> Run {
    let out = cmd.output().await.unwrap();
    Run {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `flashsale args…` with product-stock at `url`.
pub async fn flashsale(args: &[&str], url: &str) -> Run {
    let mut cmd = command(args);
    cmd.env("FLASHSALE_PRODUCT_STOCK_URL", url);
    output(cmd).await
}

pub fn amqp(exchange: &str) -> AmqpConfig {
    AmqpConfig {
        url: amqp_url(),
        exchange: exchange.to_owned(),
        queue_prefix: format!("{}.", unique_name("fs_cli_q")),
        queue_expires_ms: 60_000,
        queue_type: QueueType::Classic,
        retry_base_ms: 50,
        max_attempts: 3,
        ..Default::default()
    }
}

pub async fn spawn_stock(exchange: &str) -> (u16, Shutdown, TestDatabase) {
    let (port, stop, db, _) = spawn_stock_with(exchange, None).await;
    (port, stop, db)
}

/// [`spawn_stock`] asking the order service at `order_port` (None: the default address), also
/// handing back its AMQP settings (its queue names).
pub async fn spawn_stock_with(
    exchange: &str,
    order_port: Option<u16>,
) -> (u16, Shutdown, TestDatabase, AmqpConfig) {
    let db = TestDatabase::create().await.unwrap();
    let mut s = flashsale_product_stock::config::Settings::default();
    s.auth.allow_development_secret = true;
    if let Some(port) = order_port {
        s.order_service.url = format!("http://127.0.0.1:{port}");
    }
    s.grpc.addr = "127.0.0.1:0".into();
    s.metrics.addr = "127.0.0.1:0".into();
    s.database.url = db.url.clone();
    // Many tests run at once against one PostgreSQL: small pools keep them under its limit.
    s.database.max_connections = 10;
    s.redis.url = redis_url();
    s.redis.key_prefix = format!("{}:", unique_name("fs_cli"));
    s.amqp = amqp(exchange);
    let config = s.amqp.clone();
    let app = flashsale_product_stock::startup::build(s).await.unwrap();
    let (port, stop) = (app.grpc_port(), app.shutdown());
    tokio::spawn(app.run_until_stopped());
    (port, stop, db, config)
}

/// product-stock alone: its URL, its stop switch and its database.
pub async fn product_stock() -> (String, Shutdown, TestDatabase) {
    let (port, stop, db) = spawn_stock(&unique_name("fs_cli_ex")).await;
    (format!("http://127.0.0.1:{port}"), stop, db)
}

/// product-stock and order on free ports; both stop when this is dropped.
pub struct Stack {
    pub stock_url: String,
    pub order_url: String,
    /// The order service's database and consumer queue.
    pub order_db: String,
    pub order_queue: String,
    /// product-stock's database and the queue it consumes `order.created` from.
    pub stock_db: String,
    pub stock_order_queue: String,
    order_port: u16,
    /// The payment provider the order service uses.
    pub sim: flashsale_payment_sim::Running,
    stops: Vec<Shutdown>,
    _dbs: Vec<TestDatabase>,
}

impl Drop for Stack {
    fn drop(&mut self) {
        for s in &self.stops {
            s.trigger();
        }
    }
}

// === impl Stack ===

impl Stack {
    pub async fn spawn() -> Self {
        let exchange = unique_name("fs_cli_ex");
        // product-stock asks the order service about orders and starts first: the order
        // service's port is chosen now.
        let order_port = port_outside_the_ephemeral_range();
        let (stock_port, stock_stop, stock_db, stock_amqp) =
            spawn_stock_with(&exchange, Some(order_port)).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let sim = flashsale_payment_sim::start(
            flashsale_payment_sim::SimConfig {
                notify_delay: Duration::from_millis(10),
                ..Default::default()
            },
            listener,
        )
        .await
        .unwrap();
        let db = TestDatabase::create().await.unwrap();
        let mut s = flashsale_order::config::Settings::default();
        s.payment.provider_url = sim.url();
        s.auth.allow_development_secret = true;
        s.grpc.addr = format!("127.0.0.1:{order_port}");
        s.metrics.addr = "127.0.0.1:0".into();
        s.database.url = db.url.clone();
        s.amqp = amqp(&exchange);
        s.upstream.product_stock_url = format!("http://127.0.0.1:{stock_port}");
        s.saga.sweep_interval_ms = 200;
        dev_payment_secrets(&mut s);
        let order_queue = s
            .amqp
            .queue_name(flashsale_contract::queues::ORDER_SAGA_EVENTS);
        let app = flashsale_order::startup::build(s).await.unwrap();
        let (order_port, order_stop) = (app.grpc_port(), app.shutdown());
        tokio::spawn(app.run_until_stopped());
        Self {
            stock_url: format!("http://127.0.0.1:{stock_port}"),
            order_url: format!("http://127.0.0.1:{order_port}"),
            order_db: db.url.clone(),
            order_queue,
            stock_db: stock_db.url.clone(),
            stock_order_queue: stock_amqp
                .queue_name(flashsale_contract::queues::PRODUCT_STOCK_ORDER_EVENTS),
            order_port,
            sim,
            stops: vec![order_stop, stock_stop],
            _dbs: vec![db, stock_db],
        }
    }

    /// Creates `sku` through `flashsale product create`.
    pub async fn product(&self, sku: &str, price_cents: i64, stock: i64) {
        let (price, stock) = (price_cents.to_string(), stock.to_string());
        let run = flashsale(
            &[
                "product",
                "create",
                "--sku",
                sku,
                "--name",
                "Cli order wine",
                "--price-cents",
                &price,
                "--stock",
                &stock,
            ],
            &self.stock_url,
        )
        .await;
        assert!(run.ok, "product create: {}", run.stderr);
    }

    /// `flashsale order --user user args…` against this stack's order service.
    pub fn order_command(&self, user: &str, args: &[&str]) -> tokio::process::Command {
        let mut cmd = command(&["order", "--user", user]);
        cmd.args(args).env("FLASHSALE_ORDER_URL", &self.order_url);
        cmd
    }

    /// `flashsale args…` with every service URL of this stack in the environment (outbound's
    /// points at a closed port).
    pub async fn run(&self, args: &[&str]) -> Run {
        let mut cmd = command(args);
        cmd.env("FLASHSALE_ORDER_URL", &self.order_url)
            .env("FLASHSALE_PRODUCT_STOCK_URL", &self.stock_url)
            .env("FLASHSALE_OUTBOUND_URL", "http://127.0.0.1:1");
        output(cmd).await
    }

    pub async fn order(&self, user: &str, args: &[&str]) -> Run {
        output(self.order_command(user, args)).await
    }

    /// The buyer pays `payment_id` on the provider's checkout.
    pub async fn buyer_pays(&self, payment_id: &str) {
        use flashsale_proto::payment::v1::{
            PayCheckoutRequest, payment_provider_service_client::PaymentProviderServiceClient,
        };
        PaymentProviderServiceClient::new(channel(self.sim.port).await.unwrap())
            .pay_checkout(PayCheckoutRequest {
                payment_id: payment_id.into(),
            })
            .await
            .unwrap();
    }

    /// `order create` of `quantity` × `sku` by `user`; the new order's id.
    pub async fn place(&self, user: &str, sku: &str, quantity: i64) -> String {
        let q = quantity.to_string();
        let json = self
            .order(user, &["create", "--sku", sku, "--quantity", &q])
            .await
            .json();
        json["order"]["orderId"].as_str().unwrap().to_owned()
    }

    /// Polls the order (over gRPC, as its buyer) until it reaches `status`.
    pub async fn wait_status(&self, user: &str, order_id: &str, status: OrderStatus) -> Order {
        let client = OrderServiceClient::new(channel(self.order_port).await.unwrap());
        let token = token(user, Role::User);
        let get = || {
            let (mut client, token) = (client.clone(), token.clone());
            let req = GetOrderRequest {
                order_id: order_id.to_owned(),
            };
            async move {
                let resp = client.get_order(with_token(req, &token)).await;
                resp.ok().and_then(|r| r.into_inner().order)
            }
        };
        let found = eventually(Duration::from_secs(20), "order status", || async {
            get().await.filter(|o| o.status == status as i32)
        })
        .await;
        match found {
            Ok(order) => order,
            Err(e) => panic!("{e}: order {order_id} never {status:?}: {:?}", get().await),
        }
    }
}

/// Stdout lines are read as they come, so a watch can be followed while it runs.
pub fn piped(mut cmd: tokio::process::Command) -> tokio::process::Child {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.spawn().unwrap()
}

/// The payment provider simulator's development secrets, which a simulator started with its
/// defaults expects.
pub fn dev_payment_secrets(s: &mut flashsale_order::config::Settings) {
    s.payment.api_key = flashsale_contract::payment::DEV_PAYMENT_API_KEY.into();
    s.payment.webhook_secret = flashsale_contract::payment::DEV_WEBHOOK_SECRET.into();
}

fn port_outside_the_ephemeral_range() -> u16 {
    flashsale_test_support::servers::port_outside_the_ephemeral_range().unwrap()
}
