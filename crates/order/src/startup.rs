//! Builds the order service from its settings: database, the product-stock client, the payment
//! provider, broker, outbox relay, saga consumer, deadline sweeper, refund worker, payment
//! reconciliation, stuck-order gauge, inbox purger, change listener and the gRPC services.

use std::{sync::Arc, time::Duration};

use flashsale_platform::{
    app::{Application, Common, Foundation, Service},
    auth::ServiceToken,
    failpoint::Failpoints,
    grpc::ServerRoutes,
    peer::PeerLimits,
};
use flashsale_proto::{
    admin::v1::{
        dead_letter_service_server::DeadLetterServiceServer,
        order_timeline_service_server::OrderTimelineServiceServer,
    },
    order::v1::{
        order_service_server::OrderServiceServer,
        payment_notification_service_server::PaymentNotificationServiceServer,
    },
};
use tonic::service::interceptor::InterceptedService;

use crate::{
    api::{
        amqp,
        grpc::{EdgeLimits, OrderApi},
        payment::PaymentNotifications,
    },
    app::{
        Admission, Checkout, Intake, Payments, Queries, Reconciler, Refunds, Reports, Saga, Stuck,
    },
    config::Settings,
    domain::PaymentProvider,
    infra::{changes::OrderChanges, payment::GrpcPaymentProvider, stock::GrpcStock},
    migration::Migrator,
};

/// The order service as its binary runs it (`flashsale_platform::app::main`).
pub struct Order;

impl Service for Order {
    const NAME: &'static str = "order";
    type Settings = Settings;
    type Migrator = Migrator;

    fn load() -> anyhow::Result<Settings> {
        Ok(crate::config::load()?)
    }

    fn common(settings: &Settings) -> Common<'_> {
        settings.common()
    }

    async fn build(settings: Settings) -> anyhow::Result<Application> {
        build(settings).await
    }
}

/// [`build_with`] with failpoints from `FLASHSALE_FAILPOINTS`.
pub async fn build(settings: Settings) -> anyhow::Result<Application> {
    build_with(settings, flashsale_platform::failpoint::from_env()?).await
}

pub async fn build_with(settings: Settings, failpoints: Failpoints) -> anyhow::Result<Application> {
    let mut f = Foundation::of::<Order>(&settings).await?;
    crate::app::describe_metrics();
    flashsale_messaging::metrics::describe();
    let token = ServiceToken::for_service(&settings.auth, Order::NAME)?;
    let stock = GrpcStock::new(
        &settings.upstream,
        &settings.grpc.tls,
        token,
        Duration::from_millis(settings.saga.stock_call_timeout_ms),
    )?;

    let timeout_queue = amqp::payment_timeout_queue(
        &settings.amqp,
        Duration::from_millis(settings.saga.payment_timeout_ms),
    );
    let changes = OrderChanges::new();
    let admission = Admission::new(f.db.clone(), &settings.admission);
    let stock: Arc<GrpcStock> = Arc::new(stock);
    let reports = Reports::new(f.db.clone(), stock.clone());
    let intake = Intake::new(
        f.db.clone(),
        stock,
        &settings.saga,
        admission.clone(),
        failpoints.clone(),
    )
    .with_request_timeout(Duration::from_millis(settings.grpc.request_timeout_ms));
    if settings.payment.uses_development_secrets() {
        tracing::warn!(
            "!!! payment.webhook_secret or payment.api_key is the PUBLIC development value: \
             anyone can sign payment notifications. Set FLASHSALE_ORDER__PAYMENT__WEBHOOK_SECRET \
             and FLASHSALE_ORDER__PAYMENT__API_KEY in production !!!"
        );
    }
    let provider: Arc<dyn PaymentProvider> = Arc::new(GrpcPaymentProvider::new(&settings.payment)?);
    let notify_url = notify_url(&settings, f.runner.grpc_port())?;
    let checkout = Checkout::new(
        f.db.clone(),
        provider.clone(),
        &settings.payment.currency,
        &notify_url,
    );
    let payments = Payments::new(
        f.db.clone(),
        &settings.payment.webhook_secret,
        settings.payment.notification_tolerance_ms,
    );
    let refunds = Refunds::new(f.db.clone(), provider.clone(), &settings.payment);
    let reconciler = Reconciler::new(f.db.clone(), provider, payments.clone(), &settings.payment);
    let saga = Saga::new(f.db.clone(), timeout_queue.clone(), &settings.saga)
        .with_failpoints(failpoints.clone());
    let queries = Queries::new(f.db.clone(), changes.clone(), f.runner.shutdown());
    let stuck = Stuck::new(f.db.clone(), &settings.saga);
    let s = saga.clone();
    let half_prefetch = usize::from(settings.amqp.prefetch) / 2;
    let batchers = amqp::Batchers {
        reserved: crate::app::reserved_batcher(saga.clone(), half_prefetch),
        completed: crate::app::completed_batcher(saga.clone(), half_prefetch),
    };
    let handler = move |msg| amqp::handle(s.clone(), batchers.clone(), msg);
    let topologies = [amqp::topology(&settings.amqp)];
    let relay = flashsale_messaging::RelayOptions {
        yield_to: intake.relay_yield(),
        ..Default::default()
    };
    let messaging = flashsale_messaging::wiring::start_with(
        &mut f.runner,
        &f.db,
        &settings.amqp,
        &topologies,
        vec![timeout_queue],
        handler,
        &failpoints,
        relay,
    )
    .await?;
    let dead_letters = messaging.dead_letters;
    let shutdown = f.runner.shutdown();
    f.runner.spawn(saga.run_sweeper(shutdown.clone()));
    f.runner.spawn(stuck.clone().run_gauge(shutdown.clone()));
    f.runner.spawn(admission.run(shutdown.clone()));
    f.runner.spawn(refunds.clone().run(shutdown.clone()));
    f.runner.spawn(reconciler.run(shutdown.clone()));
    f.runner.spawn(
        intake
            .refusals()
            .clone()
            .run(f.db.clone(), shutdown.clone()),
    );
    // Every replica hears when units of a product come back, and stops refusing it from memory;
    // and when its terms change, and forgets what it knew of its sale window.
    let (forget, reset) = (intake.sold_out().clone(), intake.sold_out().clone());
    let (windows, forget_window) = (intake.windows().clone(), intake.windows().clone());
    let s = shutdown.clone();
    f.runner.spawn(flashsale_messaging::broadcast::run(
        messaging.broker,
        amqp::UNITS_BACK_KEYS
            .iter()
            .chain([&amqp::PRODUCT_UPDATED])
            .map(|k| (*k).to_owned())
            .collect(),
        move |env| {
            if let Some(sku) = amqp::sku_with_units_back(&env) {
                forget.forget(sku);
            }
            if let Some(sku) = amqp::updated_sku(&env) {
                forget_window.forget(sku);
                forget.forget(sku);
            }
        },
        move || {
            reset.clear();
            windows.clear();
        },
        async move { s.wait().await },
    ));
    let limits = EdgeLimits::new(&settings.limits);
    f.forget_idle_users(limits.rate_limiters());
    f.runner.spawn(changes.run(f.db.clone(), shutdown));

    let max = settings.grpc.max_message_bytes;
    let routes = ServerRoutes::new()
        .with_service(InterceptedService::new(
            OrderServiceServer::new(OrderApi::new(
                intake, checkout, queries, stuck, refunds, reports, limits,
            ))
            .max_decoding_message_size(max)
            .max_encoding_message_size(max),
            f.auth.clone(),
        ))
        // No bearer-token interceptor: the provider's signature authenticates a notification.
        // Anyone reaching the port may call it, so one peer's calls in flight and the time a
        // call may take to send its request are bounded.
        .with_service(
            notify_limits(&settings).guard(
                PaymentNotificationServiceServer::new(PaymentNotifications::new(
                    crate::app::notify_batcher(payments, crate::app::NOTIFY_MAX_BATCH),
                ))
                .max_decoding_message_size(max)
                .max_encoding_message_size(max),
            ),
        )
        .with_service(InterceptedService::new(
            DeadLetterServiceServer::new(dead_letters)
                .max_decoding_message_size(max)
                .max_encoding_message_size(max),
            f.auth.clone(),
        ))
        .with_service(InterceptedService::new(
            OrderTimelineServiceServer::new(flashsale_messaging::timeline::TimelineAdmin::new(
                &f.db,
                "order",
                crate::infra::timeline::Story::new(f.db.clone()),
            )?)
            .max_decoding_message_size(max)
            .max_encoding_message_size(max),
            f.auth.clone(),
        ));
    Ok(Application::new(f, routes))
}

