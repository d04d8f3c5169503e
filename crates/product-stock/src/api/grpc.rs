//! `flashsale.product.v1.ProductStockService` over tonic: check the caller's role, turn the
//! request into domain values (junk becomes `INVALID_ARGUMENT` with field violations), call the
//! use case, turn the answer back.

use flashsale_contract::{
    PAGE_TOKEN_MAX_LEN, Timestamp, check_optional_text, ms_to_timestamp, reason::meta,
    rfc3339_ms, timestamp_to_ms, to_timestamp,
};
use flashsale_platform::{
    ApiError,
    auth::{Caller, Role},
    limit::UserRateLimiter,
};
use flashsale_proto::product::v1::{
    self as pb, AdjustStockRequest, AdjustStockResponse, CommitReservationRequest,
    CommitReservationResponse, CreateProductRequest, CreateProductResponse, GetGateBuyersRequest,
    GetGateBuyersResponse, GetProductRequest, GetProductResponse, ListProductsRequest,
    ListProductsResponse, ReconcileStockRequest, ReconcileStockResponse, ReserveStockBatchRequest,
    ReserveStockBatchResponse, ReserveStockOutcome, ReserveStockRequest, ReserveStockResponse,
    UpdateProductRequest, UpdateProductResponse,
    product_stock_service_server::ProductStockService,
};
use tonic::{Request, Response, Status};

use crate::{
    app::{Catalog, CommitBatcher, DriftReport, Reconciler, Reservations},
    domain::{
        Adjustment, DeductionPolicy, GateBuyers, Product, ProductDraft, Refusal, ReservationState,
        ProductUpdate, ReserveRequest, Sale, Sku, StockError, UpdateValues, etag_of, parse_order_id,
    },
};

/// The gRPC face of the product-stock service.
#[derive(Clone)]
pub struct ProductStockApi {
    catalog: Catalog,
    gate: Reservations,
    commits: CommitBatcher,
    reconciler: Reconciler,
    /// GetProduct and ListProducts calls of each buyer (`limits.*`).
    reads: UserRateLimiter,
}

impl ProductStockApi {
    /// `commits` is the batching worker `CommitReservation` goes through
    /// ([`crate::app::commit_batcher`]); `reads` counts the buyers' reads.
    pub fn new(
        catalog: Catalog,
        gate: Reservations,
        commits: CommitBatcher,
        reconciler: Reconciler,
        reads: UserRateLimiter,
    ) -> Self {
        Self {
            catalog,
            gate,
            commits,
            reconciler,
            reads,
        }
    }
}

const ADMIN: &[Role] = &[Role::Admin];
const SERVICE: &[Role] = &[Role::Service, Role::Admin];
/// Most reservations in one ReserveStockBatch.
const MAX_RESERVE_BATCH: usize = 256;
/// Most buyers one GetGateBuyers lists.
const MAX_GATE_BUYERS: u32 = 100_000;
/// Most bytes of user ids one GetGateBuyers answer carries (well under the 4 MiB default
/// message limit).
const MAX_GATE_BUYERS_BYTES: usize = 2 * 1024 * 1024;
const ANYONE: &[Role] = &[Role::User, Role::Admin, Role::Service];

/// The caller, if `roles` may call this; admin calls are audited (see
/// [`flashsale_platform::auth::authorize`]).
fn authorize<T: std::fmt::Debug>(req: &Request<T>, roles: &[Role]) -> Result<Caller, Status> {
    Ok(flashsale_platform::auth::authorize(req, roles)?)
}

/// A product as the API shows it; `gate` is `None` while the gate has not loaded it (-1).
fn product_to_proto((p, gate): (Product, Option<i64>)) -> pb::Product {
    pb::Product {
        available: p.available(),
        sku: p.sku.to_string(),
        name: p.name,
        price_cents: p.price_cents,
        per_user_limit: p.per_user_limit,
        deduction_policy: p.policy.as_proto(),
        on_hand: p.on_hand,
        reserved: p.reserved,
        gate_available: gate.unwrap_or(-1),
        stock_buckets: p.stock_buckets,
        create_time: Some(to_timestamp(p.created_at)),
        update_time: Some(to_timestamp(p.updated_at)),
        sale_start: p.sale.start_ms.and_then(ms_to_timestamp),
        sale_end: p.sale.end_ms.and_then(ms_to_timestamp),
        sale_price_cents: p.sale.price_cents,
        etag: etag_of(p.version),
    }
}

