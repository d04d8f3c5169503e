//! The product-stock service's settings: the common sections plus the Redis stock gate, AMQP and
//! the order service it asks about orders (the hold sweeper, the gate rebuild).
//! Keys: `product_stock.<section>.<key>`, env `FLASHSALE_PRODUCT_STOCK__<SECTION>__<KEY>`.

use flashsale_messaging::AmqpConfig;
use flashsale_platform::{
    config::{ConfigError, Validate, check_range},
    limit::ReadLimitSettings,
    settings::{
        AuthSettings, CommonSettings, DatabaseSettings, GrpcSettings, MetricsSettings,
        RedisSettings, TelemetrySettings, check_refresh_ms, check_url_list,
    },
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
    pub stock: StockSettings,
    pub order_service: OrderServiceSettings,
    /// `limits.*`: GetProduct and ListProducts calls one buyer may make (admin and service
    /// calls are not counted).
    pub limits: ReadLimitSettings,
}

/// `stock.*`: limits and timings of the gate.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StockSettings {
    /// Most units one ReserveStock may take.
    pub max_quantity: i64,
    /// A hold not persisted by `order.created` within this time is released (its order is
    /// refused later with a tombstone).
    pub hold_ttl_ms: u64,
    /// How long the gate remembers an order's answer (replays within it get the first answer).
    pub order_record_ttl_secs: u64,
    /// How long the gate keeps an order's record once its units went back (the release is
    /// settled in the database): a replay within it is answered from the record, a later one
    /// from the order service's database. Short, so a buyer ordering and cancelling in a loop
    /// does not grow Redis. Never longer than `order_record_ttl_secs`.
    pub released_record_ttl_ms: u64,
    /// How often the sweeper looks for expired holds.
    pub sweep_interval_ms: u64,
    /// How often every product's gate is compared with the database, report only, for the
    /// drift gauge (`flashsale_gate_drift_units`); repairing stays an admin action.
    pub drift_check_interval_ms: u64,
    /// How long a product's lost gate stays closed before it is rebuilt: longer than the order
    /// service's request deadline, so every order whose hold was taken before the loss has been
    /// written (and is counted as pending) or has failed by the time the rebuild asks for them.
    pub rebuild_settle_ms: u64,
}

impl Default for StockSettings {
    fn default() -> Self {
        Self {
            max_quantity: 100,
            hold_ttl_ms: 300_000,
            order_record_ttl_secs: 7 * 24 * 3600,
            // A replay is a client's retry of a call it got no answer to: within its deadline
            // and a backoff, seconds, at most a minute or two. Five minutes covers that, and
            // keeps a buyer's create-and-cancel loop to that many minutes' records.
            released_record_ttl_ms: 300_000,
            sweep_interval_ms: 10_000,
            drift_check_interval_ms: 60_000,
            rebuild_settle_ms: 6_000,
        }
    }
}

impl Validate for StockSettings {
    fn validate(&self, p: &str) -> Result<(), ConfigError> {
        check_range(
            &format!("{p}.max_quantity"),
            self.max_quantity,
            1,
            1_000_000,
        )?;
        check_range(
            &format!("{p}.hold_ttl_ms"),
            self.hold_ttl_ms,
            100,
            86_400_000,
        )?;
        check_range(
            &format!("{p}.order_record_ttl_secs"),
            self.order_record_ttl_secs,
            60,
            90 * 86_400,
        )?;
        check_range(
            &format!("{p}.sweep_interval_ms"),
            self.sweep_interval_ms,
            10,
            3_600_000,
        )?;
        check_range(
            &format!("{p}.drift_check_interval_ms"),
            self.drift_check_interval_ms,
            1_000,
            86_400_000,
        )?;
        check_range(
            &format!("{p}.rebuild_settle_ms"),
            self.rebuild_settle_ms,
            0,
            600_000,
        )?;
        if self.hold_ttl_ms / 1000 >= self.order_record_ttl_secs {
            return Err(ConfigError::invalid(
                format!("{p}.order_record_ttl_secs"),
                "must be longer than stock.hold_ttl_ms",
            ));
        }
        check_range(
            &format!("{p}.released_record_ttl_ms"),
            self.released_record_ttl_ms,
            1_000,
            86_400_000,
        )
    }
}

/// `order_service.*`: where the order service is, and how long one question to it may take.
/// The hold sweeper asks it before giving a hold away, the gate rebuild for a product's pending
/// orders (docs/architecture.md#operations).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct OrderServiceSettings {
    /// The order service's gRPC endpoint, or several separated by commas; calls are spread over
    /// every replica they resolve to ([`flashsale_platform::balance`]).
    pub url: String,
    /// Deadline of one call to the order service.
    pub timeout_ms: u64,
    /// How often the URLs' names are resolved again and their addresses probed.
    pub refresh_ms: u64,
}

