//! `redis.*`: the stock gate's Redis, one server or a Redis Cluster.

use serde::{Deserialize, Serialize};

use super::redact_url;
use crate::{
    config::{ConfigError, Validate, check_range, check_url},
    tls::StoreTlsSettings,
};

/// `redis.*`: the stock gate.
#[derive(Clone, Serialize, Deserialize)]
pub struct RedisSettings {
    /// `standalone` (one server at `url`) or `cluster` (a Redis Cluster reached through
    /// `cluster_nodes`).
    #[serde(default = "default_redis_mode")]
    pub mode: String,
    /// `redis://host:port[/db]` (standalone mode; unused in cluster mode).
    pub url: String,
    /// Cluster mode: some nodes of the cluster (`redis://host:port` each; the client learns
    /// the rest from them). A TOML array or, in the environment, one comma-separated string.
    #[serde(default, deserialize_with = "url_list")]
    pub cluster_nodes: Vec<String>,
    /// Prepended to every key (tests give each run its own).
    pub key_prefix: String,
    /// Pool size.
    pub pool_size: usize,
    /// CA and client certificate of a `rediss://` server (`redis.tls.*`).
    #[serde(default)]
    pub tls: StoreTlsSettings,
}

/// The `redis.mode` of one server.
pub const REDIS_STANDALONE: &str = "standalone";
/// The `redis.mode` of a Redis Cluster.
pub const REDIS_CLUSTER: &str = "cluster";
/// Most `redis.cluster_nodes` entries.
pub const MAX_CLUSTER_NODES: usize = 64;

fn default_redis_mode() -> String {
    REDIS_STANDALONE.to_owned()
}

impl Default for RedisSettings {
    fn default() -> Self {
        Self {
            mode: default_redis_mode(),
            url: "redis://127.0.0.1:6379".into(),
            cluster_nodes: Vec::new(),
            key_prefix: String::new(),
            pool_size: 32,
            tls: StoreTlsSettings::default(),
        }
    }
}

impl RedisSettings {
    /// Settings for a Redis Cluster reached through `nodes`, the rest as [`Default`].
    pub fn cluster(nodes: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self {
            mode: REDIS_CLUSTER.to_owned(),
            cluster_nodes: nodes.into_iter().map(Into::into).collect(),
            ..Self::default()
        }
    }

    /// Whether these settings point at a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.mode == REDIS_CLUSTER
    }
}

impl std::fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let nodes: Vec<String> = self.cluster_nodes.iter().map(|u| redact_url(u)).collect();
        f.debug_struct("RedisSettings")
            .field("mode", &self.mode)
            .field("url", &redact_url(&self.url))
            .field("cluster_nodes", &nodes)
            .field("key_prefix", &self.key_prefix)
            .field("pool_size", &self.pool_size)
            .field("tls", &self.tls)
            .finish()
    }
}

/// URLs as a TOML array or a comma-separated string (what an environment variable holds).
/// Empty entries are kept, so validation can refuse them rather than silently drop them.
fn url_list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    struct Visitor;
    impl<'de> serde::de::Visitor<'de> for Visitor {
        type Value = Vec<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a list of URLs, or one string of comma-separated URLs")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
            if v.trim().is_empty() {
                return Ok(Vec::new());
            }
            Ok(v.split(',').map(|s| s.trim().to_owned()).collect())
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
                out.push(s.trim().to_owned());
            }
            Ok(out)
        }
    }
    d.deserialize_any(Visitor)
}

