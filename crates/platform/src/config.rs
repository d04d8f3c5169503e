//! Layered configuration: built-in defaults → `config/default.toml` → `config/{FLASHSALE_ENV}.toml`
//! → environment (`FLASHSALE_<SERVICE>__<SECTION>__<KEY>`, `__` between levels). Env wins, so
//! Kubernetes ConfigMaps and Secrets override files. Every service validates what it loaded and
//! refuses to start with an error naming the bad key.

use std::path::PathBuf;

use config::{Config, Environment, File, FileFormat};
use serde::{Serialize, de::DeserializeOwned};

/// Why configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A source could not be read or a value has the wrong type (the message names the key).
    #[error("configuration: {0}")]
    Load(#[from] config::ConfigError),
    /// A value parsed but is not acceptable.
    #[error("invalid configuration `{key}`: {reason}")]
    Invalid { key: String, reason: String },
}

impl ConfigError {
    /// An [`ConfigError::Invalid`] for `key`.
    pub fn invalid(key: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Invalid {
            key: key.into(),
            reason: reason.into(),
        }
    }
}

/// Settings that can say what is wrong with themselves. `prefix` is the dotted path of the
/// section (e.g. `order.database`), so errors name the full key.
pub trait Validate {
    fn validate(&self, prefix: &str) -> Result<(), ConfigError>;

    /// Keys an earlier version read and this one still accepts, and ignores, as dotted paths
    /// under the service (`redis`: a whole section); any other key nothing reads is refused.
    fn retired_keys() -> &'static [&'static str]
    where
        Self: Sized,
    {
        &[]
    }

    /// Whether a key nothing in these settings reads is refused (a service's settings). A view
    /// of one section of them, as a test of that section loads, accepts the others.
    fn refuses_unknown_keys() -> bool
    where
        Self: Sized,
    {
        true
    }
}

