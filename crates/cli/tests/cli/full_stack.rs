//! All three services in-process — product-stock, order and outbound — each with its own
//! database and queues on one shared test exchange, and the payment provider simulator, with a
//! short payment timeout so a sale's late and missing payments play out within a test.

use flashsale_platform::shutdown::Shutdown;
use flashsale_test_support::{TestDatabase, unique_name};

use crate::helpers::{Run, amqp, command, output, spawn_stock};

/// The order service's payment timeout in these tests.
pub const PAYMENT_TIMEOUT_MS: u64 = 2_000;

/// product-stock, order and outbound on free ports; all stop when this is dropped.
pub struct FullStack {
    pub stock_url: String,
    pub order_url: String,
    pub outbound_url: String,
    /// The payment provider simulator the order service uses.
    pub payment_sim_url: String,
    _sim: flashsale_payment_sim::Running,
    /// The order service's database.
    pub order_db_url: String,
    /// The order service's Prometheus endpoint.
    pub order_metrics_url: String,
    stops: Vec<Shutdown>,
    _dbs: Vec<TestDatabase>,
}

impl Drop for FullStack {
    fn drop(&mut self) {
        self.stops.iter().for_each(Shutdown::trigger);
    }
}

// === impl FullStack ===

impl FullStack {
    /// The three services; `warehouse` tunes outbound's built-in warehouse (failing SKUs).
    pub async fn spawn(warehouse: impl FnOnce(&mut flashsale_outbound::config::Settings)) -> Self {
        Self::spawn_with(PAYMENT_TIMEOUT_MS, warehouse).await
    }

    /// As [`FullStack::spawn`], with unpaid orders cancelled after `payment_timeout_ms`.
    pub async fn spawn_with(
        payment_timeout_ms: u64,
        warehouse: impl FnOnce(&mut flashsale_outbound::config::Settings),
    ) -> Self {
        let exchange = unique_name("fs_cli_ex");
        let (stock_port, stock_stop, stock_db) = spawn_stock(&exchange).await;
        let stock_url = format!("http://127.0.0.1:{stock_port}");

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let sim = flashsale_payment_sim::start(
            flashsale_payment_sim::SimConfig {
                notify_delay: std::time::Duration::from_millis(10),
                ..Default::default()
            },
            listener,
        )
        .await
        .unwrap();
        let order_db = TestDatabase::create().await.unwrap();
        let mut o = flashsale_order::config::Settings::default();
        crate::helpers::dev_payment_secrets(&mut o);
        o.payment.provider_url = sim.url();
        o.payment.refund_retry_base_ms = 50;
        o.payment.refund_sweep_interval_ms = 100;
        o.auth.allow_development_secret = true;
        o.grpc.addr = "127.0.0.1:0".into();
        o.metrics.addr = "127.0.0.1:0".into();
        o.database.url = order_db.url.clone();
        o.database.max_connections = 8;
        o.amqp = amqp(&exchange);
        o.upstream.product_stock_url = stock_url.clone();
        o.saga.payment_timeout_ms = payment_timeout_ms;
        o.saga.sweep_interval_ms = 200;
        let order = flashsale_order::startup::build(o).await.unwrap();
        let (order_port, order_stop) = (order.grpc_port(), order.shutdown());
        let order_metrics_port = order.metrics_port();
        tokio::spawn(order.run_until_stopped());

        let out_db = TestDatabase::create().await.unwrap();
        let mut s = flashsale_outbound::config::Settings::default();
        s.auth.allow_development_secret = true;
        s.grpc.addr = "127.0.0.1:0".into();
        s.metrics.addr = "127.0.0.1:0".into();
        s.database.url = out_db.url.clone();
        s.database.max_connections = 5;
        s.amqp = amqp(&exchange);
        s.upstream.product_stock_url = stock_url.clone();
        s.shipping.sweep_interval_ms = 200;
        s.shipping.retry_base_ms = 20;
        warehouse(&mut s);
        let outbound = flashsale_outbound::startup::build(s).await.unwrap();
        let (outbound_port, outbound_stop) = (outbound.grpc_port(), outbound.shutdown());
        tokio::spawn(outbound.run_until_stopped());

        Self {
            stock_url,
            order_url: format!("http://127.0.0.1:{order_port}"),
            payment_sim_url: sim.url(),
            _sim: sim,
            outbound_url: format!("http://127.0.0.1:{outbound_port}"),
            order_db_url: order_db.url.clone(),
            order_metrics_url: format!("http://127.0.0.1:{order_metrics_port}/metrics"),
            stops: vec![outbound_stop, order_stop, stock_stop],
            _dbs: vec![out_db, order_db, stock_db],
        }
    }

    /// `flashsale sale args…` against this stack.
    pub async fn sale(&self, args: &[&str]) -> Run {
        let mut cmd = command(&["sale"]);
        cmd.args(args)
            .env("FLASHSALE_PRODUCT_STOCK_URL", &self.stock_url)
            .env("FLASHSALE_ORDER_URL", &self.order_url)
            .env("FLASHSALE_OUTBOUND_URL", &self.outbound_url)
            .env("FLASHSALE_PAYMENT_SIM_URL", &self.payment_sim_url);
        output(cmd).await
    }

    /// `flashsale shipment args…` against this stack's outbound service.
    pub async fn shipment(&self, args: &[&str]) -> Run {
        let mut cmd = command(&["shipment"]);
        cmd.args(args)
            .env("FLASHSALE_OUTBOUND_URL", &self.outbound_url);
        output(cmd).await
    }
}

/// The sale's `--json` report; panics with both outputs when the sale failed.
pub fn report(run: &Run) -> serde_json::Value {
    assert!(
        run.ok,
        "sale failed\n--- stdout ---\n{}\n--- stderr ---\n{}",
        run.stdout, run.stderr
    );
    serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("not one JSON object ({e}): {}", run.stdout))
}

/// The orders of a report with plan `plan`.
pub fn orders_with_plan<'a>(
    report: &'a serde_json::Value,
    plan: &str,
) -> Vec<&'a serde_json::Value> {
    report["orders"]
        .as_array()
        .map(|a| a.iter().filter(|o| o["plan"] == plan).collect())
        .unwrap_or_default()
}
