//! One trace per order: the three services export their spans to an OTLP receiver inside the
//! test. A gateway sends CreateOrder and PayOrder for one buyer's checkout within one trace;
//! the order's spans on every service — each RPC, the provider's notification, each event
//! consumed — then share that trace id and form one tree under the gateway's span, and every
//! batch that did part of the order's work runs in a span linked to one of them.

use std::{collections::HashSet, time::Duration};

use flashsale_e2e::Stack;
use flashsale_proto::{
    admin::v1::{
        GetOrderTimelineRequest, TimelineEntryKind,
        order_timeline_service_client::OrderTimelineServiceClient,
    },
    order::v1::{
        CreateOrderRequest, GetOrderRequest, Order, OrderStatus, PayOrderRequest,
        order_service_client::OrderServiceClient,
    },
    payment::v1::{
        PayCheckoutRequest, payment_provider_service_client::PaymentProviderServiceClient,
    },
    product::v1::{
        CreateProductRequest, DeductionPolicy,
        product_stock_service_client::ProductStockServiceClient,
    },
};
use flashsale_test_support::{
    eventually,
    otlp::{OtlpReceiver, ReceivedSpan},
};

use super::{admin, connect, user};

/// A gateway's span: a fresh trace id and span id, and the `traceparent` that carries them.
struct GatewaySpan {
    trace_id: String,
    span_id: String,
}

impl GatewaySpan {
    fn new() -> Self {
        let trace_id = uuid::Uuid::new_v4().simple().to_string();
        let span_id = uuid::Uuid::new_v4().simple().to_string()[..16].to_owned();
        Self { trace_id, span_id }
    }

    /// `request` sent from within this span.
    fn carry<T>(&self, mut request: tonic::Request<T>) -> tonic::Request<T> {
        let header = format!("00-{}-{}-01", self.trace_id, self.span_id);
        request
            .metadata_mut()
            .insert("traceparent", header.parse().expect("a valid traceparent"));
        request
    }
}

/// What one order's trace must hold: `(service, span name)` of the spans in it, and the
/// batches (by name) whose span must be linked to one of its spans.
struct Story {
    spans: &'static [(&'static str, &'static str)],
    batches: &'static [&'static str],
}

const SHIPPED: Story = Story {
    spans: &[
        ("order", "flashsale.order.v1.OrderService/CreateOrder"),
        ("product-stock", "process order.created"),
        ("order", "process stock.reserved"),
        ("order", "flashsale.order.v1.OrderService/PayOrder"),
        (
            "order",
            "flashsale.order.v1.PaymentNotificationService/NotifyPayment",
        ),
        ("outbound", "process order.paid"),
        (
            "product-stock",
            "flashsale.product.v1.ProductStockService/CommitReservation",
        ),
        ("order", "process outbound.completed"),
    ],
    batches: &[
        "order_gate",
        "order_write",
        "stock_order_created",
        "order_stock_reserved",
        "order_pay_order",
        "order_payment_notifications",
        "outbound_order_paid",
        "stock_commit_reservation",
        "order_outbound_completed",
    ],
};

const CANCELLED: Story = Story {
    spans: &[
        ("order", "flashsale.order.v1.OrderService/CreateOrder"),
        ("product-stock", "process order.created"),
        ("order", "process stock.reserved"),
        ("order", "process order.payment_timeout"),
        ("product-stock", "process order.cancelled"),
    ],
    batches: &[
        "order_gate",
        "order_write",
        "stock_order_created",
        "order_stock_reserved",
    ],
};

/// What is still missing from `gateway`'s trace for `story` among `spans`; empty once the
/// trace is whole: every span the story names is in it, every batch it names is linked to it,
/// and every span of it hangs from the gateway's span or from another span of it (one tree).
fn missing(spans: &[ReceivedSpan], gateway: &GatewaySpan, story: &Story) -> Vec<String> {
    let trace: Vec<&ReceivedSpan> = spans
        .iter()
        .filter(|s| s.trace_id == gateway.trace_id)
        .collect();
    let ids: HashSet<&str> = trace.iter().map(|s| s.span_id.as_str()).collect();
    let mut missing = Vec::new();
    for (service, name) in story.spans {
        if !trace
            .iter()
            .any(|s| s.service == *service && s.name == *name)
        {
            missing.push(format!("no span {name} of {service} in the trace"));
        }
    }
    for batch in story.batches {
        let name = format!("batch {batch}");
        let linked = spans.iter().any(|s| {
            s.name == name
                && s.links
                    .iter()
                    .any(|(t, id)| *t == gateway.trace_id && ids.contains(id.as_str()))
        });
        if !linked {
            missing.push(format!("no span {name} linked to the trace"));
        }
    }
    for s in &trace {
        if s.parent_span_id != gateway.span_id && !ids.contains(s.parent_span_id.as_str()) {
            missing.push(format!(
                "{} of {} hangs from {:?}, outside the trace's tree",
                s.name, s.service, s.parent_span_id
            ));
        }
    }
    missing
}

