//! The order service's contract: `OrderService` as a buyer, an admin and a service,
//! `PaymentNotificationService`'s refusal of an unsigned notification, and the admin APIs.
//! Its products are created in product-stock.

use anyhow::{Context as _, bail, ensure};
use flashsale_contract::{Refusal, reason};
use flashsale_proto::{
    admin::v1::{
        GetOrderTimelineRequest, order_timeline_service_client::OrderTimelineServiceClient,
    },
    order::v1::{
        CancelOrderRequest, CreateOrderRequest, GetOrderRequest, ListOrdersRequest,
        ListPendingOrdersRequest, ListRefundsRequest, ListStuckOrdersRequest, LookupOrdersRequest,
        NotifyPaymentRequest, Order, OrderStatus, PayOrderRequest, RetryRefundRequest,
        WatchOrderRequest, order_service_client::OrderServiceClient,
        payment_notification_service_client::PaymentNotificationServiceClient,
    },
    payment::v1::{
        PayCheckoutRequest, payment_provider_service_client::PaymentProviderServiceClient,
    },
    product::v1::CreateProductRequest,
};
use tonic::{Code, transport::Channel};

use super::{
    Ctx, Report, answered, bad_field, denied, eventually, product_stock, refused, serving, with,
};

const SERVICE: &str = "flashsale.order.v1.OrderService";

/// Places an order for one unit of `sku` as `buyer` and waits until it is AWAITING_PAYMENT
/// (product-stock reserved its unit).
pub(super) async fn place_and_confirm(
    cx: &Ctx,
    orders: &Channel,
    buyer: &str,
    sku: &str,
) -> anyhow::Result<Order> {
    let create = CreateOrderRequest {
        request_id: uuid::Uuid::new_v4().to_string(),
        sku: sku.to_owned(),
        quantity: 1,
    };
    let order = answered(
        OrderServiceClient::new(orders.clone())
            .create_order(with(create, buyer))
            .await,
    )?
    .order
    .context("no order in the answer")?;
    wait_for(
        cx,
        orders,
        buyer,
        &order.order_id,
        OrderStatus::AwaitingPayment,
    )
    .await
}

/// Waits until the order is `status` (and fails at once if it ends otherwise).
pub(super) async fn wait_for(
    cx: &Ctx,
    orders: &Channel,
    token: &str,
    order_id: &str,
    status: OrderStatus,
) -> anyhow::Result<Order> {
    eventually(cx, &format!("order {order_id} {status:?}"), || async {
        let order = answered(
            OrderServiceClient::new(orders.clone())
                .get_order(with(
                    GetOrderRequest {
                        order_id: order_id.to_owned(),
                    },
                    token,
                ))
                .await,
        )?
        .order
        .context("no order in the answer")?;
        let now = order.status();
        if now == status {
            return Ok(Some(order));
        }
        let terminal = [OrderStatus::Cancelled, OrderStatus::Shipped];
        if terminal.contains(&now) {
            bail!("order {order_id} ended {now:?} while waiting for {status:?}");
        }
        Ok(None)
    })
    .await
}

/// Pays `order` at the simulator's checkout page: PayOrder, then PayCheckout.
pub(super) async fn pay(
    orders: &Channel,
    sim: &Channel,
    buyer: &str,
    order: &Order,
) -> anyhow::Result<()> {
    let started = answered(
        OrderServiceClient::new(orders.clone())
            .pay_order(with(
                PayOrderRequest {
                    order_id: order.order_id.clone(),
                    ..Default::default()
                },
                buyer,
            ))
            .await,
    )?;
    let checkout = started.checkout.context("no checkout in the answer")?;
    answered(
        PaymentProviderServiceClient::new(sim.clone())
            .pay_checkout(PayCheckoutRequest {
                payment_id: checkout.provider_payment_id,
            })
            .await,
    )?;
    Ok(())
}

