//! `flashsale.outbound.v1.OutboundService` over tonic.

use flashsale_contract::{PAGE_TOKEN_MAX_LEN, check_optional_text, to_timestamp};
use flashsale_platform::{
    ApiError,
    auth::{Caller, Role},
    limit::UserRateLimiter,
};
use flashsale_proto::outbound::v1::{
    self as pb, GetShipmentRequest, GetShipmentResponse, ListShipmentsRequest,
    ListShipmentsResponse, outbound_service_server::OutboundService,
};
use tonic::{Request, Response, Status};

use crate::{
    app::Shipping,
    domain::{OutboundError, Shipment, ShipmentStatus, parse_uuid},
};

/// The gRPC face of the outbound service.
#[derive(Clone)]
pub struct OutboundApi {
    shipping: Shipping,
    /// GetShipment calls of each buyer (`limits.*`).
    reads: UserRateLimiter,
}

impl OutboundApi {
    pub fn new(shipping: Shipping, reads: UserRateLimiter) -> Self {
        Self { shipping, reads }
    }
}

/// The caller, if `roles` may call this; admin calls are audited (see
/// [`flashsale_platform::auth::authorize`]).
fn authorize<T: std::fmt::Debug>(req: &Request<T>, roles: &[Role]) -> Result<Caller, Status> {
    Ok(flashsale_platform::auth::authorize(req, roles)?)
}

fn to_proto(s: Shipment) -> pb::Shipment {
    let status = match s.status {
        ShipmentStatus::Picking => pb::ShipmentStatus::Picking,
        ShipmentStatus::Shipped => pb::ShipmentStatus::Shipped,
        ShipmentStatus::Failed => pb::ShipmentStatus::Failed,
    };
    pb::Shipment {
        shipment_id: s.shipment_id.to_string(),
        order_id: s.order_id.to_string(),
        user_id: s.user_id,
        sku: s.sku,
        quantity: s.quantity,
        status: status as i32,
        failure_reason: s.failure_reason.unwrap_or_default(),
        attempts: s.attempts,
        create_time: Some(to_timestamp(s.created_at)),
        update_time: Some(to_timestamp(s.updated_at)),
        stock_committed: s.stock_committed,
        last_error: s.last_error,
        next_attempt_time: (s.status == ShipmentStatus::Picking)
            .then(|| to_timestamp(s.next_attempt_at)),
    }
}

/// The one mapping from outbound errors to the API.
impl From<OutboundError> for ApiError {
    fn from(e: OutboundError) -> Self {
        let message = e.to_string();
        match e {
            OutboundError::Invalid(v) => ApiError::InvalidArgument(v),
            OutboundError::NotFound(_) => ApiError::NotFound(message),
            OutboundError::Transient(_) => ApiError::Unavailable {
                reason: flashsale_contract::reason::DEPENDENCY_UNAVAILABLE,
                message,
            },
            OutboundError::DatabaseUnavailable(_) => ApiError::Unavailable {
                reason: flashsale_contract::reason::DATABASE_UNAVAILABLE,
                message,
            },
            OutboundError::Internal(e) => ApiError::Internal(e),
        }
    }
}

fn status(e: OutboundError) -> Status {
    ApiError::from(e).into()
}

#[tonic::async_trait]
impl OutboundService for OutboundApi {
    async fn get_shipment(
        &self,
        req: Request<GetShipmentRequest>,
    ) -> Result<Response<GetShipmentResponse>, Status> {
        let caller = authorize(&req, &[Role::User, Role::Admin])?;
        self.reads.check_caller(&caller)?;
        let order_id = parse_uuid("order_id", &req.get_ref().order_id).map_err(status)?;
        let s = self.shipping.get(&caller, order_id).await.map_err(status)?;
        Ok(Response::new(GetShipmentResponse {
            shipment: Some(to_proto(s)),
        }))
    }

    async fn list_shipments(
        &self,
        req: Request<ListShipmentsRequest>,
    ) -> Result<Response<ListShipmentsResponse>, Status> {
        authorize(&req, &[Role::Admin])?;
        let r = req.into_inner();
        check_optional_text("page_token", &r.page_token, PAGE_TOKEN_MAX_LEN)
            .map_err(|v| status(OutboundError::Invalid(vec![v])))?;
        let filter = match pb::ShipmentStatus::try_from(r.status) {
            Ok(pb::ShipmentStatus::Unspecified) => None,
            Ok(pb::ShipmentStatus::Picking) => Some(ShipmentStatus::Picking),
            Ok(pb::ShipmentStatus::Shipped) => Some(ShipmentStatus::Shipped),
            Ok(pb::ShipmentStatus::Failed) => Some(ShipmentStatus::Failed),
            Err(_) => return Err(status(OutboundError::invalid("status", "unknown status"))),
        };
        let (page, next) = self
            .shipping
            .list(filter, r.older_than_ms, r.page_size, &r.page_token)
            .await
            .map_err(status)?;
        Ok(Response::new(ListShipmentsResponse {
            shipments: page.into_iter().map(to_proto).collect(),
            next_page_token: next,
        }))
    }
}
