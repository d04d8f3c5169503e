//! The whole saga across the three services and the payment provider simulator as separate
//! processes: 1,000 buyers for 100 units; 70% of the winners pay through the provider, 20% never
//! pay, 10% pay at the provider after the deadline; the warehouse fails 5% of shipments, and the
//! provider delivers its notifications late, twice, out of order and after lost deliveries. At
//! quiescence every order is SHIPPED or CANCELLED, shipped + available = initial stock, every
//! failed shipment and late payment has exactly one refund, paid back by the provider, and the
//! gate agrees with the database.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod metrics;
mod traces;

use std::time::Duration;

use flashsale_e2e::Stack;
use flashsale_platform::auth::Role;
use flashsale_proto::{
    order::v1::{
        CancelReason, CreateOrderRequest, GetOrderRequest, ListOrdersRequest, Order, OrderStatus,
        PayOrderRequest, RefundStatus, order_service_client::OrderServiceClient,
    },
    outbound::v1::{
        ListShipmentsRequest, ShipmentStatus, outbound_service_client::OutboundServiceClient,
    },
    payment::v1::{
        PayCheckoutRequest, payment_provider_service_client::PaymentProviderServiceClient,
    },
    product::v1::{
        CreateProductRequest, DeductionPolicy, GetProductRequest, ReconcileStockRequest,
        product_stock_service_client::ProductStockServiceClient,
    },
};
use flashsale_test_support::{
    eventually,
    grpc::{token, with_token},
};
use tonic::transport::Channel;

/// Long enough that a payment made at once is notified before it on a loaded machine (the
/// simulator delays and reorders its notifications), short enough for the late payers to wait out.
const PAYMENT_TIMEOUT_MS: i64 = 8_000;

async fn connect(url: String) -> Channel {
    Channel::from_shared(url).unwrap().connect().await.unwrap()
}

fn admin<T>(m: T) -> tonic::Request<T> {
    with_token(m, &token("root", Role::Admin))
}

fn user<T>(u: &str, m: T) -> tonic::Request<T> {
    with_token(m, &token(u, Role::User))
}

struct Outcome {
    winners: usize,
    paid: usize,
    late: usize,
}

