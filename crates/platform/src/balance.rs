//! A channel that spreads calls over every replica of another service. The configured URLs are
//! resolved (DNS names to all their addresses: a Kubernetes headless Service lists one per ready
//! pod) and the addresses probed every `refresh`; the channel balances over those that accept a
//! connection (tonic's power-of-two-choices balancer, by requests in flight). A replica that
//! stops answering leaves the set at the next refresh and comes back when it answers again; a
//! new pod joins when DNS names it. When no address answers, all of them stay in, so calls
//! fail fast with `UNAVAILABLE` instead of waiting for one to appear.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    time::Duration,
};

use anyhow::Context as _;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint, channel::Change};

use crate::tls::GrpcTlsSettings;

/// How long one address may take to accept a probe's connection.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long one name may take to resolve.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(2);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The URLs of a comma-separated list, trimmed (what `upstream.product_stock_url` holds).
pub fn split_urls(list: &str) -> Vec<&str> {
    list.split(',').map(str::trim).collect()
}

/// One configured URL.
#[derive(Clone, Debug)]
struct Target {
    /// The URL as configured: requests name it (`:authority`), TLS checks its host.
    origin: http::Uri,
    scheme: String,
    host: String,
    port: u16,
    tls: Option<ClientTlsConfig>,
}

impl Target {
    fn parse(url: &str, tls: &GrpcTlsSettings) -> anyhow::Result<Self> {
        let origin: http::Uri = url
            .parse()
            .with_context(|| format!("parse upstream URL `{url}`"))?;
        let scheme = origin.scheme_str().unwrap_or("http").to_owned();
        let host = origin
            .host()
            .with_context(|| format!("upstream URL `{url}` names no host"))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = origin
            .port_u16()
            .unwrap_or(if scheme == "https" { 443 } else { 80 });
        let tls = match scheme.as_str() {
            "https" => Some(tls.client("grpc.tls")?.domain_name(host.clone())),
            "http" => None,
            other => {
                anyhow::bail!("upstream URL `{url}`: scheme must be http or https, got `{other}`")
            }
        };
        Ok(Self {
            origin,
            scheme,
            host,
            port,
            tls,
        })
    }

    /// Every address the host names now (itself, for an IP address).
    async fn resolve(&self) -> anyhow::Result<Vec<SocketAddr>> {
        let found = tokio::time::timeout(
            RESOLVE_TIMEOUT,
            tokio::net::lookup_host((self.host.as_str(), self.port)),
        )
        .await
        .with_context(|| format!("resolve {}: timed out", self.host))?
        .with_context(|| format!("resolve {}", self.host))?;
        Ok(found.collect())
    }

    /// The endpoint of `key`: one of its addresses, or the URL itself (resolved by tonic when it
    /// connects).
    fn endpoint(&self, key: &Key, timeout: Duration) -> anyhow::Result<Endpoint> {
        let url = match key {
            Key::Addr(addr) => format!("{}://{addr}", self.scheme),
            Key::Url(_) => self.origin.to_string(),
        };
        let mut endpoint = Endpoint::from_shared(url.clone())
            .with_context(|| format!("endpoint {url}"))?
            .origin(self.origin.clone())
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(timeout)
            .tcp_nodelay(true);
        if let Some(tls) = &self.tls {
            endpoint = endpoint
                .tls_config(tls.clone())
                .with_context(|| format!("TLS for {url}"))?;
        }
        Ok(endpoint)
    }
}

/// Where calls may go: an address a target resolved to, or (while no name has resolved yet)
/// the target's URL as configured.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Key {
    Addr(SocketAddr),
    Url(usize),
}

/// A channel over every replica behind `urls` (see the module docs), re-resolved and probed
/// every `refresh` by a task that ends when the channel is dropped. A name that does not
/// resolve keeps the addresses it had; until any name has resolved, calls go to the URLs as
/// given. `https://` URLs are reached over TLS with `tls`, their certificate checked against
/// the URL's host, never in plain text. Must be called inside a Tokio runtime.
pub fn channel(
    urls: &[&str],
    refresh: Duration,
    timeout: Duration,
    tls: &GrpcTlsSettings,
) -> anyhow::Result<Channel> {
    anyhow::ensure!(!urls.is_empty(), "no upstream URL");
    let targets = urls
        .iter()
        .map(|u| Target::parse(u, tls))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let (channel, tx) = Channel::balance_channel::<Key>(64);
    tokio::spawn(async move {
        let mut last: Vec<Vec<SocketAddr>> = vec![Vec::new(); targets.len()];
        let mut current: BTreeSet<Key> = BTreeSet::new();
        loop {
            let found = discover(&targets, &mut last).await;
            let wanted: BTreeMap<Key, usize> = if found.is_empty() {
                (0..targets.len()).map(|i| (Key::Url(i), i)).collect()
            } else {
                choose(&found)
                    .into_iter()
                    .filter_map(|a| Some((Key::Addr(a), found.get(&a)?.0)))
                    .collect()
            };
            for (key, &i) in &wanted {
                if current.contains(key) {
                    continue;
                }
                match targets[i].endpoint(key, timeout) {
                    Ok(e) => {
                        if tx.send(Change::Insert(key.clone(), e)).await.is_err() {
                            return;
                        }
                        tracing::info!(upstream = %targets[i].origin, ?key, "upstream replica added");
                        current.insert(key.clone());
                    }
                    Err(e) => tracing::warn!(error = format!("{e:#}"), "upstream replica skipped"),
                }
            }
            for key in current.clone() {
                if !wanted.contains_key(&key) {
                    if tx.send(Change::Remove(key.clone())).await.is_err() {
                        return;
                    }
                    tracing::info!(?key, "upstream replica removed");
                    current.remove(&key);
                }
            }
            tokio::select! {
                () = tx.closed() => return,
                () = tokio::time::sleep(refresh) => {}
            }
        }
    });
    Ok(channel)
}

