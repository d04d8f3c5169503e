//! product-stock and outbound in-process, sharing one test exchange; the test plays the order
//! service by publishing its events.

use std::time::Duration;

use flashsale_messaging::{Publisher, envelope};
use flashsale_platform::{auth::Role, shutdown::Shutdown};
use flashsale_proto::{
    events::v1::{Envelope, OrderCreated, OrderPaid, envelope::Payload},
    outbound::v1::{GetShipmentRequest, Shipment, outbound_service_client::OutboundServiceClient},
    product::v1::{
        CreateProductRequest, DeductionPolicy, GetProductRequest, Product, ReserveStockRequest,
        product_stock_service_client::ProductStockServiceClient,
    },
};
use flashsale_test_support::{
    TestDatabase, eventually,
    grpc::{channel, token, with_token},
    probe, redis_url, unique_name,
};
use sea_orm::DatabaseConnection;
use uuid::Uuid;

use crate::helpers::test_settings;

pub struct Stack {
    pub outbound_port: u16,
    pub stock_port: u16,
    pub conn: DatabaseConnection,
    /// The outbound service's AMQP settings (its queue names).
    pub amqp: flashsale_messaging::AmqpConfig,
    publisher: Publisher,
    stops: Vec<Shutdown>,
    _dbs: Vec<TestDatabase>,
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.stops.iter().for_each(Shutdown::trigger);
    }
}

pub async fn spawn_stack(tune: impl FnOnce(&mut flashsale_outbound::config::Settings)) -> Stack {
    let out_db = TestDatabase::create().await.unwrap();
    let mut out = test_settings(&out_db);
    out.shipping.sweep_interval_ms = 100;
    out.shipping.retry_base_ms = 20;

    let stock_db = TestDatabase::create().await.unwrap();
    let mut ps = flashsale_product_stock::config::Settings::default();
    ps.auth.allow_development_secret = true;
    ps.grpc.addr = "127.0.0.1:0".into();
    ps.metrics.addr = "127.0.0.1:0".into();
    ps.database.url = stock_db.url.clone();
    ps.database.max_connections = 5;
    ps.redis.url = redis_url();
    ps.redis.key_prefix = format!("{}:", unique_name("fs_test"));
    ps.amqp = out.amqp.clone();
    ps.amqp.queue_prefix = format!("{}.", unique_name("fs_test_q"));
    let stock = flashsale_product_stock::startup::build(ps).await.unwrap();
    let stock_port = stock.grpc_port();
    let mut stops = vec![stock.shutdown()];
    tokio::spawn(stock.run_until_stopped());

    out.upstream.product_stock_url = format!("http://127.0.0.1:{stock_port}");
    tune(&mut out);
    let app = flashsale_outbound::startup::build(out.clone())
        .await
        .unwrap();
    let outbound_port = app.grpc_port();
    stops.push(app.shutdown());
    tokio::spawn(app.run_until_stopped());
    let broker = flashsale_messaging::Broker::connect(out.amqp.clone())
        .await
        .unwrap();
    Stack {
        outbound_port,
        stock_port,
        conn: out_db.connect().await.unwrap(),
        amqp: out.amqp.clone(),
        publisher: Publisher::new(&broker),
        stops,
        _dbs: vec![out_db, stock_db],
    }
}

pub fn admin<T>(m: T) -> tonic::Request<T> {
    with_token(m, &token("root", Role::Admin))
}

// === impl Stack ===

impl Stack {
    pub async fn stock(&self) -> ProductStockServiceClient<tonic::transport::Channel> {
        ProductStockServiceClient::new(channel(self.stock_port).await.unwrap())
    }

    pub async fn outbound(&self) -> OutboundServiceClient<tonic::transport::Channel> {
        OutboundServiceClient::new(channel(self.outbound_port).await.unwrap())
    }

    pub async fn product(&self, sku: &str, stock: i64, policy: DeductionPolicy) {
        let req = CreateProductRequest {
            sku: sku.into(),
            name: "n".into(),
            price_cents: 100,
            initial_stock: stock,
            per_user_limit: 0,
            deduction_policy: policy as i32,
            stock_buckets: 0,
            ..Default::default()
        };
        self.stock().await.create_product(admin(req)).await.unwrap();
    }

    pub async fn get_product(&self, sku: &str) -> Product {
        let req = GetProductRequest { sku: sku.into() };
        self.stock()
            .await
            .get_product(admin(req))
            .await
            .unwrap()
            .into_inner()
            .product
            .unwrap()
    }

    pub async fn publish(&self, env: &Envelope) {
        self.publisher.publish_envelope(env).await.unwrap();
    }

    /// An order as the order service would make it: reserved in the gate and persisted by
    /// product-stock (`order.created`), so it can be paid.
    pub async fn reserved_order(&self, user: &str, sku: &str, policy: DeductionPolicy) -> Uuid {
        let order = Uuid::new_v4();
        let req = ReserveStockRequest {
            order_id: order.to_string(),
            user_id: user.into(),
            sku: sku.into(),
            quantity: 1,
        };
        self.stock()
            .await
            .reserve_stock(with_token(req, &token("order", Role::Service)))
            .await
            .unwrap();
        let created = OrderCreated {
            order_id: order.to_string(),
            user_id: user.into(),
            sku: sku.into(),
            quantity: 1,
            unit_price_cents: 100,
            total_cents: 100,
            deduction_policy: policy as i32,
        };
        let before = self.get_product(sku).await;
        self.publish(&envelope::new(
            Payload::OrderCreated(created),
            order.to_string(),
            "",
            "order",
        ))
        .await;
        eventually(Duration::from_secs(20), "reservation persisted", || async {
            let p = self.get_product(sku).await;
            (p.reserved != before.reserved || p.on_hand != before.on_hand).then_some(())
        })
        .await
        .unwrap();
        order
    }

    pub fn paid(&self, order: Uuid, user: &str, sku: &str, policy: DeductionPolicy) -> Envelope {
        let ev = OrderPaid {
            order_id: order.to_string(),
            user_id: user.into(),
            sku: sku.into(),
            quantity: 1,
            payment_id: format!("pay-{order}"),
            amount_cents: 100,
            deduction_policy: policy as i32,
        };
        envelope::new(Payload::OrderPaid(ev), order.to_string(), "", "order")
    }

    /// Polls until the order's shipment is terminal.
    pub async fn finished(&self, order: Uuid) -> Shipment {
        eventually(Duration::from_secs(30), "shipment finished", || async {
            let req = GetShipmentRequest {
                order_id: order.to_string(),
            };
            let s = self
                .outbound()
                .await
                .get_shipment(admin(req))
                .await
                .ok()?
                .into_inner()
                .shipment?;
            (s.status != flashsale_proto::outbound::v1::ShipmentStatus::Picking as i32).then_some(s)
        })
        .await
        .unwrap()
    }

    pub async fn count(&self, sql: &str) -> i64 {
        probe::count(&self.conn, sql).await.unwrap()
    }

    pub async fn outbox_of(&self, kind: &str) -> Vec<Envelope> {
        probe::outbox(&self.conn, Some(kind)).await.unwrap()
    }
}
