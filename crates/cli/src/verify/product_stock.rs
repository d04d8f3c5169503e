//! product-stock's contract: `ProductStockService` as an admin, a buyer and a service, and the
//! admin APIs every service serves.

use anyhow::{Context as _, ensure};
use flashsale_contract::reason;
use flashsale_proto::{
    admin::v1::{
        GetOrderTimelineRequest, ListDeadLettersRequest,
        dead_letter_service_client::DeadLetterServiceClient,
        order_timeline_service_client::OrderTimelineServiceClient,
    },
    order::v1::{CancelOrderRequest, order_service_client::OrderServiceClient},
    product::v1::{
        AdjustStockRequest, CommitReservationRequest, CreateProductRequest, DeductionPolicy,
        GetGateBuyersRequest, GetProductRequest, ListProductsRequest, Product,
        ReconcileStockRequest, ReservationStatus, ReserveStockBatchRequest, ReserveStockRequest,
        UpdateProductRequest, product_stock_service_client::ProductStockServiceClient,
    },
};
use tonic::{Code, transport::Channel};

use super::{Ctx, Report, answered, bad_field, denied, refused, serving, with};

pub(super) const SERVICE: &str = "flashsale.product.v1.ProductStockService";

/// A product of the run's own: `stock` units at 19.99, no per-user limit, reserved at order
/// and deducted at shipment.
pub(super) fn product(sku: &str, stock: i64) -> CreateProductRequest {
    CreateProductRequest {
        sku: sku.to_owned(),
        name: "flashsale verify".to_owned(),
        price_cents: 1999,
        initial_stock: stock,
        per_user_limit: 0,
        deduction_policy: DeductionPolicy::ReserveThenCommit as i32,
        stock_buckets: 1,
        ..Default::default()
    }
}

/// Creates `request`'s product as an admin.
pub(super) async fn create(
    channel: &Channel,
    admin: &str,
    request: CreateProductRequest,
) -> anyhow::Result<()> {
    let sku = request.sku.clone();
    answered(
        ProductStockServiceClient::new(channel.clone())
            .create_product(with(request, admin))
            .await,
    )
    .with_context(|| format!("create product {sku}"))?;
    Ok(())
}

/// How long [`write_off`] waits before it writes a product's stock off.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Settle {
    /// Until no unit is reserved in the database (the suite's cancelled orders released).
    Database,
    /// Until, besides, the gate holds no unit the database does not know of: the holds of
    /// orders refused after the gate granted them, which their events give back.
    Gate,
}

/// Writes off what is left of each of `skus` (the API deletes no product), once the orders the
/// suite cancelled gave their units back. Units still held in the gate (a direct ReserveStock,
/// for an order the order service never placed) come back only when product-stock's hold
/// sweeper gives them back (`stock.hold_ttl_ms`), and stay.
pub(super) async fn write_off(
    cx: &Ctx,
    channel: &Channel,
    skus: &[String],
    settle: Settle,
) -> anyhow::Result<()> {
    let admin = cx.admin()?;
    let c = ProductStockServiceClient::new(channel.clone());
    for sku in skus {
        let settled = super::eventually(cx, &format!("{sku}'s reservations settled"), || async {
            let p = answered(
                c.clone()
                    .get_product(with(GetProductRequest { sku: sku.clone() }, &admin))
                    .await,
            )?
            .product
            .context("no product in the answer")?;
            let settled =
                p.reserved == 0 && (settle == Settle::Database || p.gate_available == p.available);
            Ok(settled.then_some(p))
        })
        .await;
        let Ok(p) = settled else { continue };
        let free = p.available.min(p.gate_available);
        if free > 0 {
            let off = AdjustStockRequest {
                request_id: format!("{sku}-write-off"),
                sku: sku.clone(),
                delta: -free,
                reason: "flashsale verify: clean up".to_owned(),
            };
            answered(c.clone().adjust_stock(with(off, &admin)).await)
                .with_context(|| format!("write off {sku}"))?;
        }
    }
    Ok(())
}

