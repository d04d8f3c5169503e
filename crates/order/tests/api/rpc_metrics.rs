//! Every call is counted and timed by method and status code at `/metrics`, with a histogram
//! of explicit buckets; the build is named; every family a sale moves has its help text; each
//! step of an order's saga is timed from its acceptance.

use flashsale_proto::order::v1::GetOrderRequest;
use tonic::Code;

use crate::helpers::{as_user, spawn_stack};

const CREATE: &str = "flashsale.order.v1.OrderService/CreateOrder";
const GET: &str = "flashsale.order.v1.OrderService/GetOrder";

/// The value of the sample whose line starts with `name` and holds every label of `labels`.
fn sample(metrics: &str, name: &str, labels: &[&str]) -> Option<f64> {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

#[tokio::test]
async fn calls_are_counted_and_timed_by_method_and_status_code() {
    let app = spawn_stack(|_| {}).await;
    app.product("WINE", 10, 1).await;
    app.order("alice", "k1", "WINE", 1).await.unwrap();
    let refused = app.order("alice", "k2", "WINE", 1).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    let bad = app
        .client()
        .await
        .get_order(as_user(
            "alice",
            GetOrderRequest {
                order_id: "not-an-id".into(),
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    let (_, metrics) = flashsale_test_support::grpc::http_get(app.metrics_port, "/metrics")
        .await
        .unwrap();
    let requests = "flashsale_rpc_server_requests_total";
    let method = |m: &str| format!("method=\"{m}\"");
    let code = |c: &str| format!("code=\"{c}\"");
    for (m, c) in [
        (CREATE, "OK"),
        (CREATE, "FAILED_PRECONDITION"),
        (GET, "INVALID_ARGUMENT"),
    ] {
        assert_eq!(
            sample(&metrics, requests, &[&method(m), &code(c)]),
            Some(1.0),
            "{m} {c} not counted once:\n{metrics}"
        );
        // The latency histogram has buckets (summed across replicas), the last one all calls.
        let duration = "flashsale_rpc_server_duration_seconds";
        let le = |b: &str| format!("le=\"{b}\"");
        assert_eq!(
            sample(
                &metrics,
                &format!("{duration}_bucket"),
                &[&method(m), &code(c), &le("+Inf")]
            ),
            Some(1.0),
            "{m} {c} has no +Inf bucket:\n{metrics}"
        );
        assert!(
            sample(
                &metrics,
                &format!("{duration}_bucket"),
                &[&method(m), &code(c), &le("10")]
            )
            .is_some(),
            "{m} {c} has no 10 s bucket"
        );
    }
    assert!(
        metrics.contains("# TYPE flashsale_rpc_server_duration_seconds histogram"),
        "{metrics}"
    );
    assert_eq!(
        sample(&metrics, "flashsale_build_info", &["service=\"order\""]),
        Some(1.0),
        "{metrics}"
    );
}

#[tokio::test]
async fn every_family_a_sale_moves_has_its_help_text() {
    let app = spawn_stack(|_| {}).await;
    app.product("HELP", 1, 1).await;
    let o = app.order("alice", "k1", "HELP", 1).await.unwrap();
    app.order("bob", "k2", "HELP", 1).await.unwrap_err();
    app.wait_status(
        "alice",
        &o.order_id,
        flashsale_proto::order::v1::OrderStatus::AwaitingPayment,
    )
    .await;
    let (_, metrics) = flashsale_test_support::grpc::http_get(app.metrics_port, "/metrics")
        .await
        .unwrap();
    let families: Vec<&str> = metrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(families.len() >= 10, "{metrics}");
    let undescribed: Vec<&&str> = families
        .iter()
        .filter(|f| {
            !metrics
                .lines()
                .any(|l| l.starts_with(&format!("# HELP {f} ")))
        })
        .collect();
    assert!(undescribed.is_empty(), "no help text: {undescribed:?}");
}

#[tokio::test]
async fn each_step_of_an_orders_saga_is_timed_from_its_acceptance() {
    use flashsale_proto::order::v1::{CancelOrderRequest, OrderStatus};
    let app = spawn_stack(|_| {}).await;
    app.product("STEPS", 10, 1).await;
    let o = app.order("alice", "k1", "STEPS", 1).await.unwrap();
    app.wait_status("alice", &o.order_id, OrderStatus::AwaitingPayment)
        .await;
    app.client()
        .await
        .cancel_order(as_user(
            "alice",
            CancelOrderRequest {
                order_id: o.order_id.clone(),
            },
        ))
        .await
        .unwrap();
    let (_, metrics) = flashsale_test_support::grpc::http_get(app.metrics_port, "/metrics")
        .await
        .unwrap();
    let steps = "flashsale_order_saga_seconds";
    for stage in ["confirmed", "cancelled"] {
        let stage = format!("stage=\"{stage}\"");
        assert_eq!(
            sample(&metrics, &format!("{steps}_count"), &[&stage]),
            Some(1.0),
            "{stage} not timed once:\n{metrics}"
        );
        // Buckets up to an hour: a buyer may take minutes to pay.
        assert_eq!(
            sample(
                &metrics,
                &format!("{steps}_bucket"),
                &[&stage, "le=\"3600\""]
            ),
            Some(1.0),
            "{stage} has no one-hour bucket:\n{metrics}"
        );
    }
    for stage in ["paid", "shipped"] {
        let stage = format!("stage=\"{stage}\"");
        assert_eq!(sample(&metrics, &format!("{steps}_count"), &[&stage]), None);
    }
}

#[tokio::test]
async fn the_database_pool_is_exported_with_its_bound() {
    let app = spawn_stack(|_| {}).await;
    app.product("POOL", 10, 1).await;
    app.order("alice", "k1", "POOL", 1).await.unwrap();
    let service = "service=\"order\"";
    let metrics = flashsale_test_support::eventually(
        std::time::Duration::from_secs(30),
        "the pool gauges",
        || async {
            let (_, m) = flashsale_test_support::grpc::http_get(app.metrics_port, "/metrics")
                .await
                .ok()?;
            sample(
                &m,
                "flashsale_db_pool_connections",
                &[service, "state=\"idle\""],
            )
            .is_some()
            .then_some(m)
        },
    )
    .await
    .unwrap();
    // helpers.rs gives the service 8 connections; it has opened at least one.
    assert_eq!(
        sample(&metrics, "flashsale_db_pool_max_connections", &[service]),
        Some(8.0),
        "{metrics}"
    );
    let open: f64 = ["in_use", "idle"]
        .iter()
        .filter_map(|s| {
            let state = format!("state=\"{s}\"");
            sample(
                &metrics,
                "flashsale_db_pool_connections",
                &[service, &state],
            )
        })
        .sum();
    assert!((1.0..=8.0).contains(&open), "{open} open:\n{metrics}");
}
