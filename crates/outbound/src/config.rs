//! The outbound service's settings: the common sections plus AMQP and the product-stock
//! endpoint. Keys: `outbound.<section>.<key>`, env `FLASHSALE_OUTBOUND__<SECTION>__<KEY>`.

use flashsale_messaging::AmqpConfig;
use flashsale_platform::{
    config::{ConfigError, Validate},
    settings::{
        AuthSettings, CommonSettings, DatabaseSettings, GrpcSettings, MetricsSettings,
        TelemetrySettings, UpstreamSettings, validate_common,
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
