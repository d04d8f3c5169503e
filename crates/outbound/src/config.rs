//! The outbound service's settings: the common sections plus AMQP and the product-stock
//! endpoint. Keys: `outbound.<section>.<key>`, env `FLASHSALE_OUTBOUND__<SECTION>__<KEY>`.

use flashsale_messaging::AmqpConfig;
use flashsale_platform::{
    config::{ConfigError, Validate, check_range},
    limit::ReadLimitSettings,
    settings::{
        AuthSettings, CommonSettings, DatabaseSettings, GrpcSettings, MetricsSettings,
        TelemetrySettings, UpstreamSettings,
    },
};
use serde::{Deserialize, Serialize};

/// The config table and env segment of this service.
pub const SERVICE_KEY: &str = "outbound";

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Settings {
    pub grpc: GrpcSettings,
    pub metrics: MetricsSettings,
    pub database: DatabaseSettings,
    pub auth: AuthSettings,
    pub telemetry: TelemetrySettings,
    pub amqp: AmqpConfig,
    pub upstream: UpstreamSettings,
    pub shipping: ShippingSettings,
    pub warehouse: WarehouseSettings,
    /// `limits.*`: GetShipment calls one buyer may make (admin calls are not counted).
    pub limits: ReadLimitSettings,
}

/// `shipping.*`: how a shipment is retried. A transient failure (product-stock, the warehouse
/// or the database not answering) delays a shipment and never fails it; only a permanent answer
/// does. A shipment delayed past `alert_after_ms` is reported (a warning log and the
/// `flashsale_shipments_overdue` gauge) and listed by `ListShipments` with `older_than_ms`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ShippingSettings {
    /// Wait after a shipment's first delayed attempt; doubles with each further one.
    pub retry_base_ms: u64,
    /// Longest wait between two attempts at a shipment.
    pub retry_max_ms: u64,
    /// A shipment whose worker died mid-attempt is taken up again by the sweeper after this.
    pub stuck_after_ms: u64,
    /// How often the sweeper looks for shipments due for another attempt.
    pub sweep_interval_ms: u64,
    /// A shipment still not shipped this long after its order was paid is overdue.
    pub alert_after_ms: u64,
    /// Deadline of one CommitReservation call.
    pub commit_timeout_ms: u64,
}

impl Default for ShippingSettings {
    fn default() -> Self {
        Self {
            retry_base_ms: 200,
            retry_max_ms: 30_000,
            stuck_after_ms: 30_000,
            sweep_interval_ms: 1_000,
            alert_after_ms: 600_000,
            commit_timeout_ms: 3_000,
        }
    }
}

impl Validate for ShippingSettings {
    fn validate(&self, p: &str) -> Result<(), ConfigError> {
        check_range(&format!("{p}.retry_base_ms"), self.retry_base_ms, 1, 60_000)?;
        check_range(
            &format!("{p}.retry_max_ms"),
            self.retry_max_ms,
            self.retry_base_ms,
            3_600_000,
        )?;
        check_range(
            &format!("{p}.stuck_after_ms"),
            self.stuck_after_ms,
            100,
            86_400_000,
        )?;
        check_range(
            &format!("{p}.sweep_interval_ms"),
            self.sweep_interval_ms,
            10,
            3_600_000,
        )?;
        check_range(
            &format!("{p}.alert_after_ms"),
            self.alert_after_ms,
            1_000,
            30 * 86_400_000,
        )?;
        check_range(
            &format!("{p}.commit_timeout_ms"),
            self.commit_timeout_ms,
            10,
            60_000,
        )
    }
}

/// `warehouse.*`: the built-in warehouse adapter (a real integration replaces it).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct WarehouseSettings {
    /// Share of shipments the warehouse fails, 0.0..=1.0 (demos and compensation tests).
    pub fail_fraction: f64,
    /// Comma-separated SKUs whose every shipment fails.
    pub fail_skus: String,
}

impl WarehouseSettings {
    pub fn skus(&self) -> Vec<String> {
        self.fail_skus
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    }
}

