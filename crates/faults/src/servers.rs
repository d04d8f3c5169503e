//! Private PostgreSQL, Redis and RabbitMQ servers on loopback ports of their own, so a scenario
//! may crash, stop or restart them without disturbing the shared servers (5432/6379/5672) or
//! another test. Every server is stopped and its files removed when its value is dropped.

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, bail};

pub use flashsale_test_support::servers::{TempDir, free_port};
use flashsale_test_support::servers::{as_user, chown, pg_bin, wait_port};

/// Sends `signal` (`KILL`, `TERM`, `STOP`, `CONT`) to the process group `pgid`.
pub fn signal_group(pgid: u32, signal: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg("--")
        .arg(format!("-{pgid}"))
        .stderr(Stdio::null())
        .status();
}

/// Sends `signal` to the process `pid`.
pub fn signal(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status();
}

// ---------------------------------------------------------------------------------------------

/// A PostgreSQL cluster of its own (trust auth, no fsync), run by `pg_ctl`.
pub struct Postgres {
    pub port: u16,
    dir: TempDir,
    running: bool,
}

impl Postgres {
    pub async fn start() -> anyhow::Result<Self> {
        let dir = TempDir::new("fs_faults_pg")?;
        chown(&dir.0, "postgres")?;
        let out = as_user("postgres", &pg_bin("initdb"))
            .arg("-D")
            .arg(dir.0.join("data"))
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
            .stdout(Stdio::null())
            .output()
            .context("run initdb")?;
        if !out.status.success() {
            bail!("initdb failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        let mut pg = Self {
            port: free_port()?,
            dir,
            running: false,
        };
        pg.start_again().await?;
        Ok(pg)
    }

    /// `postgres://postgres@127.0.0.1:PORT/<db>`.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    fn pg_ctl(&self) -> Command {
        let mut c = as_user("postgres", &pg_bin("pg_ctl"));
        c.arg("-D").arg(self.dir.0.join("data"));
        c
    }

