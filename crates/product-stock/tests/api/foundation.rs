//! What every service promises, for the product-stock process: it migrates its database, serves
//! health, reflection and metrics (with its pools' usage), guards its RPCs, refuses bad config
//! and stops cleanly.

use flashsale_platform::auth::Role;
use flashsale_proto::product::v1::{
    CreateProductRequest, product_stock_service_client::ProductStockServiceClient,
};
use flashsale_test_support::foundation::request;
use tonic::Code;

flashsale_test_support::foundation_tests! {
    spawn: crate::helpers::spawn_app,
    service: "flashsale.product.v1.ProductStockService",
    bin: env!("CARGO_BIN_EXE_flashsale-product-stock"),
    database_url_env: "FLASHSALE_PRODUCT_STOCK__DATABASE__URL",
    database_url_key: "product_stock.database.url",
    tables: [
        "outbox",
        "inbox",
        "products",
        "stock",
        "reservations",
        "stock_ledger",
        "stock_adjustments",
    ],
    rpc: |channel, token: Option<String>| async move {
        let req = request(CreateProductRequest::default(), token.as_deref());
        ProductStockServiceClient::new(channel).create_product(req).await.map(drop)
    },
    refused: ("alice", Role::User),
    allowed: ("root", Role::Admin),
    allowed_outcome: Some(Code::InvalidArgument),
}

#[tokio::test]
async fn the_database_and_redis_pools_are_exported_with_their_bounds() {
    let app = crate::helpers::spawn_app().await;
    let service = "service=\"product-stock\"";
    let value = |m: &str, name: &str, labels: &[&str]| -> Option<f64> {
        m.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .filter(|l| labels.iter().all(|want| l.contains(want)))
            .find_map(|l| l.rsplit(' ').next()?.parse().ok())
    };
    let metrics = flashsale_test_support::eventually(
        std::time::Duration::from_secs(30),
        "the pool gauges",
        || async {
            let (_, m) = flashsale_test_support::grpc::http_get(app.metrics_port, "/metrics")
                .await
                .ok()?;
            let both = value(&m, "flashsale_redis_pool_waiting", &[service]).is_some()
                && value(&m, "flashsale_db_pool_max_connections", &[service]).is_some();
            both.then_some(m)
        },
    )
    .await
    .unwrap();
    for max in [
        "flashsale_db_pool_max_connections",
        "flashsale_redis_pool_max_connections",
    ] {
        let bound = value(&metrics, max, &[service]);
        assert!(
            bound.is_some_and(|b| b >= 1.0),
            "{max}: {bound:?}\n{metrics}"
        );
    }
    for state in ["in_use", "idle"] {
        let state = format!("state=\"{state}\"");
        for family in [
            "flashsale_db_pool_connections",
            "flashsale_redis_pool_connections",
        ] {
            assert!(
                value(&metrics, family, &[service, &state]).is_some(),
                "{family} {state}:\n{metrics}"
            );
        }
    }
    assert_eq!(
        value(&metrics, "flashsale_redis_pool_waiting", &[service]),
        Some(0.0)
    );
}
