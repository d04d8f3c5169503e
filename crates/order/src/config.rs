//! The order service's settings: the common sections plus AMQP, the product-stock endpoint and
//! the saga's timings. Keys: `order.<section>.<key>`, env `FLASHSALE_ORDER__<SECTION>__<KEY>`.
//! A key nothing reads is refused at start, naming it, except the retired `order.redis`
//! section, which a configuration written for an older version may still have: it is ignored.

use flashsale_contract::payment::{
    DEV_PAYMENT_API_KEY, DEV_WEBHOOK_SECRET, PAYMENT_SECRET_MIN_LEN, check_currency,
};
use flashsale_messaging::AmqpConfig;
use flashsale_platform::{
    config::{ConfigError, Validate, check_range, check_url},
    settings::{
        AuthSettings, CommonSettings, DatabaseSettings, GrpcSettings, MetricsSettings,
        TelemetrySettings, UpstreamSettings,
    },
};
use serde::{Deserialize, Serialize};

/// The config table and env segment of this service.
pub const SERVICE_KEY: &str = "order";

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Settings {
    pub grpc: GrpcSettings,
    pub metrics: MetricsSettings,
    pub database: DatabaseSettings,
    pub auth: AuthSettings,
    pub telemetry: TelemetrySettings,
    pub amqp: AmqpConfig,
    pub upstream: UpstreamSettings,
    pub saga: SagaSettings,
    pub payment: PaymentSettings,
    pub limits: LimitSettings,
    pub admission: AdmissionSettings,
}

/// `limits.*`: what one user may ask of this service (docs/architecture.md#limits-and-load-shedding).
/// A call over a limit is answered `RESOURCE_EXHAUSTED` (reason `RATE_LIMITED`, with a
/// `google.rpc.RetryInfo`) before it reaches the gate or the database: it writes nothing.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LimitSettings {
    /// CreateOrder calls one user may make per second, on average (0: no limit) ...
    pub create_order_per_sec: u32,
    /// ... and at once after a pause.
    pub create_order_burst: u32,
    /// PayOrder calls one user may make per second, on average (0: no limit) ...
    pub pay_order_per_sec: u32,
    /// ... and at once after a pause.
    pub pay_order_burst: u32,
    /// WatchOrder streams one user may keep open at once (each polls the database).
    pub watch_streams_per_user: u32,
    /// Reads one user may make per second, on average (0: no limit): GetOrder, ListOrders and
    /// the opening of a WatchOrder share this count ...
    pub read_per_sec: u32,
    /// ... and at once after a pause.
    pub read_burst: u32,
    /// CancelOrder calls one user may make per second, on average (0: no limit) ...
    pub cancel_order_per_sec: u32,
    /// ... and at once after a pause.
    pub cancel_order_burst: u32,
    /// NotifyPayment calls one peer address may have in flight at once (the provider's
    /// notifications need no token, so anyone reaching the port may send them).
    pub notify_in_flight_per_peer: u32,
    /// A NotifyPayment whose request has not fully arrived this long after the call started is
    /// answered `DEADLINE_EXCEEDED`, freeing its place among `grpc.max_concurrent_requests`.
    pub notify_body_timeout_ms: u64,
}

impl Default for LimitSettings {
    fn default() -> Self {
        Self {
            create_order_per_sec: 10,
            create_order_burst: 20,
            pay_order_per_sec: 5,
            pay_order_burst: 10,
            watch_streams_per_user: 8,
            // A buyer's screen polls an order or a page of orders once or twice a second;
            // twenty a second (forty at once) is ten times that, while a script reading in a
            // loop (over a thousand a second) is cut off within a fraction of a second.
            read_per_sec: 20,
            read_burst: 40,
            // A buyer cancels an order or two; as PayOrder.
            cancel_order_per_sec: 5,
            cancel_order_burst: 10,
            // Far above what a provider sends at once (each notification is answered in
            // milliseconds), and a sixteenth of the default `grpc.max_concurrent_requests`.
            notify_in_flight_per_peer: 256,
            // A notification is under a kilobyte, sent with its headers: a second allows for a
            // slow link, and is what one slow sender can hold a place for.
            notify_body_timeout_ms: 1_000,
        }
    }
}

