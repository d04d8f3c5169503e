//! The product-stock gate as the order service sees it: one port trait (so use cases can be
//! tested with a fake) and its gRPC adapter, which sends a service token and the trace context.

use std::{collections::HashMap, sync::Arc, time::Duration};

use flashsale_contract::{parse_rfc3339_ms, reason::meta};

use flashsale_platform::batch::Batcher;
use flashsale_platform::{auth::ServiceToken, settings::UpstreamSettings, tls::GrpcTlsSettings};
use flashsale_proto::product::v1::{
    GetGateBuyersRequest, GetProductRequest, ReserveStockBatchRequest, ReserveStockRequest,
    product_stock_service_client::ProductStockServiceClient,
};
use tonic::{Code, transport::Channel};
use uuid::Uuid;

use crate::domain::{OrderError, Policy, Refusal};

/// The `ErrorInfo` reason product-stock refuses a reservation with when it released that
/// order's hold already.
pub use flashsale_contract::reason::RESERVATION_RELEASED;

/// What the gate granted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Granted {
    pub unit_price_cents: i64,
    pub policy: Policy,
    pub replayed: bool,
    /// The gate's clock when it took the units (`None` on a replay, or from a product-stock
    /// that does not send it).
    pub gate_ms: Option<i64>,
}

/// The gate's buyers of a product, read with its counter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GateBuyers {
    pub available: i64,
    /// Every buyer, or `None` when the gate had too many to list or the list asked about is
    /// [`unchanged`](Self::unchanged).
    pub users: Option<Vec<String>>,
    /// The product's refills count (bumped whenever units may come back to the gate); `""` from
    /// a gate that does not keep one.
    pub refills: String,
    /// The refills count was still the one asked about: no units came back since that list was
    /// read, so it still holds every buyer while `available` is at most zero.
    pub unchanged: bool,
}

/// What product-stock says of a product, for the sale report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProductFacts {
    pub price_cents: i64,
    pub sale_price_cents: Option<i64>,
    pub sale_start_ms: Option<i64>,
    pub sale_end_ms: Option<i64>,
    pub on_hand: i64,
    pub reserved: i64,
    pub available: i64,
}

/// Most buyers asked for in one read (the list must fit in one message).
pub const MAX_LISTED_BUYERS: u32 = 100_000;

/// Takes units through the stock gate.
#[tonic::async_trait]
pub trait StockPort: Send + Sync + 'static {
    /// `Refused` for SOLD_OUT, INSUFFICIENT_STOCK, USER_LIMIT_EXCEEDED; `Closed` for
    /// SALE_NOT_STARTED and SALE_ENDED; `ReservationReleased`;
    /// `UnknownProduct`; `Unavailable` when the gate cannot answer now.
    async fn reserve(
        &self,
        order_id: Uuid,
        user_id: &str,
        sku: &str,
        quantity: i64,
    ) -> Result<Granted, OrderError>;

    /// The gate's available counter and buyers of `sku`, in one atomic read; no list when the
    /// product's refills count is still `known_refills` (`""`: always a list).
    async fn buyers(&self, sku: &str, known_refills: &str) -> Result<GateBuyers, OrderError>;

    /// The product's terms and stock (the sale report); `UnknownProduct` when there is none.
    async fn product(&self, sku: &str) -> Result<ProductFacts, OrderError> {
        let _ = sku;
        Err(OrderError::Unavailable(
            "this stock port does not read products".into(),
        ))
    }
}

/// [`StockPort`] over product-stock's gRPC API. Concurrent reservations are coalesced into
/// `ReserveStockBatch` calls (one RPC and one Redis round trip for all the CreateOrders waiting
/// at that moment); a lone one goes at once.
#[derive(Clone)]
pub struct GrpcStock {
    client: ProductStockServiceClient<Channel>,
    token: Arc<ServiceToken>,
    /// Built by [`reserve_batcher`]; each batch is one [`reserve_batch`].
    batch: Batcher<ReserveItem, Result<Granted, OrderError>>,
}

/// One reservation waiting for its batch.
#[derive(Clone, Debug)]
struct ReserveItem {
    order_id: Uuid,
    user_id: String,
    sku: String,
    quantity: i64,
}

impl ReserveItem {
    fn request(&self) -> ReserveStockRequest {
        ReserveStockRequest {
            order_id: self.order_id.to_string(),
            user_id: self.user_id.clone(),
            sku: self.sku.clone(),
            quantity: self.quantity,
        }
    }
}

