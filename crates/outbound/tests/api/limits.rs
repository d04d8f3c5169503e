//! The per-user read limit: one buyer reading GetShipment in a loop is refused
//! RESOURCE_EXHAUSTED with a retry delay, while another buyer and an admin are served.

use std::time::Duration;

use flashsale_platform::{auth::Role, error::reason_of};
use flashsale_proto::outbound::v1::{
    GetShipmentRequest, outbound_service_client::OutboundServiceClient,
};
use flashsale_test_support::grpc::{channel, token, with_token};
use tonic::Code;
use tonic_types::StatusExt as _;

use crate::helpers::spawn_with;

fn get(user: &str, role: Role) -> tonic::Request<GetShipmentRequest> {
    with_token(
        GetShipmentRequest {
            order_id: uuid::Uuid::new_v4().to_string(),
        },
        &token(user, role),
    )
}

#[tokio::test]
async fn a_buyer_reading_shipments_in_a_loop_is_rate_limited_while_others_are_served() {
    let app = spawn_with(|s| {
        s.limits.read_per_sec = 2;
        s.limits.read_burst = 5;
    })
    .await;
    let c = OutboundServiceClient::new(channel(app.grpc_port).await.unwrap());
    let mut flood = tokio::task::JoinSet::new();
    for _ in 0..200 {
        let mut c = c.clone();
        flood.spawn(async move { c.get_shipment(get("flooder", Role::User)).await });
    }
    let (mut served, mut limited) = (0, 0);
    while let Some(answer) = flood.join_next().await {
        let status = answer.unwrap().unwrap_err();
        match status.code() {
            // No such shipment: the call reached the service.
            Code::NotFound => served += 1,
            Code::ResourceExhausted => {
                assert_eq!(reason_of(&status).as_deref(), Some("RATE_LIMITED"));
                let wait = status
                    .get_details_retry_info()
                    .and_then(|r| r.retry_delay)
                    .expect("a retry delay");
                assert!(wait > Duration::ZERO && wait <= Duration::from_secs(1));
                limited += 1;
            }
            other => panic!("{other:?}: {status:?}"),
        }
    }
    assert!(served >= 5, "the burst is served: {served}");
    assert!(limited >= 150, "{limited} of 200 refused, {served} served");
    // Another buyer has their own count; admin calls are never counted.
    for (who, role, calls) in [("calm", Role::User, 5), ("ops", Role::Admin, 50)] {
        for _ in 0..calls {
            let status = c.clone().get_shipment(get(who, role)).await.unwrap_err();
            assert_eq!(status.code(), Code::NotFound, "{who}: {status:?}");
        }
    }
}