/// The largest per-second rate and burst `limits.*` accepts.
pub const MAX_RATE: u32 = 1_000_000;

impl Validate for LimitSettings {
    fn validate(&self, p: &str) -> Result<(), ConfigError> {
        check_range(
            &format!("{p}.create_order_per_sec"),
            self.create_order_per_sec,
            0,
            MAX_RATE,
        )?;
        check_range(
            &format!("{p}.create_order_burst"),
            self.create_order_burst,
            1,
            MAX_RATE,
        )?;
        check_range(
            &format!("{p}.pay_order_per_sec"),
            self.pay_order_per_sec,
            0,
            MAX_RATE,
        )?;
        check_range(
            &format!("{p}.pay_order_burst"),
            self.pay_order_burst,
            1,
            MAX_RATE,
        )?;
        check_range(
            &format!("{p}.watch_streams_per_user"),
            self.watch_streams_per_user,
            1,
            10_000,
        )?;
        check_range(&format!("{p}.read_per_sec"), self.read_per_sec, 0, MAX_RATE)?;
        check_range(&format!("{p}.read_burst"), self.read_burst, 1, MAX_RATE)?;
        check_range(
            &format!("{p}.cancel_order_per_sec"),
            self.cancel_order_per_sec,
            0,
            MAX_RATE,
        )?;
        check_range(
            &format!("{p}.cancel_order_burst"),
            self.cancel_order_burst,
            1,
            MAX_RATE,
        )?;
        check_range(
            &format!("{p}.notify_in_flight_per_peer"),
            self.notify_in_flight_per_peer,
            1,
            1_000_000,
        )?;
        check_range(
            &format!("{p}.notify_body_timeout_ms"),
            self.notify_body_timeout_ms,
            10,
            60_000,
        )
    }
}

/// The largest `saga.stuck_after_ms`, and `older_than_ms` of ListStuckOrders: 30 days.
pub const MAX_STUCK_AFTER_MS: u64 = 30 * 86_400_000;

/// `admission.*`: how much unfinished work the platform takes on
/// (docs/architecture.md#admission-control). While the orders waiting for the saga (PENDING,
/// counted with the ones this replica is still writing), or the paid orders waiting to ship
/// (PAID), are at their bound, CreateOrder refuses new buyers at once with
/// `RESOURCE_EXHAUSTED`, reason `OVERLOADED` and a `google.rpc.RetryInfo`, before the gate:
/// the orders already accepted keep flowing and drain the backlog. A bound of 0 is no bound.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AdmissionSettings {
    /// Most orders waiting for their stock to be reserved in the database (PENDING).
    pub max_unconfirmed: u64,
    /// Most paid orders waiting to be shipped (PAID).
    pub max_unshipped: u64,
    /// How often the backlog is counted (one indexed query, reading at most each bound's rows).
    pub check_interval_ms: u64,
    /// The delay a refusal's RetryInfo asks the buyer to wait.
    pub retry_after_ms: u64,
}

impl Default for AdmissionSettings {
    fn default() -> Self {
        Self {
            // Above a whole flash sale's burst (the saga confirms a few thousand orders a
            // second on one machine): the bound is for a load the platform cannot finish,
            // not for a sale it confirms within seconds. Size it as the completion rate times
            // the delay a buyer may wait for a confirmation.
            max_unconfirmed: 25_000,
            max_unshipped: 25_000,
            check_interval_ms: 100,
            retry_after_ms: 1_000,
        }
    }
}

/// The largest `admission.max_unconfirmed` and `admission.max_unshipped`.
pub const MAX_ADMISSION_BOUND: u64 = 10_000_000;

