//! Each service's `/metrics`, scraped before and after a small sale of the three service
//! binaries: every family that counts or times something moves when its event happens (calls,
//! acceptances and refusals, payments, cancellations, shipments shipped and failed, refunds,
//! events published and consumed with their lag, batches, saga steps), and every gauge an
//! operator reads is there (build, process, pools, outbox backlog, queue depths, parked
//! messages, the gate's drift).

use std::{collections::BTreeMap, time::Duration};

use flashsale_e2e::{Service, Stack};
use flashsale_proto::{
    order::v1::{CreateOrderRequest, Order, OrderStatus, order_service_client::OrderServiceClient},
    product::v1::{
        CreateProductRequest, DeductionPolicy,
        product_stock_service_client::ProductStockServiceClient,
    },
};
use flashsale_test_support::{eventually, grpc::http_get};
use tonic::transport::Channel;

use super::{
    admin, connect,
    traces::{pay_at_checkout, wait_status},
    user,
};

/// What a family adds up to: the sum of its samples (a histogram's `_count`).
type Totals = BTreeMap<String, f64>;

async fn scrape(service: &Service) -> String {
    let (_, body) = http_get(service.metrics_port, "/metrics")
        .await
        .unwrap_or_else(|e| panic!("scrape {}: {e}", service.name));
    body
}

/// Every family's total in a scrape (histograms by their count; buckets and sums left out).
fn totals(text: &str) -> Totals {
    let mut out = Totals::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let name = series.split('{').next().unwrap_or(series);
        if name.ends_with("_bucket") || name.ends_with("_sum") {
            continue;
        }
        let family = name.strip_suffix("_count").unwrap_or(name);
        if let Ok(v) = value.parse::<f64>() {
            *out.entry(family.to_owned()).or_default() += v;
        }
    }
    out
}

/// Per service: the families that must have grown, and the gauges that must be there.
struct Expect {
    service: &'static str,
    moved: &'static [&'static str],
    present: &'static [&'static str],
}

const COMMON_GAUGES: [&str; 6] = [
    "flashsale_build_info",
    "process_resident_memory_bytes",
    "process_cpu_seconds_total",
    "flashsale_db_pool_connections",
    "flashsale_outbox_backlog_rows",
    "flashsale_queue_messages_ready",
];

const EXPECT: [Expect; 3] = [
    Expect {
        service: "order",
        moved: &[
            "flashsale_rpc_server_requests_total",
            "flashsale_rpc_server_duration_seconds",
            "flashsale_orders_accepted_total",
            "flashsale_orders_refused_total",
            "flashsale_orders_paid_total",
            "flashsale_orders_cancelled_total",
            "flashsale_order_saga_seconds",
            "flashsale_payment_notifications_total",
            "flashsale_refunds_total",
            "flashsale_batch_size",
            "flashsale_batch_wait_seconds",
            "flashsale_batch_run_seconds",
            "flashsale_messages_consumed_total",
            "flashsale_consumer_lag_seconds",
            "flashsale_outbox_published_total",
            "flashsale_outbox_publish_delay_seconds",
        ],
        present: &["flashsale_dead_letters_parked"],
    },
    Expect {
        service: "product-stock",
        moved: &[
            "flashsale_rpc_server_requests_total",
            "flashsale_rpc_server_duration_seconds",
            "flashsale_reserve_accepted_total",
            "flashsale_messages_consumed_total",
            "flashsale_consumer_lag_seconds",
            "flashsale_outbox_published_total",
        ],
        present: &[
            "flashsale_gate_drift_units",
            "flashsale_redis_pool_connections",
        ],
    },
    Expect {
        service: "outbound",
        moved: &[
            "flashsale_shipments_total",
            "flashsale_messages_consumed_total",
            "flashsale_consumer_lag_seconds",
            "flashsale_outbox_published_total",
        ],
        present: &["flashsale_dead_letters_parked"],
    },
];

fn services(stack: &Stack) -> [&Service; 3] {
    [&stack.order, &stack.product_stock, &stack.outbound]
}

