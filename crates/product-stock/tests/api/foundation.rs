//! What every service promises, for the product-stock process: it migrates its database, serves
//! health, reflection and metrics, guards its RPCs, refuses bad config and stops cleanly.

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
