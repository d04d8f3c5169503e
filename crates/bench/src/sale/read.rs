//! Reading the platform back over gRPC with the admin token — orders, a buyer's orders, the
//! product, its reconcile report, shipments — many calls at once but never more than
//! [`READ_CONCURRENCY`], each retried a few times on transient errors.

use std::{future::Future, sync::Arc, time::Duration};

use flashsale_proto::{
    order::v1::{CancelReason, GetOrderRequest, ListOrdersRequest, Order, OrderStatus},
    outbound::v1::{GetShipmentRequest, Shipment},
    product::v1::{GetProductRequest, Product, ReconcileStockRequest},
};
use tokio::{sync::Semaphore, task::JoinSet};
use tonic::Code;

use super::{
    Ctx,
    follow::{Outcome, Run},
};
use crate::client::authorized;

/// Calls in flight while reading back or acting on orders.
pub(crate) const READ_CONCURRENCY: usize = 32;
/// Tries of an idempotent call that fails transiently (100, 200, 400 ms apart).
const TRIES: u32 = 4;

/// The orders with these ids (admin GetOrder), in the same order; `None` where a read failed.
pub(crate) async fn orders(ctx: &Arc<Ctx>, ids: Vec<String>) -> Vec<Option<Order>> {
    let ctx = ctx.clone();
    bounded(ids, READ_CONCURRENCY, move |order_id| {
        let ctx = ctx.clone();
        async move {
            let resp = retrying(|| {
                let (mut client, order_id) = (ctx.orders.clone(), order_id.clone());
                let req = request(GetOrderRequest { order_id }, &ctx.admin);
                async move { client.get_order(req?).await }
            })
            .await;
            resp.ok()?.into_inner().order
        }
    })
    .await
    .into_iter()
    .map(Option::flatten)
    .collect()
}

/// One of the sale's products as it is now.
pub(crate) async fn product(ctx: &Ctx, sku: &str) -> Option<Product> {
    let resp = retrying(|| {
        let mut client = ctx.stock.clone();
        let req = request(
            GetProductRequest {
                sku: sku.to_owned(),
            },
            &ctx.admin,
        );
        async move { client.get_product(req?).await }
    })
    .await;
    resp.ok()?.into_inner().product
}

/// The order service's report of `sku`'s sale (GetSaleReport).
pub(crate) async fn sale_report(
    ctx: &Ctx,
    sku: &str,
) -> Option<flashsale_proto::order::v1::SaleReport> {
    let resp = retrying(|| {
        let mut client = ctx.orders.clone();
        let req = request(
            flashsale_proto::order::v1::GetSaleReportRequest {
                sku: sku.to_owned(),
            },
            &ctx.admin,
        );
        async move { client.get_sale_report(req?).await }
    })
    .await;
    resp.ok()?.into_inner().report
}

/// The ids of `buyer`'s orders of the sale's product, every page.
pub(crate) async fn list_of(ctx: &Ctx, buyer: usize) -> Result<Vec<String>, tonic::Status> {
    let mut ids = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = retrying(|| {
            let mut client = ctx.orders.clone();
            let req = ListOrdersRequest {
                user_id: ctx.buyers[buyer].clone(),
                status: OrderStatus::Unspecified as i32,
                page_size: 500,
                page_token: page_token.clone(),
            };
            let req = request(req, &ctx.admin);
            async move { client.list_orders(req?).await }
        })
        .await?
        .into_inner();
        ids.extend(
            page.orders
                .into_iter()
                .filter(|o| ctx.skus.contains(&o.sku))
                .map(|o| o.order_id),
        );
        if page.next_page_token.is_empty() {
            return Ok(ids);
        }
        page_token = page.next_page_token;
    }
}

/// The shipment of every order that was paid (admin GetShipment), in the order of `run`.
pub(crate) async fn shipments(ctx: &Arc<Ctx>, run: &Run) -> Vec<Option<Shipment>> {
    let wanted: Vec<Option<String>> = run
        .tracked
        .iter()
        .map(|t| {
            let paid = t.outcome == Outcome::Paid
                || t.order.as_ref().is_some_and(|o| {
                    o.status == OrderStatus::Shipped as i32
                        || o.cancel_reason == CancelReason::OutboundFailed as i32
                });
            paid.then(|| t.order_id.clone())
        })
        .collect();
    let ctx = ctx.clone();
    bounded(wanted, READ_CONCURRENCY, move |id| {
        let ctx = ctx.clone();
        async move {
            let order_id = id?;
            let resp = retrying(|| {
                let (mut client, order_id) = (ctx.outbound.clone(), order_id.clone());
                let req = request(GetShipmentRequest { order_id }, &ctx.admin);
                async move { client.get_shipment(req?).await }
            })
            .await;
            resp.ok()?.into_inner().shipment
        }
    })
    .await
    .into_iter()
    .map(Option::flatten)
    .collect()
}

/// Each product's drift between gate and database (ReconcileStock without repair), by sku.
pub(crate) async fn drift(ctx: &Ctx) -> std::collections::BTreeMap<String, i64> {
    let resp = retrying(|| {
        let mut client = ctx.stock.clone();
        let req = ReconcileStockRequest {
            skus: ctx.skus.clone(),
            repair: false,
        };
        let req = request(req, &ctx.admin);
        async move { client.reconcile_stock(req?).await }
    })
    .await;
    resp.map(|r| {
        r.into_inner()
            .reports
            .into_iter()
            .map(|r| (r.sku, r.drift))
            .collect()
    })
    .unwrap_or_default()
}

/// `message` with the bearer `token`, as a gRPC request.
pub(crate) fn request<T>(message: T, token: &str) -> Result<tonic::Request<T>, tonic::Status> {
    authorized(message, token).map_err(|e| tonic::Status::unauthenticated(format!("{e:#}")))
}

/// `call` until it succeeds, is refused for good, or has failed [`TRIES`] times on a transient
/// error (backing off) — what a gateway does for idempotent calls.
pub(crate) async fn retrying<T, F, Fut>(mut call: F) -> Result<T, tonic::Status>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, tonic::Status>>,
{
    let mut delay = Duration::from_millis(100);
    for _ in 1..TRIES {
        match call().await {
            Err(s) if transient(s.code()) => {
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
            done => return done,
        }
    }
    call().await
}

fn transient(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable
            | Code::DeadlineExceeded
            | Code::ResourceExhausted
            | Code::Aborted
            | Code::Internal
            | Code::Unknown
    )
}

/// Runs `f` over `items`, at most `limit` at once; the results in the order of `items`, `None`
/// where a task died.
pub(crate) async fn bounded<T, R, F, Fut>(items: Vec<T>, limit: usize, f: F) -> Vec<Option<R>>
where
    T: Send + 'static,
    R: Send + 'static,
    F: Fn(T) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = R> + Send + 'static,
{
    let gate = Arc::new(Semaphore::new(limit));
    let f = Arc::new(f);
    let mut out: Vec<Option<R>> = std::iter::repeat_with(|| None).take(items.len()).collect();
    let mut tasks = JoinSet::new();
    for (i, item) in items.into_iter().enumerate() {
        let (gate, f) = (gate.clone(), f.clone());
        tasks.spawn(async move {
            let _permit = gate.acquire().await;
            (i, f(item).await)
        });
    }
    while let Some(done) = tasks.join_next().await {
        if let Ok((i, r)) = done {
            out[i] = Some(r);
        }
    }
    out
}