pub(super) async fn run(cx: &Ctx, url: &str, report: &mut Report) -> anyhow::Result<()> {
    let channel = cx.channel(url).await?;
    serving(report, &channel, &[SERVICE]).await;
    let c = ProductStockServiceClient::new(channel.clone());
    let (admin, buyer, service) = (cx.admin()?, cx.user("buyer")?, cx.service()?);
    let sku = cx.sku("stock");
    let one_left = cx.sku("last-unit");
    let later = cx.sku("opens-later");
    let get = |sku: &str| GetProductRequest {
        sku: sku.to_owned(),
    };

    // CreateProduct
    report.record(
        "CreateProduct without a token: UNAUTHENTICATED",
        refused(
            c.clone().create_product(product(&sku, 10)).await,
            Code::Unauthenticated,
            None,
        ),
    );
    report.record(
        "CreateProduct as a buyer: PERMISSION_DENIED",
        denied(
            c.clone()
                .create_product(with(product(&sku, 10), &buyer))
                .await,
        ),
    );
    report.record(
        "CreateProduct with a negative price: INVALID_ARGUMENT price_cents, nothing created",
        async {
            let bad = CreateProductRequest {
                price_cents: -1,
                ..product(&sku, 10)
            };
            bad_field(
                c.clone().create_product(with(bad, &admin)).await,
                "price_cents",
            )?;
            refused(
                c.clone().get_product(with(get(&sku), &admin)).await,
                Code::NotFound,
                None,
            )
        }
        .await,
    );
    report.record(
        "CreateProduct with a malformed sku: INVALID_ARGUMENT sku",
        bad_field(
            c.clone()
                .create_product(with(product("not a sku!", 1), &admin))
                .await,
            "sku",
        ),
    );
    report.record(
        "CreateProduct",
        async {
            let p = answered(
                c.clone()
                    .create_product(with(product(&sku, 10), &admin))
                    .await,
            )?
            .product
            .context("no product in the answer")?;
            ensure!(
                p.sku == sku && p.on_hand == 10 && p.available == 10 && p.price_cents == 1999,
                "answered {p:?}"
            );
            create(&channel, &admin, product(&one_left, 1)).await
        }
        .await,
    );
    report.record(
        "CreateProduct of an existing sku: ALREADY_EXISTS SKU_EXISTS",
        refused(
            c.clone()
                .create_product(with(product(&sku, 3), &admin))
                .await,
            Code::AlreadyExists,
            Some(reason::SKU_EXISTS),
        ),
    );

    // UpdateProduct
    let rename = |request_id: &str, etag: &str, paths: &[&str]| UpdateProductRequest {
        request_id: format!("{sku}-{request_id}"),
        product: Some(Product {
            sku: sku.clone(),
            etag: etag.to_owned(),
            name: "flashsale verify, renamed".to_owned(),
            ..Product::default()
        }),
        update_mask: Some(flashsale_contract::FieldMask {
            paths: paths.iter().map(|p| (*p).to_owned()).collect(),
        }),
    };
    report.record(
        "UpdateProduct as a buyer: PERMISSION_DENIED",
        denied(
            c.clone()
                .update_product(with(rename("buyer", "", &["name"]), &buyer))
                .await,
        ),
    );
    report.record(
        "UpdateProduct with an empty update_mask: INVALID_ARGUMENT update_mask",
        bad_field(
            c.clone()
                .update_product(with(rename("empty", "", &[]), &admin))
                .await,
            "update_mask",
        ),
    );
    report.record(
        "UpdateProduct of the name, for the etag read, and its replay",
        async {
            let p = answered(c.clone().get_product(with(get(&sku), &admin)).await)?
                .product
                .context("no product in the answer")?;
            let first = answered(
                c.clone()
                    .update_product(with(rename("name", &p.etag, &["name"]), &admin))
                    .await,
            )?;
            let renamed = first.product.context("no product in the answer")?;
            ensure!(
                !first.replayed
                    && renamed.name == "flashsale verify, renamed"
                    && renamed.etag != p.etag
                    && renamed.price_cents == p.price_cents,
                "answered {renamed:?}"
            );
            let again = answered(
                c.clone()
                    .update_product(with(rename("name", &p.etag, &["name"]), &admin))
                    .await,
            )?;
            ensure!(again.replayed, "the retry was applied again: {again:?}");
            refused(
                c.clone()
                    .update_product(with(rename("stale", &p.etag, &["name"]), &admin))
                    .await,
                Code::Aborted,
                Some(reason::ETAG_MISMATCH),
            )
        }
        .await,
    );
    report.record(
        "UpdateProduct of an unknown sku: NOT_FOUND",
        refused(
            c.clone()
                .update_product(with(
                    UpdateProductRequest {
                        product: Some(Product {
                            sku: cx.sku("missing"),
                            name: "flashsale verify".to_owned(),
                            ..Product::default()
                        }),
                        ..rename("missing", "", &["name"])
                    },
                    &admin,
                ))
                .await,
            Code::NotFound,
            None,
        ),
    );
    report.record(
        "ReserveStock before the product's sale opens: SALE_NOT_STARTED with the opening",
        async {
            let start = chrono::Utc::now().timestamp_millis() + 3_600_000;
            let opens_later = CreateProductRequest {
                sale_start: flashsale_contract::ms_to_timestamp(start),
                ..product(&later, 1)
            };
            create(&channel, &admin, opens_later).await?;
            let order_id = uuid::Uuid::new_v4().to_string();
            let early = ReserveStockRequest {
                order_id,
                user_id: cx.user_id("early"),
                sku: later.clone(),
                quantity: 1,
            };
            let status = match c.clone().reserve_stock(with(early, &service)).await {
                Ok(r) => anyhow::bail!("reserved before the opening: {:?}", r.into_inner()),
                Err(s) => s,
            };
            ensure!(
                status.code() == Code::FailedPrecondition
                    && flashsale_platform::error::reason_of(&status).as_deref()
                        == Some("SALE_NOT_STARTED"),
                "answered {status:?}"
            );
            let meta = flashsale_platform::error::info_metadata(&status);
            let opening = meta
                .get(reason::meta::SALE_START)
                .and_then(|v| flashsale_contract::parse_rfc3339_ms(v));
            ensure!(
                opening == Some(start) && meta.contains_key(reason::meta::GATE_TIME),
                "metadata {meta:?}"
            );
            anyhow::Ok(())
        }
        .await,
    );

    // GetProduct, ListProducts
    report.record(
        "GetProduct as a buyer",
        async {
            let p = answered(c.clone().get_product(with(get(&sku), &buyer)).await)?
                .product
                .context("no product in the answer")?;
            ensure!(p.sku == sku && p.gate_available == 10, "answered {p:?}");
            anyhow::Ok(())
        }
        .await,
    );
    report.record(
        "GetProduct of an unknown sku: NOT_FOUND",
        refused(
            c.clone()
                .get_product(with(get(&cx.sku("missing")), &buyer))
                .await,
            Code::NotFound,
            None,
        ),
    );
    report.record(
        "GetProduct of a malformed sku: INVALID_ARGUMENT sku",
        bad_field(
            c.clone()
                .get_product(with(get("no such sku?"), &buyer))
                .await,
            "sku",
        ),
    );
    report.record(
        "ListProducts pages through to the new product",
        async {
            let mut token = String::new();
            for _ in 0..10_000 {
                let page = answered(
                    c.clone()
                        .list_products(with(
                            ListProductsRequest {
                                page_size: 500,
                                page_token: token,
                            },
                            &buyer,
                        ))
                        .await,
                )?;
                if page.products.iter().any(|p| p.sku == sku) {
                    return Ok(());
                }
                if page.next_page_token.is_empty() {
                    break;
                }
                token = page.next_page_token;
            }
            anyhow::bail!("{sku} is on no page")
        }
        .await,
    );
    report.record(
        "ListProducts with a token it did not issue: INVALID_ARGUMENT page_token",
        bad_field(
            c.clone()
                .list_products(with(
                    ListProductsRequest {
                        page_size: 10,
                        page_token: "not-a-token".to_owned(),
                    },
                    &buyer,
                ))
                .await,
            "page_token",
        ),
    );

    // AdjustStock
    let restock = AdjustStockRequest {
        request_id: format!("{}-restock", cx.run),
        sku: sku.clone(),
        delta: 5,
        reason: "flashsale verify".to_owned(),
    };
    report.record(
        "AdjustStock as a buyer: PERMISSION_DENIED",
        denied(c.clone().adjust_stock(with(restock.clone(), &buyer)).await),
    );
    report.record(
        "AdjustStock restocks, and its retry is a replay that changes nothing",
        async {
            let first = answered(c.clone().adjust_stock(with(restock.clone(), &admin)).await)?;
            let p = first.product.context("no product in the answer")?;
            ensure!(
                !first.replayed && p.on_hand == 15 && p.available == 15,
                "answered {p:?}"
            );
            let again = answered(c.clone().adjust_stock(with(restock.clone(), &admin)).await)?;
            let p = again.product.context("no product in the answer")?;
            ensure!(
                again.replayed && p.on_hand == 15,
                "the retry answered {p:?}"
            );
            anyhow::Ok(())
        }
        .await,
    );
    report.record(
        "AdjustStock with a used request id and another delta: FAILED_PRECONDITION IDEMPOTENCY_KEY_REUSED",
        refused(
            c.clone()
                .adjust_stock(with(
                    AdjustStockRequest {
                        delta: 6,
                        ..restock.clone()
                    },
                    &admin,
                ))
                .await,
            Code::FailedPrecondition,
            Some(reason::IDEMPOTENCY_KEY_REUSED),
        ),
    );
    report.record(
        "AdjustStock writing off more than is free: FAILED_PRECONDITION INSUFFICIENT_STOCK",
        refused(
            c.clone()
                .adjust_stock(with(
                    AdjustStockRequest {
                        request_id: format!("{}-too-much", cx.run),
                        delta: -1000,
                        ..restock.clone()
                    },
                    &admin,
                ))
                .await,
            Code::FailedPrecondition,
            Some(flashsale_contract::Refusal::InsufficientStock.reason()),
        ),
    );
    report.record(
        "AdjustStock by zero: INVALID_ARGUMENT delta",
        bad_field(
            c.clone()
                .adjust_stock(with(
                    AdjustStockRequest {
                        request_id: format!("{}-zero", cx.run),
                        delta: 0,
                        ..restock.clone()
                    },
                    &admin,
                ))
                .await,
            "delta",
        ),
    );

    // ReserveStock, ReserveStockBatch, GetGateBuyers: the order service's calls
    let reserve = |sku: &str, user: &str| ReserveStockRequest {
        order_id: uuid::Uuid::new_v4().to_string(),
        user_id: cx.user_id(user),
        sku: sku.to_owned(),
        quantity: 1,
    };
    let held = reserve(&sku, "holder");
    report.record(
        "ReserveStock as a buyer: PERMISSION_DENIED",
        denied(c.clone().reserve_stock(with(held.clone(), &buyer)).await),
    );
    report.record(
        "ReserveStock holds a unit, and its retry is a replay",
        async {
            let first = answered(c.clone().reserve_stock(with(held.clone(), &service)).await)?;
            ensure!(
                first.status == ReservationStatus::Reserved as i32
                    && first.unit_price_cents == 1999
                    && !first.replayed,
                "answered {first:?}"
            );
            let again = answered(c.clone().reserve_stock(with(held.clone(), &service)).await)?;
            ensure!(again.replayed, "the retry answered {again:?}");
            anyhow::Ok(())
        }
        .await,
    );
    report.record(
        "ReserveStock of no units: INVALID_ARGUMENT quantity",
        bad_field(
            c.clone()
                .reserve_stock(with(
                    ReserveStockRequest {
                        quantity: 0,
                        ..reserve(&sku, "holder")
                    },
                    &service,
                ))
                .await,
            "quantity",
        ),
    );
    report.record(
        "ReserveStock of an unknown sku: NOT_FOUND",
        refused(
            c.clone()
                .reserve_stock(with(reserve(&cx.sku("missing"), "holder"), &service))
                .await,
            Code::NotFound,
            None,
        ),
    );
    report.record(
        "ReserveStock past the last unit: FAILED_PRECONDITION SOLD_OUT",
        async {
            answered(
                c.clone()
                    .reserve_stock(with(reserve(&one_left, "first"), &service))
                    .await,
            )?;
            refused(
                c.clone()
                    .reserve_stock(with(reserve(&one_left, "second"), &service))
                    .await,
                Code::FailedPrecondition,
                Some(flashsale_contract::Refusal::SoldOut.reason()),
            )
        }
        .await,
    );
    report.record(
        "ReserveStockBatch answers each item: one held, one bad",
        async {
            let batch = ReserveStockBatchRequest {
                items: vec![
                    reserve(&sku, "batch"),
                    ReserveStockRequest {
                        quantity: 0,
                        ..reserve(&sku, "batch-bad")
                    },
                ],
            };
            let answer = answered(c.clone().reserve_stock_batch(with(batch, &service)).await)?;
            let codes: Vec<i32> = answer.outcomes.iter().map(|o| o.code).collect();
            ensure!(
                codes == [Code::Ok as i32, Code::InvalidArgument as i32],
                "answered {answer:?}"
            );
            anyhow::Ok(())
        }
        .await,
    );
    report.record(
        "GetGateBuyers names the buyers holding units",
        async {
            let answer = answered(
                c.clone()
                    .get_gate_buyers(with(
                        GetGateBuyersRequest {
                            sku: sku.clone(),
                            max_buyers: 1000,
                            known_refills: String::new(),
                        },
                        &service,
                    ))
                    .await,
            )?;
            ensure!(
                answer.complete && answer.user_ids.contains(&cx.user_id("holder")),
                "answered {answer:?}"
            );
            anyhow::Ok(())
        }
        .await,
    );
    report.record(
        "GetGateBuyers as a buyer: PERMISSION_DENIED",
        denied(
            c.clone()
                .get_gate_buyers(with(
                    GetGateBuyersRequest {
                        sku: sku.clone(),
                        max_buyers: 1,
                        ..Default::default()
                    },
                    &buyer,
                ))
                .await,
        ),
    );

    // CommitReservation: outbound's call, on an order the order service placed
    let unknown = uuid::Uuid::new_v4().to_string();
    report.record(
        "CommitReservation of an order with no reservation: NOT_FOUND",
        refused(
            c.clone()
                .commit_reservation(with(
                    CommitReservationRequest { order_id: unknown },
                    &service,
                ))
                .await,
            Code::NotFound,
            None,
        ),
    );
    report.record(
        "CommitReservation of a malformed order id: INVALID_ARGUMENT order_id",
        bad_field(
            c.clone()
                .commit_reservation(with(
                    CommitReservationRequest {
                        order_id: "not-a-uuid".to_owned(),
                    },
                    &service,
                ))
                .await,
            "order_id",
        ),
    );
    match cx.channel(&cx.order_url).await {
        Err(e) => report.not_made(
            "CommitReservation of a reserved order, and its retry",
            &format!("the order service, which places the order, is out of reach: {e:#}"),
        ),
        Ok(orders) => report.record(
            "CommitReservation of a reserved order, and its retry",
            commit_a_reserved_order(cx, &channel, orders, &sku).await,
        ),
    }

    // ReconcileStock, and the admin APIs
    report.record(
        "ReconcileStock reports the run's products, with no drift",
        async {
            let answer = answered(
                c.clone()
                    .reconcile_stock(with(
                        ReconcileStockRequest {
                            skus: vec![one_left.clone()],
                            repair: false,
                        },
                        &admin,
                    ))
                    .await,
            )?;
            ensure!(
                answer.reports.len() == 1 && answer.reports[0].drift == 0,
                "answered {answer:?}"
            );
            anyhow::Ok(())
        }
        .await,
    );
    report.record(
        "ReconcileStock as a service: PERMISSION_DENIED",
        denied(
            c.clone()
                .reconcile_stock(with(ReconcileStockRequest::default(), &service))
                .await,
        ),
    );
    admin_apis(cx, report, &channel).await?;

    write_off(cx, &channel, &[sku, one_left, later], Settle::Database).await
}