async fn run_sale(
    stack: &Stack,
    sku: &str,
    policy: DeductionPolicy,
    buyers: usize,
    stock: i64,
) -> Outcome {
    let mut ps = ProductStockServiceClient::new(connect(stack.product_stock.url()).await);
    let orders = OrderServiceClient::new(connect(stack.order.url()).await);
    let create = CreateProductRequest {
        sku: sku.into(),
        name: "e2e".into(),
        price_cents: 1000,
        initial_stock: stock,
        per_user_limit: 1,
        deduction_policy: policy as i32,
        stock_buckets: 0,
        ..Default::default()
    };
    ps.create_product(admin(create)).await.unwrap();

    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..buyers {
        let mut c = orders.clone();
        let sku = sku.to_owned();
        tasks.spawn(async move {
            let req = CreateOrderRequest {
                request_id: format!("r{i}"),
                sku,
                quantity: 1,
            };
            c.create_order(user(&format!("buyer{i}"), req))
                .await
                .map(|r| r.into_inner().order.unwrap())
        });
    }
    let mut winners: Vec<Order> = Vec::new();
    let mut refusals = std::collections::BTreeMap::<String, usize>::new();
    while let Some(r) = tasks.join_next().await {
        match r.unwrap() {
            Ok(o) => winners.push(o),
            Err(s) => {
                let why = flashsale_platform::error::reason_of(&s)
                    .unwrap_or_else(|| format!("{:?}", s.code()));
                *refusals.entry(why).or_default() += 1;
            }
        }
    }
    assert_eq!(
        winners.len() as i64,
        stock,
        "every unit sold once, no more; refusals {refusals:?}"
    );
    // Wait until every winner awaits payment.
    for o in &winners {
        let c = orders.clone();
        eventually(Duration::from_secs(60), "awaiting payment", || {
            let mut c = c.clone();
            let (u, id) = (o.user_id.clone(), o.order_id.clone());
            async move {
                let o = c
                    .get_order(user(&u, GetOrderRequest { order_id: id }))
                    .await
                    .ok()?
                    .into_inner()
                    .order?;
                (o.status == OrderStatus::AwaitingPayment as i32).then_some(())
            }
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", stack.logs()));
    }
    // 70% pay now, 20% never, 10% after their deadline: each payer starts the payment
    // (PayOrder) and pays on the provider's checkout; only the provider's notification pays.
    let sim = PaymentProviderServiceClient::new(connect(stack.payment_sim.url()).await);
    let n = winners.len();
    let (pay_now, late_from) = (n * 7 / 10, n * 9 / 10);
    let mut tasks = tokio::task::JoinSet::new();
    for (i, o) in winners.iter().enumerate() {
        if (pay_now..late_from).contains(&i) {
            continue;
        }
        let (mut c, mut sim) = (orders.clone(), sim.clone());
        let late = i >= late_from;
        let o = o.clone();
        tasks.spawn(async move {
            let start = PayOrderRequest {
                order_id: o.order_id.clone(),
                ..Default::default()
            };
            let started = match c.pay_order(user(&o.user_id, start)).await {
                Ok(r) => r.into_inner(),
                Err(s) => return (late, Err(Some(s.code()))),
            };
            assert_eq!(
                started.order.unwrap().status,
                OrderStatus::AwaitingPayment as i32,
                "starting a payment pays nothing"
            );
            if late {
                // Past the deadline and the sweeper's period: the order is cancelled by then.
                tokio::time::sleep(Duration::from_millis(PAYMENT_TIMEOUT_MS as u64 + 2_500)).await;
            }
            let checkout = PayCheckoutRequest {
                payment_id: started.checkout.unwrap().provider_payment_id,
            };
            (
                late,
                sim.pay_checkout(checkout)
                    .await
                    .map(drop)
                    .map_err(|s| Some(s.code())),
            )
        });
    }
    let (mut paid, mut late) = (0, 0);
    while let Some(r) = tasks.join_next().await {
        match r.unwrap() {
            (false, Ok(())) => paid += 1,
            (true, Ok(())) => late += 1,
            other => panic!("unexpected payment outcome {other:?}"),
        }
    }
    Outcome {
        winners: n,
        paid,
        late,
    }
}

async fn all_orders(stack: &Stack) -> Vec<Order> {
    let mut c = OrderServiceClient::new(connect(stack.order.url()).await);
    let (mut all, mut token) = (Vec::new(), String::new());
    loop {
        let req = ListOrdersRequest {
            page_size: 500,
            page_token: token,
            ..Default::default()
        };
        let page = c.list_orders(admin(req)).await.unwrap().into_inner();
        all.extend(page.orders);
        if page.next_page_token.is_empty() {
            return all;
        }
        token = page.next_page_token;
    }
}

async fn check_quiescence(stack: &Stack, sku: &str, stock: i64, outcome: &Outcome) {
    let terminal = eventually(Duration::from_secs(60), "every order terminal", || async {
        let all = all_orders(stack).await;
        all.iter()
            .all(|o| {
                o.status == OrderStatus::Shipped as i32 || o.status == OrderStatus::Cancelled as i32
            })
            .then_some(all)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", stack.logs()));
    assert_eq!(terminal.len(), outcome.winners);
    let by = |f: &dyn Fn(&Order) -> bool| terminal.iter().filter(|o| f(o)).count();
    let shipped = by(&|o| o.status == OrderStatus::Shipped as i32);
    let failed = by(&|o| o.cancel_reason == CancelReason::OutboundFailed as i32);
    let timed_out = by(&|o| o.cancel_reason == CancelReason::PaymentTimeout as i32);
    assert_eq!(
        shipped + failed,
        outcome.paid,
        "every paid order shipped or failed"
    );
    assert_eq!(
        timed_out,
        outcome.winners - outcome.paid,
        "unpaid and late orders timed out"
    );
    // A late payment's refund follows the provider's notification, which may arrive after its
    // order was cancelled; every refund is then paid back by the provider (the refund worker).
    let expected = failed + outcome.late;
    let counts = |all: &[Order]| {
        let refunded: Vec<&Order> = all
            .iter()
            .filter(|o| o.refund_status != RefundStatus::None as i32)
            .collect();
        let paid_back = refunded
            .iter()
            .filter(|o| o.refund_status == RefundStatus::Completed as i32)
            .count();
        let whole = refunded.iter().all(|o| o.refund_cents == o.total_cents);
        (refunded.len(), paid_back, whole)
    };
    let settled = eventually(
        Duration::from_secs(60),
        "every refund paid back",
        || async {
            let c = counts(&all_orders(stack).await);
            (c == (expected, expected, true)).then_some(c)
        },
    )
    .await;
    if settled.is_err() {
        let (refunded, paid_back, whole) = counts(&all_orders(stack).await);
        panic!(
            "one refund per failed shipment and late payment ({failed} + {}), each of the whole \
             total and paid back: {refunded} refunds, {paid_back} paid back, whole {whole}\n{}",
            outcome.late,
            stack.logs()
        );
    }

    let mut out = OutboundServiceClient::new(connect(stack.outbound.url()).await);
    let req = ListShipmentsRequest {
        status: ShipmentStatus::Failed as i32,
        page_size: 500,
        page_token: String::new(),
        older_than_ms: 0,
    };
    let failed_shipments = out
        .list_shipments(admin(req))
        .await
        .unwrap()
        .into_inner()
        .shipments
        .len();
    assert_eq!(failed_shipments, failed);

    // Stock conservation and gate = database, once product-stock has applied every release.
    let mut ps = ProductStockServiceClient::new(connect(stack.product_stock.url()).await);
    let settled = eventually(Duration::from_secs(30), "stock settled", || {
        let mut ps = ps.clone();
        async move {
            let p = ps
                .get_product(admin(GetProductRequest { sku: sku.into() }))
                .await
                .ok()?
                .into_inner()
                .product?;
            (p.reserved == 0 && p.available + shipped as i64 == stock).then_some(p)
        }
    })
    .await;
    let p = settled.unwrap_or_else(|e| panic!("{e}\n{}", stack.logs()));
    assert_eq!(p.gate_available, p.available, "gate equals the database");
    let drift = ps
        .reconcile_stock(admin(ReconcileStockRequest {
            skus: vec![sku.into()],
            repair: false,
        }))
        .await;
    assert_eq!(drift.unwrap().into_inner().reports[0].drift, 0);
    println!(
        "{sku}: {} winners, {shipped} shipped, {failed} failed shipments, {} late payments refunded, {timed_out} timed out",
        outcome.winners, outcome.late
    );
}

fn env() -> Vec<(&'static str, String)> {
    vec![
        (
            "FLASHSALE_ORDER__SAGA__PAYMENT_TIMEOUT_MS",
            PAYMENT_TIMEOUT_MS.to_string(),
        ),
        ("FLASHSALE_ORDER__SAGA__SWEEP_INTERVAL_MS", "500".into()),
        (
            "FLASHSALE_OUTBOUND__WAREHOUSE__FAIL_FRACTION",
            "0.05".into(),
        ),
        (
            "FLASHSALE_OUTBOUND__WAREHOUSE__FAIL_SKUS",
            "FAILING-SKU".into(),
        ),
        (
            "FLASHSALE_OUTBOUND__SHIPPING__SWEEP_INTERVAL_MS",
            "500".into(),
        ),
        (
            "FLASHSALE_ORDER__PAYMENT__REFUND_RETRY_BASE_MS",
            "100".into(),
        ),
        (
            "FLASHSALE_ORDER__PAYMENT__REFUND_SWEEP_INTERVAL_MS",
            "200".into(),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_buyers_for_a_hundred_units_end_shipped_or_refunded() {
    let env = env();
    let extra: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    // A provider as unreliable as real ones: late, duplicated, reordered and lost notifications,
    // and refunds declined before they are paid.
    let unreliable = [
        "--notify-jitter-ms",
        "300",
        "--duplicate-fraction",
        "0.3",
        "--attempt-failed-fraction",
        "0.3",
        "--reorder",
        "--delivery-failures",
        "1",
        "--retry-base-ms",
        "100",
        "--refund-failures",
        "2",
    ];
    let stack = Stack::start_with_sim(&extra, &unreliable).await.unwrap();
    let outcome = run_sale(
        &stack,
        "E2E-RETAIL",
        DeductionPolicy::ReserveThenCommit,
        1000,
        100,
    )
    .await;
    assert_eq!((outcome.paid, outcome.late), (70, 10));
    check_quiescence(&stack, "E2E-RETAIL", 100, &outcome).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ticketing_commit_at_order_goes_through_the_same_flow() {
    let env = env();
    let extra: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let stack = Stack::start(&extra).await.unwrap();
    let outcome = run_sale(
        &stack,
        "E2E-TICKET",
        DeductionPolicy::CommitAtOrder,
        400,
        50,
    )
    .await;
    assert_eq!((outcome.paid, outcome.late), (35, 5));
    check_quiescence(&stack, "E2E-TICKET", 50, &outcome).await;
}
