//! The `[amqp]` section of a service's settings.

use std::{fmt, time::Duration};

use flashsale_platform::{config::ConfigError, tls::StoreTlsSettings};
use serde::{Deserialize, Serialize};

/// Which RabbitMQ queue type the work, retry, parking-lot and holding queues use.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum QueueType {
    /// Replicated Raft queues: the production choice on a cluster.
    #[default]
    Quorum,
    /// Single-node queues, for brokers without quorum queues.
    Classic,
}

impl QueueType {
    /// The `x-queue-type` argument value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Quorum => "quorum",
            Self::Classic => "classic",
        }
    }
}

/// Connection and topology settings shared by the publisher, the relay and the consumers.
///
/// `Debug` never prints the password of `url`.
#[derive(Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct AmqpConfig {
    /// `amqp://user:password@host:port/vhost` (the default vhost is `%2f`): the one broker node,
    /// when `urls` is empty.
    pub url: String,
    /// The nodes of a RabbitMQ cluster, each an `amqp://` or `amqps://` URL like `url`. When
    /// set it replaces `url` (which must then be left at its default or be one of them): the
    /// connection starts at a random node and, whenever it drops, moves on to the next one
    /// that answers. Also read from a comma-separated string (an environment variable).
    #[serde(deserialize_with = "list_or_csv")]
    pub urls: Vec<String>,
    /// The durable topic exchange every event is published to.
    pub exchange: String,
    /// Prefix of every queue this service declares (tests use it for isolation).
    pub queue_prefix: String,
    /// Unacknowledged deliveries a consumer may hold at once (also its handler concurrency).
    pub prefetch: u16,
    /// Handler runs per message before it is parked in the dead-letter queue.
    pub max_attempts: u32,
    /// Delay before the first retry; each further retry waits twice as long.
    pub retry_base_ms: u64,
    /// `quorum` (default) or `classic`.
    pub queue_type: QueueType,
    /// 0 (production): queues and the exchange live until deleted. Above 0, every queue this
    /// service declares is deleted by the broker after this long unused (`x-expires`) and the
    /// exchange once no queue is bound to it: tests set it so nothing they declare outlives them.
    pub queue_expires_ms: u64,
    /// Most events the outbox relay sends in one AMQP message (a bundle,
    /// docs/architecture.md#messaging): rows of one routing key found in the same relay batch
    /// travel together, and the consumer settles each on its own. 1 sends every event alone (what
    /// consumers built before bundles need: roll consumers out first). 1..=1000.
    pub bundle_max_events: u16,
    /// How long the inbox remembers a processed message, in hours; older rows are purged (see
    /// [`crate::inbox::run_purger`]). A duplicate arriving after that is applied again, so this
    /// must comfortably exceed the longest time between two deliveries of one message: the
    /// retry ladder (checked: at least twice its length), a replay whose mark was lost, and a
    /// relay that republishes rows it published but could not mark once its service is back
    /// (as long as that service stays down). 1..=8760; default one week.
    pub inbox_retention_hours: u32,
    /// How long the outbox keeps a row once it is published, in hours: 0 (the default) deletes
    /// it in the relay's own transaction, so a published event costs no update and no later
    /// purge; 1..=8760 keeps it that long (to read what was sent), then the relay purges it.
    pub outbox_keep_published_hours: u32,
    /// Most inbox rows one purge statement deletes: small batches keep each lock and WAL burst
    /// short next to the consumers' claims. 1..=100000.
    pub inbox_purge_batch: u32,
    /// How often the inbox purger looks for old rows, in milliseconds. 1000..=86400000.
    pub inbox_purge_interval_ms: u64,
    /// CA and client certificate of an `amqps://` broker (`amqp.tls.*`).
    pub tls: StoreTlsSettings,
}