impl Validate for AdmissionSettings {
    fn validate(&self, p: &str) -> Result<(), ConfigError> {
        check_range(
            &format!("{p}.max_unconfirmed"),
            self.max_unconfirmed,
            0,
            MAX_ADMISSION_BOUND,
        )?;
        check_range(
            &format!("{p}.max_unshipped"),
            self.max_unshipped,
            0,
            MAX_ADMISSION_BOUND,
        )?;
        check_range(
            &format!("{p}.check_interval_ms"),
            self.check_interval_ms,
            10,
            60_000,
        )?;
        check_range(
            &format!("{p}.retry_after_ms"),
            self.retry_after_ms,
            1,
            600_000,
        )
    }
}

/// `saga.*`: timings and limits of the order saga.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SagaSettings {
    /// How long a buyer has to pay once the stock is persisted (default 15 minutes).
    pub payment_timeout_ms: u64,
    /// How often the sweeper cancels orders past their deadline (a lost delayed message never
    /// leaves an order stuck).
    pub sweep_interval_ms: u64,
    /// How long "sold out" is remembered per product, so a flood on it costs nothing.
    pub sold_out_cache_ms: u64,
    /// Most units one CreateOrder may ask for.
    pub max_quantity: i64,
    /// Deadline of one call to product-stock.
    pub stock_call_timeout_ms: u64,
    /// Accepting orders comes first: while orders are being accepted (one was, less than this
    /// long ago) the outbox relay holds this service's events back (0: it never does) ...
    pub intake_quiet_ms: u64,
    /// ... except events that have waited this long; once one has, the load is sustained and
    /// the relay holds nothing back until the intake has been quiet this long.
    pub intake_max_lag_ms: u64,
    /// An order unchanged this long while PENDING or PAID, or this long past its payment
    /// deadline while AWAITING_PAYMENT, is stuck: counted in `flashsale_orders_stuck` and
    /// listed by ListStuckOrders (docs/architecture.md#operations).
    pub stuck_after_ms: u64,
    /// How often the stuck orders are counted (one indexed query each time).
    pub stuck_check_interval_ms: u64,
    /// Longest a CreateOrder's order write may take, from the call's arrival (shortened to the
    /// call's own deadline and `grpc.request_timeout_ms`): a write not begun by then is dropped
    /// and one under way is cancelled by the database, so no order is written once its caller
    /// may have given up. product-stock's hold sweeper trusts a "missing" answer only because
    /// of it: `stock.hold_ttl_ms` must exceed it, with room to spare.
    pub intake_write_deadline_ms: u64,
}

/// The largest `saga.intake_write_deadline_ms`: a fifth of product-stock's default
/// `stock.hold_ttl_ms` (5 minutes).
pub const MAX_INTAKE_WRITE_DEADLINE_MS: u64 = 60_000;

impl Default for SagaSettings {
    fn default() -> Self {
        Self {
            payment_timeout_ms: 15 * 60 * 1000,
            sweep_interval_ms: 1_000,
            sold_out_cache_ms: 1_000,
            max_quantity: 100,
            stock_call_timeout_ms: 3_000,
            intake_quiet_ms: 50,
            intake_max_lag_ms: 15_000,
            stuck_after_ms: 10 * 60 * 1000,
            stuck_check_interval_ms: 30_000,
            // The default request deadline: a write takes milliseconds, and a caller that gave
            // up was told nothing.
            intake_write_deadline_ms: 5_000,
        }
    }
}

impl Validate for SagaSettings {
    fn validate(&self, p: &str) -> Result<(), ConfigError> {
        check_range(
            &format!("{p}.payment_timeout_ms"),
            self.payment_timeout_ms,
            100,
            7 * 86_400_000,
        )?;
        check_range(
            &format!("{p}.sweep_interval_ms"),
            self.sweep_interval_ms,
            10,
            3_600_000,
        )?;
        check_range(
            &format!("{p}.sold_out_cache_ms"),
            self.sold_out_cache_ms,
            0,
            60_000,
        )?;
        check_range(
            &format!("{p}.max_quantity"),
            self.max_quantity,
            1,
            1_000_000,
        )?;
        check_range(
            &format!("{p}.stock_call_timeout_ms"),
            self.stock_call_timeout_ms,
            10,
            60_000,
        )?;
        check_range(
            &format!("{p}.intake_quiet_ms"),
            self.intake_quiet_ms,
            0,
            10_000,
        )?;
        check_range(
            &format!("{p}.intake_max_lag_ms"),
            self.intake_max_lag_ms,
            10,
            60_000,
        )?;
        check_range(
            &format!("{p}.stuck_after_ms"),
            self.stuck_after_ms,
            1_000,
            MAX_STUCK_AFTER_MS,
        )?;
        check_range(
            &format!("{p}.stuck_check_interval_ms"),
            self.stuck_check_interval_ms,
            1_000,
            3_600_000,
        )?;
        check_range(
            &format!("{p}.intake_write_deadline_ms"),
            self.intake_write_deadline_ms,
            10,
            MAX_INTAKE_WRITE_DEADLINE_MS,
        )
    }
}

