//! What every service promises, for the order process: it migrates its database, serves health,
//! reflection and metrics, guards its RPCs, refuses bad config and stops cleanly.

use flashsale_platform::auth::Role;
use flashsale_proto::order::v1::{CreateOrderRequest, order_service_client::OrderServiceClient};
use flashsale_test_support::foundation::request;
use tonic::Code;

flashsale_test_support::foundation_tests! {
    spawn: crate::helpers::spawn_app,
    service: "flashsale.order.v1.OrderService",
    bin: env!("CARGO_BIN_EXE_flashsale-order"),
    database_url_env: "FLASHSALE_ORDER__DATABASE__URL",
    database_url_key: "order.database.url",
    tables: ["outbox", "inbox", "orders", "order_status_history", "payments", "refunds"],
    rpc: |channel, token: Option<String>| async move {
        let req = request(CreateOrderRequest::default(), token.as_deref());
        OrderServiceClient::new(channel).create_order(req).await.map(drop)
    },
    refused: ("order", Role::Service),
    allowed: ("alice", Role::User),
    allowed_outcome: Some(Code::InvalidArgument),
}
