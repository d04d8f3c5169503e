//! Builds the outbound service from its settings.

use flashsale_platform::{
    app::{Application, Foundation},
    dead_letter::PendingDeadLetters,
    grpc::ServerRoutes,
};
use flashsale_proto::{
    admin::v1::dead_letter_service_server::DeadLetterServiceServer,
    outbound::v1::outbound_service_server::OutboundServiceServer,
};
use tonic::service::interceptor::InterceptedService;

use crate::{adapters::grpc::OutboundApi, config::Settings, migration::Migrator};

/// Connects and migrates the database, binds the listeners and wires the gRPC services.
pub async fn build(settings: Settings) -> anyhow::Result<Application> {
    let f = Foundation::build::<Migrator>(
        "outbound",
        &settings.grpc,
        &settings.metrics,
        &settings.database,
        &settings.auth,
    )
    .await?;
    let max = settings.grpc.max_message_bytes;
    let routes = ServerRoutes::new()
        .with_service(InterceptedService::new(
            OutboundServiceServer::new(OutboundApi)
                .max_decoding_message_size(max)
                .max_encoding_message_size(max),
            f.auth.clone(),
        ))
        .with_service(InterceptedService::new(
            DeadLetterServiceServer::new(PendingDeadLetters)
                .max_decoding_message_size(max)
                .max_encoding_message_size(max),
            f.auth.clone(),
        ));
    Ok(Application::new(f, routes))
}