/// `payment.*`: the payment provider (docs/architecture.md#payments).
#[derive(Clone, Serialize, Deserialize)]
pub struct PaymentSettings {
    /// The provider's gRPC endpoint (`flashsale.payment.v1.PaymentProviderService`).
    pub provider_url: String,
    /// The merchant's API key, sent on every call to the provider. Required (at least 32
    /// bytes); a secret: set it through the environment.
    pub api_key: String,
    /// The secret the provider signs its notifications with (HMAC-SHA256). Required (at least
    /// 32 bytes); a secret: set it through the environment.
    pub webhook_secret: String,
    /// Where the provider sends notifications (this service's gRPC endpoint, as the provider
    /// reaches it); empty: `http://<grpc.addr>` with an unspecified address read as 127.0.0.1.
    pub notify_url: String,
    /// ISO 4217 code of the prices (the provider charges the order's total in it).
    pub currency: String,
    /// Deadline of one call to the provider.
    pub call_timeout_ms: u64,
    /// A notification signed further than this from now is refused (bounds replays).
    pub notification_tolerance_ms: u64,
    /// Calls to the provider for one refund before it is parked FAILED.
    pub refund_max_attempts: u32,
    /// Delay after a refund's first failed attempt, doubling each attempt (at most 10 minutes).
    pub refund_retry_base_ms: u64,
    /// How often refunds that are due are looked for.
    pub refund_sweep_interval_ms: u64,
    /// A started payment whose success has not arrived this long after it was started is asked
    /// about at the provider (reconciliation); then again each time its age doubles, for a day.
    pub reconcile_after_ms: u64,
    /// How often payments due a question to the provider are looked for.
    pub reconcile_interval_ms: u64,
}

impl std::fmt::Debug for PaymentSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = |s: &str| {
            if s.is_empty() {
                "<unset>"
            } else {
                "<redacted>"
            }
        };
        f.debug_struct("PaymentSettings")
            .field("provider_url", &self.provider_url)
            .field("api_key", &shown(&self.api_key))
            .field("webhook_secret", &shown(&self.webhook_secret))
            .field("notify_url", &self.notify_url)
            .field("currency", &self.currency)
            .field("call_timeout_ms", &self.call_timeout_ms)
            .field("notification_tolerance_ms", &self.notification_tolerance_ms)
            .field("refund_max_attempts", &self.refund_max_attempts)
            .field("refund_retry_base_ms", &self.refund_retry_base_ms)
            .field("refund_sweep_interval_ms", &self.refund_sweep_interval_ms)
            .field("reconcile_after_ms", &self.reconcile_after_ms)
            .field("reconcile_interval_ms", &self.reconcile_interval_ms)
            .finish()
    }
}

impl Default for PaymentSettings {
    /// No secrets: a service started without `payment.api_key` and `payment.webhook_secret`
    /// (config/default.toml carries the development ones) refuses to start.
    fn default() -> Self {
        Self {
            provider_url: "http://127.0.0.1:50054".into(),
            api_key: String::new(),
            webhook_secret: String::new(),
            notify_url: String::new(),
            currency: "EUR".into(),
            call_timeout_ms: 3_000,
            notification_tolerance_ms: 300_000,
            refund_max_attempts: 8,
            refund_retry_base_ms: 1_000,
            refund_sweep_interval_ms: 1_000,
            reconcile_after_ms: 300_000,
            reconcile_interval_ms: 60_000,
        }
    }
}