/// Where config files are read from: `$FLASHSALE_CONFIG_DIR`, else `./config`.
pub fn config_dir() -> PathBuf {
    std::env::var_os("FLASHSALE_CONFIG_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("config"))
}

/// Loads the settings of `service` (the table name, e.g. `product_stock`) from all layers,
/// starting from `defaults`, then validates them.
pub fn load<T>(service: &str, defaults: &T) -> Result<T, ConfigError>
where
    T: Serialize + DeserializeOwned + Validate,
{
    let dir = config_dir();
    let env_name = std::env::var("FLASHSALE_ENV").ok();
    load_from(
        service,
        defaults,
        &dir,
        env_name.as_deref(),
        environment(None),
    )
}

/// The environment layer: `FLASHSALE_<SERVICE>__<SECTION>__<KEY>` variables, from the process's
/// environment, or from `vars` where given (tests, and checks of the variables deployment files
/// set).
pub fn environment(vars: Option<std::collections::HashMap<String, String>>) -> Environment {
    Environment::with_prefix("FLASHSALE")
        .prefix_separator("_")
        .separator("__")
        .try_parsing(true)
        .source(vars)
}

/// [`load`] with explicit sources, for tests (never `set_var` in tests).
pub fn load_from<T>(
    service: &str,
    defaults: &T,
    dir: &std::path::Path,
    env_name: Option<&str>,
    env: Environment,
) -> Result<T, ConfigError>
where
    T: Serialize + DeserializeOwned + Validate,
{
    // The defaults as serde writes them: the config crate's own copy drops keys whose default
    // is an empty list or unset.
    let known = serde_json::to_value(defaults)
        .map_err(|e| ConfigError::invalid(service, format!("defaults: {e}")))?;
    let defaults = Config::try_from(&std::collections::BTreeMap::from([(service, defaults)]))?;
    let mut builder = Config::builder().add_source(defaults).add_source(
        File::from(dir.join("default.toml"))
            .format(FileFormat::Toml)
            .required(false),
    );
    if let Some(name) = env_name.filter(|n| !n.is_empty()) {
        builder = builder.add_source(
            File::from(dir.join(format!("{name}.toml")))
                .format(FileFormat::Toml)
                .required(false),
        );
    }
    let cfg = builder.add_source(env).build()?;
    // `Config::get` would replace the failing key's path with `service`; deserializing a table
    // `{service: …}` keeps the full dotted key (`order.grpc.addr`) in type errors.
    let table = cfg.get_table(service)?;
    let mut unknown = Vec::new();
    if T::refuses_unknown_keys() {
        unknown_keys(service, &table, &known, &mut unknown);
    }
    unknown.retain(|path| {
        !T::retired_keys().iter().any(|retired| {
            let old = format!("{service}.{retired}");
            *path == old || path.starts_with(&format!("{old}."))
        })
    });
    if let Some(first) = unknown.first() {
        return Err(ConfigError::invalid(
            first.as_str(),
            format!(
                "no setting has this name (misspelt, or from another version?); unknown: {}",
                unknown.join(", ")
            ),
        ));
    }
    let root = config::Value::new(
        None,
        config::ValueKind::Table(config::Map::from_iter([(
            service.to_owned(),
            config::Value::new(None, config::ValueKind::Table(table)),
        )])),
    );
    let mut by_service: std::collections::BTreeMap<String, T> =
        serde::Deserialize::deserialize(root)?;
    let settings = by_service
        .remove(service)
        .ok_or_else(|| ConfigError::invalid(service, "missing table"))?;
    settings.validate(service)?;
    Ok(settings)
}

/// Collects into `out`, as dotted paths under `prefix`, the keys of `given` (the settings of
/// every layer) that `known` (the defaults) does not have: a setting nothing reads, such as a
/// misspelt environment variable, is refused rather than ignored. Under a table that is empty
/// or unset by default (a map, an optional section) any key is accepted.
fn unknown_keys(
    prefix: &str,
    given: &config::Map<String, config::Value>,
    known: &serde_json::Value,
    out: &mut Vec<String>,
) {
    let Some(known) = known.as_object().filter(|k| !k.is_empty()) else {
        return;
    };
    for (key, value) in given {
        let path = format!("{prefix}.{key}");
        match (known.get(key), &value.kind) {
            (None, _) => out.push(path),
            (Some(inner), config::ValueKind::Table(nested)) => {
                unknown_keys(&path, nested, inner, out);
            }
            (Some(_), _) => {}
        }
    }
}

/// Checks that `value` parses as a URL whose scheme is one of `schemes`.
pub fn check_url(key: &str, value: &str, schemes: &[&str]) -> Result<url::Url, ConfigError> {
    let url =
        url::Url::parse(value).map_err(|e| ConfigError::invalid(key, format!("not a URL: {e}")))?;
    if !schemes.contains(&url.scheme()) {
        return Err(ConfigError::invalid(
            key,
            format!("scheme must be one of {schemes:?}, got `{}`", url.scheme()),
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(ConfigError::invalid(key, "URL has no host"));
    }
    Ok(url)
}

/// Checks that `value` is a `host:port` socket address.
pub fn check_socket_addr(key: &str, value: &str) -> Result<std::net::SocketAddr, ConfigError> {
    value
        .parse()
        .map_err(|e| ConfigError::invalid(key, format!("not an ip:port address: {e}")))
}

/// Checks `lo <= value <= hi`.
pub fn check_range<N>(key: &str, value: N, lo: N, hi: N) -> Result<(), ConfigError>
where
    N: PartialOrd + std::fmt::Display,
{
    if value < lo || value > hi {
        return Err(ConfigError::invalid(
            key,
            format!("must be in {lo}..={hi}, got {value}"),
        ));
    }
    Ok(())
}

/// Turns a section's own `key: reason` message (e.g. `amqp.url: not a URL`) into an
/// [`ConfigError::Invalid`] whose key carries the service prefix (`order.amqp.url`).
pub fn prefixed(prefix: &str, message: &str) -> ConfigError {
    match message.split_once(": ") {
        Some((key, reason)) if !key.contains(' ') => {
            ConfigError::invalid(format!("{prefix}.{key}"), reason)
        }
        _ => ConfigError::invalid(prefix, message),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::settings::*;

    #[derive(Clone, Debug, Serialize, serde::Deserialize)]
    struct Demo {
        grpc: GrpcSettings,
        metrics: MetricsSettings,
        database: DatabaseSettings,
        auth: AuthSettings,
        telemetry: TelemetrySettings,
        extra: u32,
    }

    impl Validate for Demo {
        fn validate(&self, p: &str) -> Result<(), ConfigError> {
            validate_common(
                p,
                &self.grpc,
                &self.metrics,
                &self.database,
                &self.auth,
                &self.telemetry,
            )?;
            check_range(&format!("{p}.extra"), self.extra, 1, 10)
        }
    }

    fn demo() -> Demo {
        let c = CommonSettings::local(50052, 9102, "flashsale_orders");
        Demo {
            grpc: c.grpc,
            metrics: c.metrics,
            database: c.database,
            auth: c.auth,
            telemetry: c.telemetry,
            extra: 3,
        }
    }

    fn env(vars: &[(&str, &str)]) -> Environment {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect();
        environment(Some(map))
    }

    fn dir_with(files: &[(&str, &str)]) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("fs-config-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, body) in files {
            std::fs::write(dir.join(name), body).unwrap();
        }
        dir
    }

    #[test]
    fn layers_apply_in_order_defaults_file_env_file_then_environment() {
        let dir = dir_with(&[
            (
                "default.toml",
                "[order]\nextra = 4\n[order.grpc]\naddr = \"127.0.0.1:7000\"\n",
            ),
            (
                "staging.toml",
                "[order.grpc]\naddr = \"127.0.0.1:7001\"\nrequest_timeout_ms = 9\n",
            ),
        ]);
        let s: Demo = load_from("order", &demo(), &dir, None, env(&[])).unwrap();
        assert_eq!((s.extra, s.grpc.addr.as_str()), (4, "127.0.0.1:7000"));
        assert_eq!(s.metrics.addr, "0.0.0.0:9102", "untouched defaults stay");

        let s: Demo = load_from("order", &demo(), &dir, Some("staging"), env(&[])).unwrap();
        assert_eq!(
            (s.grpc.addr.as_str(), s.grpc.request_timeout_ms),
            ("127.0.0.1:7001", 9)
        );

        let vars = [
            ("FLASHSALE_ORDER__GRPC__ADDR", "127.0.0.1:7002"),
            ("FLASHSALE_ORDER__EXTRA", "7"),
        ];
        let s: Demo = load_from("order", &demo(), &dir, Some("staging"), env(&vars)).unwrap();
        assert_eq!((s.grpc.addr.as_str(), s.extra), ("127.0.0.1:7002", 7));
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn bad_values_are_refused_naming_the_key() {
        let dir = dir_with(&[]);
        let cases = [
            (
                "FLASHSALE_ORDER__DATABASE__URL",
                "not a url",
                "order.database.url",
            ),
            (
                "FLASHSALE_ORDER__DATABASE__URL",
                "mysql://h/db",
                "order.database.url",
            ),
            (
                "FLASHSALE_ORDER__DATABASE__URL",
                "postgres://h/",
                "order.database.url",
            ),
            (
                "FLASHSALE_ORDER__GRPC__ADDR",
                "localhost",
                "order.grpc.addr",
            ),
            (
                "FLASHSALE_ORDER__GRPC__MAX_MESSAGE_BYTES",
                "1",
                "order.grpc.max_message_bytes",
            ),
            (
                "FLASHSALE_ORDER__AUTH__JWT_SECRET",
                "short",
                "order.auth.jwt_secret",
            ),
            (
                "FLASHSALE_ORDER__TELEMETRY__LOG_FORMAT",
                "xml",
                "order.telemetry.log_format",
            ),
            (
                "FLASHSALE_ORDER__DATABASE__MIGRATE_ON_START",
                "maybe",
                "order.database.migrate_on_start",
            ),
            ("FLASHSALE_ORDER__EXTRA", "99", "order.extra"),
            ("FLASHSALE_ORDER__EXTRA", "many", "order.extra"),
            (
                "FLASHSALE_ORDER__GRPC__REQUEST_TIMEOUT_MS",
                "soon",
                "order.grpc.request_timeout_ms",
            ),
            (
                "FLASHSALE_ORDER__GRPC__MAX_CONCURRENT_REQUESTS",
                "0",
                "order.grpc.max_concurrent_requests",
            ),
            (
                "FLASHSALE_ORDER__GRPC__MAX_CONCURRENT_REQUESTS",
                "lots",
                "order.grpc.max_concurrent_requests",
            ),
        ];
        for (var, value, key) in cases {
            let err = load_from("order", &demo(), &dir, None, env(&[(var, value)])).unwrap_err();
            assert!(
                err.to_string().contains(key),
                "{var}={value}: `{err}` does not name {key}"
            );
        }
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn a_setting_nothing_reads_is_refused_naming_it_wherever_it_comes_from() {
        let dir = dir_with(&[]);
        for (var, key) in [
            ("FLASHSALE_ORDER__EXTRAS", "order.extras"),
            (
                "FLASHSALE_ORDER__GRPC__REQUEST_TIMEOUT",
                "order.grpc.request_timeout",
            ),
            ("FLASHSALE_ORDER__DATABSE__URL", "order.databse"),
        ] {
            let err = load_from("order", &demo(), &dir, None, env(&[(var, "5")])).unwrap_err();
            assert!(
                err.to_string().contains(key) && err.to_string().contains("no setting"),
                "{var}: `{err}` does not name {key}"
            );
        }
        let file = dir_with(&[(
            "default.toml",
            "[order.metrics]\nadress = \"127.0.0.1:9\"\n",
        )]);
        let err = load_from("order", &demo(), &file, None, env(&[])).unwrap_err();
        assert!(err.to_string().contains("order.metrics.adress"), "{err}");
        // Another service's settings, and variables outside any service, are not this one's.
        let ok = load_from(
            "order",
            &demo(),
            &dir,
            None,
            env(&[
                ("FLASHSALE_OUTBOUND__NOTHING", "1"),
                ("FLASHSALE_ORDER_URL", "http://127.0.0.1:1"),
                ("FLASHSALE_ORDER__EXTRA", "4"),
            ]),
        )
        .unwrap();
        assert_eq!(ok.extra, 4);
        std::fs::remove_dir_all(dir).ok();
        std::fs::remove_dir_all(file).ok();
    }

    #[test]
    fn a_broken_config_file_is_an_error_not_ignored() {
        let dir = dir_with(&[("default.toml", "[order\nextra = ")]);
        assert!(load_from::<Demo>("order", &demo(), &dir, None, env(&[])).is_err());
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn section_messages_get_the_service_prefix() {
        let e = prefixed("order", "amqp.url: not a valid URL");
        assert_eq!(
            e.to_string(),
            "invalid configuration `order.amqp.url`: not a valid URL"
        );
    }
}
