//! What issue #2 promises of the product-stock process: it migrates its database, serves health,
//! reflection and metrics, guards its RPCs, refuses bad config and stops cleanly.

use flashsale_platform::auth::Role;
use flashsale_proto::product::v1::{
    CreateProductRequest, product_stock_service_client::ProductStockServiceClient,
};
use flashsale_test_support::{
    foundation::{check_clean_stop, check_endpoints, check_refuses_bad_database_url, check_tables},
    grpc::{channel, token, with_token},
};
use tonic::Code;

use crate::helpers::spawn_app;

const SERVICE: &str = "flashsale.product.v1.ProductStockService";
const BIN: &str = env!("CARGO_BIN_EXE_flashsale-product-stock");
const ENV_DB_URL: &str = "FLASHSALE_PRODUCT_STOCK__DATABASE__URL";
const BAD_KEY: &str = "product_stock.database.url";

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
            "products",
            "stock",
            "reservations",
            "stock_ledger",
            "stock_adjustments",
        ],
    )
    .await
    .unwrap();
    app.shutdown.trigger();
}

#[tokio::test]
async fn business_rpcs_check_the_token_before_anything_else() {
    let app = spawn_app().await;
    let mut client = ProductStockServiceClient::new(channel(app.grpc_port).await.unwrap());
    let anonymous = client
        .create_product(CreateProductRequest::default())
        .await
        .unwrap_err();
    assert_eq!(anonymous.code(), Code::Unauthenticated);
    let weak_role = client
        .create_product(with_token(
            CreateProductRequest::default(),
            &token("alice", Role::User),
        ))
        .await
        .unwrap_err();
    assert_eq!(weak_role.code(), Code::PermissionDenied);
    let allowed = client
        .create_product(with_token(
            CreateProductRequest::default(),
            &token("root", Role::Admin),
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