    /// Starts the server on its data directory (after [`Postgres::crash`]).
    pub async fn start_again(&mut self) -> anyhow::Result<()> {
        // synchronous_commit stays on: with it off an immediate stop loses commits the services
        // were told are durable, a loss the suite would then wrongly blame on them.
        let opts = format!(
            "-c listen_addresses=127.0.0.1 -p {} -k {} -c fsync=off -c full_page_writes=off \
             -c max_connections=200",
            self.port,
            self.dir.0.display()
        );
        let out = self
            .pg_ctl()
            .arg("-l")
            .arg(self.dir.0.join("server.log"))
            .args(["-w", "-t", "60", "-o", &opts, "start"])
            .output()
            .context("run pg_ctl start")?;
        if !out.status.success() {
            let log = std::fs::read_to_string(self.dir.0.join("server.log")).unwrap_or_default();
            bail!(
                "pg_ctl start failed: {}\n{log}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        self.running = true;
        wait_port(self.port, Duration::from_secs(30), "PostgreSQL").await
    }

    /// Stops the server at once, as a crash would (`pg_ctl stop -m immediate`).
    pub fn crash(&mut self) {
        let _ = self
            .pg_ctl()
            .args(["-m", "immediate", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        self.running = false;
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if self.running {
            self.crash();
        }
    }
}

// ---------------------------------------------------------------------------------------------

/// A Redis server of its own, as a child process. It never saves by itself; a scenario may take
/// a snapshot ([`Redis::save`]) and later restart the server from it.
pub struct Redis {
    pub port: u16,
    dir: TempDir,
    child: Option<Child>,
}

/// The snapshot file in the server's directory.
const REDIS_DUMP: &str = "dump.rdb";

impl Redis {
    pub async fn start() -> anyhow::Result<Self> {
        let mut r = Self {
            port: free_port()?,
            dir: TempDir::new("fs_faults_redis")?,
            child: None,
        };
        r.start_again().await?;
        Ok(r)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts an empty server on the same port (after [`Redis::kill`]): a snapshot taken
    /// earlier is removed first.
    pub async fn start_again(&mut self) -> anyhow::Result<()> {
        let dump = self.dir.0.join(REDIS_DUMP);
        if dump.exists() {
            std::fs::remove_file(&dump).with_context(|| format!("remove {}", dump.display()))?;
        }
        self.spawn().await
    }

    /// Starts the server on the same port from the snapshot [`Redis::save`] wrote (after
    /// [`Redis::kill`]): everything written since the snapshot is gone, what it held is back.
    pub async fn start_from_snapshot(&mut self) -> anyhow::Result<()> {
        let dump = self.dir.0.join(REDIS_DUMP);
        anyhow::ensure!(dump.exists(), "no Redis snapshot at {}", dump.display());
        self.spawn().await
    }

    /// Writes a snapshot of everything the server holds now (`SAVE`).
    pub async fn save(&self) -> anyhow::Result<()> {
        let client = deadpool_redis::redis::Client::open(self.url())?;
        let mut c = client.get_multiplexed_async_connection().await?;
        let _: () = deadpool_redis::redis::cmd("SAVE")
            .query_async(&mut c)
            .await
            .context("Redis SAVE")?;
        Ok(())
    }

    async fn spawn(&mut self) -> anyhow::Result<()> {
        use std::os::unix::process::CommandExt as _;
        let child = Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--dbfilename",
                REDIS_DUMP,
            ])
            .arg("--dir")
            .arg(&self.dir.0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .context("start redis-server")?;
        self.child = Some(child);
        wait_port(self.port, Duration::from_secs(15), "Redis").await?;
        // The port opens before a snapshot is loaded; until then commands answer LOADING.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            let ping = async {
                let client = deadpool_redis::redis::Client::open(self.url())?;
                let mut c = client.get_multiplexed_async_connection().await?;
                deadpool_redis::redis::cmd("PING")
                    .query_async::<String>(&mut c)
                    .await
            };
            match ping.await {
                Ok(_) => return Ok(()),
                Err(e) if tokio::time::Instant::now() >= deadline => {
                    bail!("Redis on port {} does not answer: {e}", self.port)
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// Kills the server: everything it held is gone.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}

// ---------------------------------------------------------------------------------------------

/// A RabbitMQ node of its own beside the default one: its own Erlang node name
/// (`rabbit_<port>@localhost`), AMQP and distribution ports, config, data and log directories
/// (the approach of `scripts/dev-infra.sh`). It takes several seconds to accept connections.
pub struct Rabbit {
    pub port: u16,
    dir: TempDir,
    child: Option<Child>,
}

impl Rabbit {
    pub async fn start() -> anyhow::Result<Self> {
        let dir = TempDir::new("fs_faults_rmq")?;
        let port = free_port()?;
        // The node's own config: the system one pins the listener to 5672.
        std::fs::write(
            dir.0.join("rabbitmq.conf"),
            format!("listeners.tcp.local = 127.0.0.1:{port}\nloopback_users = none\n"),
        )?;
        std::fs::write(dir.0.join("env.conf"), "ERL_EPMD_ADDRESS=127.0.0.1\n")?;
        std::fs::write(dir.0.join("enabled_plugins"), "[].\n")?;
        chown(&dir.0, "rabbitmq")?;
        let mut r = Self {
            port,
            dir,
            child: None,
        };
        r.start_again().await?;
        Ok(r)
    }

    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    /// Starts the node on its data directory (after [`Rabbit::stop`]).
    pub async fn start_again(&mut self) -> anyhow::Result<()> {
        use std::os::unix::process::CommandExt as _;
        let d = &self.dir.0;
        let port = self.port;
        let dist = free_port()?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(d.join("server.out"))?;
        let child = as_user("rabbitmq", Path::new("/usr/sbin/rabbitmq-server"))
            .env("HOME", d)
            .env("RABBITMQ_CONF_ENV_FILE", d.join("env.conf"))
            .env("RABBITMQ_CONFIG_FILE", d.join("rabbitmq.conf"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", d.join("enabled_plugins"))
            .env("RABBITMQ_NODENAME", format!("rabbit_{port}@localhost"))
            .env("RABBITMQ_NODE_PORT", port.to_string())
            .env("RABBITMQ_DIST_PORT", dist.to_string())
            .env("RABBITMQ_MNESIA_BASE", d.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", d.join("log"))
            .env("RABBITMQ_PID_FILE", d.join("pid"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .spawn()
            .context("start rabbitmq-server")?;
        self.child = Some(child);
        wait_port(self.port, Duration::from_secs(90), "RabbitMQ").await?;
        // The listener opens a little before the node answers AMQP handshakes.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            match lapin::Connection::connect(&self.url(), lapin::ConnectionProperties::default())
                .await
            {
                Ok(c) => {
                    let _ = c.close(200, "ready".into()).await;
                    return Ok(());
                }
                Err(e) if tokio::time::Instant::now() >= deadline => {
                    bail!("RabbitMQ on port {port} does not answer: {e}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// Stops the node: `KILL` at once or `TERM` (a clean shutdown), and waits for it.
    pub fn stop(&mut self, kill: bool) {
        if let Some(mut c) = self.child.take() {
            signal_group(c.id(), if kill { "KILL" } else { "TERM" });
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while std::time::Instant::now() < deadline {
                if matches!(c.try_wait(), Ok(Some(_))) && !self.beam_alive() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            signal_group(c.id(), "KILL");
            let _ = c.wait();
        }
    }

    fn beam_alive(&self) -> bool {
        std::fs::read_to_string(self.dir.0.join("pid"))
            .ok()
            .and_then(|p| p.trim().parse::<u32>().ok())
            .is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists())
    }
}

impl Drop for Rabbit {
    fn drop(&mut self) {
        self.stop(true);
        // The Erlang VM may outlive the script that started it.
        if let Some(pid) = std::fs::read_to_string(self.dir.0.join("pid"))
            .ok()
            .and_then(|p| p.trim().parse::<u32>().ok())
        {
            signal(pid, "KILL");
        }
    }
}