/// The buyer of `o` starts its payment (PayOrder, sent through `send`) and pays on the
/// provider's page, which carries no trace of ours.
pub(super) async fn pay_at_checkout(
    stack: &Stack,
    orders: &OrderServiceClient<tonic::transport::Channel>,
    o: &Order,
    send: impl FnOnce(tonic::Request<PayOrderRequest>) -> tonic::Request<PayOrderRequest>,
) {
    let start = PayOrderRequest {
        order_id: o.order_id.clone(),
        ..Default::default()
    };
    let started = orders
        .clone()
        .pay_order(send(user(&o.user_id, start)))
        .await
        .unwrap()
        .into_inner();
    let mut sim = PaymentProviderServiceClient::new(connect(stack.payment_sim.url()).await);
    sim.pay_checkout(PayCheckoutRequest {
        payment_id: started.checkout.unwrap().provider_payment_id,
    })
    .await
    .unwrap();
}

pub(super) async fn wait_status(
    orders: &OrderServiceClient<tonic::transport::Channel>,
    o: &Order,
    want: OrderStatus,
    stack: &Stack,
) {
    eventually(Duration::from_secs(60), "order status", || {
        let mut c = orders.clone();
        let (u, id) = (o.user_id.clone(), o.order_id.clone());
        async move {
            let o = c
                .get_order(user(&u, GetOrderRequest { order_id: id }))
                .await
                .ok()?
                .into_inner()
                .order?;
            (o.status == want as i32).then_some(())
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: waiting for {want:?}\n{}", stack.logs()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_order_is_one_trace_from_create_order_to_shipped_or_cancelled() {
    let receiver = OtlpReceiver::start().await.unwrap();
    let endpoint = receiver.endpoint();
    let extra = [
        (
            "FLASHSALE_PRODUCT_STOCK__TELEMETRY__OTLP_ENDPOINT",
            endpoint.as_str(),
        ),
        (
            "FLASHSALE_ORDER__TELEMETRY__OTLP_ENDPOINT",
            endpoint.as_str(),
        ),
        (
            "FLASHSALE_OUTBOUND__TELEMETRY__OTLP_ENDPOINT",
            endpoint.as_str(),
        ),
        // Long enough to pay the first order, short enough to wait out for the second; only
        // the order's own timer cancels it (the sweeper, which has no order's trace, waits).
        ("FLASHSALE_ORDER__SAGA__PAYMENT_TIMEOUT_MS", "4000"),
        ("FLASHSALE_ORDER__SAGA__SWEEP_INTERVAL_MS", "3600000"),
        // What is logged does not decide what is traced.
        ("RUST_LOG", "warn"),
        // Published events stay in the outboxes: the order timelines show them.
        ("FLASHSALE_ORDER__AMQP__OUTBOX_KEEP_PUBLISHED_HOURS", "1"),
        (
            "FLASHSALE_PRODUCT_STOCK__AMQP__OUTBOX_KEEP_PUBLISHED_HOURS",
            "1",
        ),
        ("FLASHSALE_OUTBOUND__AMQP__OUTBOX_KEEP_PUBLISHED_HOURS", "1"),
    ];
    let stack = Stack::start(&extra).await.unwrap();
    let sku = format!("TRACE-{}", uuid::Uuid::new_v4().simple());
    let mut ps = ProductStockServiceClient::new(connect(stack.product_stock.url()).await);
    ps.create_product(admin(CreateProductRequest {
        sku: sku.clone(),
        name: "traced".into(),
        price_cents: 1000,
        initial_stock: 10,
        per_user_limit: 1,
        deduction_policy: DeductionPolicy::ReserveThenCommit as i32,
        stock_buckets: 0,
        ..Default::default()
    }))
    .await
    .unwrap();
    let orders = OrderServiceClient::new(connect(stack.order.url()).await);
    let (shipped, cancelled) = (GatewaySpan::new(), GatewaySpan::new());
    let mut placed = Vec::new();
    for (buyer, gateway) in [("shipped-buyer", &shipped), ("cancelled-buyer", &cancelled)] {
        let create = CreateOrderRequest {
            request_id: "checkout".into(),
            sku: sku.clone(),
            quantity: 1,
        };
        let order = orders
            .clone()
            .create_order(gateway.carry(user(buyer, create)))
            .await
            .unwrap()
            .into_inner()
            .order
            .unwrap();
        placed.push(order);
    }
    let (paid, unpaid) = (&placed[0], &placed[1]);
    wait_status(&orders, paid, OrderStatus::AwaitingPayment, &stack).await;
    pay_at_checkout(&stack, &orders, paid, |r| shipped.carry(r)).await;
    wait_status(&orders, paid, OrderStatus::Shipped, &stack).await;
    wait_status(&orders, unpaid, OrderStatus::Cancelled, &stack).await;

    // The services export in batches: wait until both traces are whole.
    let whole = eventually(Duration::from_secs(60), "both traces whole", || {
        let spans = receiver.spans();
        let whole = missing(&spans, &shipped, &SHIPPED).is_empty()
            && missing(&spans, &cancelled, &CANCELLED).is_empty();
        async move { whole.then_some(()) }
    })
    .await;
    let spans = receiver.spans();
    assert!(
        whole.is_ok(),
        "shipped order: {:#?}\ncancelled order: {:#?}\n{} spans received",
        missing(&spans, &shipped, &SHIPPED),
        missing(&spans, &cancelled, &CANCELLED),
        spans.len()
    );
    // Two orders, two traces: no span of one order's trace is in the other's.
    let of = |g: &GatewaySpan| -> HashSet<String> {
        spans
            .iter()
            .filter(|s| s.trace_id == g.trace_id)
            .map(|s| s.span_id.clone())
            .collect()
    };
    assert!(of(&shipped).is_disjoint(&of(&cancelled)));
    // Consumer spans carry OpenTelemetry's messaging attributes; server spans the RPC ones.
    let consumed = spans
        .iter()
        .find(|s| s.trace_id == shipped.trace_id && s.name == "process order.paid")
        .unwrap();
    assert_eq!(
        consumed
            .attributes
            .get("messaging.system")
            .map(String::as_str),
        Some("rabbitmq")
    );
    assert_eq!(
        consumed
            .attributes
            .get("messaging.rabbitmq.destination.routing_key")
            .map(String::as_str),
        Some("order.paid")
    );
    let served = spans
        .iter()
        .find(|s| s.trace_id == shipped.trace_id && s.name.ends_with("/PayOrder"))
        .unwrap();
    assert_eq!(
        served.attributes.get("rpc.system").map(String::as_str),
        Some("grpc")
    );
    assert_eq!(
        served.attributes.get("rpc.method").map(String::as_str),
        Some("PayOrder")
    );
    assert_eq!(
        served
            .attributes
            .get("rpc.grpc.status_code")
            .map(String::as_str),
        Some("0")
    );

    // Each service's timeline of the shipped order names its trace, and so do the events in it.
    for url in [
        stack.order.url(),
        stack.product_stock.url(),
        stack.outbound.url(),
    ] {
        let mut c = OrderTimelineServiceClient::new(connect(url).await);
        let answer = c
            .get_order_timeline(admin(GetOrderTimelineRequest {
                order_id: paid.order_id.clone(),
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(answer.trace_id, shipped.trace_id, "{answer:#?}");
        let events: Vec<_> = answer
            .entries
            .iter()
            .filter(|e| !e.event_type.is_empty())
            .collect();
        assert!(
            events
                .iter()
                .any(|e| e.kind == TimelineEntryKind::EventPublished as i32),
            "{} published none of its events: {answer:#?}",
            answer.service
        );
        assert!(
            events.iter().all(|e| e.trace_id == shipped.trace_id),
            "{answer:#?}"
        );
    }
}