/// Most reservations in one `ReserveStockBatch`.
const MAX_BATCH: usize = 128;
/// Batches in flight at once (calls arriving meanwhile form the next). Two, not more: larger
/// batches cost product-stock and Redis less per reservation; one is no faster
/// (docs/benchmarks.md).
const PARALLEL_BATCHES: usize = 2;

impl GrpcStock {
    /// A client of every product-stock replica behind `upstream.product_stock_url`, balanced
    /// ([`flashsale_platform::balance`]); it connects lazily (the order service starts even if
    /// product-stock is not up yet; calls then fail `UNAVAILABLE`), over TLS with `tls` for
    /// `https://` URLs. Must be called inside a Tokio runtime.
    pub fn new(
        upstream: &UpstreamSettings,
        tls: &GrpcTlsSettings,
        token: Arc<ServiceToken>,
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        let client = ProductStockServiceClient::new(flashsale_platform::balance::channel(
            &upstream.product_stock_urls(),
            upstream.product_stock_refresh(),
            timeout,
            tls,
        )?);
        let batch = reserve_batcher(client.clone(), token.clone());
        Ok(Self {
            client,
            token,
            batch,
        })
    }
}

/// The gate's batcher: concurrent CreateOrders' reservations gathered into one
/// `ReserveStockBatch` ([`reserve_batch`]), [`PARALLEL_BATCHES`] in flight.
fn reserve_batcher(
    client: ProductStockServiceClient<Channel>,
    token: Arc<ServiceToken>,
) -> Batcher<ReserveItem, Result<Granted, OrderError>> {
    Batcher::serving(
        "order_gate",
        MAX_BATCH,
        Duration::ZERO,
        PARALLEL_BATCHES,
        (client, token),
        |(client, token), items| async move { reserve_batch(client, &token, items).await },
    )
}

/// One `ReserveStockBatch` for `items`; one answer each. A product-stock that does not know
/// the batch call yet (an older replica during a rolling update) gets one call per item.
async fn reserve_batch(
    client: ProductStockServiceClient<Channel>,
    token: &ServiceToken,
    items: Vec<ReserveItem>,
) -> Vec<Result<Granted, OrderError>> {
    if let [one] = items.as_slice() {
        return vec![reserve_one(client, token, one).await];
    }
    let msg = ReserveStockBatchRequest {
        items: items.iter().map(ReserveItem::request).collect(),
    };
    let req = match flashsale_platform::grpc::service_request(msg, token) {
        Ok(r) => r,
        Err(e) => {
            return items
                .iter()
                .map(|_| {
                    Err(OrderError::Internal(anyhow::anyhow!(
                        "service request: {e}"
                    )))
                })
                .collect();
        }
    };
    match client.clone().reserve_stock_batch(req).await {
        Ok(resp) => {
            let mut outcomes = resp.into_inner().outcomes.into_iter();
            items
                .iter()
                .map(|item| match outcomes.next() {
                    Some(o) => match o.reserved {
                        Some(r) => Ok(granted(&r)),
                        None => Err(map_error(
                            Code::from(o.code),
                            &o.message,
                            Info {
                                reason: (!o.reason.is_empty()).then_some(o.reason),
                                metadata: o.metadata,
                            },
                            o.fields,
                            &item.sku,
                        )),
                    },
                    None => Err(OrderError::Unavailable(
                        "product-stock answered fewer reservations than asked".into(),
                    )),
                })
                .collect()
        }
        Err(s) if s.code() == Code::Unimplemented => {
            let each = items.iter().map(|i| reserve_one(client.clone(), token, i));
            futures_util::future::join_all(each).await
        }
        Err(s) => items
            .iter()
            .map(|i| Err(map_status(s.clone(), &i.sku)))
            .collect(),
    }
}

async fn reserve_one(
    mut client: ProductStockServiceClient<Channel>,
    token: &ServiceToken,
    item: &ReserveItem,
) -> Result<Granted, OrderError> {
    let req = flashsale_platform::grpc::service_request(item.request(), token)
        .map_err(|e| OrderError::Internal(anyhow::anyhow!("service request: {e}")))?;
    match client.reserve_stock(req).await {
        Ok(resp) => Ok(granted(&resp.into_inner())),
        Err(s) => Err(map_status(s, &item.sku)),
    }
}