pub(super) async fn run(cx: &Ctx, url: &str, report: &mut Report) -> anyhow::Result<()> {
    let channel = cx.channel(url).await?;
    serving(
        report,
        &channel,
        &[SERVICE, "flashsale.order.v1.PaymentNotificationService"],
    )
    .await;
    let stock = cx
        .channel(&cx.product_stock_url)
        .await
        .context("product-stock, where the suite creates its products")?;
    let (admin, service) = (cx.admin()?, cx.service()?);
    let (alice, bob, carol) = (cx.user("alice")?, cx.user("bob")?, cx.user("carol")?);
    let (sku, limited, one_left) = (cx.sku("order"), cx.sku("limited"), cx.sku("one-left"));
    product_stock::create(&stock, &admin, product_stock::product(&sku, 10)).await?;
    product_stock::create(
        &stock,
        &admin,
        CreateProductRequest {
            per_user_limit: 1,
            ..product_stock::product(&limited, 10)
        },
    )
    .await?;
    product_stock::create(&stock, &admin, product_stock::product(&one_left, 1)).await?;
    let c = OrderServiceClient::new(channel.clone());
    let create = |request_id: &str, sku: &str| CreateOrderRequest {
        request_id: format!("{}-{request_id}", cx.run),
        sku: sku.to_owned(),
        quantity: 1,
    };

    // CreateOrder
    report.record(
        "CreateOrder without a token: UNAUTHENTICATED",
        refused(
            c.clone().create_order(create("a", &sku)).await,
            Code::Unauthenticated,
            None,
        ),
    );
    report.record(
        "CreateOrder as an admin: PERMISSION_DENIED",
        denied(
            c.clone()
                .create_order(with(create("a", &sku), &admin))
                .await,
        ),
    );
    report.record(
        "CreateOrder of no units: INVALID_ARGUMENT quantity",
        bad_field(
            c.clone()
                .create_order(with(
                    CreateOrderRequest {
                        quantity: 0,
                        ..create("a", &sku)
                    },
                    &alice,
                ))
                .await,
            "quantity",
        ),
    );
    report.record(
        "CreateOrder without a request id: INVALID_ARGUMENT request_id",
        bad_field(
            c.clone()
                .create_order(with(
                    CreateOrderRequest {
                        request_id: String::new(),
                        ..create("a", &sku)
                    },
                    &alice,
                ))
                .await,
            "request_id",
        ),
    );
    report.record(
        "CreateOrder of an unknown sku: NOT_FOUND",
        refused(
            c.clone()
                .create_order(with(create("a", &cx.sku("missing")), &alice))
                .await,
            Code::NotFound,
            None,
        ),
    );
    let mut placed: Option<Order> = None;
    report.record(
        "CreateOrder, and its retry is a replay of the same order",
        async {
            let first = answered(
                c.clone()
                    .create_order(with(create("a", &sku), &alice))
                    .await,
            )?;
            let order = first.order.context("no order in the answer")?;
            ensure!(
                !first.replayed
                    && order.sku == sku
                    && order.quantity == 1
                    && order.unit_price_cents == 1999
                    && order.user_id == cx.user_id("alice"),
                "answered {order:?}"
            );
            let again = answered(
                c.clone()
                    .create_order(with(create("a", &sku), &alice))
                    .await,
            )?;
            let same = again.order.context("no order in the retry's answer")?;
            ensure!(
                again.replayed && same.order_id == order.order_id,
                "the retry answered {same:?}"
            );
            placed = Some(order);
            anyhow::Ok(())
        }
        .await,
    );
    report.record(
        "CreateOrder with a used request id and another quantity: FAILED_PRECONDITION IDEMPOTENCY_KEY_REUSED",
        refused(
            c.clone()
                .create_order(with(
                    CreateOrderRequest {
                        quantity: 2,
                        ..create("a", &sku)
                    },
                    &alice,
                ))
                .await,
            Code::FailedPrecondition,
            Some(reason::IDEMPOTENCY_KEY_REUSED),
        ),
    );
    let mut limited_order: Option<Order> = None;
    report.record(
        "CreateOrder past the per-user limit: FAILED_PRECONDITION USER_LIMIT_EXCEEDED",
        async {
            let first = answered(
                c.clone()
                    .create_order(with(create("limit-1", &limited), &alice))
                    .await,
            )?;
            limited_order = first.order;
            refused(
                c.clone()
                    .create_order(with(create("limit-2", &limited), &alice))
                    .await,
                Code::FailedPrecondition,
                Some(Refusal::UserLimitExceeded.reason()),
            )
        }
        .await,
    );
    let mut last_unit: Option<Order> = None;
    report.record(
        "CreateOrder past the last unit: FAILED_PRECONDITION SOLD_OUT",
        async {
            let first = answered(
                c.clone()
                    .create_order(with(create("last", &one_left), &bob))
                    .await,
            )?;
            last_unit = first.order;
            refused(
                c.clone()
                    .create_order(with(create("too-late", &one_left), &carol))
                    .await,
                Code::FailedPrecondition,
                Some(Refusal::SoldOut.reason()),
            )
        }
        .await,
    );
    let Some(order) = placed else {
        bail!("no order was placed: the rest of the suite needs one");
    };
    let get = |order_id: &str| GetOrderRequest {
        order_id: order_id.to_owned(),
    };

    // GetOrder, ListOrders, WatchOrder
    report.record(
        "GetOrder of one's own order, and as an admin",
        async {
            for token in [&alice, &admin] {
                let got = answered(c.clone().get_order(with(get(&order.order_id), token)).await)?
                    .order
                    .context("no order in the answer")?;
                ensure!(got.order_id == order.order_id, "answered {got:?}");
            }
            anyhow::Ok(())
        }
        .await,
    );
    report.record(
        "GetOrder of another buyer's order: NOT_FOUND",
        refused(
            c.clone().get_order(with(get(&order.order_id), &bob)).await,
            Code::NotFound,
            None,
        ),
    );
    report.record(
        "GetOrder of a malformed id: INVALID_ARGUMENT order_id",
        bad_field(
            c.clone().get_order(with(get("not-a-uuid"), &alice)).await,
            "order_id",
        ),
    );
    report.record(
        "ListOrders lists one's own orders",
        async {
            let page = answered(
                c.clone()
                    .list_orders(with(ListOrdersRequest::default(), &alice))
                    .await,
            )?;
            ensure!(
                page.orders.iter().any(|o| o.order_id == order.order_id)
                    && page.orders.iter().all(|o| o.user_id == cx.user_id("alice")),
                "answered {page:?}"
            );
            anyhow::Ok(())
        }
        .await,
    );
    report.record(
        "ListOrders of another buyer's orders: PERMISSION_DENIED",
        denied(
            c.clone()
                .list_orders(with(
                    ListOrdersRequest {
                        user_id: cx.user_id("alice"),
                        ..Default::default()
                    },
                    &bob,
                ))
                .await,
        ),
    );
    report.record(
        "WatchOrder streams the order until it awaits payment",
        async {
            let mut stream = answered(
                c.clone()
                    .watch_order(with(
                        WatchOrderRequest {
                            order_id: order.order_id.clone(),
                        },
                        &alice,
                    ))
                    .await,
            )?;
            let awaiting = tokio::time::timeout(cx.saga_timeout, async {
                while let Some(msg) = stream.message().await? {
                    let o = msg.order.context("no order in a message")?;
                    ensure!(o.order_id == order.order_id, "streamed {o:?}");
                    if o.status() == OrderStatus::AwaitingPayment {
                        return anyhow::Ok(());
                    }
                }
                bail!("the stream ended before the order awaited payment")
            });
            awaiting
                .await
                .with_context(|| format!("not within {:?}", cx.saga_timeout))?
        }
        .await,
    );
    report.record(
        "WatchOrder of an unknown order: NOT_FOUND",
        refused(
            c.clone()
                .watch_order(with(
                    WatchOrderRequest {
                        order_id: uuid::Uuid::new_v4().to_string(),
                    },
                    &alice,
                ))
                .await,
            Code::NotFound,
            None,
        ),
    );

    // PayOrder
    let pay_req = |order_id: &str| PayOrderRequest {
        order_id: order_id.to_owned(),
        ..Default::default()
    };
    report.record(
        "PayOrder with an amount other than the total: INVALID_ARGUMENT amount_cents",
        bad_field(
            c.clone()
                .pay_order(with(
                    PayOrderRequest {
                        amount_cents: 1,
                        ..pay_req(&order.order_id)
                    },
                    &alice,
                ))
                .await,
            "amount_cents",
        ),
    );
    report.record(
        "PayOrder of another buyer's order: NOT_FOUND",
        refused(
            c.clone()
                .pay_order(with(pay_req(&order.order_id), &bob))
                .await,
            Code::NotFound,
            None,
        ),
    );
    report.record(
        "PayOrder starts the payment, and its retry is a replay of the same checkout",
        async {
            wait_for(
                cx,
                &channel,
                &alice,
                &order.order_id,
                OrderStatus::AwaitingPayment,
            )
            .await?;
            let first = answered(
                c.clone()
                    .pay_order(with(pay_req(&order.order_id), &alice))
                    .await,
            )?;
            let checkout = first.checkout.context("no checkout in the answer")?;
            ensure!(
                !first.replayed
                    && checkout.amount_cents == 1999
                    && !checkout.provider_payment_id.is_empty(),
                "answered {checkout:?}"
            );
            let again = answered(
                c.clone()
                    .pay_order(with(pay_req(&order.order_id), &alice))
                    .await,
            )?;
            let same = again
                .checkout
                .context("no checkout in the retry's answer")?;
            ensure!(
                again.replayed && same.provider_payment_id == checkout.provider_payment_id,
                "the retry answered {same:?}"
            );
            anyhow::Ok(())
        }
        .await,
    );
    let paid = match &cx.payment_sim_url {
        None => {
            report.not_made(
                "a paid order is PAID, and cannot be cancelled: FAILED_PRECONDITION ORDER_NOT_CANCELLABLE",
                "no --payment-sim-url: the suite cannot pay",
            );
            false
        }
        Some(sim_url) => {
            let outcome = async {
                let sim = cx.channel(sim_url).await?;
                pay(&channel, &sim, &alice, &order).await?;
                eventually(cx, "the order paid", || async {
                    let now = answered(
                        c.clone()
                            .get_order(with(get(&order.order_id), &alice))
                            .await,
                    )?
                    .order
                    .context("no order in the answer")?
                    .status();
                    Ok([OrderStatus::Paid, OrderStatus::Shipped]
                        .contains(&now)
                        .then_some(()))
                })
                .await?;
                refused(
                    c.clone()
                        .cancel_order(with(
                            CancelOrderRequest {
                                order_id: order.order_id.clone(),
                            },
                            &alice,
                        ))
                        .await,
                    Code::FailedPrecondition,
                    Some(reason::ORDER_NOT_CANCELLABLE),
                )
            }
            .await;
            let paid = outcome.is_ok();
            report.record(
                "a paid order is PAID, and cannot be cancelled: FAILED_PRECONDITION ORDER_NOT_CANCELLABLE",
                outcome,
            );
            paid
        }
    };

    // CancelOrder
    let cancel = |order_id: &str| CancelOrderRequest {
        order_id: order_id.to_owned(),
    };
    match &limited_order {
        None => report.not_made(
            "CancelOrder, its retry, and PayOrder of the cancelled order",
            "no order of the limited product was placed",
        ),
        Some(o) => report.record(
            "CancelOrder, its retry, and PayOrder of the cancelled order: FAILED_PRECONDITION ORDER_NOT_PAYABLE",
            async {
                for _ in 0..2 {
                    let done = answered(c.clone().cancel_order(with(cancel(&o.order_id), &alice)).await)?
                        .order
                        .context("no order in the answer")?;
                    ensure!(done.status() == OrderStatus::Cancelled, "answered {done:?}");
                }
                refused(
                    c.clone()
                        .pay_order(with(pay_req(&o.order_id), &alice))
                        .await,
                    Code::FailedPrecondition,
                    Some(reason::ORDER_NOT_PAYABLE),
                )
            }
            .await,
        ),
    }
    report.record(
        "CancelOrder of an unknown order: NOT_FOUND",
        refused(
            c.clone()
                .cancel_order(with(cancel(&uuid::Uuid::new_v4().to_string()), &alice))
                .await,
            Code::NotFound,
            None,
        ),
    );

    // The service-only and admin rpcs
    report.record(
        "LookupOrders finds the order",
        async {
            let found = answered(
                c.clone()
                    .lookup_orders(with(
                        LookupOrdersRequest {
                            order_ids: vec![order.order_id.clone()],
                        },
                        &service,
                    ))
                    .await,
            )?;
            ensure!(
                found.orders.len() == 1 && found.orders[0].order_id == order.order_id,
                "answered {found:?}"
            );
            anyhow::Ok(())
        }
        .await,
    );
    report.record(
        "LookupOrders as a buyer: PERMISSION_DENIED",
        denied(
            c.clone()
                .lookup_orders(with(LookupOrdersRequest::default(), &alice))
                .await,
        ),
    );
    report.record(
        "LookupOrders of a malformed id: INVALID_ARGUMENT order_ids[0]",
        bad_field(
            c.clone()
                .lookup_orders(with(
                    LookupOrdersRequest {
                        order_ids: vec!["not-a-uuid".to_owned()],
                    },
                    &service,
                ))
                .await,
            "order_ids[0]",
        ),
    );
    report.record(
        "ListPendingOrders of the run's product",
        answered(
            c.clone()
                .list_pending_orders(with(
                    ListPendingOrdersRequest {
                        sku: sku.clone(),
                        ..Default::default()
                    },
                    &service,
                ))
                .await,
        )
        .map(drop),
    );
    report.record(
        "ListPendingOrders of a malformed sku: INVALID_ARGUMENT sku",
        bad_field(
            c.clone()
                .list_pending_orders(with(
                    ListPendingOrdersRequest {
                        sku: "no such sku?".to_owned(),
                        ..Default::default()
                    },
                    &service,
                ))
                .await,
            "sku",
        ),
    );
    report.record(
        "ListStuckOrders",
        answered(
            c.clone()
                .list_stuck_orders(with(ListStuckOrdersRequest::default(), &admin))
                .await,
        )
        .map(drop),
    );
    report.record(
        "ListStuckOrders as a buyer: PERMISSION_DENIED",
        denied(
            c.clone()
                .list_stuck_orders(with(ListStuckOrdersRequest::default(), &alice))
                .await,
        ),
    );
    report.record(
        "ListRefunds",
        answered(
            c.clone()
                .list_refunds(with(ListRefundsRequest::default(), &admin))
                .await,
        )
        .map(drop),
    );
    report.record(
        "RetryRefund of an order with no refund: NOT_FOUND",
        refused(
            c.clone()
                .retry_refund(with(
                    RetryRefundRequest {
                        order_id: order.order_id.clone(),
                    },
                    &admin,
                ))
                .await,
            Code::NotFound,
            None,
        ),
    );
    report.record(
        "GetOrderTimeline of the order names its trace and its steps",
        async {
            let timeline = answered(
                OrderTimelineServiceClient::new(channel.clone())
                    .get_order_timeline(with(
                        GetOrderTimelineRequest {
                            order_id: order.order_id.clone(),
                        },
                        &admin,
                    ))
                    .await,
            )?;
            ensure!(
                timeline.service == "order" && timeline.entries.len() >= 2,
                "answered {timeline:?}"
            );
            anyhow::Ok(())
        }
        .await,
    );
    product_stock::admin_apis(cx, report, &channel).await?;
    report.record(
        "NotifyPayment with a bad signature: UNAUTHENTICATED",
        refused(
            PaymentNotificationServiceClient::new(channel.clone())
                .notify_payment(NotifyPaymentRequest {
                    payload: b"{}".to_vec(),
                    signature: "not-a-signature".to_owned(),
                    timestamp: chrono::Utc::now().timestamp(),
                })
                .await,
            Code::Unauthenticated,
            None,
        ),
    );

    // Clean up: what is still open is cancelled, what is left is written off.
    let mut open = vec![(alice.clone(), limited_order), (bob.clone(), last_unit)];
    if !paid {
        open.push((alice.clone(), Some(order)));
    }
    for (token, o) in open {
        if let Some(o) = o {
            let _ = c
                .clone()
                .cancel_order(with(cancel(&o.order_id), &token))
                .await;
        }
    }
    product_stock::write_off(
        cx,
        &stock,
        &[sku, limited, one_left],
        product_stock::Settle::Gate,
    )
    .await
}