/// The per-peer limits of NotifyPayment (`limits.notify_*`).
fn notify_limits(settings: &Settings) -> PeerLimits {
    PeerLimits::new(
        "NotifyPayment",
        usize::try_from(settings.limits.notify_in_flight_per_peer).unwrap_or(usize::MAX),
        Duration::from_millis(settings.limits.notify_body_timeout_ms),
    )
}

/// Where the provider sends notifications: `payment.notify_url`, or this server's gRPC address
/// (`port`, the one bound) with an unspecified host read as 127.0.0.1.
fn notify_url(settings: &Settings, port: u16) -> anyhow::Result<String> {
    if !settings.payment.notify_url.is_empty() {
        return Ok(settings.payment.notify_url.clone());
    }
    let addr: std::net::SocketAddr = settings
        .grpc
        .addr
        .parse()
        .map_err(|e| anyhow::anyhow!("parse grpc.addr `{}`: {e}", settings.grpc.addr))?;
    let host = match addr.ip() {
        ip if ip.is_unspecified() => "127.0.0.1".to_owned(),
        std::net::IpAddr::V6(ip) => format!("[{ip}]"),
        ip => ip.to_string(),
    };
    // The server speaks TLS only once it has a certificate.
    let scheme = if settings.grpc.tls.cert_file.is_empty() {
        "http"
    } else {
        "https"
    };
    Ok(format!("{scheme}://{host}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_notify_url_defaults_to_this_servers_address() {
        let mut s = Settings::default();
        s.grpc.addr = "0.0.0.0:50052".into();
        assert_eq!(notify_url(&s, 50052).unwrap(), "http://127.0.0.1:50052");
        s.grpc.tls.cert_file = "/etc/flashsale/order.crt".into();
        assert_eq!(notify_url(&s, 50052).unwrap(), "https://127.0.0.1:50052");
        s.grpc.tls.cert_file.clear();
        s.grpc.addr = "127.0.0.1:0".into();
        assert_eq!(notify_url(&s, 41234).unwrap(), "http://127.0.0.1:41234");
        s.grpc.addr = "[::]:50052".into();
        assert_eq!(notify_url(&s, 50052).unwrap(), "http://127.0.0.1:50052");
        s.grpc.addr = "10.1.2.3:50052".into();
        assert_eq!(notify_url(&s, 50052).unwrap(), "http://10.1.2.3:50052");
        s.payment.notify_url = "https://orders.example:443".into();
        assert_eq!(notify_url(&s, 50052).unwrap(), "https://orders.example:443");
    }
}