/// Places an order for one unit of `sku` through the order service, waits until product-stock
/// reserved it, commits the reservation as outbound does, retries the commit, then cancels the
/// order (product-stock puts the committed unit back).
async fn commit_a_reserved_order(
    cx: &Ctx,
    channel: &Channel,
    orders: Channel,
    sku: &str,
) -> anyhow::Result<()> {
    let buyer = cx.user("committer")?;
    let order = super::order::place_and_confirm(cx, &orders, &buyer, sku).await?;
    let mut c = ProductStockServiceClient::new(channel.clone());
    let commit = CommitReservationRequest {
        order_id: order.order_id.clone(),
    };
    let first = answered(
        c.commit_reservation(with(commit.clone(), &cx.service()?))
            .await,
    )?;
    ensure!(
        first.sku == sku && first.quantity == 1 && !first.replayed,
        "answered {first:?}"
    );
    let again = answered(c.commit_reservation(with(commit, &cx.service()?)).await)?;
    ensure!(again.replayed, "the retry answered {again:?}");
    answered(
        OrderServiceClient::new(orders)
            .cancel_order(with(
                CancelOrderRequest {
                    order_id: order.order_id,
                },
                &buyer,
            ))
            .await,
    )?;
    Ok(())
}

/// The admin APIs every service serves: parked messages and an order's timeline.
pub(super) async fn admin_apis(
    cx: &Ctx,
    report: &mut Report,
    channel: &Channel,
) -> anyhow::Result<()> {
    let (admin, buyer) = (cx.admin()?, cx.user("buyer")?);
    let dlq = DeadLetterServiceClient::new(channel.clone());
    report.record(
        "ListDeadLetters",
        answered(
            dlq.clone()
                .list_dead_letters(with(
                    ListDeadLettersRequest {
                        page_size: 1,
                        ..Default::default()
                    },
                    &admin,
                ))
                .await,
        )
        .map(drop),
    );
    report.record(
        "ListDeadLetters as a buyer: PERMISSION_DENIED",
        denied(
            dlq.clone()
                .list_dead_letters(with(ListDeadLettersRequest::default(), &buyer))
                .await,
        ),
    );
    let timeline = OrderTimelineServiceClient::new(channel.clone());
    report.record(
        "GetOrderTimeline of a malformed order id: INVALID_ARGUMENT order_id",
        bad_field(
            timeline
                .clone()
                .get_order_timeline(with(
                    GetOrderTimelineRequest {
                        order_id: "not-a-uuid".to_owned(),
                    },
                    &admin,
                ))
                .await,
            "order_id",
        ),
    );
    report.record(
        "GetOrderTimeline as a buyer: PERMISSION_DENIED",
        denied(
            timeline
                .clone()
                .get_order_timeline(with(
                    GetOrderTimelineRequest {
                        order_id: uuid::Uuid::new_v4().to_string(),
                    },
                    &buyer,
                ))
                .await,
        ),
    );
    Ok(())
}