fn granted(r: &flashsale_proto::product::v1::ReserveStockResponse) -> Granted {
    Granted {
        unit_price_cents: r.unit_price_cents,
        policy: Policy::from_proto(r.deduction_policy).unwrap_or(Policy::ReserveThenCommit),
        replayed: r.replayed,
        gate_ms: r.gate_time.as_ref().and_then(flashsale_contract::timestamp_to_ms),
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
        let item = ReserveItem {
            order_id,
            user_id: user_id.to_owned(),
            sku: sku.to_owned(),
            quantity,
        };
        match self.batch.call(item).await {
            Ok(answer) => answer,
            Err(e) => Err(OrderError::Unavailable(format!("stock reservations: {e}"))),
        }
    }

    async fn buyers(&self, sku: &str, known_refills: &str) -> Result<GateBuyers, OrderError> {
        let msg = GetGateBuyersRequest {
            sku: sku.to_owned(),
            max_buyers: MAX_LISTED_BUYERS,
            known_refills: known_refills.to_owned(),
        };
        let req = flashsale_platform::grpc::service_request(msg, &self.token)
            .map_err(|e| OrderError::Internal(anyhow::anyhow!("service request: {e}")))?;
        match self.client.clone().get_gate_buyers(req).await {
            Ok(resp) => {
                let r = resp.into_inner();
                Ok(GateBuyers {
                    available: r.gate_available,
                    users: r.complete.then_some(r.user_ids),
                    refills: r.refills,
                    unchanged: r.unchanged,
                })
            }
            Err(s) => Err(map_status(s, sku)),
        }
    }

    async fn product(&self, sku: &str) -> Result<ProductFacts, OrderError> {
        let msg = GetProductRequest {
            sku: sku.to_owned(),
        };
        let req = flashsale_platform::grpc::service_request(msg, &self.token)
            .map_err(|e| OrderError::Internal(anyhow::anyhow!("service request: {e}")))?;
        let p = match self.client.clone().get_product(req).await {
            Ok(resp) => resp.into_inner().product.ok_or_else(|| {
                OrderError::Unavailable("product-stock answered no product".into())
            })?,
            Err(s) => return Err(map_status(s, sku)),
        };
        let ms = |t: Option<&flashsale_contract::Timestamp>| {
            t.and_then(flashsale_contract::timestamp_to_ms)
        };
        Ok(ProductFacts {
            price_cents: p.price_cents,
            sale_price_cents: p.sale_price_cents,
            sale_start_ms: ms(p.sale_start.as_ref()),
            sale_end_ms: ms(p.sale_end.as_ref()),
            on_hand: p.on_hand,
            reserved: p.reserved,
            available: p.available,
        })
    }
}

fn map_status(s: tonic::Status, sku: &str) -> OrderError {
    map_error(
        s.code(),
        s.message(),
        Info {
            reason: flashsale_platform::error::reason_of(&s),
            metadata: flashsale_platform::error::info_metadata(&s),
        },
        flashsale_platform::error::violated_fields(&s),
        sku,
    )
}

/// A status's `ErrorInfo`: its reason and metadata.
#[derive(Debug, Default)]
struct Info {
    reason: Option<String>,
    metadata: HashMap<String, String>,
}

fn map_error(code: Code, message: &str, info: Info, fields: Vec<String>, sku: &str) -> OrderError {
    match code {
        Code::FailedPrecondition => refusal(info, message),
        Code::NotFound => OrderError::UnknownProduct(sku.to_owned()),
        Code::InvalidArgument => OrderError::Invalid(
            fields
                .into_iter()
                .map(|f| (f, message.to_owned()))
                .collect(),
        ),
        Code::Unavailable
        | Code::DeadlineExceeded
        | Code::Cancelled
        | Code::ResourceExhausted
        | Code::Unknown => OrderError::Unavailable(format!("product-stock: {message}")),
        other => OrderError::Internal(anyhow::anyhow!(
            "product-stock answered {other:?}: {message}"
        )),
    }
}

