//! Builds the outbound service from its settings: database, the product-stock client, the
//! warehouse adapter, broker, outbox relay, the `order.paid` consumer, the stuck-shipment
//! sweeper, the dead-letter admin and the gRPC services.

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

/// The outbound service as its binary runs it (`flashsale_platform::app::main`).
pub struct Outbound;

impl Service for Outbound {
    const NAME: &'static str = "outbound";
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

pub async fn build_with(settings: Settings, failpoints: Failpoints) -> anyhow::Result<Application> {
    let mut f = Foundation::of::<Outbound>(&settings).await?;
    crate::app::describe_metrics();
    flashsale_messaging::metrics::describe();
    let token = ServiceToken::for_service(&settings.auth, Outbound::NAME)?;
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
    f.runner
        .spawn(shipping.clone().run_sweeper(f.runner.shutdown()));

    let reads = settings.limits.limiter("GetShipment");
    f.forget_idle_users(vec![reads.clone()]);

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
        ))
        .with_service(InterceptedService::new(
            OrderTimelineServiceServer::new(flashsale_messaging::timeline::TimelineAdmin::new(
                &f.db,
                "outbound",
                crate::infra::timeline::Story::new(f.db.clone()),
            )?)
            .max_decoding_message_size(max)
            .max_encoding_message_size(max),
            f.auth.clone(),
        ));
    Ok(Application::new(f, routes))
}