impl Default for AmqpConfig {
    fn default() -> Self {
        Self {
            url: DEFAULT_URL.to_owned(),
            urls: Vec::new(),
            exchange: "flashsale.events".to_owned(),
            queue_prefix: String::new(),
            prefetch: 64,
            max_attempts: 5,
            retry_base_ms: 1000,
            queue_type: QueueType::Quorum,
            queue_expires_ms: 0,
            bundle_max_events: 64,
            inbox_retention_hours: 7 * 24,
            outbox_keep_published_hours: 0,
            inbox_purge_batch: 1_000,
            inbox_purge_interval_ms: 60_000,
            tls: StoreTlsSettings::default(),
        }
    }
}

impl fmt::Debug for AmqpConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpConfig")
            .field("url", &redact_url(&self.url))
            .field(
                "urls",
                &self.urls.iter().map(|u| redact_url(u)).collect::<Vec<_>>(),
            )
            .field("exchange", &self.exchange)
            .field("queue_prefix", &self.queue_prefix)
            .field("prefetch", &self.prefetch)
            .field("max_attempts", &self.max_attempts)
            .field("retry_base_ms", &self.retry_base_ms)
            .field("queue_type", &self.queue_type)
            .field("queue_expires_ms", &self.queue_expires_ms)
            .field("bundle_max_events", &self.bundle_max_events)
            .field("inbox_retention_hours", &self.inbox_retention_hours)
            .field("inbox_purge_batch", &self.inbox_purge_batch)
            .field("inbox_purge_interval_ms", &self.inbox_purge_interval_ms)
            .field(
                "outbox_keep_published_hours",
                &self.outbox_keep_published_hours,
            )
            .field("tls", &self.tls)
            .finish()
    }
}

impl AmqpConfig {
    /// [`Self::validate`] within a service's settings: the error names the key under `prefix`
    /// (`order.amqp.urls`, say).
    pub fn validate_under(&self, prefix: &str) -> Result<(), ConfigError> {
        self.validate()
            .map_err(|e| flashsale_platform::config::prefixed(prefix, &e))
    }

    /// Checks every value; the error names the offending key (`amqp.<key>: …`) and never
    /// contains the password.
    pub fn validate(&self) -> Result<(), String> {
        if let Err(e) = self.tls.validate("amqp.tls") {
            return Err(match e {
                ConfigError::Invalid { key, reason } => format!("{key}: {reason}"),
                other => other.to_string(),
            });
        }
        if self.urls.len() > MAX_NODES {
            return Err(format!(
                "amqp.urls: at most {MAX_NODES} nodes, not {}",
                self.urls.len()
            ));
        }
        if self.urls.is_empty() {
            self.check_url("amqp.url", &self.url)?;
        } else {
            for (i, u) in self.urls.iter().enumerate() {
                self.check_url(&format!("amqp.urls[{i}]"), u)?;
                if self.urls[..i].contains(u) {
                    return Err(format!("amqp.urls[{i}]: {} is listed twice", redact_url(u)));
                }
            }
            if self.url != DEFAULT_URL && !self.urls.contains(&self.url) {
                return Err(
                    "amqp.url: set either amqp.url (one node) or amqp.urls (a cluster), not \
                     both with different nodes"
                        .to_owned(),
                );
            }
        }
        if self.exchange.trim().is_empty() {
            return Err("amqp.exchange: must not be empty".to_owned());
        }
        if self.exchange.len() > 200 || self.queue_prefix.len() > 100 {
            return Err("amqp.exchange / amqp.queue_prefix: too long for AMQP names".to_owned());
        }
        if self.prefetch == 0 {
            return Err("amqp.prefetch: must be 1..=65535".to_owned());
        }
        if self.max_attempts == 0 || self.max_attempts > 20 {
            return Err("amqp.max_attempts: must be 1..=20".to_owned());
        }
        if self.queue_expires_ms > 0 && self.queue_expires_ms < 1_000 {
            return Err("amqp.queue_expires_ms: must be 0 (never) or at least 1000".to_owned());
        }
        if self.retry_base_ms == 0 || self.retry_base_ms > 3_600_000 {
            return Err("amqp.retry_base_ms: must be 1..=3600000".to_owned());
        }
        if self.bundle_max_events == 0 || self.bundle_max_events > crate::bundle::MAX_EVENTS {
            return Err(format!(
                "amqp.bundle_max_events: must be 1..={} (1: no bundles)",
                crate::bundle::MAX_EVENTS
            ));
        }
        if self.inbox_retention_hours == 0 || self.inbox_retention_hours > 8_760 {
            return Err("amqp.inbox_retention_hours: must be 1..=8760".to_owned());
        }
        let ladder = self.redelivery_window();
        if self.inbox_retention() < ladder * 2 {
            return Err(format!(
                "amqp.inbox_retention_hours: must be at least twice the retry ladder ({} s with \
                 amqp.max_attempts and amqp.retry_base_ms), or a retried message could be applied twice",
                ladder.as_secs()
            ));
        }
        if self.inbox_purge_batch == 0 || self.inbox_purge_batch > 100_000 {
            return Err("amqp.inbox_purge_batch: must be 1..=100000".to_owned());
        }
        if self.outbox_keep_published_hours > 8_760 {
            return Err(
                "amqp.outbox_keep_published_hours: must be 0..=8760 (0: deleted once published)"
                    .to_owned(),
            );
        }
        if !(1_000..=86_400_000).contains(&self.inbox_purge_interval_ms) {
            return Err("amqp.inbox_purge_interval_ms: must be 1000..=86400000".to_owned());
        }
        Ok(())
    }