impl Validate for WarehouseSettings {
    fn validate(&self, p: &str) -> Result<(), ConfigError> {
        if !(0.0..=1.0).contains(&self.fail_fraction) {
            return Err(ConfigError::invalid(
                format!("{p}.fail_fraction"),
                "must be within 0.0..=1.0",
            ));
        }
        if self
            .skus()
            .iter()
            .any(|s| flashsale_contract::check_sku(s).is_err())
        {
            return Err(ConfigError::invalid(
                format!("{p}.fail_skus"),
                "comma-separated SKUs of [A-Za-z0-9._-]{1,64}",
            ));
        }
        Ok(())
    }
}

impl Default for Settings {
    fn default() -> Self {
        let c = CommonSettings::local(50053, 9103, "flashsale_outbound");
        Self {
            grpc: c.grpc,
            metrics: c.metrics,
            database: c.database,
            auth: c.auth,
            telemetry: c.telemetry,
            amqp: AmqpConfig::default(),
            upstream: UpstreamSettings::default(),
            shipping: ShippingSettings::default(),
            warehouse: WarehouseSettings::default(),
            limits: ReadLimitSettings::default(),
        }
    }
}

flashsale_platform::common_settings!(Settings);

impl Validate for Settings {
    fn validate(&self, p: &str) -> Result<(), ConfigError> {
        self.common().validate(p)?;
        self.amqp.validate_under(p)?;
        self.upstream.validate(&format!("{p}.upstream"))?;
        self.shipping.validate(&format!("{p}.shipping"))?;
        self.warehouse.validate(&format!("{p}.warehouse"))?;
        self.limits.validate(&format!("{p}.limits"))
    }
}

/// Loads the settings from defaults, files and environment.
pub fn load() -> Result<Settings, ConfigError> {
    flashsale_platform::config::load(SERVICE_KEY, &Settings::default())
}

#[cfg(test)]
mod tests {
    use flashsale_test_support::settings::each_is_refused_naming_its_key;

    use super::*;

    #[test]
    fn bad_shipping_and_warehouse_values_name_their_key() {
        type Case = flashsale_test_support::settings::Case<Settings>;
        let cases: [Case; 13] = [
            ("outbound.shipping.retry_base_ms", |s| {
                s.shipping.retry_base_ms = 0
            }),
            ("outbound.shipping.retry_max_ms", |s| {
                s.shipping.retry_max_ms = s.shipping.retry_base_ms - 1
            }),
            ("outbound.shipping.alert_after_ms", |s| {
                s.shipping.alert_after_ms = 999
            }),
            ("outbound.shipping.alert_after_ms", |s| {
                s.shipping.alert_after_ms = 31 * 86_400_000
            }),
            ("outbound.shipping.stuck_after_ms", |s| {
                s.shipping.stuck_after_ms = 1
            }),
            ("outbound.warehouse.fail_fraction", |s| {
                s.warehouse.fail_fraction = 1.5
            }),
            ("outbound.warehouse.fail_skus", |s| {
                s.warehouse.fail_skus = "OK, bad sku".into()
            }),
            ("outbound.upstream.product_stock_url", |s| {
                s.upstream.product_stock_url = "nope".into()
            }),
            ("outbound.upstream.product_stock_url", |s| {
                s.upstream.product_stock_url = "http://a:1,,http://b:1".into()
            }),
            ("outbound.upstream.product_stock_refresh_ms", |s| {
                s.upstream.product_stock_refresh_ms = 0
            }),
            ("outbound.limits.read_per_sec", |s| {
                s.limits.read_per_sec = 1_000_001
            }),
            ("outbound.limits.read_burst", |s| s.limits.read_burst = 0),
            ("outbound.limits.read_burst", |s| {
                s.limits.read_burst = 1_000_001
            }),
        ];
        each_is_refused_naming_its_key(&Settings::default(), SERVICE_KEY, &cases);
        let w = WarehouseSettings {
            fail_fraction: 0.0,
            fail_skus: " A, B ,,".into(),
        };
        assert_eq!(w.skus(), ["A", "B"]);
    }
}
