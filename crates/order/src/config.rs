//! The order service's settings: the common sections plus Redis (sold-out cache), AMQP and the
//! product-stock endpoint. Keys: `order.<section>.<key>`, env `FLASHSALE_ORDER__<SECTION>__<KEY>`.

use flashsale_messaging::AmqpConfig;
use flashsale_platform::{
    config::{ConfigError, Validate},
    settings::{
        AuthSettings, CommonSettings, DatabaseSettings, GrpcSettings, MetricsSettings,
        RedisSettings, TelemetrySettings, UpstreamSettings, validate_common,
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
    pub redis: RedisSettings,
    pub amqp: AmqpConfig,
    pub upstream: UpstreamSettings,
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
            redis: RedisSettings::default(),
            amqp: AmqpConfig::default(),
            upstream: UpstreamSettings::default(),
        }
    }
}

impl Validate for Settings {
    fn validate(&self, p: &str) -> Result<(), ConfigError> {
        validate_common(
            p,
            &self.grpc,
            &self.metrics,
            &self.database,
            &self.auth,
            &self.telemetry,
        )?;
        self.redis.validate(&format!("{p}.redis"))?;
        self.amqp
            .validate()
            .map_err(|e| flashsale_platform::config::prefixed(p, &e))?;
        self.upstream.validate(&format!("{p}.upstream"))
    }
}

/// Loads the settings from defaults, files and environment.
pub fn load() -> Result<Settings, ConfigError> {
    flashsale_platform::config::load(SERVICE_KEY, &Settings::default())
}
