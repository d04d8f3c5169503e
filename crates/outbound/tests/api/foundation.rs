//! What issue #2 promises of the outbound process: it migrates its database, serves health,
//! reflection and metrics, guards its RPCs, refuses bad config and stops cleanly.

use flashsale_platform::auth::Role;
use flashsale_proto::outbound::v1::{
    ListShipmentsRequest, outbound_service_client::OutboundServiceClient,
};
use flashsale_test_support::{
    foundation::{check_clean_stop, check_endpoints, check_refuses_bad_database_url, check_tables},
    grpc::{channel, token, with_token},
};
use tonic::Code;

use crate::helpers::spawn_app;

const SERVICE: &str = "flashsale.outbound.v1.OutboundService";
const BIN: &str = env!("CARGO_BIN_EXE_flashsale-outbound");
const ENV_DB_URL: &str = "FLASHSALE_OUTBOUND__DATABASE__URL";
const BAD_KEY: &str = "outbound.database.url";

#[tokio::test]
async fn service_serves_health_reflection_metrics_and_stops_cleanly() {
    let app = spawn_app().await;
    check_endpoints(app.grpc_port, app.metrics_port, SERVICE)
        .await
        .unwrap();
    check_clean_stop(app.grpc_port, app.shutdown, app.task)
        .await
        .unwrap();
}

#[tokio::test]
async fn start_up_runs_the_migrations() {
    let app = spawn_app().await;
    check_tables(
        &app.db.url,
        &[
            "outbox",
            "inbox",
            "dead_letters",
            "shipments",
            "shipment_attempts",
        ],
    )
    .await
    .unwrap();
    app.shutdown.trigger();
}

#[tokio::test]
async fn business_rpcs_check_the_token_before_anything_else() {
    let app = spawn_app().await;
    let mut client = OutboundServiceClient::new(channel(app.grpc_port).await.unwrap());
    let anonymous = client
        .list_shipments(ListShipmentsRequest::default())
        .await
        .unwrap_err();
    assert_eq!(anonymous.code(), Code::Unauthenticated);
    let weak_role = client
        .list_shipments(with_token(
            ListShipmentsRequest::default(),
            &token("alice", Role::User),
        ))
        .await
        .unwrap_err();
    assert_eq!(weak_role.code(), Code::PermissionDenied);
    let allowed = client
        .list_shipments(with_token(
            ListShipmentsRequest::default(),
            &token("root", Role::Admin),
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(allowed.shipments.is_empty());
    app.shutdown.trigger();
}

#[tokio::test]
async fn binary_refuses_an_unparsable_database_url_naming_the_key() {
    check_refuses_bad_database_url(BIN, ENV_DB_URL, BAD_KEY)
        .await
        .unwrap();
}
