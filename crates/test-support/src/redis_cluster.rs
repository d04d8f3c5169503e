//! A private Redis Cluster of three masters and three replicas on free loopback ports, for the
//! tests of cluster mode. It needs `redis-server` and `redis-cli` (Debian's `redis-server`
//! package); without them [`RedisCluster::start`] fails and says so: a cluster test never skips.
//! The nodes keep nothing on disk (no RDB, no AOF), use a short `cluster-node-timeout` so a
//! failover takes seconds, and are killed and their files removed when the value is dropped.

use std::{
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, bail};
use flashsale_platform::redis::{Node, cluster::parse_masters};

use crate::{
    servers::{TempDir, free_port, wait_port},
    tls::{CertFiles, Pki},
};

/// `cluster-node-timeout` of the nodes (ms): how long a master may be unreachable before the
/// others fail it over.
pub const NODE_TIMEOUT_MS: u64 = 2_000;

/// Longest wait for the cluster to form, or to finish a failover.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Three masters, each with one replica, on loopback.
pub struct RedisCluster {
    nodes: Vec<ClusterNode>,
    tls: Option<NodeTls>,
    _dir: TempDir,
}

/// The files of a cluster that speaks only TLS: the CA, the nodes' certificate (also their
/// client certificate towards each other) and `redis-cli`'s client certificate.
struct NodeTls {
    ca: String,
    server: CertFiles,
    cli: CertFiles,
}

impl NodeTls {
    fn server_args(&self) -> Vec<String> {
        [
            "--tls-cluster",
            "yes",
            "--tls-replication",
            "yes",
            "--tls-auth-clients",
            "yes",
            "--tls-cert-file",
            &self.server.cert_path(),
            "--tls-key-file",
            &self.server.key_path(),
            "--tls-ca-cert-file",
            &self.ca,
        ]
        .map(str::to_owned)
        .to_vec()
    }

    fn cli_args(&self) -> Vec<String> {
        [
            "--tls",
            "--cacert",
            &self.ca,
            "--cert",
            &self.cli.cert_path(),
            "--key",
            &self.cli.key_path(),
        ]
        .map(str::to_owned)
        .to_vec()
    }
}

struct ClusterNode {
    port: u16,
    /// The cluster bus port.
    bus: u16,
    /// Where the node keeps `nodes.conf` (its identity and view of the cluster).
    dir: std::path::PathBuf,
    child: Option<Child>,
}

impl ClusterNode {
    /// Starts `redis-server` on the node's ports and directory; a node started again on its
    /// `nodes.conf` rejoins the cluster as the node it was.
    fn spawn(&mut self, tls: Option<&NodeTls>) -> anyhow::Result<()> {
        let mut server = Command::new("redis-server");
        match tls {
            None => server.args(["--port", &self.port.to_string()]),
            Some(tls) => server
                .args(["--port", "0", "--tls-port", &self.port.to_string()])
                .args(tls.server_args()),
        };
        let child = server
            .args(["--bind", "127.0.0.1"])
            .args([
                "--cluster-enabled",
                "yes",
                "--cluster-port",
                &self.bus.to_string(),
            ])
            .args(["--cluster-node-timeout", &NODE_TIMEOUT_MS.to_string()])
            .args(["--cluster-config-file", "nodes.conf"])
            .args(["--save", "", "--appendonly", "no"])
            .args([
                "--repl-diskless-sync",
                "yes",
                "--repl-diskless-sync-delay",
                "0",
            ])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // In the test's process group (no group of their own): a test runner that kills
            // a timed-out test's group takes the nodes with it.
            .spawn()
            .context("start redis-server --cluster-enabled yes")?;
        self.child = Some(child);
        Ok(())
    }
}

