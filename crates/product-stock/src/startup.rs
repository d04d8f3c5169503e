//! Builds the product-stock service from its settings: database, Redis gate, the order-service
//! client, broker, the outbox relay, the saga consumers, the hold sweeper and the gRPC services.

use std::{sync::Arc, time::Duration};

use flashsale_platform::{
    app::{Application, Common, Foundation, Service},
    auth::ServiceToken,
    failpoint::Failpoints,
    grpc::ServerRoutes,
};
use flashsale_proto::{
    admin::v1::{
        dead_letter_service_server::DeadLetterServiceServer,
        order_timeline_service_server::OrderTimelineServiceServer,
    },
    product::v1::product_stock_service_server::ProductStockServiceServer,
};
use tonic::service::interceptor::InterceptedService;

use crate::{
    api::{amqp, grpc::ProductStockApi},
    app::{Catalog, Reconciler, Reservations, StockSaga, Terms},
    config::Settings,
    infra::{
        gate::RedisGate,
        orders::{GrpcOrders, OrderPort},
    },
    migration::Migrator,
};

/// How often, on a Redis Cluster, the gate checks each master's run id (a replica promoted by a
/// failover has its own): the longest a promoted master serves gates that may miss its former
/// master's last writes before they are dropped and rebuilt.
pub const CLUSTER_RUN_CHECK_PERIOD: Duration = Duration::from_secs(1);

/// The product-stock service as its binary runs it (`flashsale_platform::app::main`).
pub struct ProductStock;

impl Service for ProductStock {
    const NAME: &'static str = "product-stock";
    type Settings = Settings;
    type Migrator = Migrator;

    fn load() -> anyhow::Result<Settings> {
        Ok(crate::config::load()?)
    }

    fn common(settings: &Settings) -> Common<'_> {
        settings.common()
    }

    async fn build(settings: Settings) -> anyhow::Result<Application> {
        build(settings).await
    }
}

/// [`build_with`] with failpoints from `FLASHSALE_FAILPOINTS`.
pub async fn build(settings: Settings) -> anyhow::Result<Application> {
    build_with(settings, flashsale_platform::failpoint::from_env()?).await
}

/// Connects and migrates the database, connects Redis and RabbitMQ, and wires everything.
pub async fn build_with(settings: Settings, failpoints: Failpoints) -> anyhow::Result<Application> {
    let token = ServiceToken::for_service(&settings.auth, ProductStock::NAME)?;
    let orders = GrpcOrders::new(&settings.order_service, &settings.grpc.tls, token)?;
    build_with_orders(settings, failpoints, Arc::new(orders)).await
}

/// [`build_with`] asking `orders` about orders instead of the order service at
/// `order_service.url` (tests put a fake there).
pub async fn build_with_orders(
    settings: Settings,
    failpoints: Failpoints,
    orders: Arc<dyn OrderPort>,
) -> anyhow::Result<Application> {
    let mut f = Foundation::of::<ProductStock>(&settings).await?;
    crate::app::describe_metrics();
    flashsale_messaging::metrics::describe();
    // Every new connection first checks that Redis did not come back from a stale snapshot
    // (docs/architecture.md#operations).
    let pool = RedisGate::pool(&settings.redis, &settings.redis.key_prefix)?;
    f.runner.spawn(flashsale_platform::pools::watch_redis(
        ProductStock::NAME,
        pool.clone(),
        f.runner.shutdown(),
    ));
    let record_ttl = Duration::from_secs(settings.stock.order_record_ttl_secs);
    let redis_gate = RedisGate::new(pool, settings.redis.key_prefix.clone(), record_ttl)
        .with_released_record_ttl(
            Duration::from_millis(settings.stock.released_record_ttl_ms).min(record_ttl),
        );
    // One terms cache for every handle; UpdateProduct's `product.updated` invalidates it.
    let terms = Terms::new(f.db.clone());
    let gate = Reservations::new(
        f.db.clone(),
        redis_gate.clone(),
        orders.clone(),
        terms.clone(),
        &settings.stock,
    );
    let catalog = Catalog::new(
        f.db.clone(),
        redis_gate.clone(),
        gate.clone(),
        failpoints.clone(),
    );
    let saga = StockSaga::new(
        f.db.clone(),
        redis_gate.clone(),
        terms.clone(),
        failpoints.clone(),
    );
    if settings.redis.is_cluster() {
        // A failover reaches existing cluster connections without a new one: check the
        // masters' run ids periodically too (docs/architecture.md#operations).
        f.runner.spawn(
            redis_gate
                .clone()
                .watch_redis_runs(CLUSTER_RUN_CHECK_PERIOD, f.runner.shutdown()),
        );
    }
    let reconciler = Reconciler::new(
        f.db.clone(),
        redis_gate,
        orders,
        terms.clone(),
        &settings.stock,
    );

    let topologies = [
        amqp::order_events_topology(&settings.amqp),
        amqp::stock_events_topology(&settings.amqp),
    ];
    let created =
        crate::app::created_batcher(saga.clone(), usize::from(settings.amqp.prefetch) / 2);
    let consumer_saga = saga.clone();
    let handler = move |msg| amqp::handle(consumer_saga.clone(), created.clone(), msg);
    let messaging = flashsale_messaging::wiring::start(
        &mut f.runner,
        &f.db,
        &settings.amqp,
        &topologies,
        vec![],
        handler,
        &failpoints,
    )
    .await?;
    let dead_letters = messaging.dead_letters;
    // Every replica hears of every product's change of terms, and reads them again.
    let (forget, reset) = (terms.clone(), terms);
    let stop = f.runner.shutdown();
    f.runner.spawn(flashsale_messaging::broadcast::run(
        messaging.broker,
        vec![amqp::PRODUCT_UPDATED.to_owned()],
        move |env| {
            if let Some(sku) = amqp::updated_sku(&env) {
                let (terms, sku) = (forget.clone(), sku.to_owned());
                tokio::spawn(async move { terms.forget(&sku).await });
            }
        },
        move || {
            let terms = reset.clone();
            tokio::spawn(async move { terms.clear().await });
        },
        async move { stop.wait().await },
    ));
    f.runner
        .spawn(reconciler.clone().run_sweeper(f.runner.shutdown()));
    f.runner
        .spawn(reconciler.clone().run_drift_check(f.runner.shutdown()));

    let reads = settings.limits.limiter("GetProduct/ListProducts");
    f.forget_idle_users(vec![reads.clone()]);

    let max = settings.grpc.max_message_bytes;
    let routes = ServerRoutes::new()
        .with_service(InterceptedService::new(
            ProductStockServiceServer::new(ProductStockApi::new(
                catalog,
                gate,
                crate::app::commit_batcher(saga),
                reconciler,
                reads,
            ))
            .max_decoding_message_size(max)
            .max_encoding_message_size(max),
            f.auth.clone(),
        ))
        .with_service(InterceptedService::new(
            DeadLetterServiceServer::new(dead_letters)
                .max_decoding_message_size(max)
                .max_encoding_message_size(max),
            f.auth.clone(),
        ))
        .with_service(InterceptedService::new(
            OrderTimelineServiceServer::new(flashsale_messaging::timeline::TimelineAdmin::new(
                &f.db,
                "product-stock",
                crate::infra::timeline::Story::new(f.db.clone()),
            )?)
            .max_decoding_message_size(max)
            .max_encoding_message_size(max),
            f.auth.clone(),
        ));
    Ok(Application::new(f, routes))
}