/// What is still missing after the sale, against the totals `before` it.
async fn missing(stack: &Stack, before: &[Totals; 3]) -> Vec<String> {
    let mut out = Vec::new();
    for (i, s) in services(stack).into_iter().enumerate() {
        let now = totals(&scrape(s).await);
        let expect = EXPECT.iter().find(|e| e.service == s.name).unwrap();
        for family in expect.moved {
            let (was, is) = (
                before[i].get(*family).copied().unwrap_or(0.0),
                now.get(*family).copied().unwrap_or(0.0),
            );
            if is <= was {
                out.push(format!("{}: {family} did not move ({was} -> {is})", s.name));
            }
        }
        for family in expect.present.iter().chain(&COMMON_GAUGES) {
            if !now.contains_key(*family) {
                out.push(format!("{}: no {family}", s.name));
            }
        }
    }
    out
}

async fn place(orders: &OrderServiceClient<Channel>, buyer: &str, sku: &str) -> Order {
    let req = CreateOrderRequest {
        request_id: "checkout".into(),
        sku: sku.into(),
        quantity: 1,
    };
    orders
        .clone()
        .create_order(user(buyer, req))
        .await
        .unwrap()
        .into_inner()
        .order
        .unwrap()
}

async fn pay(stack: &Stack, orders: &OrderServiceClient<Channel>, o: &Order) {
    wait_status(orders, o, OrderStatus::AwaitingPayment, stack).await;
    pay_at_checkout(stack, orders, o, |r| r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_family_moves_when_its_event_happens_on_every_service() {
    let extra = [
        ("FLASHSALE_ORDER__SAGA__PAYMENT_TIMEOUT_MS", "3000"),
        ("FLASHSALE_ORDER__SAGA__SWEEP_INTERVAL_MS", "500"),
        ("FLASHSALE_ORDER__PAYMENT__REFUND_RETRY_BASE_MS", "100"),
        ("FLASHSALE_ORDER__PAYMENT__REFUND_SWEEP_INTERVAL_MS", "200"),
        ("FLASHSALE_OUTBOUND__WAREHOUSE__FAIL_SKUS", "METRICS-FAILS"),
        ("FLASHSALE_OUTBOUND__SHIPPING__SWEEP_INTERVAL_MS", "500"),
        (
            "FLASHSALE_PRODUCT_STOCK__STOCK__DRIFT_CHECK_INTERVAL_MS",
            "1000",
        ),
    ];
    let stack = Stack::start(&extra).await.unwrap();
    let mut before: [Totals; 3] = Default::default();
    for (i, s) in services(&stack).into_iter().enumerate() {
        before[i] = totals(&scrape(s).await);
    }

    let mut ps = ProductStockServiceClient::new(connect(stack.product_stock.url()).await);
    for (sku, stock) in [("METRICS-SHIPS", 2), ("METRICS-FAILS", 1)] {
        ps.create_product(admin(CreateProductRequest {
            sku: sku.into(),
            name: "metered".into(),
            price_cents: 1000,
            initial_stock: stock,
            per_user_limit: 1,
            deduction_policy: DeductionPolicy::ReserveThenCommit as i32,
            stock_buckets: 0,
            ..Default::default()
        }))
        .await
        .unwrap();
    }
    let orders = OrderServiceClient::new(connect(stack.order.url()).await);
    // Shipped; never paid (cancelled); sold out (refused); paid, its shipment failed (refunded).
    let shipped = place(&orders, "payer", "METRICS-SHIPS").await;
    let unpaid = place(&orders, "forgetful", "METRICS-SHIPS").await;
    let sold_out = orders
        .clone()
        .create_order(user(
            "late",
            CreateOrderRequest {
                request_id: "checkout".into(),
                sku: "METRICS-SHIPS".into(),
                quantity: 1,
            },
        ))
        .await;
    assert!(sold_out.is_err(), "{sold_out:?}");
    let failed = place(&orders, "unlucky", "METRICS-FAILS").await;
    pay(&stack, &orders, &shipped).await;
    pay(&stack, &orders, &failed).await;
    wait_status(&orders, &shipped, OrderStatus::Shipped, &stack).await;
    wait_status(&orders, &unpaid, OrderStatus::Cancelled, &stack).await;
    wait_status(&orders, &failed, OrderStatus::Cancelled, &stack).await;

    // Gauges and histograms are read on timers: wait until every family has moved.
    let settled = eventually(Duration::from_secs(30), "every family moved", || async {
        missing(&stack, &before).await.is_empty().then_some(())
    })
    .await;
    if settled.is_err() {
        panic!("{:#?}\n{}", missing(&stack, &before).await, stack.logs());
    }
}