    /// The broker nodes to connect to, in configured order: `urls`, or `url` alone.
    pub fn nodes(&self) -> Vec<String> {
        if self.urls.is_empty() {
            vec![self.url.clone()]
        } else {
            self.urls.clone()
        }
    }

    /// `raw` as a broker URL under `key`: amqp or amqps with a host, amqps when TLS files are
    /// set.
    fn check_url(&self, key: &str, raw: &str) -> Result<(), String> {
        match url::Url::parse(raw) {
            Ok(u) if u.scheme() == "amqp" && self.tls.is_set() => Err(format!(
                "amqp.tls: TLS files are set but {key} is not amqps://: the connection would be \
                 plain"
            )),
            Ok(u) if matches!(u.scheme(), "amqp" | "amqps") && u.host_str().is_some() => Ok(()),
            Ok(u) if !matches!(u.scheme(), "amqp" | "amqps") => Err(format!(
                "{key}: scheme must be amqp or amqps, not `{}`",
                u.scheme()
            )),
            Ok(_) => Err(format!("{key}: has no host")),
            Err(e) => Err(format!("{key}: not a valid URL ({e})")),
        }
    }

    /// The longest a message can spend on the retry ladder: the sum of its retry delays.
    pub fn redelivery_window(&self) -> Duration {
        (1..self.max_attempts).map(|i| self.retry_delay(i)).sum()
    }

    /// How long a published outbox row is kept (zero: deleted once published).
    pub fn outbox_keep_published(&self) -> Duration {
        Duration::from_secs(u64::from(self.outbox_keep_published_hours) * 3_600)
    }

    /// `inbox_retention_hours` as a duration.
    pub fn inbox_retention(&self) -> Duration {
        Duration::from_secs(u64::from(self.inbox_retention_hours) * 3_600)
    }

    /// What the inbox purger runs with.
    pub fn inbox_purge(&self) -> crate::inbox::PurgeOptions {
        crate::inbox::PurgeOptions {
            retention: self.inbox_retention(),
            batch: self.inbox_purge_batch,
            interval: Duration::from_millis(self.inbox_purge_interval_ms),
            ..Default::default()
        }
    }

    /// The TTL of retry queue `i` (1-based): `retry_base_ms * 2^(i-1)`, capped at one day.
    pub fn retry_delay(&self, i: u32) -> Duration {
        let factor = 1u64 << i.saturating_sub(1).min(30);
        Duration::from_millis(self.retry_base_ms.saturating_mul(factor).min(86_400_000))
    }

    /// `x-expires` of every declared queue, when set.
    pub fn queue_expiry(&self) -> Option<Duration> {
        (self.queue_expires_ms > 0).then(|| Duration::from_millis(self.queue_expires_ms))
    }

    /// `queue_prefix` + `name`.
    pub fn queue_name(&self, name: &str) -> String {
        format!("{}{name}", self.queue_prefix)
    }
}