impl RedisSettings {
    /// The scheme every connection uses: `redis.url`'s, or in cluster mode the nodes' (all
    /// alike).
    fn check_endpoints(&self, p: &str) -> Result<String, ConfigError> {
        let nodes_key = format!("{p}.cluster_nodes");
        match self.mode.as_str() {
            REDIS_STANDALONE => {
                if !self.cluster_nodes.is_empty() {
                    return Err(ConfigError::invalid(
                        nodes_key,
                        "set, but redis.mode is `standalone`: set redis.mode = \"cluster\" to \
                         use a Redis Cluster, or leave the list empty",
                    ));
                }
                let url = check_url(&format!("{p}.url"), &self.url, &["redis", "rediss"])?;
                Ok(url.scheme().to_owned())
            }
            REDIS_CLUSTER => {
                // Checked although unused, so a typo there is not carried along unnoticed.
                check_url(&format!("{p}.url"), &self.url, &["redis", "rediss"])?;
                if self.cluster_nodes.is_empty() {
                    return Err(ConfigError::invalid(
                        nodes_key,
                        "redis.mode is `cluster`: list at least one node, e.g. \
                         [\"redis://10.0.0.1:7000\"]",
                    ));
                }
                if self.cluster_nodes.len() > MAX_CLUSTER_NODES {
                    return Err(ConfigError::invalid(
                        nodes_key,
                        format!("at most {MAX_CLUSTER_NODES} nodes"),
                    ));
                }
                let mut scheme: Option<String> = None;
                let mut credentials: Option<(String, Option<String>)> = None;
                let mut seen = std::collections::HashSet::new();
                for (i, node) in self.cluster_nodes.iter().enumerate() {
                    let key = format!("{nodes_key}[{i}]");
                    if node.is_empty() {
                        return Err(ConfigError::invalid(key, "empty entry"));
                    }
                    let url = check_url(&key, node, &["redis", "rediss"])?;
                    if !matches!(url.path(), "" | "/" | "/0") {
                        return Err(ConfigError::invalid(
                            key,
                            "a Redis Cluster has only database 0: no /db in the URL",
                        ));
                    }
                    if url.query().is_some() || url.fragment().is_some() {
                        return Err(ConfigError::invalid(key, "no query or fragment"));
                    }
                    let addr = (
                        url.host_str().unwrap_or_default().to_owned(),
                        url.port().unwrap_or(6379),
                    );
                    if !seen.insert(addr) {
                        return Err(ConfigError::invalid(key, "listed twice"));
                    }
                    let these = (url.username().to_owned(), url.password().map(str::to_owned));
                    match &credentials {
                        Some(first) if *first != these => {
                            return Err(ConfigError::invalid(
                                key,
                                "every node must carry the same user and password (one cluster, \
                                 one set of credentials)",
                            ));
                        }
                        _ => credentials = Some(these),
                    }
                    match &scheme {
                        Some(s) if s != url.scheme() => {
                            return Err(ConfigError::invalid(
                                key,
                                "every node must use the same scheme (all redis:// or all \
                                 rediss://)",
                            ));
                        }
                        _ => scheme = Some(url.scheme().to_owned()),
                    }
                }
                Ok(scheme.unwrap_or_default())
            }
            other => Err(ConfigError::invalid(
                format!("{p}.mode"),
                format!("must be `standalone` or `cluster`, got `{other}`"),
            )),
        }
    }
}

impl Validate for RedisSettings {
    fn validate(&self, p: &str) -> Result<(), ConfigError> {
        let scheme = self.check_endpoints(p)?;
        self.tls.validate(&format!("{p}.tls"))?;
        if self.tls.is_set() && scheme != "rediss" {
            return Err(ConfigError::invalid(
                format!("{p}.tls"),
                "TLS files are set but the Redis URLs (redis.url, or redis.cluster_nodes in \
                 cluster mode) are not rediss://: the connection would be plain",
            ));
        }
        if self.key_prefix.len() > 64 || self.key_prefix.contains(['{', '}', ' ']) {
            return Err(ConfigError::invalid(
                format!("{p}.key_prefix"),
                "at most 64 characters, no braces or spaces (braces are hash tags)",
            ));
        }
        check_range(&format!("{p}.pool_size"), self.pool_size, 1, 1_024)
    }
}