impl PaymentSettings {
    /// Whether a development secret or key is in use (the service warns loudly).
    pub fn uses_development_secrets(&self) -> bool {
        self.webhook_secret == DEV_WEBHOOK_SECRET || self.api_key == DEV_PAYMENT_API_KEY
    }
}

fn check_secret(key: &str, value: &str) -> Result<(), ConfigError> {
    if value.is_empty() {
        return Err(ConfigError::invalid(
            key,
            "is not set: the payment provider's secret is required (set it through the environment)",
        ));
    }
    if value.len() < PAYMENT_SECRET_MIN_LEN {
        return Err(ConfigError::invalid(
            key,
            format!("must be at least {PAYMENT_SECRET_MIN_LEN} bytes"),
        ));
    }
    Ok(())
}

impl Validate for PaymentSettings {
    fn validate(&self, p: &str) -> Result<(), ConfigError> {
        check_url(
            &format!("{p}.provider_url"),
            &self.provider_url,
            &["http", "https"],
        )?;
        check_secret(&format!("{p}.api_key"), &self.api_key)?;
        check_secret(&format!("{p}.webhook_secret"), &self.webhook_secret)?;
        if !self.notify_url.is_empty() {
            check_url(
                &format!("{p}.notify_url"),
                &self.notify_url,
                &["http", "https"],
            )?;
        }
        check_currency(&self.currency)
            .map_err(|why| ConfigError::invalid(format!("{p}.currency"), why))?;
        check_range(
            &format!("{p}.call_timeout_ms"),
            self.call_timeout_ms,
            10,
            60_000,
        )?;
        check_range(
            &format!("{p}.notification_tolerance_ms"),
            self.notification_tolerance_ms,
            1_000,
            86_400_000,
        )?;
        check_range(
            &format!("{p}.refund_max_attempts"),
            self.refund_max_attempts,
            1,
            100,
        )?;
        check_range(
            &format!("{p}.refund_retry_base_ms"),
            self.refund_retry_base_ms,
            10,
            600_000,
        )?;
        check_range(
            &format!("{p}.refund_sweep_interval_ms"),
            self.refund_sweep_interval_ms,
            10,
            3_600_000,
        )?;
        check_range(
            &format!("{p}.reconcile_after_ms"),
            self.reconcile_after_ms,
            1_000,
            86_400_000,
        )?;
        check_range(
            &format!("{p}.reconcile_interval_ms"),
            self.reconcile_interval_ms,
            10,
            3_600_000,
        )
    }
}

impl Default for Settings {
    fn default() -> Self {
        let c = CommonSettings::local(50052, 9102, "flashsale_orders");
        Self {
            grpc: c.grpc,
            metrics: c.metrics,
            database: c.database,
            auth: c.auth,
            telemetry: c.telemetry,
            amqp: AmqpConfig::default(),
            upstream: UpstreamSettings::default(),
            saga: SagaSettings::default(),
            payment: PaymentSettings::default(),
            limits: LimitSettings::default(),
            admission: AdmissionSettings::default(),
        }
    }
}

flashsale_platform::common_settings!(Settings);

impl Validate for Settings {
    /// The order service reached Redis itself before the gate moved behind product-stock.
    fn retired_keys() -> &'static [&'static str] {
        &["redis"]
    }

    fn validate(&self, p: &str) -> Result<(), ConfigError> {
        self.common().validate(p)?;
        self.amqp.validate_under(p)?;
        self.upstream.validate(&format!("{p}.upstream"))?;
        self.saga.validate(&format!("{p}.saga"))?;
        self.payment.validate(&format!("{p}.payment"))?;
        self.limits.validate(&format!("{p}.limits"))?;
        self.admission.validate(&format!("{p}.admission"))
    }
}

/// Loads the settings from defaults, files and environment.
pub fn load() -> Result<Settings, ConfigError> {
    flashsale_platform::config::load(SERVICE_KEY, &Settings::default())
}

#[cfg(test)]
mod tests;
