//! Builds the outbound service from its settings: database, the product-stock client, the
//! warehouse adapter, broker, outbox relay, the `order.paid` consumer, the stuck-shipment
//! sweeper, the dead-letter admin and the gRPC services.

use std::{sync::Arc, time::Duration};

use flashsale_platform::{
    app::{Application, Foundation},
    auth::{JwtKeys, ServiceToken},
    failpoint::Failpoints,
    grpc::ServerRoutes,
};
use flashsale_proto::{
    admin::v1::dead_letter_service_server::DeadLetterServiceServer,
    outbound::v1::outbound_service_server::OutboundServiceServer,
};
use tonic::service::interceptor::InterceptedService;

use crate::{
    api::{amqp, grpc::OutboundApi},
    app::Shipping,
    config::Settings,
    infra::{
        stock::GrpcCommitter,
        warehouse::{AlwaysShips, FlakyWarehouse, Warehouse},
    },
    migration::Migrator,
};

/// How often the rate limiter forgets users whose counts are back to full.
const FORGET_IDLE_USERS_EVERY: Duration = Duration::from_secs(10);

/// [`build_with`] with failpoints from `FLASHSALE_FAILPOINTS`.
pub async fn build(settings: Settings) -> anyhow::Result<Application> {
    build_with(settings, flashsale_platform::failpoint::from_env()?).await
}

pub async fn build_with(settings: Settings, failpoints: Failpoints) -> anyhow::Result<Application> {
    let mut f = Foundation::build::<Migrator>(
        "outbound",
        &settings.grpc,
        &settings.metrics,
        &settings.database,
        &settings.auth,
    )
    .await?;
    let keys = JwtKeys::from_settings(&settings.auth, "outbound")?;
    let token = Arc::new(
        ServiceToken::new(keys, "outbound")
            .map_err(|e| anyhow::anyhow!("mint service token: {e}"))?,
    );
    let stock = GrpcCommitter::new(
        &settings.upstream,
        &settings.grpc.tls,
        token,
        Duration::from_millis(settings.shipping.commit_timeout_ms),
    )?;
    let warehouse: Arc<dyn Warehouse> =
        if settings.warehouse.fail_fraction > 0.0 || !settings.warehouse.skus().is_empty() {
            Arc::new(FlakyWarehouse::new(
                settings.warehouse.fail_fraction,
                settings.warehouse.skus(),
            ))
        } else {
            Arc::new(AlwaysShips)
        };
    let shipping = Shipping::new(
        f.db.clone(),
        Arc::new(stock),
        warehouse,
        settings.shipping.clone(),
    )
    .with_failpoints(failpoints.clone());

    let paid = crate::app::paid_batcher(shipping.clone(), usize::from(settings.amqp.prefetch) / 2);
    let handler = move |msg| amqp::handle(paid.clone(), msg);
    let topologies = [amqp::topology(&settings.amqp)];
    let dead_letters = flashsale_messaging::wiring::start(
        &mut f.runner,
        &f.db,
        &settings.amqp,
        &topologies,
        vec![],
        handler,
        &failpoints,
    )
    .await?
    .dead_letters;
    f.runner.spawn(flashsale_messaging::inbox::run_purger(
        f.db.clone(),
        settings.amqp.inbox_purge(),
        f.runner.shutdown(),
    ));
    f.runner
        .spawn(shipping.clone().run_sweeper(f.runner.shutdown()));

    let reads = settings.limits.limiter("GetShipment");
    let shutdown = f.runner.shutdown();
    f.runner.spawn(flashsale_platform::limit::forget_idle_users(
        vec![reads.clone()],
        FORGET_IDLE_USERS_EVERY,
        async move { shutdown.wait().await },
    ));

    let max = settings.grpc.max_message_bytes;
    let routes = ServerRoutes::new()
        .with_service(InterceptedService::new(
            OutboundServiceServer::new(OutboundApi::new(shipping, reads))
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
