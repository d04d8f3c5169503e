//! What issue #2 promises of the order process: it migrates its database, serves health,
//! reflection and metrics, guards its RPCs, refuses bad config and stops cleanly.

use flashsale_platform::auth::Role;
use flashsale_proto::order::v1::{CreateOrderRequest, order_service_client::OrderServiceClient};
use flashsale_test_support::{
    foundation::{check_clean_stop, check_endpoints, check_refuses_bad_database_url, check_tables},
    grpc::{channel, token, with_token},
};
use tonic::Code;

use crate::helpers::spawn_app;

const SERVICE: &str = "flashsale.order.v1.OrderService";
const BIN: &str = env!("CARGO_BIN_EXE_flashsale-order");
const ENV_DB_URL: &str = "FLASHSALE_ORDER__DATABASE__URL";
const BAD_KEY: &str = "order.database.url";

#[tokio::test]
async fn service_serves_health_reflection_metrics_and_stops_cleanly() {
    let mut app = spawn_app().await;
    check_endpoints(app.grpc_port, app.metrics_port, SERVICE)
        .await
        .unwrap();
    let task = app.task.take().unwrap();
    check_clean_stop(app.grpc_port, app.shutdown.clone(), task)
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
            "orders",
            "order_status_history",
            "payments",
            "refunds",
        ],
    )
    .await
    .unwrap();
    app.shutdown.trigger();
}

#[tokio::test]
async fn business_rpcs_check_the_token_before_anything_else() {
    let app = spawn_app().await;
    let mut client = OrderServiceClient::new(channel(app.grpc_port).await.unwrap());
    let anonymous = client
        .create_order(CreateOrderRequest::default())
        .await
        .unwrap_err();
    assert_eq!(anonymous.code(), Code::Unauthenticated);
    let weak_role = client
        .create_order(with_token(
            CreateOrderRequest::default(),
            &token("order", Role::Service),
        ))
        .await
        .unwrap_err();
    assert_eq!(weak_role.code(), Code::PermissionDenied);
    let allowed = client
        .create_order(with_token(
            CreateOrderRequest::default(),
            &token("alice", Role::User),
        ))
        .await
        .unwrap_err();
    assert_eq!(allowed.code(), Code::InvalidArgument, "{allowed:?}");
    app.shutdown.trigger();
}

#[tokio::test]
async fn binary_refuses_an_unparsable_database_url_naming_the_key() {
    check_refuses_bad_database_url(BIN, ENV_DB_URL, BAD_KEY)
        .await
        .unwrap();
}
