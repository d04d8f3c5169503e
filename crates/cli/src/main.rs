//! `flashsale`: the command-line face of the platform — mint tokens, check health, and (in later
//! issues) administer products, place orders and run load.

use std::{process::ExitCode, time::Duration};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use flashsale_platform::auth::{DEV_SECRET, JwtKeys, Role};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

#[derive(Parser)]
#[command(
    name = "flashsale",
    version,
    about = "Flash-sale platform command line"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Mint a JWT bearer token for a user, an admin or a service.
    Token {
        /// The subject (user id, admin name or service name).
        #[arg(long)]
        sub: String,
        /// user, admin or service.
        #[arg(long, default_value = "user")]
        role: Role,
        /// Lifetime in seconds.
        #[arg(long, default_value_t = 3600)]
        ttl_secs: u64,
        /// HS256 secret; the services' development secret when unset.
        #[arg(long, env = "FLASHSALE_JWT_SECRET", hide_env_values = true)]
        secret: Option<String>,
    },
    /// Check grpc.health.v1 of the three services; exit 0 only if all are SERVING.
    Health {
        #[arg(
            long,
            env = "FLASHSALE_PRODUCT_STOCK_URL",
            default_value = "http://127.0.0.1:50051"
        )]
        product_stock_url: String,
        #[arg(
            long,
            env = "FLASHSALE_ORDER_URL",
            default_value = "http://127.0.0.1:50052"
        )]
        order_url: String,
        #[arg(
            long,
            env = "FLASHSALE_OUTBOUND_URL",
            default_value = "http://127.0.0.1:50053"
        )]
        outbound_url: String,
        /// Per-service timeout in milliseconds.
        #[arg(long, default_value_t = 2000)]
        timeout_ms: u64,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    match run(Cli::parse()).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Token {
            sub,
            role,
            ttl_secs,
            secret,
        } => {
            anyhow::ensure!(
                !sub.is_empty() && sub.len() <= flashsale_platform::auth::MAX_SUBJECT_LEN,
                "--sub must be 1..={} bytes",
                flashsale_platform::auth::MAX_SUBJECT_LEN
            );
            anyhow::ensure!(
                (1..=31_536_000).contains(&ttl_secs),
                "--ttl-secs must be 1..=31536000"
            );
            let secret = secret
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| DEV_SECRET.to_owned());
            let token = JwtKeys::new(secret.as_bytes())?
                .mint(&sub, role, Duration::from_secs(ttl_secs))
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            println!("{token}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Health {
            product_stock_url,
            order_url,
            outbound_url,
            timeout_ms,
        } => {
            let timeout = Duration::from_millis(timeout_ms);
            let mut all = true;
            for (name, url, service) in [
                (
                    "product-stock",
                    product_stock_url,
                    "flashsale.product.v1.ProductStockService",
                ),
                ("order", order_url, "flashsale.order.v1.OrderService"),
                (
                    "outbound",
                    outbound_url,
                    "flashsale.outbound.v1.OutboundService",
                ),
            ] {
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
    }
}

async fn check(url: &str, service: &str, timeout: Duration) -> anyhow::Result<String> {
    let channel = tonic::transport::Endpoint::from_shared(url.to_owned())
        .context("parse URL")?
        .connect_timeout(timeout)
        .timeout(timeout)
        .connect()
        .await
        .context("connect")?;
    let resp = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await
        .map_err(|s| anyhow::anyhow!("{}: {}", s.code(), s.message()))?;
    let status =
        ServingStatus::try_from(resp.into_inner().status).unwrap_or(ServingStatus::Unknown);
    Ok(status.as_str_name().to_owned())
}
