//! `flashsale-payment-sim`: a payment provider that behaves like a real one, for development and
//! tests (docs/architecture.md#payments). It serves `flashsale.payment.v1.PaymentProviderService`:
//! the merchant (the order service, with its API key) creates payments and refunds them; the
//! buyer pays on the checkout (`PayCheckout`); the provider then tells the merchant through
//! signed notifications (HMAC-SHA256, `flashsale_contract::payment::sign`) sent to the payment's
//! `notify_url`, retried until they are accepted.
//!
//! Like a real provider it is not polite: [`SimConfig`] makes notifications arrive late
//! (`notify_delay`, `notify_jitter`), twice (`duplicate_fraction`, the same signed bytes again: a
//! replay), in another order (`reorder`, and an ATTEMPT_FAILED event before the success for
//! `attempt_failed_fraction` of the payments), lost (`delivery_failures`: the first deliveries
//! of each notification never arrive, or `drop_notifications`: none ever does), refunds declined
//! (`refund_failures`) and answered slowly (`refund_delay`). `GetPayment` tells the merchant
//! where a payment is, whatever became of its notifications.

mod notify;
mod provider;

use std::time::Duration;

use anyhow::Context as _;
use flashsale_contract::payment::{
    DEV_PAYMENT_API_KEY, DEV_WEBHOOK_SECRET, PAYMENT_SECRET_MIN_LEN,
};
use flashsale_platform::{grpc::ServerRoutes, settings::GrpcSettings, shutdown::Shutdown};
use flashsale_proto::payment::v1::payment_provider_service_server::PaymentProviderServiceServer;
use tokio::net::TcpListener;

pub use notify::Stats;
pub use provider::Simulator;

/// The simulator's behaviour.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// The merchant's API key (CreatePayment and RefundPayment must carry it).
    pub api_key: String,
    /// The secret notifications are signed with.
    pub webhook_secret: String,
    /// Base of the checkout URLs handed out (`<public_url>/checkout/<payment id>`); empty: the
    /// address served.
    pub public_url: String,
    /// Every notification waits this long before its first delivery …
    pub notify_delay: Duration,
    /// … plus a random extra up to this (notifications overtake one another).
    pub notify_jitter: Duration,
    /// Share of notifications delivered twice, the same signed bytes each time (0..=1).
    pub duplicate_fraction: f64,
    /// Share of payments whose buyer first has an attempt declined: an ATTEMPT_FAILED
    /// notification before the SUCCEEDED one (0..=1).
    pub attempt_failed_fraction: f64,
    /// Deliver each payment's notifications last first.
    pub reorder: bool,
    /// The first this-many deliveries of each notification are lost (never sent).
    pub delivery_failures: u32,
    /// Deliveries of one notification before the simulator gives up on it.
    pub max_deliveries: u32,
    /// Wait after a failed delivery, doubling each time (at most 5 s).
    pub retry_base: Duration,
    /// The first this-many calls of each refund are declined (`u32::MAX`: every one).
    pub refund_failures: u32,
    /// Every notification is dropped, never sent (the merchant learns of payments only by
    /// asking: GetPayment).
    pub drop_notifications: bool,
    /// Every RefundPayment call takes this long before it answers (a slow provider).
    pub refund_delay: Duration,
    /// Seed of the simulator's randomness.
    pub seed: u64,
    /// How notifications reach an `https://` notification URL (CA, client certificate).
    pub notify_tls: flashsale_platform::tls::GrpcTlsSettings,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            api_key: DEV_PAYMENT_API_KEY.to_owned(),
            webhook_secret: DEV_WEBHOOK_SECRET.to_owned(),
            public_url: String::new(),
            notify_delay: Duration::from_millis(50),
            notify_jitter: Duration::ZERO,
            duplicate_fraction: 0.0,
            attempt_failed_fraction: 0.0,
            reorder: false,
            delivery_failures: 0,
            max_deliveries: 20,
            retry_base: Duration::from_millis(200),
            refund_failures: 0,
            drop_notifications: false,
            refund_delay: Duration::ZERO,
            seed: 1,
            notify_tls: flashsale_platform::tls::GrpcTlsSettings::default(),
        }
    }
}

