//! A private RabbitMQ cluster of three nodes on loopback ports of its own, for tests that kill a
//! node: each node has its own Erlang node name (`fs_rmq_<port>@localhost`), AMQP and
//! distribution ports, data and log directories in one temporary directory, and all share one
//! Erlang cookie (not the shared broker's, so neither can reach the other). Nodes 1 and 2 join
//! node 0 with `rabbitmqctl stop_app; join_cluster; start_app`. The shared broker
//! (`rabbit@<host>` on 5672) is never touched; epmd is shared with it.
//!
//! [`RabbitCluster::kill`] SIGKILLs one node's Erlang VM; [`RabbitCluster::restart`] starts it
//! again on its data. Dropping the value kills every node and removes its files. Starting takes tens of seconds
//! (three Erlang VMs and two joins on a small machine): [`RabbitCluster::started_in`] says how
//! long.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::servers::{TempDir, as_user, chown, free_port, wait_port};

/// How long one node may take to accept AMQP connections.
const NODE_START: Duration = Duration::from_secs(120);
/// Times a node is started and asked to join before the cluster start gives up.
const JOIN_ATTEMPTS: u32 = 3;
/// How long one `rabbitmqctl` call may take.
const CLI_TIMEOUT: Duration = Duration::from_secs(90);

/// The directory of RabbitMQ's own scripts (`FLASHSALE_TEST_RABBITMQ_BIN` names another).
/// Called directly rather than through Debian's `/usr/sbin` wrappers, which would log into the
/// shared broker's files and use its Erlang cookie.
fn rabbit_bin(program: &str) -> PathBuf {
    let dir = std::env::var("FLASHSALE_TEST_RABBITMQ_BIN")
        .unwrap_or_else(|_| "/usr/lib/rabbitmq/bin".to_owned());
    Path::new(&dir).join(program)
}

/// One node of the cluster.
struct Node {
    name: String,
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

// === impl Node ===

impl Node {
    /// The process id of the node's Erlang VM (from its pid file), once it has written it.
    fn beam_pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.dir.join("pid"))
            .ok()
            .and_then(|p| p.trim().parse().ok())
    }

    /// Whether the node's start script has ended (the node is not running).
    fn exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_none_or(|c| c.try_wait().ok().flatten().is_some())
    }

    /// SIGKILL to the Erlang VM, then to the rest of the node's process group (the start
    /// script and its helpers).
    fn kill(&mut self) {
        if let Some(pid) = self.beam_pid() {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
        if let Some(mut c) = self.child.take() {
            let group = format!("-{}", c.id());
            let _ = Command::new("kill")
                .args(["-KILL", "--", &group])
                .stderr(Stdio::null())
                .status();
            let _ = c.wait();
        }
    }
}

/// A running three-node cluster; see the module documentation.
pub struct RabbitCluster {
    nodes: Vec<Node>,
    home: PathBuf,
    started_in: Duration,
    _dir: TempDir,
}

// === impl RabbitCluster ===

