//! Committing a reservation on product-stock at shipment: one port trait and its gRPC adapter.

use std::{sync::Arc, time::Duration};

use flashsale_platform::{auth::ServiceToken, settings::UpstreamSettings, tls::GrpcTlsSettings};
use flashsale_proto::product::v1::{
    CommitReservationRequest, product_stock_service_client::ProductStockServiceClient,
};
use tonic::{Code, transport::Channel};
use uuid::Uuid;

/// Why a commit did not happen.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    /// product-stock refused (`FAILED_PRECONDITION` / `NOT_FOUND`): retrying cannot help.
    #[error("{0}")]
    Permanent(String),
    /// Unreachable, overloaded, or the reservation is not persisted yet: retry later.
    #[error("{0}")]
    Transient(String),
}

#[tonic::async_trait]
pub trait StockCommitter: Send + Sync + 'static {
    /// Deducts the order's reserved units from on_hand; idempotent.
    async fn commit(&self, order_id: Uuid) -> Result<(), CommitError>;
}

/// [`StockCommitter`] over product-stock's gRPC API, with a service token.
#[derive(Clone)]
pub struct GrpcCommitter {
    client: ProductStockServiceClient<Channel>,
    token: Arc<ServiceToken>,
}

impl GrpcCommitter {
    /// A lazily connecting client of every product-stock replica behind
    /// `upstream.product_stock_url`, balanced ([`flashsale_platform::balance`]), over TLS with
    /// `tls` for `https://` URLs. Must be called inside a Tokio runtime.
    pub fn new(
        upstream: &UpstreamSettings,
        tls: &GrpcTlsSettings,
        token: Arc<ServiceToken>,
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            client: ProductStockServiceClient::new(flashsale_platform::balance::channel(
                &upstream.product_stock_urls(),
                upstream.product_stock_refresh(),
                timeout,
                tls,
            )?),
            token,
        })
    }
}

#[tonic::async_trait]
impl StockCommitter for GrpcCommitter {
    async fn commit(&self, order_id: Uuid) -> Result<(), CommitError> {
        let msg = CommitReservationRequest {
            order_id: order_id.to_string(),
        };
        let req = flashsale_platform::grpc::service_request(msg, &self.token)
            .map_err(|e| CommitError::Transient(format!("service request: {e}")))?;
        match self.client.clone().commit_reservation(req).await {
            Ok(_) => Ok(()),
            Err(s) => {
                let reason = flashsale_platform::error::reason_of(&s).unwrap_or_default();
                let text = format!("CommitReservation: {:?} {reason} {}", s.code(), s.message());
                // An order is paid only once product-stock persisted its reservation, so a
                // reservation that is missing, released or refused stays so: permanent.
                match s.code() {
                    Code::FailedPrecondition
                    | Code::NotFound
                    | Code::InvalidArgument
                    | Code::PermissionDenied => Err(CommitError::Permanent(text)),
                    _ => Err(CommitError::Transient(text)),
                }
            }
        }
    }
}