/// A sale off the wire: each instant to the millisecond (finer parts are dropped), with the
/// fields that are no instant named (and left unset).
fn sale_of(
    start: Option<&Timestamp>,
    end: Option<&Timestamp>,
    price_cents: Option<i64>,
) -> (Sale, Vec<(String, String)>) {
    let mut bad = Vec::new();
    let mut instant = |field: &str, ts: Option<&Timestamp>| {
        let ms = timestamp_to_ms(ts?);
        if ms.is_none() {
            bad.push((
                field.to_owned(),
                "must be a valid instant (nanos in 0..1e9, years 1..=9999)".to_owned(),
            ));
        }
        ms
    };
    let sale = Sale {
        start_ms: instant("sale_start", start),
        end_ms: instant("sale_end", end),
        price_cents,
    };
    (sale, bad)
}

fn reserved_to_proto(ok: &crate::app::Reserved) -> ReserveStockResponse {
    ReserveStockResponse {
        status: pb::ReservationStatus::Reserved as i32,
        unit_price_cents: ok.unit_price_cents,
        deduction_policy: ok.policy.as_proto(),
        gate_available: ok.gate_available,
        replayed: ok.replayed,
        gate_time: ok.gate_ms.and_then(ms_to_timestamp),
    }
}

fn drift_to_proto(d: DriftReport) -> pb::StockDrift {
    pb::StockDrift {
        sku: d.sku.to_string(),
        gate_available: d.gate_available,
        unpersisted_holds: d.unpersisted_holds,
        expected_gate_available: d.expected_gate_available,
        drift: d.drift,
        repaired: d.repaired,
    }
}

fn status(e: impl Into<StockError>) -> Status {
    ApiError::from(e.into()).into()
}

/// The one mapping from product-stock errors to the API (AIP-193 reasons).
impl From<StockError> for ApiError {
    fn from(e: StockError) -> Self {
        let message = e.to_string();
        match e {
            StockError::Invalid(v) => ApiError::InvalidArgument(v),
            StockError::UnknownProduct(_) | StockError::UnknownReservation(_) => {
                ApiError::NotFound(message)
            }
            StockError::DuplicateSku(_) => ApiError::AlreadyExists {
                reason: flashsale_contract::reason::SKU_EXISTS,
                message,
            },
            StockError::Refused(r, _) => ApiError::failed_precondition(r.reason(), message),
            StockError::Closed {
                refusal,
                at_ms,
                gate_ms,
            } => {
                let at = if refusal == Refusal::SaleEnded {
                    meta::SALE_END
                } else {
                    meta::SALE_START
                };
                ApiError::failed_precondition_with(
                    refusal.reason(),
                    message,
                    vec![(at, rfc3339_ms(at_ms)), (meta::GATE_TIME, rfc3339_ms(gate_ms))],
                )
            }
            StockError::WriteOffAboveFree(_) => {
                ApiError::failed_precondition(Refusal::InsufficientStock.reason(), message)
            }
            StockError::EtagMismatch { .. } => ApiError::Aborted {
                reason: flashsale_contract::reason::ETAG_MISMATCH,
                message,
            },
            StockError::SaleInProgress => ApiError::failed_precondition(
                flashsale_contract::reason::SALE_IN_PROGRESS,
                message,
            ),
            StockError::IdempotencyKeyReused(_) => ApiError::failed_precondition(
                flashsale_contract::reason::IDEMPOTENCY_KEY_REUSED,
                message,
            ),
            StockError::ReservationReleased(_) => ApiError::failed_precondition(
                flashsale_contract::reason::RESERVATION_RELEASED,
                message,
            ),
            StockError::GateUnavailable(_) => ApiError::Unavailable {
                reason: flashsale_contract::reason::STOCK_GATE_UNAVAILABLE,
                message,
            },
            StockError::DatabaseUnavailable(_) => ApiError::Unavailable {
                reason: flashsale_contract::reason::DATABASE_UNAVAILABLE,
                message,
            },
            StockError::Internal(e) => ApiError::Internal(e),
        }
    }
}

#[tonic::async_trait]
impl ProductStockService for ProductStockApi {
    async fn create_product(
        &self,
        req: Request<CreateProductRequest>,
    ) -> Result<Response<CreateProductResponse>, Status> {
        authorize(&req, ADMIN)?;
        let r = req.into_inner();
        let draft = ProductDraft::new(
            &r.sku,
            &r.name,
            r.price_cents,
            r.initial_stock,
            r.per_user_limit,
            DeductionPolicy::from_proto(r.deduction_policy),
            r.stock_buckets,
        );
        let (sale, unreadable) = sale_of(
            r.sale_start.as_ref(),
            r.sale_end.as_ref(),
            r.sale_price_cents,
        );
        let now_ms = chrono::Utc::now().timestamp_millis();
        let draft = ProductDraft::on_sale(draft, sale, unreadable, now_ms).map_err(status)?;
        let view = self.catalog.create_product(draft).await.map_err(status)?;
        Ok(Response::new(CreateProductResponse {
            product: Some(product_to_proto(view)),
        }))
    }

