//! `flashsale.outbound.v1.OutboundService` over tonic. The business RPCs arrive with shipping
//! (issue #5); until then each one checks the caller's role and answers `UNIMPLEMENTED`.

use flashsale_platform::{auth::Role, grpc::not_yet};
use flashsale_proto::outbound::v1::{
    GetShipmentRequest, GetShipmentResponse, ListShipmentsRequest, ListShipmentsResponse,
    outbound_service_server::OutboundService,
};
use tonic::{Request, Response, Status};

/// The gRPC face of the outbound service.
#[derive(Clone, Debug, Default)]
pub struct OutboundApi;

#[tonic::async_trait]
impl OutboundService for OutboundApi {
    async fn get_shipment(
        &self,
        req: Request<GetShipmentRequest>,
    ) -> Result<Response<GetShipmentResponse>, Status> {
        Err(not_yet(&req, &[Role::User, Role::Admin], "GetShipment"))
    }

    async fn list_shipments(
        &self,
        req: Request<ListShipmentsRequest>,
    ) -> Result<Response<ListShipmentsResponse>, Status> {
        Err(not_yet(&req, &[Role::Admin], "ListShipments"))
    }
}