/// What a round of resolution found: each address, the index of the target naming it, and
/// whether it accepted a connection. A target whose name does not resolve this round keeps the
/// addresses of its last resolution (`last`).
async fn discover(
    targets: &[Target],
    last: &mut [Vec<SocketAddr>],
) -> BTreeMap<SocketAddr, (usize, bool)> {
    let mut found = BTreeMap::new();
    for (i, target) in targets.iter().enumerate() {
        match target.resolve().await {
            Ok(addrs) if !addrs.is_empty() => last[i] = addrs,
            Ok(_) => tracing::warn!(upstream = %target.origin, "upstream resolved to no address"),
            Err(e) => tracing::warn!(error = format!("{e:#}"), "upstream not resolved"),
        }
        for addr in &last[i] {
            found.entry(*addr).or_insert((i, false));
        }
    }
    let probes = found.keys().map(|addr| async move {
        let up = tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect(addr))
            .await
            .is_ok_and(|c| c.is_ok());
        (*addr, up)
    });
    for (addr, up) in futures_util::future::join_all(probes).await {
        if let Some(entry) = found.get_mut(&addr) {
            entry.1 = up;
        }
    }
    found
}

/// The addresses to balance over: those that answered, or all of them when none did.
fn choose<T>(found: &BTreeMap<SocketAddr, (T, bool)>) -> BTreeSet<SocketAddr> {
    let up: BTreeSet<SocketAddr> = found
        .iter()
        .filter(|(_, (_, up))| *up)
        .map(|(a, _)| *a)
        .collect();
    if up.is_empty() {
        found.keys().copied().collect()
    } else {
        up
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn the_replicas_that_answer_are_chosen_or_all_when_none_does() {
        let some = BTreeMap::from([(addr(1), ((), true)), (addr(2), ((), false))]);
        assert_eq!(choose(&some), BTreeSet::from([addr(1)]));
        let none = BTreeMap::from([(addr(1), ((), false)), (addr(2), ((), false))]);
        assert_eq!(choose(&none), BTreeSet::from([addr(1), addr(2)]));
    }

    #[test]
    fn a_list_is_split_at_commas_and_trimmed() {
        assert_eq!(
            split_urls("http://a:1, http://b:2"),
            ["http://a:1", "http://b:2"]
        );
        assert_eq!(split_urls("http://a:1"), ["http://a:1"]);
    }

    #[tokio::test]
    async fn calls_to_a_name_that_never_resolves_fail_unavailable_instead_of_waiting() {
        use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
        let channel = channel(
            &["http://no-such-host.invalid:50051"],
            Duration::from_millis(100),
            Duration::from_secs(2),
            &GrpcTlsSettings::default(),
        )
        .unwrap();
        let answer = tokio::time::timeout(
            Duration::from_secs(20),
            HealthClient::new(channel).check(HealthCheckRequest::default()),
        )
        .await
        .expect("the call came back");
        assert_eq!(answer.unwrap_err().code(), tonic::Code::Unavailable);
    }

    #[tokio::test]
    async fn a_target_keeps_its_host_for_tls_and_finds_the_default_port() {
        let t = Target::parse("http://localhost", &GrpcTlsSettings::default()).unwrap();
        assert_eq!((t.host.as_str(), t.port), ("localhost", 80));
        assert!(t.tls.is_none());
        let addrs = t.resolve().await.unwrap();
        assert!(addrs.iter().all(|a| a.ip().is_loopback() && a.port() == 80));
        let err = Target::parse("ftp://x:1", &GrpcTlsSettings::default()).unwrap_err();
        assert!(err.to_string().contains("scheme"), "{err}");
    }
}
