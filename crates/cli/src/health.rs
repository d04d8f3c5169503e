//! `flashsale health`: grpc.health.v1 of the three services, or of one (`--only`, as a
//! container's health check: `FLASHSALE_SERVICE=order flashsale health`).

use std::{process::ExitCode, time::Duration};

use anyhow::Context as _;
use flashsale_bench::client::ServiceUrls;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    urls: ServiceUrls,
    #[arg(
        long,
        env = "FLASHSALE_PAYMENT_SIM_URL",
        default_value = "http://127.0.0.1:50054"
    )]
    payment_sim_url: String,
    /// Check this one service only (the payment simulator too); default: the three services.
    #[arg(long, value_enum, env = "FLASHSALE_SERVICE")]
    only: Option<Target>,
    /// Per-service timeout in milliseconds.
    #[arg(long, default_value_t = 2000)]
    timeout_ms: u64,
}

/// What `--only` may name.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Target {
    ProductStock,
    Order,
    Outbound,
    PaymentSim,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let timeout = Duration::from_millis(args.timeout_ms);
    let mut all = true;
    let targets = [
        (
            Target::ProductStock,
            "product-stock",
            args.urls.product_stock_url,
            "flashsale.product.v1.ProductStockService",
        ),
        (
            Target::Order,
            "order",
            args.urls.order_url,
            "flashsale.order.v1.OrderService",
        ),
        (
            Target::Outbound,
            "outbound",
            args.urls.outbound_url,
            "flashsale.outbound.v1.OutboundService",
        ),
        (
            Target::PaymentSim,
            "payment-sim",
            args.payment_sim_url,
            "flashsale.payment.v1.PaymentProviderService",
        ),
    ];
    let chosen = targets.into_iter().filter(|(t, ..)| match args.only {
        Some(only) => *t == only,
        None => *t != Target::PaymentSim,
    });
    for (_, name, url, service) in chosen {
        let status = match check(&url, service, timeout).await {
            Ok(s) => s,
            Err(e) => format!("DOWN ({e:#})"),
        };
        all &= status == "SERVING";
        println!("{name:<14} {url:<28} {status}");
    }
    Ok(if all {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

async fn check(url: &str, service: &str, timeout: Duration) -> anyhow::Result<String> {
    let channel = flashsale_bench::client::connect(url, timeout).await?;
    let resp = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await
        .map_err(|s| anyhow::anyhow!("{}: {}", s.code(), s.message()))
        .context("health check")?;
    let status =
        ServingStatus::try_from(resp.into_inner().status).unwrap_or(ServingStatus::Unknown);
    Ok(status.as_str_name().to_owned())
}
