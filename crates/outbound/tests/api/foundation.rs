//! What every service promises, for the outbound process: it migrates its database, serves
//! health, reflection and metrics, guards its RPCs, refuses bad config and stops cleanly.

use flashsale_platform::auth::Role;
use flashsale_proto::outbound::v1::{
    ListShipmentsRequest, outbound_service_client::OutboundServiceClient,
};
use flashsale_test_support::foundation::request;

flashsale_test_support::foundation_tests! {
    spawn: crate::helpers::spawn_app,
    service: "flashsale.outbound.v1.OutboundService",
    bin: env!("CARGO_BIN_EXE_flashsale-outbound"),
    database_url_env: "FLASHSALE_OUTBOUND__DATABASE__URL",
    database_url_key: "outbound.database.url",
    tables: ["outbox", "inbox", "dead_letters", "shipments", "shipment_attempts"],
    rpc: |channel, token: Option<String>| async move {
        let req = request(ListShipmentsRequest::default(), token.as_deref());
        let shipments = OutboundServiceClient::new(channel).list_shipments(req).await?;
        assert!(shipments.into_inner().shipments.is_empty());
        Ok(())
    },
    refused: ("alice", Role::User),
    allowed: ("root", Role::Admin),
    allowed_outcome: None,
}
