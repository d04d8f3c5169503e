//! `flashsale-payment-sim`: serves the simulated payment provider until SIGTERM/SIGINT.

use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use flashsale_contract::payment::{DEV_PAYMENT_API_KEY, DEV_WEBHOOK_SECRET};
use flashsale_payment_sim::SimConfig;

/// A payment provider simulator: the order service creates payments and refunds here, buyers
/// pay with PayCheckout, and the simulator sends the order service signed notifications,
/// delayed, duplicated, reordered or lost as asked.
#[derive(Parser, Debug)]
#[command(name = "flashsale-payment-sim", version)]
struct Args {
    /// gRPC listen address.
    #[arg(
        long,
        env = "FLASHSALE_PAYMENT_SIM_ADDR",
        default_value = "127.0.0.1:50054"
    )]
    addr: std::net::SocketAddr,
    /// The merchant's API key (at least 32 bytes); the order service's `payment.api_key`.
    #[arg(long, env = "FLASHSALE_PAYMENT_SIM_API_KEY", default_value = DEV_PAYMENT_API_KEY, hide_default_value = true)]
    api_key: String,
    /// The notification signing secret (at least 32 bytes); the order service's
    /// `payment.webhook_secret`.
    #[arg(long, env = "FLASHSALE_PAYMENT_SIM_WEBHOOK_SECRET", default_value = DEV_WEBHOOK_SECRET, hide_default_value = true)]
    webhook_secret: String,
    /// Base of the checkout URLs handed out; default: the address served.
    #[arg(long, default_value = "")]
    public_url: String,
    /// Wait before a notification's first delivery, in milliseconds.
    #[arg(long, default_value_t = 50)]
    notify_delay_ms: u64,
    /// Random extra wait, up to this many milliseconds (notifications overtake one another).
    #[arg(long, default_value_t = 0)]
    notify_jitter_ms: u64,
    /// Share of notifications delivered twice, the same signed bytes (0..=1).
    #[arg(long, default_value_t = 0.0)]
    duplicate_fraction: f64,
    /// Share of payments with a declined attempt first: ATTEMPT_FAILED before SUCCEEDED (0..=1).
    #[arg(long, default_value_t = 0.0)]
    attempt_failed_fraction: f64,
    /// Deliver each payment's notifications last first.
    #[arg(long)]
    reorder: bool,
    /// The first N deliveries of every notification are lost.
    #[arg(long, default_value_t = 0)]
    delivery_failures: u32,
    /// Deliveries of one notification before giving up on it.
    #[arg(long, default_value_t = 20)]
    max_deliveries: u32,
    /// Wait after a failed delivery, doubling each time (milliseconds).
    #[arg(long, default_value_t = 200)]
    retry_base_ms: u64,
    /// The first N calls of every refund are declined (`always`: every one).
    #[arg(long, default_value = "0", value_parser = refund_failures)]
    refund_failures: u32,
    /// Never send a notification (the merchant must ask: GetPayment).
    #[arg(long)]
    drop_notifications: bool,
    /// Every refund call waits this many milliseconds before it answers.
    #[arg(long, default_value_t = 0)]
    refund_delay_ms: u64,
    /// Seed of the simulator's randomness.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// CA that an `https://` notification URL's server certificate must chain to (default: the
    /// system's roots).
    #[arg(long, env = "FLASHSALE_TLS_CA_FILE", default_value = "")]
    tls_ca_file: String,
    /// Client certificate presented to an `https://` notification URL (mutual TLS), with
    /// `--tls-key-file`.
    #[arg(long, env = "FLASHSALE_TLS_CERT_FILE", default_value = "")]
    tls_cert_file: String,
    #[arg(long, env = "FLASHSALE_TLS_KEY_FILE", default_value = "")]
    tls_key_file: String,
}

fn refund_failures(s: &str) -> Result<u32, String> {
    if s == "always" {
        return Ok(u32::MAX);
    }
    s.parse()
        .map_err(|_| format!("`{s}` is not a count or `always`"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let settings = flashsale_platform::settings::TelemetrySettings::default();
    let _telemetry = flashsale_platform::telemetry::init(&settings, "payment-sim")?;
    let config = SimConfig {
        api_key: args.api_key,
        webhook_secret: args.webhook_secret,
        public_url: args.public_url,
        notify_delay: Duration::from_millis(args.notify_delay_ms),
        notify_jitter: Duration::from_millis(args.notify_jitter_ms),
        duplicate_fraction: args.duplicate_fraction,
        attempt_failed_fraction: args.attempt_failed_fraction,
        reorder: args.reorder,
        delivery_failures: args.delivery_failures,
        max_deliveries: args.max_deliveries,
        retry_base: Duration::from_millis(args.retry_base_ms),
        refund_failures: args.refund_failures,
        drop_notifications: args.drop_notifications,
        refund_delay: Duration::from_millis(args.refund_delay_ms),
        seed: args.seed,
        notify_tls: flashsale_platform::tls::GrpcTlsSettings {
            ca_file: args.tls_ca_file,
            client_cert_file: args.tls_cert_file,
            client_key_file: args.tls_key_file,
            ..Default::default()
        },
    };
    config.validate()?;
    let listener = tokio::net::TcpListener::bind(args.addr)
        .await
        .with_context(|| format!("bind {}", args.addr))?;
    tracing::info!(addr = %args.addr, behaviour = %summary(&config), "payment simulator listening");
    flashsale_payment_sim::serve(config, listener, flashsale_platform::shutdown::signal()).await
}

fn summary(c: &SimConfig) -> String {
    format!(
        "delay {:?} + up to {:?}, duplicates {}, attempt failures {}, reorder {}, lost deliveries {}, declined refund calls {}, notifications dropped {}, refund delay {:?}",
        c.notify_delay,
        c.notify_jitter,
        c.duplicate_fraction,
        c.attempt_failed_fraction,
        c.reorder,
        c.delivery_failures,
        c.refund_failures,
        c.drop_notifications,
        c.refund_delay
    )
}