impl SimConfig {
    /// Refuses settings the simulator cannot run with, naming the option.
    pub fn validate(&self) -> anyhow::Result<()> {
        for (name, value) in [
            ("--api-key", &self.api_key),
            ("--webhook-secret", &self.webhook_secret),
        ] {
            anyhow::ensure!(
                value.len() >= PAYMENT_SECRET_MIN_LEN,
                "{name} must be at least {PAYMENT_SECRET_MIN_LEN} bytes"
            );
        }
        for (name, value) in [
            ("--duplicate-fraction", self.duplicate_fraction),
            ("--attempt-failed-fraction", self.attempt_failed_fraction),
        ] {
            anyhow::ensure!(
                (0.0..=1.0).contains(&value),
                "{name} must be within 0..=1 (got {value})"
            );
        }
        anyhow::ensure!(
            self.max_deliveries > self.delivery_failures.min(1_000_000),
            "--max-deliveries ({}) must exceed --delivery-failures ({}), or no notification arrives",
            self.max_deliveries,
            self.delivery_failures
        );
        anyhow::ensure!(
            self.public_url.is_empty()
                || self.public_url.starts_with("http://")
                || self.public_url.starts_with("https://"),
            "--public-url must be an http(s) URL"
        );
        Ok(())
    }
}

/// A simulator serving on a port of its own until stopped (or dropped).
pub struct Running {
    pub port: u16,
    pub simulator: Simulator,
    shutdown: Shutdown,
}

impl Running {
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// What the notifier did so far.
    pub fn stats(&self) -> Stats {
        self.simulator.stats()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.shutdown.trigger();
    }
}

/// Starts the simulator on `listener` in this process (tests; the binary uses [`serve`]).
pub async fn start(config: SimConfig, listener: TcpListener) -> anyhow::Result<Running> {
    config.validate()?;
    let port = listener.local_addr().context("simulator address")?.port();
    let simulator = Simulator::new(config, port);
    let shutdown = Shutdown::new();
    let (sim, stop) = (simulator.clone(), shutdown.clone());
    tokio::spawn(async move {
        if let Err(e) = serve_with(sim, listener, async move { stop.wait().await }).await {
            tracing::error!(error = %e, "payment simulator stopped");
        }
    });
    Ok(Running {
        port,
        simulator,
        shutdown,
    })
}

/// Serves the simulator on `listener` until `shutdown` resolves.
pub async fn serve(
    config: SimConfig,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    config.validate()?;
    let port = listener.local_addr().context("simulator address")?.port();
    serve_with(Simulator::new(config, port), listener, shutdown).await
}

async fn serve_with(
    simulator: Simulator,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let routes = ServerRoutes::new().with_service(PaymentProviderServiceServer::new(simulator));
    let settings = GrpcSettings::on_port(0);
    flashsale_platform::grpc::serve(listener, &settings, routes, shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_settings_are_refused_naming_the_option() {
        type Case = (&'static str, fn(&mut SimConfig));
        let cases: [Case; 7] = [
            ("--api-key", |c| c.api_key = "short".into()),
            ("--webhook-secret", |c| c.webhook_secret.clear()),
            ("--duplicate-fraction", |c| c.duplicate_fraction = 1.5),
            ("--attempt-failed-fraction", |c| {
                c.attempt_failed_fraction = -0.1
            }),
            ("--max-deliveries", |c| {
                c.delivery_failures = 3;
                c.max_deliveries = 3;
            }),
            ("--public-url", |c| c.public_url = "pay.example".into()),
            ("--duplicate-fraction", |c| c.duplicate_fraction = f64::NAN),
        ];
        assert!(SimConfig::default().validate().is_ok());
        for (name, mutate) in cases {
            let mut c = SimConfig::default();
            mutate(&mut c);
            let e = c
                .validate()
                .map(|()| String::new())
                .unwrap_or_else(|e| e.to_string());
            assert!(e.contains(name), "`{e}` does not name {name}");
        }
    }
}
