//! The configuration sections every service shares. A service's own `Settings` struct is made
//! of these plus its own sections; see `crates/*/src/config.rs`.

use serde::{Deserialize, Serialize};

use crate::config::{ConfigError, Validate, check_range, check_socket_addr, check_url};

/// `grpc.*`: where and how the gRPC server listens.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GrpcSettings {
    /// Listen address, `ip:port`.
    pub addr: String,
    /// Largest request or response message, in bytes.
    pub max_message_bytes: usize,
    /// Deadline for one unary request, in milliseconds (streams are not cut).
    pub request_timeout_ms: u64,
    /// Calls in flight at once, over every connection; one more is answered `UNAVAILABLE`
    /// (reason `OVERLOADED`) at once instead of waiting. Health checks are not counted.
    pub max_concurrent_requests: usize,
}

impl GrpcSettings {
    pub fn on_port(port: u16) -> Self {
        Self {
            addr: format!("0.0.0.0:{port}"),
            max_message_bytes: 4 * 1024 * 1024,
            request_timeout_ms: 5_000,
            max_concurrent_requests: 4_096,
        }
    }
}

impl Validate for GrpcSettings {
    fn validate(&self, p: &str) -> Result<(), ConfigError> {
        check_socket_addr(&format!("{p}.addr"), &self.addr)?;
        check_range(
            &format!("{p}.max_message_bytes"),
            self.max_message_bytes,
            1024,
            64 << 20,
        )?;
        check_range(
            &format!("{p}.request_timeout_ms"),
            self.request_timeout_ms,
            1,
            600_000,
        )?;
        check_range(
            &format!("{p}.max_concurrent_requests"),
            self.max_concurrent_requests,
            1,
            1_000_000,
        )
    }
}

/// `metrics.*`: the Prometheus `/metrics` endpoint.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MetricsSettings {
    /// Listen address, `ip:port`.
    pub addr: String,
}

impl Validate for MetricsSettings {
    fn validate(&self, p: &str) -> Result<(), ConfigError> {
        check_socket_addr(&format!("{p}.addr"), &self.addr).map(drop)
    }
}

/// `database.*`: the service's own PostgreSQL database.
#[derive(Clone, Serialize, Deserialize)]
pub struct DatabaseSettings {
    /// `postgres://user[:password]@host[:port]/database`; created if missing.
    pub url: String,
    /// Pool size.
    pub max_connections: u32,
}

impl std::fmt::Debug for DatabaseSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatabaseSettings")
            .field("url", &redact_url(&self.url))
            .field("max_connections", &self.max_connections)
            .finish()
    }
}

impl Validate for DatabaseSettings {
    fn validate(&self, p: &str) -> Result<(), ConfigError> {
        let key = format!("{p}.url");
        let url = check_url(&key, &self.url, &["postgres", "postgresql"])?;
        let db = url.path().trim_start_matches('/');
        if db.is_empty() || db.contains('/') {
            return Err(ConfigError::invalid(
                key,
                "URL must name one database, e.g. /flashsale_orders",
            ));
        }
        check_range(
            &format!("{p}.max_connections"),
            self.max_connections,
            1,
            1_000,
        )
    }
}

/// `redis.*`: the stock gate.
#[derive(Clone, Serialize, Deserialize)]
pub struct RedisSettings {
    /// `redis://host:port[/db]`.
    pub url: String,
    /// Prepended to every key (tests give each run its own).
    pub key_prefix: String,
    /// Pool size.
    pub pool_size: usize,
}

impl Default for RedisSettings {
    fn default() -> Self {
        Self {
            url: "redis://127.0.0.1:6379".into(),
            key_prefix: String::new(),
            pool_size: 32,
        }
    }
}

impl std::fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSettings")
            .field("url", &redact_url(&self.url))
            .field("key_prefix", &self.key_prefix)
            .field("pool_size", &self.pool_size)
            .finish()
    }
}

impl Validate for RedisSettings {
    fn validate(&self, p: &str) -> Result<(), ConfigError> {
        check_url(&format!("{p}.url"), &self.url, &["redis", "rediss"])?;
        if self.key_prefix.len() > 64 || self.key_prefix.contains(['{', '}', ' ']) {
            return Err(ConfigError::invalid(
                format!("{p}.key_prefix"),
                "at most 64 characters, no braces or spaces (braces are hash tags)",
            ));
        }
        check_range(&format!("{p}.pool_size"), self.pool_size, 1, 1_024)
    }
}

