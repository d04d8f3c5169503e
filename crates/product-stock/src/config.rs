//! The product-stock service's settings: the common sections plus the Redis stock gate and AMQP.
//! Keys: `product_stock.<section>.<key>`, env `FLASHSALE_PRODUCT_STOCK__<SECTION>__<KEY>`.

use flashsale_messaging::AmqpConfig;
use flashsale_platform::{
    config::{ConfigError, Validate},
    settings::{
        AuthSettings, CommonSettings, DatabaseSettings, GrpcSettings, MetricsSettings, TelemetrySettings,
        validate_common, RedisSettings},
};
use serde::{Deserialize, Serialize};

/// The config table and env segment of this service.
pub const SERVICE_KEY: &str = "product_stock";

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Settings {
    pub grpc: GrpcSettings,
    pub metrics: MetricsSettings,
    pub database: DatabaseSettings,
    pub auth: AuthSettings,
    pub telemetry: TelemetrySettings,
    pub redis: RedisSettings,
    pub amqp: AmqpConfig,
}

impl Default for Settings {
    fn default() -> Self {
        let c = CommonSettings::local(50051, 9101, "flashsale_product");
        Self {
            grpc: c.grpc,
            metrics: c.metrics,
            database: c.database,
            auth: c.auth,
            telemetry: c.telemetry,
            redis: RedisSettings::default(),
            amqp: AmqpConfig::default(),
        }
    }
}

impl Validate for Settings {
    fn validate(&self, p: &str) -> Result<(), ConfigError> {
        validate_common(p, &self.grpc, &self.metrics, &self.database, &self.auth, &self.telemetry)?;
        self.redis.validate(&format!("{p}.redis"))?;
        self.amqp
            .validate()
            .map_err(|e| flashsale_platform::config::prefixed(p, &e))
    }
}

/// Loads the settings from defaults, files and environment.
pub fn load() -> Result<Settings, ConfigError> {
    flashsale_platform::config::load(SERVICE_KEY, &Settings::default())
}
