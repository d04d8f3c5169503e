//! The configuration sections every service shares. A service's own `Settings` struct is made
//! of these plus its own sections; see `crates/*/src/config.rs`.

use serde::{Deserialize, Serialize};

mod redis;

pub use redis::{MAX_CLUSTER_NODES, REDIS_CLUSTER, REDIS_STANDALONE, RedisSettings};

use crate::{
    config::{ConfigError, Validate, check_range, check_socket_addr, check_url},
    tls::GrpcTlsSettings,
};

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
    /// TLS of the server and of this service's calls to other services (`grpc.tls.*`).
    #[serde(default)]
    pub tls: GrpcTlsSettings,
}

impl GrpcSettings {
    pub fn on_port(port: u16) -> Self {
        Self {
            addr: format!("0.0.0.0:{port}"),
            max_message_bytes: 4 * 1024 * 1024,
            request_timeout_ms: 5_000,
            max_concurrent_requests: 4_096,
            tls: GrpcTlsSettings::default(),
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
        )?;
        self.tls.validate(&format!("{p}.tls"))
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
    /// Whether `serve` applies pending migrations at start-up (under the service's migration
    /// lock). `false`: a separate `migrate` step does (a Kubernetes init container), and `serve`
    /// refuses to start while a migration is pending.
    #[serde(default = "migrate_on_start")]
    pub migrate_on_start: bool,
}

fn migrate_on_start() -> bool {
    true
}

impl std::fmt::Debug for DatabaseSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatabaseSettings")
            .field("url", &redact_url(&self.url))
            .field("max_connections", &self.max_connections)
            .field("migrate_on_start", &self.migrate_on_start)
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
        for (k, v) in url.query_pairs() {
            let allowed: &[&str] = match k.as_ref() {
                "sslmode" => &[
                    "disable",
                    "allow",
                    "prefer",
                    "require",
                    "verify-ca",
                    "verify-full",
                ],
                _ => continue,
            };
            if !allowed.contains(&v.as_ref()) {
                return Err(ConfigError::invalid(
                    &key,
                    format!("sslmode must be one of {allowed:?}, got `{v}`"),
                ));
            }
        }
        for file in ["sslrootcert", "sslcert", "sslkey"] {
            if let Some((_, path)) = url.query_pairs().find(|(k, _)| k == file) {
                crate::tls::read_pem(&format!("{key} ({file})"), &path)?;
            }
        }
        check_range(
            &format!("{p}.max_connections"),
            self.max_connections,
            1,
            1_000,
        )
    }
}

/// `auth.*`: which keys sign and verify bearer tokens (docs/security.md#tokens-and-keys).
#[derive(Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct AuthSettings {
    /// Allows the public development secret: it is used for a key set left empty, and accepted
    /// in a list. Only for a laptop; without it such a service refuses to start.
    pub allow_development_secret: bool,
    /// The `aud` every token must name.
    pub audience: String,
    /// The `iss` of user tokens (the gateway's identity provider).
    pub user_issuer: String,
    /// HS256 secrets user tokens may be signed with, at least 32 bytes each: a TOML array, or
    /// one string of comma-separated secrets (the environment). Several during a rotation.
    #[serde(deserialize_with = "secret_list")]
    pub user_secrets: Vec<String>,
    /// A JWKS file (RFC 7517) with the identity provider's RS256/ES256 public keys, chosen by
    /// the token's `kid`; empty = none.
    pub user_jwks_file: String,
    /// The `iss` of service and admin tokens.
    pub service_issuer: String,
    /// HS256 secrets service and admin tokens may be signed with (never one of
    /// `user_secrets`); the first signs this service's own calls.
    #[serde(deserialize_with = "secret_list")]
    pub service_secrets: Vec<String>,
    /// The one secret of earlier versions; refused with a message naming its replacements.
    pub jwt_secret: String,
}

impl Default for AuthSettings {
    fn default() -> Self {
        Self {
            allow_development_secret: false,
            audience: crate::auth::DEFAULT_AUDIENCE.to_owned(),
            user_issuer: crate::auth::DEFAULT_USER_ISSUER.to_owned(),
            user_secrets: Vec::new(),
            user_jwks_file: String::new(),
            service_issuer: crate::auth::DEFAULT_SERVICE_ISSUER.to_owned(),
            service_secrets: Vec::new(),
            jwt_secret: String::new(),
        }
    }
}

impl std::fmt::Debug for AuthSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthSettings")
            .field("allow_development_secret", &self.allow_development_secret)
            .field("audience", &self.audience)
            .field("user_issuer", &self.user_issuer)
            .field(
                "user_secrets",
                &format!("<{} redacted>", self.user_secrets.len()),
            )
            .field("user_jwks_file", &self.user_jwks_file)
            .field("service_issuer", &self.service_issuer)
            .field(
                "service_secrets",
                &format!("<{} redacted>", self.service_secrets.len()),
            )
            .finish()
    }
}

/// Secrets as a TOML array or a comma-separated string (what an environment variable holds).
fn secret_list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    struct Visitor;
    impl<'de> serde::de::Visitor<'de> for Visitor {
        type Value = Vec<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a list of secrets, or one string of comma-separated secrets")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok(v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect())
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(Vec::new())
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(s) = seq.next_element::<String>()? {
                if !s.trim().is_empty() {
                    out.push(s.trim().to_owned());
                }
            }
            Ok(out)
        }
    }
    d.deserialize_any(Visitor)
}

