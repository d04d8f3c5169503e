//! The order service as product-stock sees it: one port trait (so the use cases can be tested
//! with a fake) and its gRPC adapter, which sends a service token and the trace context.
//!
//! Product-stock asks about orders in two places (docs/architecture.md#operations): the hold
//! sweeper, before it gives away a hold that never reached the database (was the order written
//! and acknowledged?), and the gate rebuild, which keeps the units of orders acknowledged but not
//! yet persisted here.

use std::{collections::HashMap, sync::Arc, time::Duration};

use flashsale_platform::{auth::ServiceToken, tls::GrpcTlsSettings};
use flashsale_proto::order::v1::{
    ListPendingOrdersRequest, LookupOrdersRequest, OrderStatus,
    order_service_client::OrderServiceClient,
};
use tonic::transport::Channel;
use uuid::Uuid;

use crate::config::OrderServiceSettings;

/// Most ids one lookup may carry (the order service's limit).
pub const MAX_LOOKUP: usize = 500;
/// Orders per page of the pending list (the order service's maximum page).
const PENDING_PAGE: i32 = 500;
/// Most pages of pending orders one rebuild reads (a bound on a runaway answer, far above any
/// product's orders in flight).
const MAX_PENDING_PAGES: usize = 2_000;

/// Where an order stands, as far as a gate hold is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OrderState {
    /// Written and acknowledged to the buyer, not cancelled: its units must stay held.
    Live,
    /// Cancelled: its units may go back.
    Cancelled,
}

/// An order acknowledged to its buyer whose stock may not have reached product-stock yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingOrder {
    pub order_id: Uuid,
    pub user_id: String,
    pub quantity: i64,
}

/// Why the order service could not answer. Nothing is given away on it.
#[derive(Debug, thiserror::Error)]
#[error("the order service cannot answer: {0}")]
pub struct OrdersUnavailable(pub String);

/// Questions to the order service.
#[tonic::async_trait]
pub trait OrderPort: Send + Sync + 'static {
    /// The state of each order among `ids` (at most [`MAX_LOOKUP`]) that exists; the missing
    /// ones are absent.
    async fn lookup(&self, ids: &[Uuid]) -> Result<HashMap<Uuid, OrderState>, OrdersUnavailable>;

    /// Every PENDING order of `sku`.
    async fn pending(&self, sku: &str) -> Result<Vec<PendingOrder>, OrdersUnavailable>;
}

/// [`OrderPort`] over the order service's gRPC API.
#[derive(Clone)]
pub struct GrpcOrders {
    client: OrderServiceClient<Channel>,
    token: Arc<ServiceToken>,
}

impl GrpcOrders {
    /// A lazily connecting client of every order replica behind `settings.url`, balanced
    /// ([`flashsale_platform::balance`]; product-stock starts even if the order service is not
    /// up yet; calls then fail and nothing is given away), over TLS with `tls` for `https://`
    /// URLs. Must be called inside a Tokio runtime.
    pub fn new(
        settings: &OrderServiceSettings,
        tls: &GrpcTlsSettings,
        token: Arc<ServiceToken>,
    ) -> anyhow::Result<Self> {
        let client = OrderServiceClient::new(flashsale_platform::balance::channel(
            &flashsale_platform::balance::split_urls(&settings.url),
            Duration::from_millis(settings.refresh_ms),
            Duration::from_millis(settings.timeout_ms),
            tls,
        )?);
        Ok(Self { client, token })
    }

    fn request<T>(&self, msg: T) -> Result<tonic::Request<T>, OrdersUnavailable> {
        flashsale_platform::grpc::service_request(msg, &self.token)
            .map_err(|e| OrdersUnavailable(format!("service request: {e}")))
    }
}

fn unavailable(s: &tonic::Status) -> OrdersUnavailable {
    OrdersUnavailable(format!("{:?}: {}", s.code(), s.message()))
}

fn parse_id(raw: &str) -> Result<Uuid, OrdersUnavailable> {
    Uuid::try_parse(raw)
        .map_err(|_| OrdersUnavailable(format!("the order service answered order id `{raw}`")))
}

#[tonic::async_trait]
impl OrderPort for GrpcOrders {
    async fn lookup(&self, ids: &[Uuid]) -> Result<HashMap<Uuid, OrderState>, OrdersUnavailable> {
        let mut found = HashMap::with_capacity(ids.len());
        for chunk in ids.chunks(MAX_LOOKUP) {
            let msg = LookupOrdersRequest {
                order_ids: chunk.iter().map(|id| id.hyphenated().to_string()).collect(),
            };
            let resp = self
                .client
                .clone()
                .lookup_orders(self.request(msg)?)
                .await
                .map_err(|s| unavailable(&s))?;
            for o in resp.into_inner().orders {
                let state = if o.status == OrderStatus::Cancelled as i32 {
                    OrderState::Cancelled
                } else {
                    OrderState::Live
                };
                found.insert(parse_id(&o.order_id)?, state);
            }
        }
        Ok(found)
    }

    async fn pending(&self, sku: &str) -> Result<Vec<PendingOrder>, OrdersUnavailable> {
        let mut orders = Vec::new();
        let mut token = String::new();
        for _ in 0..MAX_PENDING_PAGES {
            let msg = ListPendingOrdersRequest {
                sku: sku.to_owned(),
                page_size: PENDING_PAGE,
                page_token: token,
            };
            let page = self
                .client
                .clone()
                .list_pending_orders(self.request(msg)?)
                .await
                .map_err(|s| unavailable(&s))?
                .into_inner();
            for o in page.orders {
                orders.push(PendingOrder {
                    order_id: parse_id(&o.order_id)?,
                    user_id: o.user_id,
                    quantity: o.quantity,
                });
            }
            if page.next_page_token.is_empty() {
                return Ok(orders);
            }
            token = page.next_page_token;
        }
        Err(OrdersUnavailable(format!(
            "more than {MAX_PENDING_PAGES} pages of pending orders for {sku}"
        )))
    }
}