impl Default for OrderServiceSettings {
    fn default() -> Self {
        Self {
            url: "http://127.0.0.1:50052".into(),
            timeout_ms: 3_000,
            refresh_ms: 2_000,
        }
    }
}

impl Validate for OrderServiceSettings {
    fn validate(&self, p: &str) -> Result<(), ConfigError> {
        check_url_list(&format!("{p}.url"), &self.url)?;
        check_range(&format!("{p}.timeout_ms"), self.timeout_ms, 10, 60_000)?;
        check_refresh_ms(&format!("{p}.refresh_ms"), self.refresh_ms)
    }
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
            stock: StockSettings::default(),
            order_service: OrderServiceSettings::default(),
            limits: ReadLimitSettings::default(),
        }
    }
}

flashsale_platform::common_settings!(Settings);

impl Validate for Settings {
    fn validate(&self, p: &str) -> Result<(), ConfigError> {
        self.common().validate(p)?;
        self.redis.validate(&format!("{p}.redis"))?;
        self.amqp.validate_under(p)?;
        self.stock.validate(&format!("{p}.stock"))?;
        self.order_service.validate(&format!("{p}.order_service"))?;
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

    fn error_of(f: impl FnOnce(&mut Settings)) -> String {
        let mut s = Settings::default();
        f(&mut s);
        s.validate(SERVICE_KEY)
            .map(|()| String::new())
            .unwrap_or_else(|e| e.to_string())
    }

    #[test]
    fn defaults_are_valid() {
        assert_eq!(error_of(|_| {}), "");
    }

    #[test]
    fn bad_stock_and_redis_values_name_their_key() {
        type Case = flashsale_test_support::settings::Case<Settings>;
        let cases: [Case; 22] = [
            ("product_stock.stock.max_quantity", |s| {
                s.stock.max_quantity = 0
            }),
            ("product_stock.stock.hold_ttl_ms", |s| {
                s.stock.hold_ttl_ms = 5
            }),
            ("product_stock.stock.order_record_ttl_secs", |s| {
                s.stock.order_record_ttl_secs = 1
            }),
            ("product_stock.stock.order_record_ttl_secs", |s| {
                s.stock.order_record_ttl_secs = 100;
                s.stock.hold_ttl_ms = 200_000;
            }),
            ("product_stock.stock.sweep_interval_ms", |s| {
                s.stock.sweep_interval_ms = 0
            }),
            ("product_stock.stock.drift_check_interval_ms", |s| {
                s.stock.drift_check_interval_ms = 999
            }),
            ("product_stock.stock.drift_check_interval_ms", |s| {
                s.stock.drift_check_interval_ms = 86_400_001
            }),
            ("product_stock.stock.released_record_ttl_ms", |s| {
                s.stock.released_record_ttl_ms = 999
            }),
            ("product_stock.stock.released_record_ttl_ms", |s| {
                s.stock.released_record_ttl_ms = 86_400_001
            }),
            ("product_stock.limits.read_per_sec", |s| {
                s.limits.read_per_sec = 1_000_001
            }),
            ("product_stock.limits.read_burst", |s| {
                s.limits.read_burst = 0
            }),
            ("product_stock.stock.rebuild_settle_ms", |s| {
                s.stock.rebuild_settle_ms = 600_001
            }),
            ("product_stock.redis.url", |s| {
                s.redis.url = "http://x".into()
            }),
            ("product_stock.amqp.prefetch", |s| s.amqp.prefetch = 0),
            ("product_stock.order_service.url", |s| {
                s.order_service.url = "ftp://x".into()
            }),
            ("product_stock.order_service.url", |s| {
                s.order_service.url = "not a url".into()
            }),
            ("product_stock.order_service.timeout_ms", |s| {
                s.order_service.timeout_ms = 0
            }),
            ("product_stock.order_service.timeout_ms", |s| {
                s.order_service.timeout_ms = 60_001
            }),
            ("product_stock.order_service.url", |s| {
                s.order_service.url = "http://a:1,,http://b:1".into()
            }),
            ("product_stock.order_service.url", |s| {
                s.order_service.url = "http://a:1, http://a:1".into()
            }),
            ("product_stock.order_service.refresh_ms", |s| {
                s.order_service.refresh_ms = 0
            }),
            ("product_stock.order_service.refresh_ms", |s| {
                s.order_service.refresh_ms = 600_001
            }),
        ];
        each_is_refused_naming_its_key(&Settings::default(), SERVICE_KEY, &cases);
    }

    #[test]
    fn bad_redis_cluster_values_name_their_key() {
        use flashsale_platform::settings::RedisSettings;
        let nodes = |list: &[&str]| RedisSettings::cluster(list.iter().copied());
        let cases: Vec<(&str, RedisSettings)> = vec![
            (
                "product_stock.redis.mode",
                RedisSettings {
                    mode: "sentinel".into(),
                    ..RedisSettings::default()
                },
            ),
            // A node list in standalone mode would be ignored: refused instead.
            (
                "product_stock.redis.cluster_nodes",
                RedisSettings {
                    cluster_nodes: vec!["redis://127.0.0.1:7000".into()],
                    ..RedisSettings::default()
                },
            ),
            ("product_stock.redis.cluster_nodes", nodes(&[])),
            (
                "product_stock.redis.cluster_nodes[1]",
                nodes(&["redis://127.0.0.1:7000", ""]),
            ),
            (
                "product_stock.redis.cluster_nodes[0]",
                nodes(&["127.0.0.1:7000"]),
            ),
            (
                "product_stock.redis.cluster_nodes[0]",
                nodes(&["http://a:7000"]),
            ),
            (
                "product_stock.redis.cluster_nodes[0]",
                nodes(&["redis://:7000"]),
            ),
            (
                "product_stock.redis.cluster_nodes[0]",
                nodes(&["redis://a:7000/2"]),
            ),
            (
                "product_stock.redis.cluster_nodes[1]",
                nodes(&["redis://a:7000", "redis://a:7000"]),
            ),
            (
                "product_stock.redis.cluster_nodes[1]",
                nodes(&["redis://a:7000", "rediss://b:7000"]),
            ),
            (
                "product_stock.redis.cluster_nodes[1]",
                nodes(&["redis://:pw@a:7000", "redis://:other@b:7000"]),
            ),
            (
                "product_stock.redis.cluster_nodes",
                nodes(&["redis://a:7000"; 65]),
            ),
            // Checked in cluster mode too, though unused there.
            (
                "product_stock.redis.url",
                RedisSettings {
                    url: "http://x".into(),
                    ..nodes(&["redis://a:7000"])
                },
            ),
        ];
        for (key, redis) in cases {
            let shown = format!("{:?}", redis.cluster_nodes);
            let e = error_of(|s| s.redis = redis);
            assert!(e.contains(key), "`{e}` does not name {key} ({shown})");
        }
        assert_eq!(
            error_of(|s| s.redis = nodes(&["redis://:pw@a:7000", "redis://:pw@b:7001/0"])),
            ""
        );
    }

    #[test]
    fn cluster_nodes_load_from_a_toml_array_or_one_comma_separated_variable() {
        let dir = std::env::temp_dir().join(format!("fs-config-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("default.toml"),
            "[product_stock.redis]\nmode = \"cluster\"\n\
             cluster_nodes = [\"redis://10.0.0.1:7000\", \"redis://10.0.0.2:7000\"]\n",
        )
        .unwrap();
        let env = |vars: &[(&str, &str)]| {
            flashsale_platform::config::environment(Some(
                vars.iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ))
        };
        let load = |vars: &[(&str, &str)]| {
            flashsale_platform::config::load_from(
                SERVICE_KEY,
                &Settings::default(),
                &dir,
                None,
                env(vars),
            )
        };
        // The shipped file: standalone, with an empty node list.
        let shipped = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config");
        let s = flashsale_platform::config::load_from(
            SERVICE_KEY,
            &Settings::default(),
            &shipped,
            None,
            env(&[]),
        )
        .unwrap();
        assert!(!s.redis.is_cluster() && s.redis.cluster_nodes.is_empty());
        let s = load(&[]).unwrap();
        assert!(s.redis.is_cluster());
        assert_eq!(
            s.redis.cluster_nodes,
            ["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"]
        );
        let var = "FLASHSALE_PRODUCT_STOCK__REDIS__CLUSTER_NODES";
        let s = load(&[(var, "redis://a:7000, redis://b:7001,redis://c:7002")]).unwrap();
        assert_eq!(
            s.redis.cluster_nodes,
            ["redis://a:7000", "redis://b:7001", "redis://c:7002"]
        );
        let e = load(&[(var, "redis://a:7000,,redis://c:7002")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("product_stock.redis.cluster_nodes[1]"), "{e}");
        let e = load(&[("FLASHSALE_PRODUCT_STOCK__REDIS__MODE", "standalone")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("product_stock.redis.cluster_nodes"), "{e}");
        std::fs::remove_dir_all(dir).ok();
    }
}