/// The one translation of product-stock's refusals. A reason this version does not know (a
/// newer product-stock, or none at all) is a break of the contract between the two services,
/// not something the buyer can act on: it is logged and answered as an internal error.
fn refusal(info: Info, message: &str) -> OrderError {
    match info.reason.as_deref() {
        Some(RESERVATION_RELEASED) => OrderError::ReservationReleased(message.to_owned()),
        Some(r) => match Refusal::from_reason(r) {
            Some(refusal) if refusal.is_window() => closed(refusal, &info.metadata, message),
            Some(refusal) => OrderError::Refused(refusal, message.to_owned()),
            None => unknown_refusal(r, message),
        },
        None => unknown_refusal("", message),
    }
}

/// A refusal by the sale window, with the instants its metadata names; one without them breaks
/// the contract as an unknown reason does.
fn closed(refusal: Refusal, metadata: &HashMap<String, String>, message: &str) -> OrderError {
    let at_key = if refusal == Refusal::SaleEnded {
        meta::SALE_END
    } else {
        meta::SALE_START
    };
    let instant = |k: &str| metadata.get(k).and_then(|v| parse_rfc3339_ms(v));
    match (instant(at_key), instant(meta::GATE_TIME)) {
        (Some(at_ms), Some(gate_ms)) => OrderError::Closed {
            refusal,
            at_ms,
            gate_ms,
            message: message.to_owned(),
        },
        _ => unknown_refusal(refusal.reason(), message),
    }
}

fn unknown_refusal(reason: &str, message: &str) -> OrderError {
    tracing::error!(%reason, %message, "product-stock refused a reservation for a reason this version does not know");
    OrderError::Internal(anyhow::anyhow!(
        "product-stock refused for an unknown reason `{reason}`: {message}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_translated_once_into_typed_values() {
        let reason = |r: &str| Info {
            reason: Some(r.to_owned()),
            metadata: HashMap::new(),
        };
        for r in Refusal::ALL.into_iter().filter(|r| !r.is_window()) {
            let e = map_error(Code::FailedPrecondition, "no", reason(r.reason()), vec![], "S");
            assert!(
                matches!(e, OrderError::Refused(got, ref m) if got == r && m == "no"),
                "{e:?}"
            );
        }
        let released = map_error(
            Code::FailedPrecondition,
            "gone",
            reason(RESERVATION_RELEASED),
            vec![],
            "S",
        );
        assert!(
            matches!(released, OrderError::ReservationReleased(_)),
            "{released:?}"
        );
        for unknown in [reason("SOMETHING_NEW"), Info::default()] {
            let e = map_error(Code::FailedPrecondition, "?", unknown, vec![], "S");
            assert!(matches!(e, OrderError::Internal(_)), "{e:?}");
        }
    }

    #[test]
    fn a_refusal_by_the_sale_window_carries_its_instants_or_is_a_broken_contract() {
        let info = |r: Refusal, pairs: &[(&str, &str)]| Info {
            reason: Some(r.reason().to_owned()),
            metadata: pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        };
        let start = "2026-12-07T20:00:00.000Z";
        let gate = "2026-12-07T19:59:55.250Z";
        let e = map_error(
            Code::FailedPrecondition,
            "not yet",
            info(
                Refusal::SaleNotStarted,
                &[(meta::SALE_START, start), (meta::GATE_TIME, gate)],
            ),
            vec![],
            "S",
        );
        match e {
            OrderError::Closed {
                refusal: Refusal::SaleNotStarted,
                at_ms,
                gate_ms,
                ..
            } => assert_eq!(at_ms - gate_ms, 4_750),
            other => panic!("{other:?}"),
        }
        let e = map_error(
            Code::FailedPrecondition,
            "over",
            info(
                Refusal::SaleEnded,
                &[(meta::SALE_END, start), (meta::GATE_TIME, gate)],
            ),
            vec![],
            "S",
        );
        assert!(
            matches!(e, OrderError::Closed { refusal: Refusal::SaleEnded, .. }),
            "{e:?}"
        );
        // The wrong instant's key, or none, or one that is no instant.
        for pairs in [
            vec![(meta::SALE_END, start), (meta::GATE_TIME, gate)],
            vec![],
            vec![(meta::SALE_START, "soon"), (meta::GATE_TIME, gate)],
        ] {
            let e = map_error(
                Code::FailedPrecondition,
                "?",
                info(Refusal::SaleNotStarted, &pairs),
                vec![],
                "S",
            );
            assert!(matches!(e, OrderError::Internal(_)), "{pairs:?}: {e:?}");
        }
    }
}