/// `amqp.url`'s default: the broker on this machine.
const DEFAULT_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
/// Most nodes `amqp.urls` may list.
const MAX_NODES: usize = 16;

/// `amqp.urls` from a list, or from one string of comma-separated URLs (how an environment
/// variable carries it); blank entries are dropped.
fn list_or_csv<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum ListOrCsv {
        List(Vec<String>),
        Csv(String),
    }
    let raw = match ListOrCsv::deserialize(d)? {
        ListOrCsv::List(l) => l,
        ListOrCsv::Csv(s) => s.split(',').map(str::to_owned).collect(),
    };
    Ok(raw
        .into_iter()
        .map(|u| u.trim().to_owned())
        .filter(|u| !u.is_empty())
        .collect())
}

/// The URL with its password replaced by `***` (or a placeholder when it does not parse).
pub(crate) fn redact_url(raw: &str) -> String {
    match url::Url::parse(raw) {
        Ok(mut u) => {
            if u.password().is_some() {
                let _ = u.set_password(Some("***"));
            }
            u.to_string()
        }
        Err(_) => "<unparsable url>".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bad(f: impl FnOnce(&mut AmqpConfig)) -> String {
        let mut c = AmqpConfig::default();
        f(&mut c);
        c.validate().unwrap_err()
    }

    #[test]
    fn default_config_is_valid() {
        assert_eq!(AmqpConfig::default().validate(), Ok(()));
    }

    #[test]
    fn each_bad_key_is_named() {
        assert!(bad(|c| c.url = "http://h/".into()).starts_with("amqp.url:"));
        assert!(bad(|c| c.url = "not a url".into()).starts_with("amqp.url:"));
        assert!(bad(|c| c.url = "amqp://".into()).starts_with("amqp.url:"));
        assert!(bad(|c| c.exchange = " ".into()).starts_with("amqp.exchange:"));
        assert!(bad(|c| c.queue_expires_ms = 500).starts_with("amqp.queue_expires_ms:"));
        assert!(bad(|c| c.prefetch = 0).starts_with("amqp.prefetch:"));
        assert!(bad(|c| c.max_attempts = 0).starts_with("amqp.max_attempts:"));
        assert!(bad(|c| c.retry_base_ms = 0).starts_with("amqp.retry_base_ms:"));
        assert!(bad(|c| c.bundle_max_events = 0).starts_with("amqp.bundle_max_events:"));
        assert!(bad(|c| c.bundle_max_events = 1001).starts_with("amqp.bundle_max_events:"));
        let one = AmqpConfig {
            bundle_max_events: 1,
            ..AmqpConfig::default()
        };
        assert_eq!(one.validate(), Ok(()));
    }

    #[test]
    fn a_cluster_is_a_list_of_urls_and_url_is_a_list_of_one() {
        let one = AmqpConfig::default();
        assert_eq!(one.nodes(), vec![DEFAULT_URL.to_owned()]);
        let c: AmqpConfig = serde_json::from_str(
            r#"{"urls":["amqp://u:p@a:5672/%2f","amqp://u:p@b:5672/%2f","amqp://u:p@c:5672/%2f"]}"#,
        )
        .unwrap();
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(c.nodes().len(), 3);
        assert_eq!(c.nodes()[1], "amqp://u:p@b:5672/%2f");
        // An environment variable carries the list as one comma-separated string.
        let env: AmqpConfig =
            serde_json::from_str(r#"{"urls":"amqp://a:5672/%2f, amqp://b:5673/%2f,"}"#).unwrap();
        assert_eq!(
            env.nodes(),
            vec![
                "amqp://a:5672/%2f".to_owned(),
                "amqp://b:5673/%2f".to_owned()
            ]
        );
        // `url` left at its default, or naming one of the nodes, is fine beside `urls`.
        let both = AmqpConfig {
            url: "amqp://b:5673/%2f".into(),
            ..env.clone()
        };
        assert_eq!(both.validate(), Ok(()));
    }

    /// A service's settings with just the `[amqp]` section.
    #[derive(Debug, Deserialize, Serialize)]
    struct Service {
        amqp: AmqpConfig,
    }

    impl flashsale_platform::config::Validate for Service {
        /// The AMQP section of a service's settings only.
        fn refuses_unknown_keys() -> bool {
            false
        }

        fn validate(&self, prefix: &str) -> Result<(), ConfigError> {
            self.amqp.validate_under(prefix)
        }
    }

    fn load(toml: &str, env: &[(&str, &str)]) -> Result<Service, ConfigError> {
        let dir = std::env::temp_dir().join(format!("fs-amqp-config-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("default.toml"), toml).unwrap();
        let env = config::Environment::with_prefix("FLASHSALE")
            .prefix_separator("_")
            .separator("__")
            .try_parsing(true)
            .source(Some(
                env.iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ));
        let defaults = Service {
            amqp: AmqpConfig::default(),
        };
        let loaded = flashsale_platform::config::load_from("svc", &defaults, &dir, None, env);
        let _ = std::fs::remove_dir_all(&dir);
        loaded
    }

    #[test]
    fn urls_load_from_a_toml_list_or_a_comma_separated_environment_variable() {
        let s = load(
            "[svc.amqp]\nurls = [\"amqp://a:5672/%2f\", \"amqp://b:5672/%2f\"]\n",
            &[],
        )
        .unwrap();
        assert_eq!(
            s.amqp.nodes(),
            vec!["amqp://a:5672/%2f", "amqp://b:5672/%2f"]
        );
        let s = load(
            "",
            &[(
                "FLASHSALE_SVC__AMQP__URLS",
                "amqp://a:5672/%2f,amqp://b:5673/%2f,amqp://c:5674/%2f",
            )],
        )
        .unwrap();
        assert_eq!(s.amqp.nodes().len(), 3);
        assert_eq!(s.amqp.nodes()[2], "amqp://c:5674/%2f");
        let s = load("", &[("FLASHSALE_SVC__AMQP__URL", "amqp://one:5672/%2f")]).unwrap();
        assert_eq!(s.amqp.nodes(), vec!["amqp://one:5672/%2f"]);
        let e = load("", &[("FLASHSALE_SVC__AMQP__URLS", "amqp://a/,redis://b/")]).unwrap_err();
        assert!(e.to_string().contains("svc.amqp.urls[1]"), "{e}");
    }

    #[test]
    fn the_shipped_config_files_amqp_sections_load() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config");
        for service in ["product_stock", "order", "outbound"] {
            let defaults = Service {
                amqp: AmqpConfig::default(),
            };
            let env =
                config::Environment::with_prefix("FLASHSALE").source(Some(Default::default()));
            let s = flashsale_platform::config::load_from(service, &defaults, &dir, None, env)
                .unwrap_or_else(|e| panic!("{service}: {e}"));
            assert_eq!(s.amqp.nodes(), vec![DEFAULT_URL.to_owned()], "{service}");
        }
    }

    #[test]
    fn bad_urls_are_named() {
        let nodes = |urls: &[&str]| -> Vec<String> { urls.iter().map(|u| (*u).into()).collect() };
        let e = bad(|c| c.urls = nodes(&["amqp://a/", "http://b/"]));
        assert!(e.starts_with("amqp.urls[1]:"), "{e}");
        let e = bad(|c| c.urls = nodes(&["amqp://"]));
        assert!(e.starts_with("amqp.urls[0]:"), "{e}");
        let e = bad(|c| c.urls = nodes(&["amqp://u:s3cret@a/", "amqp://u:s3cret@a/"]));
        assert!(
            e.starts_with("amqp.urls[1]:") && e.contains("twice") && !e.contains("s3cret"),
            "{e}"
        );
        let many: Vec<String> = (0..17).map(|i| format!("amqp://n{i}/")).collect();
        assert!(bad(|c| c.urls = many).starts_with("amqp.urls:"));
        let e = bad(|c| {
            c.url = "amqp://elsewhere/".into();
            c.urls = nodes(&["amqp://a/", "amqp://b/"]);
        });
        assert!(e.starts_with("amqp.url:"), "{e}");
        assert!(serde_json::from_str::<AmqpConfig>(r#"{"urls":7}"#).is_err());
    }

    #[test]
    fn bad_inbox_purge_keys_are_named() {
        assert!(bad(|c| c.inbox_retention_hours = 0).starts_with("amqp.inbox_retention_hours:"));
        assert!(
            bad(|c| c.inbox_retention_hours = 8_761).starts_with("amqp.inbox_retention_hours:")
        );
        // 20 attempts from an hour apart, doubling (a day at most each): about 15 days of retries.
        let long_ladder = bad(|c| {
            c.max_attempts = 20;
            c.retry_base_ms = 3_600_000;
        });
        assert!(
            long_ladder.starts_with("amqp.inbox_retention_hours:")
                && long_ladder.contains("retry ladder"),
            "{long_ladder}"
        );
        assert!(bad(|c| c.inbox_purge_batch = 0).starts_with("amqp.inbox_purge_batch:"));
        assert!(bad(|c| c.inbox_purge_batch = 100_001).starts_with("amqp.inbox_purge_batch:"));
        assert!(
            bad(|c| c.inbox_purge_interval_ms = 999).starts_with("amqp.inbox_purge_interval_ms:")
        );
        assert!(
            bad(|c| c.outbox_keep_published_hours = 8_761)
                .starts_with("amqp.outbox_keep_published_hours:")
        );
        assert!(
            bad(|c| c.inbox_purge_interval_ms = 86_400_001)
                .starts_with("amqp.inbox_purge_interval_ms:")
        );
        let c: AmqpConfig = serde_json::from_str(r#"{"inbox_retention_hours":48}"#).unwrap();
        assert_eq!(c.inbox_purge().retention, Duration::from_secs(48 * 3_600));
        assert_eq!(c.inbox_purge().batch, 1_000);
    }

    #[test]
    fn the_redelivery_window_sums_the_ladder() {
        let c = AmqpConfig {
            retry_base_ms: 1_000,
            max_attempts: 5,
            ..AmqpConfig::default()
        };
        assert_eq!(c.redelivery_window(), Duration::from_secs(1 + 2 + 4 + 8));
    }

    #[test]
    fn amqps_is_accepted() {
        let c = AmqpConfig {
            url: "amqps://u:p@broker.example:5671/%2f".into(),
            ..AmqpConfig::default()
        };
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn debug_and_errors_never_show_the_password() {
        let c = AmqpConfig {
            url: "amqp://user:s3cret@host:5672/%2f".into(),
            ..AmqpConfig::default()
        };
        let shown = format!("{c:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        let cluster = AmqpConfig {
            urls: vec![
                "amqp://user:s3cret@a/".into(),
                "amqp://user:s3cret@b/".into(),
            ],
            ..AmqpConfig::default()
        };
        let shown = format!("{cluster:?}");
        assert!(
            !shown.contains("s3cret") && shown.contains("@b/"),
            "{shown}"
        );
        assert!(shown.contains("user"), "{shown}");
        let err = bad(|c| c.url = "ftp://user:s3cret@host/".into());
        assert!(!err.contains("s3cret"), "{err}");
    }

    #[test]
    fn queue_type_and_defaults_deserialize() {
        let c: AmqpConfig =
            serde_json::from_str(r#"{"queue_type":"classic","prefetch":8}"#).unwrap();
        assert_eq!(c.queue_type, QueueType::Classic);
        assert_eq!(c.prefetch, 8);
        assert_eq!(c.exchange, "flashsale.events");
        assert!(serde_json::from_str::<AmqpConfig>(r#"{"queue_type":"lazy"}"#).is_err());
    }

    #[test]
    fn retry_delays_double() {
        let c = AmqpConfig {
            retry_base_ms: 10,
            ..AmqpConfig::default()
        };
        assert_eq!(c.retry_delay(1), Duration::from_millis(10));
        assert_eq!(c.retry_delay(2), Duration::from_millis(20));
        assert_eq!(c.retry_delay(4), Duration::from_millis(80));
    }
}