    async fn update_product(
        &self,
        req: Request<UpdateProductRequest>,
    ) -> Result<Response<UpdateProductResponse>, Status> {
        authorize(&req, ADMIN)?;
        let r = req.into_inner();
        let p = r.product.unwrap_or_default();
        let (sale, unreadable) =
            sale_of(p.sale_start.as_ref(), p.sale_end.as_ref(), p.sale_price_cents);
        let values = UpdateValues {
            name: p.name,
            price_cents: p.price_cents,
            per_user_limit: p.per_user_limit,
            sale,
            unreadable,
        };
        let paths = r.update_mask.map(|m| m.paths).unwrap_or_default();
        let update = ProductUpdate::new(&r.request_id, &p.sku, &p.etag, &paths, values)
            .map_err(status)?;
        let (view, replayed) = self.catalog.update_product(update).await.map_err(status)?;
        Ok(Response::new(UpdateProductResponse {
            product: Some(product_to_proto(view)),
            replayed,
        }))
    }

    async fn get_product(
        &self,
        req: Request<GetProductRequest>,
    ) -> Result<Response<GetProductResponse>, Status> {
        let caller = authorize(&req, ANYONE)?;
        self.reads.check_caller(&caller)?;
        let sku = Sku::parse(&req.get_ref().sku).map_err(status)?;
        let view = self.catalog.get_product(&sku).await.map_err(status)?;
        Ok(Response::new(GetProductResponse {
            product: Some(product_to_proto(view)),
        }))
    }

    async fn list_products(
        &self,
        req: Request<ListProductsRequest>,
    ) -> Result<Response<ListProductsResponse>, Status> {
        let caller = authorize(&req, ANYONE)?;
        self.reads.check_caller(&caller)?;
        let r = req.into_inner();
        check_optional_text("page_token", &r.page_token, PAGE_TOKEN_MAX_LEN)
            .map_err(|v| status(StockError::Invalid(vec![v])))?;
        let (views, next) = self
            .catalog
            .list_products(r.page_size, &r.page_token)
            .await
            .map_err(status)?;
        Ok(Response::new(ListProductsResponse {
            products: views.into_iter().map(product_to_proto).collect(),
            next_page_token: next,
        }))
    }

    async fn adjust_stock(
        &self,
        req: Request<AdjustStockRequest>,
    ) -> Result<Response<AdjustStockResponse>, Status> {
        authorize(&req, ADMIN)?;
        let r = req.into_inner();
        let adj = Adjustment::new(&r.request_id, &r.sku, r.delta, &r.reason).map_err(status)?;
        let (view, replayed) = self.catalog.adjust_stock(adj).await.map_err(status)?;
        Ok(Response::new(AdjustStockResponse {
            product: Some(product_to_proto(view)),
            replayed,
        }))
    }

    async fn reserve_stock(
        &self,
        req: Request<ReserveStockRequest>,
    ) -> Result<Response<ReserveStockResponse>, Status> {
        authorize(&req, SERVICE)?;
        let r = req.into_inner();
        let max = self.gate.max_quantity();
        let reserve = ReserveRequest::new(&r.order_id, &r.user_id, &r.sku, r.quantity, max)
            .map_err(status)?;
        let ok = self.gate.reserve(reserve).await.map_err(status)?;
        Ok(Response::new(reserved_to_proto(&ok)))
    }

    async fn reserve_stock_batch(
        &self,
        req: Request<ReserveStockBatchRequest>,
    ) -> Result<Response<ReserveStockBatchResponse>, Status> {
        authorize(&req, SERVICE)?;
        let items = req.into_inner().items;
        if items.is_empty() || items.len() > MAX_RESERVE_BATCH {
            return Err(status(StockError::invalid(
                "items",
                format!("must hold 1..={MAX_RESERVE_BATCH} reservations"),
            )));
        }
        let max = self.gate.max_quantity();
        // Items that fail validation are answered as ReserveStock would; the rest go to the
        // gate together.
        let parsed: Vec<Result<ReserveRequest, StockError>> = items
            .iter()
            .map(|r| ReserveRequest::new(&r.order_id, &r.user_id, &r.sku, r.quantity, max))
            .collect();
        let valid: Vec<ReserveRequest> = parsed
            .iter()
            .filter_map(|p| p.as_ref().ok().cloned())
            .collect();
        let mut reserved = self
            .gate
            .reserve_many(&valid)
            .await
            .map_err(status)?
            .into_iter();
        let outcomes = parsed
            .into_iter()
            .map(|p| {
                let result = match p {
                    Ok(_) => reserved.next().unwrap_or_else(|| {
                        Err(StockError::Internal(anyhow::anyhow!("missing gate answer")))
                    }),
                    Err(e) => Err(e),
                };
                match result {
                    Ok(ok) => ReserveStockOutcome {
                        reserved: Some(reserved_to_proto(&ok)),
                        ..ReserveStockOutcome::default()
                    },
                    Err(e) => {
                        let s = status(e);
                        ReserveStockOutcome {
                            reserved: None,
                            code: s.code() as i32,
                            message: s.message().to_owned(),
                            reason: flashsale_platform::error::reason_of(&s).unwrap_or_default(),
                            fields: flashsale_platform::error::violated_fields(&s),
                            metadata: flashsale_platform::error::info_metadata(&s),
                        }
                    }
                }
            })
            .collect();
        Ok(Response::new(ReserveStockBatchResponse { outcomes }))
    }