/// `auth.*`: verification of bearer tokens.
#[derive(Clone, Default, Serialize, Deserialize)]
pub struct AuthSettings {
    /// HS256 secret shared with whoever mints tokens. Empty: a built-in development secret
    /// (logged as a loud warning at start-up).
    pub jwt_secret: String,
}

impl std::fmt::Debug for AuthSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = if self.jwt_secret.is_empty() {
            "<dev default>"
        } else {
            "<redacted>"
        };
        f.debug_struct("AuthSettings")
            .field("jwt_secret", &shown)
            .finish()
    }
}

impl Validate for AuthSettings {
    fn validate(&self, p: &str) -> Result<(), ConfigError> {
        if !self.jwt_secret.is_empty() && self.jwt_secret.len() < 32 {
            return Err(ConfigError::invalid(
                format!("{p}.jwt_secret"),
                "must be at least 32 bytes (or empty for the development secret)",
            ));
        }
        Ok(())
    }
}

/// `telemetry.*`: logs and traces.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TelemetrySettings {
    /// `pretty` or `json`.
    pub log_format: String,
    /// OTLP/gRPC collector, e.g. `http://otel-collector:4317`; empty = no export.
    pub otlp_endpoint: String,
}

impl Default for TelemetrySettings {
    fn default() -> Self {
        Self {
            log_format: "pretty".into(),
            otlp_endpoint: String::new(),
        }
    }
}

impl Validate for TelemetrySettings {
    fn validate(&self, p: &str) -> Result<(), ConfigError> {
        if !matches!(self.log_format.as_str(), "pretty" | "json") {
            return Err(ConfigError::invalid(
                format!("{p}.log_format"),
                format!("must be `pretty` or `json`, got `{}`", self.log_format),
            ));
        }
        if !self.otlp_endpoint.is_empty() {
            check_url(
                &format!("{p}.otlp_endpoint"),
                &self.otlp_endpoint,
                &["http", "https"],
            )?;
        }
        Ok(())
    }
}

/// `upstream.*`: other services this one calls.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct UpstreamSettings {
    /// The product-stock gRPC endpoint.
    pub product_stock_url: String,
}

impl Default for UpstreamSettings {
    fn default() -> Self {
        Self {
            product_stock_url: "http://127.0.0.1:50051".into(),
        }
    }
}

impl Validate for UpstreamSettings {
    fn validate(&self, p: &str) -> Result<(), ConfigError> {
        check_url(
            &format!("{p}.product_stock_url"),
            &self.product_stock_url,
            &["http", "https"],
        )
        .map(drop)
    }
}

/// `url` with any password replaced, for logs.
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) => {
            if u.password().is_some() {
                let _ = u.set_password(Some("***"));
            }
            u.to_string()
        }
        Err(_) => "<unparsable url>".to_owned(),
    }
}

/// The sections every service has. A service's `Settings` holds them as its own top-level
/// fields (`grpc`, `metrics`, `database`, `auth`, `telemetry`) rather than through
/// `#[serde(flatten)]`, which would hide the full key from type errors.
#[derive(Clone, Debug)]
pub struct CommonSettings {
    pub grpc: GrpcSettings,
    pub metrics: MetricsSettings,
    pub database: DatabaseSettings,
    pub auth: AuthSettings,
    pub telemetry: TelemetrySettings,
}

impl CommonSettings {
    /// Defaults for a service on `grpc_port`, `metrics_port` and database `db_name` on the local
    /// PostgreSQL.
    pub fn local(grpc_port: u16, metrics_port: u16, db_name: &str) -> Self {
        Self {
            grpc: GrpcSettings::on_port(grpc_port),
            metrics: MetricsSettings {
                addr: format!("0.0.0.0:{metrics_port}"),
            },
            database: DatabaseSettings {
                url: format!("postgres://postgres@127.0.0.1:5432/{db_name}"),
                max_connections: 20,
            },
            auth: AuthSettings::default(),
            telemetry: TelemetrySettings::default(),
        }
    }
}

/// Validates the common sections of a service whose table is `p`.
pub fn validate_common(
    p: &str,
    grpc: &GrpcSettings,
    metrics: &MetricsSettings,
    database: &DatabaseSettings,
    auth: &AuthSettings,
    telemetry: &TelemetrySettings,
) -> Result<(), ConfigError> {
    grpc.validate(&format!("{p}.grpc"))?;
    metrics.validate(&format!("{p}.metrics"))?;
    database.validate(&format!("{p}.database"))?;
    auth.validate(&format!("{p}.auth"))?;
    telemetry.validate(&format!("{p}.telemetry"))
}
