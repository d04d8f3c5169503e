//! The product-stock gate as the order service sees it: one port trait (so use cases can be
//! tested with a fake) and its gRPC adapter, which sends a service token and the trace context.

use std::{sync::Arc, time::Duration};

use flashsale_platform::auth::ServiceToken;
use flashsale_proto::product::v1::{
    DeductionPolicy, GetGateBuyersRequest, ReserveStockRequest,
    product_stock_service_client::ProductStockServiceClient,
};
use tonic::{Code, transport::Channel};
use uuid::Uuid;

use crate::domain::{OrderError, Policy};

/// What the gate granted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Granted {
    pub unit_price_cents: i64,
    pub policy: Policy,
    pub replayed: bool,
}

/// The gate's buyers of a product, read with its counter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GateBuyers {
    pub available: i64,
    /// Every buyer, or `None` when the gate had too many to list.
    pub users: Option<Vec<String>>,
}

/// Most buyers asked for in one read (the list must fit in one message).
pub const MAX_LISTED_BUYERS: u32 = 100_000;

/// Takes units through the stock gate.
#[tonic::async_trait]
pub trait StockPort: Send + Sync + 'static {
    /// `Refused(reason, message)` for SOLD_OUT, INSUFFICIENT_STOCK, USER_LIMIT_EXCEEDED, …;
    /// `UnknownProduct`; `Unavailable` when the gate cannot answer now.
    async fn reserve(
        &self,
        order_id: Uuid,
        user_id: &str,
        sku: &str,
        quantity: i64,
    ) -> Result<Granted, OrderError>;

    /// The gate's available counter and buyers of `sku`, in one atomic read.
    async fn buyers(&self, sku: &str) -> Result<GateBuyers, OrderError>;
}

/// [`StockPort`] over product-stock's gRPC API.
#[derive(Clone)]
pub struct GrpcStock {
    client: ProductStockServiceClient<Channel>,
    token: Arc<ServiceToken>,
}

impl GrpcStock {
    /// A lazily connecting client of `url` (the order service starts even if product-stock is
    /// not up yet; calls then fail `UNAVAILABLE`).
    pub fn new(url: &str, token: Arc<ServiceToken>, timeout: Duration) -> anyhow::Result<Self> {
        Ok(Self {
            client: ProductStockServiceClient::new(flashsale_platform::grpc::lazy_channel(
                url, timeout,
            )?),
            token,
        })
    }
}

#[tonic::async_trait]
impl StockPort for GrpcStock {
    async fn reserve(
        &self,
        order_id: Uuid,
        user_id: &str,
        sku: &str,
        quantity: i64,
    ) -> Result<Granted, OrderError> {
        let msg = ReserveStockRequest {
            order_id: order_id.to_string(),
            user_id: user_id.to_owned(),
            sku: sku.to_owned(),
            quantity,
        };
        let req = flashsale_platform::grpc::service_request(msg, &self.token)
            .map_err(|e| OrderError::Internal(anyhow::anyhow!("service request: {e}")))?;
        match self.client.clone().reserve_stock(req).await {
            Ok(resp) => {
                let r = resp.into_inner();
                let policy = match DeductionPolicy::try_from(r.deduction_policy) {
                    Ok(DeductionPolicy::CommitAtOrder) => Policy::CommitAtOrder,
                    _ => Policy::ReserveThenCommit,
                };
                Ok(Granted {
                    unit_price_cents: r.unit_price_cents,
                    policy,
                    replayed: r.replayed,
                })
            }
            Err(s) => Err(map_status(s, sku)),
        }
    }

    async fn buyers(&self, sku: &str) -> Result<GateBuyers, OrderError> {
        let msg = GetGateBuyersRequest {
            sku: sku.to_owned(),
            max_buyers: MAX_LISTED_BUYERS,
        };
        let req = flashsale_platform::grpc::service_request(msg, &self.token)
            .map_err(|e| OrderError::Internal(anyhow::anyhow!("service request: {e}")))?;
        match self.client.clone().get_gate_buyers(req).await {
            Ok(resp) => {
                let r = resp.into_inner();
                Ok(GateBuyers {
                    available: r.gate_available,
                    users: r.complete.then_some(r.user_ids),
                })
            }
            Err(s) => Err(map_status(s, sku)),
        }
    }
}

fn map_status(s: tonic::Status, sku: &str) -> OrderError {
    match s.code() {
        Code::FailedPrecondition => {
            let reason = flashsale_platform::error::reason_of(&s)
                .unwrap_or_else(|| "FAILED_PRECONDITION".into());
            OrderError::Refused(reason, s.message().to_owned())
        }
        Code::NotFound => OrderError::UnknownProduct(sku.to_owned()),
        Code::InvalidArgument => OrderError::Invalid(
            flashsale_platform::error::violated_fields(&s)
                .into_iter()
                .map(|f| (f, s.message().to_owned()))
                .collect(),
        ),
        Code::Unavailable
        | Code::DeadlineExceeded
        | Code::Cancelled
        | Code::ResourceExhausted
        | Code::Unknown => OrderError::Unavailable(format!("product-stock: {}", s.message())),
        _ => OrderError::Internal(anyhow::anyhow!(
            "product-stock answered {:?}: {}",
            s.code(),
            s.message()
        )),
    }
}
