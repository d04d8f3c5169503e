//! Builds the order service from its settings: database, the product-stock client, broker,
//! outbox relay, saga consumer, deadline sweeper, stuck-order gauge, inbox purger, change
//! listener and the gRPC services.

use std::{sync::Arc, time::Duration};

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
    api::{amqp, grpc::OrderApi},
    app::{Checkout, Intake, Queries, Saga, Stuck},
    config::Settings,
    infra::{changes::OrderChanges, stock::GrpcStock},
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
        &settings.grpc.tls,
        token,
        Duration::from_millis(settings.saga.stock_call_timeout_ms),
    )?;

    let timeout_queue = amqp::payment_timeout_queue(
        &settings.amqp,
        Duration::from_millis(settings.saga.payment_timeout_ms),
    );
    let changes = OrderChanges::new();
    let intake = Intake::new(
        f.db.clone(),
        Arc::new(stock),
        &settings.saga,
        failpoints.clone(),
    );
    let checkout = Checkout::new(f.db.clone());
    let saga = Saga::new(f.db.clone(), timeout_queue.clone(), &settings.saga);
    let queries = Queries::new(f.db.clone(), changes.clone());
    let stuck = Stuck::new(f.db.clone(), &settings.saga);
    let s = saga.clone();
    let reserved =
        crate::app::reserved_batcher(saga.clone(), usize::from(settings.amqp.prefetch) / 2);
    let handler = move |msg| amqp::handle(s.clone(), reserved.clone(), msg);
    let topologies = [amqp::topology(&settings.amqp)];
    let relay = flashsale_messaging::RelayOptions {
        yield_to: intake.relay_yield(),
        ..Default::default()
    };
    let messaging = flashsale_messaging::wiring::start_with(
        &mut f.runner,
        &f.db,
        &settings.amqp,
        &topologies,
        vec![timeout_queue],
        handler,
        &failpoints,
        relay,
    )
    .await?;
    let dead_letters = messaging.dead_letters;
    let shutdown = f.runner.shutdown();
    f.runner.spawn(saga.run_sweeper(shutdown.clone()));
    f.runner.spawn(stuck.clone().run_gauge(shutdown.clone()));
    f.runner.spawn(flashsale_messaging::inbox::run_purger(
        f.db.clone(),
        settings.amqp.inbox_purge(),
        shutdown.clone(),
    ));
    // Every replica hears when units of a product come back, and stops refusing it from memory.
    let (forget, reset) = (intake.sold_out().clone(), intake.sold_out().clone());
    let s = shutdown.clone();
    f.runner.spawn(flashsale_messaging::broadcast::run(
        messaging.broker,
        amqp::UNITS_BACK_KEYS
            .iter()
            .map(|k| (*k).to_owned())
            .collect(),
        move |env| {
            if let Some(sku) = amqp::sku_with_units_back(&env) {
                forget.forget(sku);
            }
        },
        move || reset.clear(),
        async move { s.wait().await },
    ));
    f.runner.spawn(changes.run(f.db.clone(), shutdown));

    let max = settings.grpc.max_message_bytes;
    let routes = ServerRoutes::new()
        .with_service(InterceptedService::new(
            OrderServiceServer::new(OrderApi::new(intake, checkout, queries, stuck))
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
