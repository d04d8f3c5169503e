//! Builds the order service from its settings: database, the product-stock client, broker,
//! outbox relay, saga consumer, deadline sweeper, change listener and the gRPC services.

use std::{sync::Arc, time::Duration};

use anyhow::Context as _;
use flashsale_messaging::{
    Broker, Consumer, DeadLetterAdmin, DeadLetterDrainer, OutboxRelay, Publisher,
};
use flashsale_platform::{
    app::{Application, Foundation},
    auth::{JwtKeys, ServiceToken},
    failpoint::Failpoints,
    grpc::ServerRoutes,
};
use flashsale_proto::{
    admin::v1::dead_letter_service_server::DeadLetterServiceServer,
    order::v1::order_service_server::OrderServiceServer,
};
use tonic::service::interceptor::InterceptedService;

use crate::{
    adapters::{amqp, grpc::OrderApi, stock::GrpcStock},
    app::{Orders, WatchHub},
    config::Settings,
    migration::Migrator,
};

/// [`build_with`] with failpoints from `FLASHSALE_FAILPOINTS`.
pub async fn build(settings: Settings) -> anyhow::Result<Application> {
    build_with(settings, flashsale_platform::failpoint::from_env()?).await
}

pub async fn build_with(settings: Settings, failpoints: Failpoints) -> anyhow::Result<Application> {
    let mut f = Foundation::build::<Migrator>(
        "order",
        &settings.grpc,
        &settings.metrics,
        &settings.database,
        &settings.auth,
    )
    .await?;
    let keys = JwtKeys::from_settings(&settings.auth, "order")?;
    let token = Arc::new(
        ServiceToken::new(keys, "order").map_err(|e| anyhow::anyhow!("mint service token: {e}"))?,
    );
    let stock = GrpcStock::new(
        &settings.upstream.product_stock_url,
        token,
        Duration::from_millis(settings.saga.stock_call_timeout_ms),
    )?;

    let broker = Broker::connect(settings.amqp.clone())
        .await
        .context("connect to RabbitMQ")?;
    let timeout_queue = amqp::payment_timeout_queue(
        &settings.amqp,
        Duration::from_millis(settings.saga.payment_timeout_ms),
    );
    let topology = amqp::topology(&settings.amqp);
    let channel = broker.channel().await.context("open AMQP channel")?;
    topology.declare(&channel).await.context("declare queues")?;
    timeout_queue
        .declare(&channel)
        .await
        .context("declare the payment-timeout queue")?;

    let watch = WatchHub::new();
    let orders = Orders::new(
        f.db.clone(),
        Arc::new(stock),
        settings.saga.clone(),
        timeout_queue.clone(),
        watch.clone(),
        failpoints.clone(),
    );
    let shutdown = f.runner.shutdown();
    let relay = OutboxRelay::new(
        &f.db,
        Publisher::with_delay_queues(&broker, vec![timeout_queue]),
    )?
    .with_failpoints(failpoints.clone());
    let s = shutdown.clone();
    f.runner
        .spawn(async move { relay.run(async move { s.wait().await }).await });
    let topologies = [topology];
    let o = orders.clone();
    let consumer = Consumer::new(&broker, topologies[0].clone(), move |msg| {
        amqp::handle(o.clone(), msg)
    })
    .with_failpoints(failpoints);
    let drainer = DeadLetterDrainer::new(&broker, &f.db, &topologies)?;
    let s = shutdown.clone();
    f.runner
        .spawn(async move { drainer.run(async move { s.wait().await }).await });
    let dead_letters = DeadLetterAdmin::new(&f.db, Publisher::new(&broker), &topologies)?;
    let s = shutdown.clone();
    f.runner
        .spawn(async move { consumer.run(async move { s.wait().await }).await });
    f.runner.spawn(orders.clone().run_sweeper(shutdown.clone()));
    f.runner.spawn(watch.run(f.db.clone(), shutdown.clone()));
    let b = broker.clone();
    f.runner.spawn(async move {
        shutdown.wait().await;
        b.close().await;
        Ok(())
    });

    let max = settings.grpc.max_message_bytes;
    let routes = ServerRoutes::new()
        .with_service(InterceptedService::new(
            OrderServiceServer::new(OrderApi::new(orders))
                .max_decoding_message_size(max)
                .max_encoding_message_size(max),
            f.auth.clone(),
        ))
        .with_service(InterceptedService::new(
            DeadLetterServiceServer::new(dead_letters)
                .max_decoding_message_size(max)
                .max_encoding_message_size(max),
            f.auth.clone(),
        ));
    Ok(Application::new(f, routes))
}