    async fn get_gate_buyers(
        &self,
        req: Request<GetGateBuyersRequest>,
    ) -> Result<Response<GetGateBuyersResponse>, Status> {
        authorize(&req, SERVICE)?;
        let r = req.into_inner();
        let sku = Sku::parse(&r.sku).map_err(status)?;
        if !(1..=MAX_GATE_BUYERS).contains(&r.max_buyers) {
            return Err(status(StockError::invalid(
                "max_buyers",
                format!("must be 1..={MAX_GATE_BUYERS}"),
            )));
        }
        let found = self
            .gate
            .gate_buyers(&sku, r.max_buyers, &r.known_refills)
            .await
            .map_err(status)?;
        let unchanged = matches!(found, GateBuyers::Unchanged { .. });
        let resp = match found {
            GateBuyers::Listed {
                available,
                users,
                refills,
            } => {
                let count = i64::try_from(users.len()).unwrap_or(i64::MAX);
                // A list that would not fit in one message is not sent (the caller then asks
                // the gate per request, which is always correct).
                let bytes: usize = users.iter().map(|u| u.len() + 3).sum();
                let complete = bytes <= MAX_GATE_BUYERS_BYTES;
                GetGateBuyersResponse {
                    gate_available: available,
                    buyer_count: count,
                    user_ids: if complete { users } else { Vec::new() },
                    complete,
                    refills,
                    unchanged: false,
                }
            }
            // No list: the caller's earlier one still holds, or there are too many to send.
            GateBuyers::Unchanged {
                available,
                count,
                refills,
            }
            | GateBuyers::TooMany {
                available,
                count,
                refills,
            } => GetGateBuyersResponse {
                gate_available: available,
                buyer_count: count,
                user_ids: Vec::new(),
                complete: false,
                refills,
                unchanged,
            },
            GateBuyers::NotLoaded => {
                return Err(status(StockError::GateUnavailable(
                    "the gate has not loaded the product".into(),
                )));
            }
        };
        Ok(Response::new(resp))
    }

    async fn commit_reservation(
        &self,
        req: Request<CommitReservationRequest>,
    ) -> Result<Response<CommitReservationResponse>, Status> {
        authorize(&req, SERVICE)?;
        let order_id = parse_order_id(&req.get_ref().order_id).map_err(status)?;
        let (r, replayed) = self
            .commits
            .call((order_id, flashsale_messaging::outbox::current_trace()))
            .await
            .map_err(|e| status(StockError::Internal(anyhow::Error::new(e))))?
            .map_err(status)?;
        let state = match r.state {
            ReservationState::Reserved => pb::ReservationState::Reserved,
            ReservationState::Committed => pb::ReservationState::Committed,
            ReservationState::Released => pb::ReservationState::Released,
        };
        Ok(Response::new(CommitReservationResponse {
            order_id: r.order_id.to_string(),
            sku: r.sku.to_string(),
            quantity: r.quantity,
            state: state as i32,
            replayed,
        }))
    }

    async fn reconcile_stock(
        &self,
        req: Request<ReconcileStockRequest>,
    ) -> Result<Response<ReconcileStockResponse>, Status> {
        authorize(&req, ADMIN)?;
        let r = req.into_inner();
        let mut skus = Vec::with_capacity(r.skus.len());
        let mut bad = Vec::new();
        for (i, raw) in r.skus.iter().enumerate() {
            match Sku::parse(raw) {
                Ok(sku) => skus.push(sku),
                Err(e) => bad.push((format!("skus[{i}]"), e.to_string())),
            }
        }
        if !bad.is_empty() {
            return Err(status(StockError::Invalid(bad)));
        }
        let reports = self
            .reconciler
            .reconcile(skus, r.repair)
            .await
            .map_err(status)?;
        Ok(Response::new(ReconcileStockResponse {
            reports: reports.into_iter().map(drift_to_proto).collect(),
        }))
    }
}
