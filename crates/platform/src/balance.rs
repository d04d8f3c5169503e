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

    fn endpoint(&self, addr: SocketAddr, timeout: Duration) -> anyhow::Result<Endpoint> {
        let url = format!("{}://{addr}", self.scheme);
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

/// A channel over every replica behind `urls` (see the module docs), re-resolved and probed
/// every `refresh` by a task that ends when the channel is dropped. Calls made before the first
/// resolution wait for it (at most a few seconds). `https://` URLs are reached over TLS with
/// `tls`, their certificate checked against the URL's host, never in plain text. Must be called
/// inside a Tokio runtime.
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
    let (channel, tx) = Channel::balance_channel::<SocketAddr>(64);
    tokio::spawn(async move {
        let mut current: BTreeSet<SocketAddr> = BTreeSet::new();
        loop {
            let found = discover(&targets).await;
            let chosen = choose(&found);
            for (addr, (target, _)) in &found {
                if chosen.contains(addr) && !current.contains(addr) {
                    match target.endpoint(*addr, timeout) {
                        Ok(e) => {
                            if tx.send(Change::Insert(*addr, e)).await.is_err() {
                                return;
                            }
                            tracing::info!(upstream = %target.origin, %addr, "upstream replica added");
                            current.insert(*addr);
                        }
                        Err(e) => {
                            tracing::warn!(error = format!("{e:#}"), "upstream replica skipped")
                        }
                    }
                }
            }
            for addr in current.clone() {
                if !chosen.contains(&addr) {
                    if tx.send(Change::Remove(addr)).await.is_err() {
                        return;
                    }
                    tracing::info!(%addr, "upstream replica removed");
                    current.remove(&addr);
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

/// What a round of resolution found: each address, the target naming it, and whether it
/// accepted a connection.
async fn discover(targets: &[Target]) -> BTreeMap<SocketAddr, (Target, bool)> {
    let mut found = BTreeMap::new();
    for target in targets {
        match target.resolve().await {
            Ok(addrs) => {
                for addr in addrs {
                    found.entry(addr).or_insert_with(|| (target.clone(), false));
                }
            }
            Err(e) => tracing::warn!(error = format!("{e:#}"), "upstream not resolved"),
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