impl RedisCluster {
    /// Starts six nodes, joins them with `redis-cli --cluster create … --cluster-replicas 1`,
    /// and waits until every node says `cluster_state:ok` and every master has an in-sync
    /// replica.
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_with(None).await
    }

    /// [`Self::start`], every node speaking only TLS (clients, the cluster bus and replication)
    /// with a certificate of `pki`, and requiring a client certificate signed by its CA.
    pub async fn start_tls(pki: &Pki) -> anyhow::Result<Self> {
        Self::start_with(Some(NodeTls {
            ca: pki.ca_path(),
            server: pki.service("redis-cluster")?,
            cli: pki.client("redis-cli")?,
        }))
        .await
    }

    async fn start_with(tls: Option<NodeTls>) -> anyhow::Result<Self> {
        check_binaries()?;
        let dir = TempDir::new("fs_redis_cluster")?;
        let mut nodes = Vec::with_capacity(6);
        let mut taken = std::collections::HashSet::new();
        for _ in 0..6 {
            let (port, bus) = (distinct_port(&mut taken)?, distinct_port(&mut taken)?);
            let node_dir = dir.0.join(port.to_string());
            std::fs::create_dir_all(&node_dir).context("create a node's directory")?;
            let mut node = ClusterNode {
                port,
                bus,
                dir: node_dir,
                child: None,
            };
            node.spawn(tls.as_ref())?;
            nodes.push(node);
        }
        let cluster = Self {
            nodes,
            tls,
            _dir: dir,
        };
        for node in &cluster.nodes {
            wait_port(node.port, Duration::from_secs(15), "a Redis Cluster node").await?;
        }
        let addrs: Vec<String> = cluster
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let mut create = tokio::process::Command::new("redis-cli");
        if let Some(tls) = &cluster.tls {
            create.args(tls.cli_args());
        }
        let out = tokio::time::timeout(
            SETTLE_TIMEOUT,
            create
                .arg("--cluster")
                .arg("create")
                .args(&addrs)
                .args(["--cluster-replicas", "1", "--cluster-yes"])
                .kill_on_drop(true)
                .output(),
        )
        .await
        .context("redis-cli --cluster create timed out")?
        .context("run redis-cli --cluster create")?;
        if !out.status.success() {
            bail!(
                "redis-cli --cluster create failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        cluster.wait_settled(None).await?;
        Ok(cluster)
    }

    /// `redis://127.0.0.1:PORT` (`rediss://` with TLS) of every node (what
    /// `redis.cluster_nodes` lists).
    pub fn urls(&self) -> Vec<String> {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        self.nodes
            .iter()
            .map(|n| format!("{scheme}://127.0.0.1:{}", n.port))
            .collect()
    }

    /// The masters serving slots now, as a live node sees them.
    pub async fn masters(&self) -> anyhow::Result<Vec<Node>> {
        for node in self.live() {
            if let Ok(text) = self.cli(node.port, &["CLUSTER", "NODES"]).await {
                let masters = parse_masters(&text);
                if !masters.is_empty() {
                    return Ok(masters);
                }
            }
        }
        bail!("no live node of the cluster answered CLUSTER NODES")
    }

    /// The port of the master serving `slot`.
    pub async fn master_of(&self, slot: u16) -> anyhow::Result<u16> {
        self.masters()
            .await?
            .into_iter()
            .find(|m| m.serves(slot))
            .map(|m| m.port)
            .with_context(|| format!("no master serves slot {slot}"))
    }

    /// Kills the master on `port` with SIGKILL and waits until its replica serves its slots
    /// and every live node says `cluster_state:ok`. Returns the new master's port.
    pub async fn kill_master(&mut self, port: u16) -> anyhow::Result<u16> {
        let slot = self
            .masters()
            .await?
            .into_iter()
            .find(|m| m.port == port)
            .and_then(|m| m.first_slot())
            .with_context(|| format!("127.0.0.1:{port} is not a master serving slots"))?;
        self.kill(port)?;
        self.wait_settled(Some(port)).await?;
        let new = self.master_of(slot).await?;
        anyhow::ensure!(
            new != port,
            "slot {slot} is still served by the killed master"
        );
        Ok(new)
    }

    /// Stops the master on `port` from shipping writes to its replica: a password the replica
    /// does not know, then its replication link cut, so it cannot come back. Writes the master
    /// acknowledges from now on are the tail that asynchronous replication had not shipped when
    /// the master dies ([`Self::kill_master`]): the promoted replica never sees them. Clients
    /// already connected stay authenticated.
    pub async fn cut_replication(&self, port: u16) -> anyhow::Result<()> {
        let password = crate::unique_name("cut");
        let set = self
            .cli(port, &["CONFIG", "SET", "requirepass", &password])
            .await?;
        anyhow::ensure!(set.trim() == "OK", "CONFIG SET requirepass: {set}");
        let killed = self
            .cli_auth(port, &password, &["CLIENT", "KILL", "TYPE", "replica"])
            .await?;
        anyhow::ensure!(
            killed.trim().parse::<u32>().is_ok_and(|n| n >= 1),
            "CLIENT KILL TYPE replica: {killed}"
        );
        Ok(())
    }

    /// Kills the node on `port` with SIGKILL (no failover wait).
    pub fn kill(&mut self, port: u16) -> anyhow::Result<()> {
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.port == port)
            .with_context(|| format!("no node of this cluster on port {port}"))?;
        let mut child = node
            .child
            .take()
            .with_context(|| format!("the node on port {port} is already dead"))?;
        child.kill().context("SIGKILL a Redis node")?;
        child.wait().context("reap a Redis node")?;
        Ok(())
    }

    /// Starts the killed node on `port` again on its `nodes.conf`, empty (the nodes keep no
    /// data on disk), and waits until the cluster has settled with all six nodes: a master
    /// that was failed over comes back as the replica of the node that replaced it.
    pub async fn restart(&mut self, port: u16) -> anyhow::Result<()> {
        let tls = self.tls.as_ref();
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.port == port)
            .with_context(|| format!("no node of this cluster on port {port}"))?;
        anyhow::ensure!(node.child.is_none(), "the node on port {port} is running");
        node.spawn(tls)?;
        wait_port(port, Duration::from_secs(15), "a Redis Cluster node").await?;
        self.wait_settled(None).await
    }

    fn live(&self) -> impl Iterator<Item = &ClusterNode> {
        self.nodes.iter().filter(|n| n.child.is_some())
    }

    /// Waits until every live node says `cluster_state:ok`, three masters other than `dead`
    /// serve all 16384 slots, and every master with a live replica has it in sync.
    async fn wait_settled(&self, dead: Option<u16>) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + SETTLE_TIMEOUT;
        loop {
            let Err(last) = self.settled(dead).await else {
                return Ok(());
            };
            if tokio::time::Instant::now() >= deadline {
                bail!("the Redis Cluster did not settle within {SETTLE_TIMEOUT:?}: {last:#}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn settled(&self, dead: Option<u16>) -> anyhow::Result<()> {
        for node in self.live() {
            let info = self.cli(node.port, &["CLUSTER", "INFO"]).await?;
            anyhow::ensure!(
                info.lines().any(|l| l.trim() == "cluster_state:ok"),
                "node {} is not cluster_state:ok",
                node.port
            );
            let masters = parse_masters(&self.cli(node.port, &["CLUSTER", "NODES"]).await?);
            anyhow::ensure!(
                masters.len() == 3 && masters.iter().all(|m| Some(m.port) != dead),
                "node {} sees masters {:?}",
                node.port,
                masters.iter().map(Node::addr).collect::<Vec<_>>()
            );
            let served: u32 = masters
                .iter()
                .flat_map(|m| &m.slots)
                .map(|(lo, hi)| u32::from(hi - lo) + 1)
                .sum();
            anyhow::ensure!(served == 16_384, "node {} sees {served} slots", node.port);
            if masters.iter().any(|m| m.port == node.port) {
                let repl = self.cli(node.port, &["INFO", "replication"]).await?;
                let replicas = repl
                    .lines()
                    .filter(|l| l.starts_with("slave") && l.contains("state=online"))
                    .count();
                let live_replicas = self.live().count() - 3;
                // With all six alive every master has its replica; after a kill, the dead
                // master's replica became a master and has none.
                anyhow::ensure!(
                    replicas >= 1 || live_replicas < 3,
                    "master {} has no replica in sync",
                    node.port
                );
            }
        }
        Ok(())
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// A free port not handed out before in `taken`.
fn distinct_port(taken: &mut std::collections::HashSet<u16>) -> anyhow::Result<u16> {
    for _ in 0..100 {
        let port = free_port()?;
        if taken.insert(port) {
            return Ok(port);
        }
    }
    bail!("no distinct free port after 100 tries")
}

/// Fails with a clear message when the Redis programs are missing.
fn check_binaries() -> anyhow::Result<()> {
    for program in ["redis-server", "redis-cli"] {
        let ok = Command::new(program)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        anyhow::ensure!(
            ok,
            "`{program} --version` failed: the Redis Cluster tests need redis-server and \
             redis-cli (Debian package redis-server) on PATH"
        );
    }
    Ok(())
}

impl RedisCluster {
    /// `redis-cli -p PORT ARGS…`'s output (bounded by a timeout).
    async fn cli(&self, port: u16, args: &[&str]) -> anyhow::Result<String> {
        cli_with(self.tls.as_ref(), port, None, args).await
    }

    /// [`Self::cli`] authenticated with `password`.
    async fn cli_auth(&self, port: u16, password: &str, args: &[&str]) -> anyhow::Result<String> {
        cli_with(self.tls.as_ref(), port, Some(password), args).await
    }
}

async fn cli_with(
    tls: Option<&NodeTls>,
    port: u16,
    password: Option<&str>,
    args: &[&str],
) -> anyhow::Result<String> {
    let mut cmd = tokio::process::Command::new("redis-cli");
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string()]);
    if let Some(tls) = tls {
        cmd.args(tls.cli_args());
    }
    if let Some(password) = password {
        // Through the environment, not the command line.
        cmd.env("REDISCLI_AUTH", password);
    }
    let out = tokio::time::timeout(
        Duration::from_secs(5),
        cmd.args(args).kill_on_drop(true).output(),
    )
    .await
    .with_context(|| format!("redis-cli -p {port} {args:?} timed out"))?
    .with_context(|| format!("run redis-cli -p {port}"))?;
    anyhow::ensure!(out.status.success(), "redis-cli -p {port} {args:?} failed");
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