impl RabbitCluster {
    /// Starts three nodes, clusters them and waits until every node runs and lists all three.
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_nodes(3).await
    }

    /// [`RabbitCluster::start`] with `n` nodes (at least 1).
    pub async fn start_nodes(n: usize) -> anyhow::Result<Self> {
        anyhow::ensure!(n >= 1, "a cluster needs at least one node");
        let began = Instant::now();
        let dir = TempDir::new("fs_rmq_cluster")?;
        let home = dir.0.clone();
        let cookie = home.join(".erlang.cookie");
        std::fs::write(&cookie, uuid::Uuid::new_v4().simple().to_string())
            .context("write the Erlang cookie")?;
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&cookie, std::fs::Permissions::from_mode(0o400))
                .context("chmod the Erlang cookie")?;
        }
        let mut cluster = Self {
            nodes: Vec::with_capacity(n),
            home,
            started_in: Duration::ZERO,
            _dir: dir,
        };
        for i in 0..n {
            let node = cluster.prepare_node(i)?;
            cluster.nodes.push(node);
        }
        chown(&cluster.home, "rabbitmq")?;
        for i in 0..n {
            cluster.spawn_node(i)?;
        }
        for node in &cluster.nodes {
            if let Err(e) = wait_port(node.port, NODE_START, &node.name).await {
                let out = std::fs::read_to_string(node.dir.join("server.out")).unwrap_or_default();
                bail!("{e}\n{out}");
            }
        }
        let seed = cluster.nodes[0].name.clone();
        for i in 1..n {
            let mut attempt = 1;
            while let Err(e) = cluster.join(i, &seed).await {
                if attempt == JOIN_ATTEMPTS {
                    return Err(e);
                }
                attempt += 1;
                // The node to join may be the one that died: it starts again on its data.
                if cluster.nodes[0].exited() {
                    eprintln!("rabbit cluster: the seed node died; starting it again");
                    cluster.nodes[0].kill();
                    cluster.spawn_node(0)?;
                    wait_port(cluster.nodes[0].port, NODE_START, &seed).await?;
                    cluster.ctl(&seed, &["await_startup"]).await?;
                }
                // On a busy machine a node has been seen to die between its start and its join:
                // start it again from an empty data directory and join once more.
                eprintln!("rabbit cluster: node {i} did not join ({e:#}); starting it afresh");
                cluster.nodes[i].kill();
                let mnesia = cluster.nodes[i].dir.join("mnesia");
                if mnesia.exists() {
                    std::fs::remove_dir_all(&mnesia)
                        .with_context(|| format!("remove {}", mnesia.display()))?;
                }
                cluster.spawn_node(i)?;
                wait_port(cluster.nodes[i].port, NODE_START, &cluster.nodes[i].name).await?;
            }
        }
        let deadline = tokio::time::Instant::now() + NODE_START;
        loop {
            let running = cluster.running_nodes().await?;
            if cluster.nodes.iter().all(|n| running.contains(&n.name)) {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                bail!("the cluster runs {running:?} after {NODE_START:?}, not all {n} nodes");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        cluster.started_in = began.elapsed();
        Ok(cluster)
    }

    /// Node `i` leaves its own cluster and joins `seed`'s.
    async fn join(&self, i: usize, seed: &str) -> anyhow::Result<()> {
        let name = self.nodes[i].name.clone();
        self.ctl(&name, &["await_startup"]).await?;
        self.ctl(&name, &["stop_app"]).await?;
        self.ctl(&name, &["join_cluster", seed]).await?;
        self.ctl(&name, &["start_app"]).await?;
        wait_port(self.nodes[i].port, NODE_START, &name).await
    }

    fn prepare_node(&self, i: usize) -> anyhow::Result<Node> {
        let port = free_port()?;
        let dir = self.home.join(format!("n{i}"));
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        std::fs::write(
            dir.join("rabbitmq.conf"),
            format!("listeners.tcp.1 = 127.0.0.1:{port}\nloopback_users = none\n"),
        )?;
        std::fs::write(dir.join("env.conf"), "ERL_EPMD_ADDRESS=127.0.0.1\n")?;
        std::fs::write(dir.join("enabled_plugins"), "[].\n")?;
        Ok(Node {
            name: format!("fs_rmq_{port}@localhost"),
            port,
            dir,
            child: None,
        })
    }

    fn spawn_node(&mut self, i: usize) -> anyhow::Result<()> {
        use std::os::unix::process::CommandExt as _;
        let home = self.home.clone();
        let node = &mut self.nodes[i];
        let d = node.dir.clone();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(d.join("server.out"))?;
        let child = as_user("rabbitmq", &rabbit_bin("rabbitmq-server"))
            .env("HOME", &home)
            .env("RABBITMQ_CONF_ENV_FILE", d.join("env.conf"))
            .env("RABBITMQ_CONFIG_FILE", d.join("rabbitmq.conf"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", d.join("enabled_plugins"))
            .env("RABBITMQ_NODENAME", &node.name)
            .env("RABBITMQ_NODE_PORT", node.port.to_string())
            .env("RABBITMQ_DIST_PORT", free_port()?.to_string())
            .env("RABBITMQ_MNESIA_BASE", d.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", d.join("log"))
            .env("RABBITMQ_PID_FILE", d.join("pid"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .spawn()
            .with_context(|| format!("start rabbitmq-server {}", node.name))?;
        node.child = Some(child);
        Ok(())
    }

    /// How long [`RabbitCluster::start`] took, from nothing to three clustered running nodes.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// How many nodes the cluster has.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the cluster has no node (never, once started).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// `amqp://guest:guest@127.0.0.1:PORT/%2f` of node `i`.
    pub fn url(&self, i: usize) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.nodes[i].port)
    }

    /// Every node's URL, in node order (what `amqp.urls` lists).
    pub fn urls(&self) -> Vec<String> {
        (0..self.nodes.len()).map(|i| self.url(i)).collect()
    }

    /// The Erlang node name of node `i` (`fs_rmq_<port>@localhost`).
    pub fn node_name(&self, i: usize) -> &str {
        &self.nodes[i].name
    }

    /// The AMQP port of node `i`.
    pub fn port(&self, i: usize) -> u16 {
        self.nodes[i].port
    }

    /// The index of the node whose Erlang name or AMQP URL is `which`.
    pub fn index_of(&self, which: &str) -> Option<usize> {
        self.nodes
            .iter()
            .position(|n| n.name == which)
            .or_else(|| (0..self.nodes.len()).find(|i| self.url(*i) == which))
    }

    /// Whether node `i` has been killed.
    pub fn is_killed(&self, i: usize) -> bool {
        self.nodes[i].child.is_none()
    }

    /// Kills node `i` with SIGKILL (no clean shutdown: its connections drop, its queue
    /// replicas vanish mid-write) and waits until its AMQP port is closed.
    pub async fn kill(&mut self, i: usize) -> anyhow::Result<()> {
        let node = &mut self.nodes[i];
        anyhow::ensure!(node.child.is_some(), "node {} is already killed", node.name);
        node.kill();
        let port = node.port;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            if tokio::time::Instant::now() >= deadline {
                bail!("node {i} still accepts connections after SIGKILL");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// Starts killed node `i` again on its data (it rejoins the cluster by itself) and waits
    /// until the cluster lists it running.
    pub async fn restart(&mut self, i: usize) -> anyhow::Result<()> {
        anyhow::ensure!(self.is_killed(i), "node {i} is running");
        self.spawn_node(i)?;
        wait_port(self.nodes[i].port, NODE_START, &self.nodes[i].name).await?;
        let name = self.nodes[i].name.clone();
        let deadline = tokio::time::Instant::now() + NODE_START;
        while !self.running_nodes().await?.contains(&name) {
            if tokio::time::Instant::now() >= deadline {
                bail!("{name} did not rejoin the cluster within {NODE_START:?}");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Ok(())
    }

    /// A node that has not been killed, to ask the cluster questions.
    fn live_node(&self) -> anyhow::Result<&str> {
        self.nodes
            .iter()
            .find(|n| n.child.is_some())
            .map(|n| n.name.as_str())
            .context("every node of the cluster is killed")
    }

    /// The nodes the cluster reports running (asked of a live node).
    pub async fn running_nodes(&self) -> anyhow::Result<Vec<String>> {
        let node = self.live_node()?.to_owned();
        let out = self
            .ctl(&node, &["cluster_status", "--formatter", "json"])
            .await?;
        let json: serde_json::Value =
            serde_json::from_str(&out).with_context(|| format!("cluster_status: {out}"))?;
        Ok(strings(&json["running_nodes"]))
    }

    /// The leader, the members and the running members of quorum queue `queue` (in vhost `/`) as node indexes; the
    /// leader is `None` while an election runs.
    pub async fn quorum_queue(&self, queue: &str) -> anyhow::Result<QuorumQueue> {
        let node = self.live_node()?.to_owned();
        let out = self
            .ctl(
                &node,
                &[
                    "list_queues",
                    "-p",
                    "/",
                    "--formatter",
                    "json",
                    "name",
                    "type",
                    "leader",
                    "members",
                    "online",
                ],
            )
            .await?;
        let rows: Vec<serde_json::Value> =
            serde_json::from_str(&out).with_context(|| format!("list_queues: {out}"))?;
        let row = rows
            .iter()
            .find(|r| r["name"] == queue)
            .with_context(|| format!("no queue {queue} in {out}"))?;
        anyhow::ensure!(
            row["type"] == "quorum",
            "queue {queue} is not a quorum queue: {row}"
        );
        let leader = row["leader"].as_str().and_then(|l| self.index_of(l));
        let nodes = |key: &str| {
            strings(&row[key])
                .iter()
                .filter_map(|m| self.index_of(m))
                .collect()
        };
        Ok(QuorumQueue {
            leader,
            members: nodes("members"),
            online: nodes("online"),
        })
    }

    /// Runs `rabbitmqctl -n <node> <args>` (as the `rabbitmq` user, with the cluster's cookie)
    /// and returns its standard output.
    pub async fn ctl(&self, node: &str, args: &[&str]) -> anyhow::Result<String> {
        let mut cmd = as_user("rabbitmq", &rabbit_bin("rabbitmqctl"));
        cmd.env("HOME", &self.home)
            .args(["-q", "-n", node])
            .args(args)
            .stdin(Stdio::null());
        let mut cmd = tokio::process::Command::from(cmd);
        cmd.kill_on_drop(true);
        let out = tokio::time::timeout(CLI_TIMEOUT, cmd.output())
            .await
            .with_context(|| format!("rabbitmqctl {args:?} on {node} took over {CLI_TIMEOUT:?}"))?
            .context("run rabbitmqctl")?;
        if !out.status.success() {
            bail!(
                "rabbitmqctl {args:?} on {node} failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Drop for RabbitCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.kill();
        }
    }
}

/// Where a quorum queue's replicas are, as node indexes of a [`RabbitCluster`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuorumQueue {
    /// The node of the current leader, when one is elected.
    pub leader: Option<usize>,
    /// The nodes holding a replica.
    pub members: Vec<usize>,
    /// The members whose replica runs.
    pub online: Vec<usize>,
}

/// The strings of a JSON array (empty for anything else).
fn strings(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}