/// An issuer or audience: 1..=256 printable characters.
fn check_name(key: String, value: &str) -> Result<(), ConfigError> {
    if value.is_empty() || value.len() > 256 || value.chars().any(char::is_control) {
        return Err(ConfigError::invalid(
            key,
            "must be 1..=256 characters, none of them control characters",
        ));
    }
    Ok(())
}

impl Validate for AuthSettings {
    fn validate(&self, p: &str) -> Result<(), ConfigError> {
        if !self.jwt_secret.is_empty() {
            return Err(ConfigError::invalid(
                format!("{p}.jwt_secret"),
                "replaced by auth.user_secrets (user tokens) and auth.service_secrets (service \
                 and admin tokens): set those, with different secrets",
            ));
        }
        check_name(format!("{p}.audience"), &self.audience)?;
        check_name(format!("{p}.user_issuer"), &self.user_issuer)?;
        check_name(format!("{p}.service_issuer"), &self.service_issuer)?;
        let dev = crate::auth::DEV_SECRET;
        for (name, list) in [
            ("user_secrets", &self.user_secrets),
            ("service_secrets", &self.service_secrets),
        ] {
            if list.iter().any(|s| s.len() < 32) {
                return Err(ConfigError::invalid(
                    format!("{p}.{name}"),
                    "every secret must be at least 32 bytes",
                ));
            }
            if list.iter().any(|s| s == dev) && !self.allow_development_secret {
                return Err(ConfigError::invalid(
                    format!("{p}.{name}"),
                    "holds the public development secret (allowed only with \
                     auth.allow_development_secret = true, never in production)",
                ));
            }
        }
        if self
            .service_secrets
            .iter()
            .any(|s| s != dev && self.user_secrets.contains(s))
        {
            return Err(ConfigError::invalid(
                format!("{p}.service_secrets"),
                "must not share a secret with auth.user_secrets: a user key could then sign \
                 admin tokens",
            ));
        }
        if !self.user_jwks_file.is_empty() {
            crate::auth::keys::check_jwks_file(&self.user_jwks_file)
                .map_err(|e| ConfigError::invalid(format!("{p}.user_jwks_file"), e))?;
        }
        Ok(())
    }
}

/// `telemetry.*`: logs and traces.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TelemetrySettings {
    /// `pretty` or `json`.
    pub log_format: String,
    /// OTLP/gRPC collector, e.g. `http://otel-collector:4317`; empty = the endpoint of
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`, else no export.
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
    /// The product-stock gRPC endpoint: one URL, or several separated by commas. Each URL's host
    /// is resolved to all its addresses (a headless Service names every ready pod) and calls
    /// are spread over those that answer ([`crate::balance`]).
    pub product_stock_url: String,
    /// How often the product-stock URLs are resolved again and their addresses probed.
    pub product_stock_refresh_ms: u64,
}

impl UpstreamSettings {
    /// The product-stock URLs, trimmed.
    pub fn product_stock_urls(&self) -> Vec<&str> {
        crate::balance::split_urls(&self.product_stock_url)
    }

    pub fn product_stock_refresh(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.product_stock_refresh_ms)
    }
}

impl Default for UpstreamSettings {
    fn default() -> Self {
        Self {
            product_stock_url: "http://127.0.0.1:50051".into(),
            product_stock_refresh_ms: 2_000,
        }
    }
}

/// Most URLs one upstream list may hold.
const MAX_UPSTREAM_URLS: usize = 64;

/// Checks a comma-separated list of one or more distinct `http`/`https` URLs (an upstream's
/// replicas, [`crate::balance`]).
pub fn check_url_list(key: &str, list: &str) -> Result<(), ConfigError> {
    let urls = crate::balance::split_urls(list);
    if urls.len() > MAX_UPSTREAM_URLS {
        return Err(ConfigError::invalid(
            key,
            format!("at most {MAX_UPSTREAM_URLS} URLs"),
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for url in urls {
        if url.is_empty() {
            return Err(ConfigError::invalid(key, "an empty URL in the list"));
        }
        check_url(key, url, &["http", "https"])?;
        if !seen.insert(url) {
            return Err(ConfigError::invalid(
                key,
                format!("`{url}` is listed twice"),
            ));
        }
    }
    Ok(())
}

/// Checks how often an upstream's names are resolved again: 100 ms to 10 minutes.
pub fn check_refresh_ms(key: &str, value: u64) -> Result<(), ConfigError> {
    check_range(key, value, 100, 600_000)
}

impl Validate for UpstreamSettings {
    fn validate(&self, p: &str) -> Result<(), ConfigError> {
        check_url_list(&format!("{p}.product_stock_url"), &self.product_stock_url)?;
        check_refresh_ms(
            &format!("{p}.product_stock_refresh_ms"),
            self.product_stock_refresh_ms,
        )
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
                migrate_on_start: true,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn several_product_stock_urls_are_accepted_and_bad_lists_name_the_key() {
        let list = UpstreamSettings {
            product_stock_url: "http://stock-0:50051, https://stock.ns.svc:50051".into(),
            ..UpstreamSettings::default()
        };
        assert!(list.validate("order.upstream").is_ok());
        assert_eq!(
            list.product_stock_urls(),
            ["http://stock-0:50051", "https://stock.ns.svc:50051"]
        );
        for bad in [
            "",
            "http://a:1,",
            "http://a:1,ftp://b:1",
            "http://a:1,http://a:1",
        ] {
            let s = UpstreamSettings {
                product_stock_url: bad.into(),
                ..UpstreamSettings::default()
            };
            let e = s.validate("order.upstream").map_err(|e| e.to_string());
            assert!(
                e.as_ref()
                    .is_err_and(|e| e.contains("order.upstream.product_stock_url")),
                "{bad:?}: {e:?}"
            );
        }
    }
}
