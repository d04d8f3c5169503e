//! The three service binaries as processes of their own, wired to a scenario's private servers,
//! each one restartable after a crash with the same configuration.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use anyhow::{Context as _, bail};
use tokio::process::{Child, Command};

use crate::servers::{free_port, signal};

/// Which service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    ProductStock,
    Order,
    Outbound,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::ProductStock => "product-stock",
            Kind::Order => "order",
            Kind::Outbound => "outbound",
        }
    }

    /// The `FLASHSALE_<SERVICE>__` part of its environment keys.
    fn env_key(self) -> &'static str {
        match self {
            Kind::ProductStock => "PRODUCT_STOCK",
            Kind::Order => "ORDER",
            Kind::Outbound => "OUTBOUND",
        }
    }
}

/// One service process and what it takes to start it again.
pub struct Service {
    pub kind: Kind,
    pub port: u16,
    /// Where it answers `GET /metrics`.
    pub metrics_port: u16,
    exe: PathBuf,
    env: Vec<(String, String)>,
    log: PathBuf,
    child: Option<Child>,
    /// Started more than once (a scenario restarted it).
    pub restarts: u32,
    /// Which replica of its service (1 unless a scenario runs several).
    pub replica: u32,
}

impl Service {
    /// Prepares (does not start) `kind` with settings `(SECTION__KEY, value)` on a free port.
    pub fn new(kind: Kind, dir: &Path, settings: &[(String, String)]) -> anyhow::Result<Self> {
        Self::on_port(kind, dir, settings, free_port()?)
    }

    /// [`Service::new`] on a port chosen beforehand (another service is told it first).
    pub fn on_port(
        kind: Kind,
        dir: &Path,
        settings: &[(String, String)],
        port: u16,
    ) -> anyhow::Result<Self> {
        // `FLASHSALE_FAULTS_BIN_DIR` points at a copy of the binaries a shared target directory
        // cannot overwrite mid-run; by default they are cargo's, beside this executable.
        let bins = match std::env::var_os("FLASHSALE_FAULTS_BIN_DIR") {
            Some(dir) => PathBuf::from(dir),
            None => flashsale_e2e::bin_dir()?,
        };
        let exe = bins.join(format!("flashsale-{}", kind.name()));
        if !exe.exists() {
            bail!(
                "{} is missing: run `cargo build --workspace --bins` first",
                exe.display()
            );
        }
        let key = kind.env_key();
        let metrics_port = free_port()?;
        let config_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config");
        let mut env = vec![
            (
                "FLASHSALE_CONFIG_DIR".to_owned(),
                config_dir.display().to_string(),
            ),
            ("RUST_LOG".to_owned(), "warn,flashsale=info".to_owned()),
            (
                format!("FLASHSALE_{key}__GRPC__ADDR"),
                format!("127.0.0.1:{port}"),
            ),
            (
                format!("FLASHSALE_{key}__METRICS__ADDR"),
                format!("127.0.0.1:{metrics_port}"),
            ),
        ];
        env.extend(
            settings
                .iter()
                .map(|(k, v)| (format!("FLASHSALE_{key}__{k}"), v.clone())),
        );
        Ok(Self {
            kind,
            port,
            metrics_port,
            exe,
            env,
            log: dir.join(format!("{}.log", kind.name())),
            child: None,
            restarts: 0,
            replica: 1,
        })
    }

    /// The same service as replica `n` (its own log file).
    pub fn labelled(mut self, n: u32) -> Self {
        self.replica = n;
        self.log.set_file_name(format!("{}.log", self.label()));
        self
    }

    /// Its name, with its replica number when it is not the first.
    pub fn label(&self) -> String {
        match self.replica {
            1 => self.kind.name().to_owned(),
            n => format!("{}-{n}", self.kind.name()),
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Starts the process (`failpoints`: a `FLASHSALE_FAILPOINTS` spec) and waits until it is
    /// SERVING.
    pub async fn start(&mut self, failpoints: Option<&str>) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let mut cmd = Command::new(&self.exe);
        cmd.arg("serve")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true);
        if let Some(spec) = failpoints {
            cmd.env("FLASHSALE_FAILPOINTS", spec);
        } else {
            cmd.env_remove("FLASHSALE_FAILPOINTS");
        }
        if self.child.is_some() {
            self.restarts += 1;
        }
        self.child = Some(
            cmd.spawn()
                .with_context(|| format!("start {}", self.exe.display()))?,
        );
        self.wait_serving(Duration::from_secs(60)).await
    }

    /// Waits until the health check answers SERVING.
    pub async fn wait_serving(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if serving(&self.url()).await {
                return Ok(());
            }
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                bail!(
                    "{} exited ({status}) before SERVING:\n{}",
                    self.label(),
                    self.log_tail()
                );
            }
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "{} did not become SERVING within {timeout:?}:\n{}",
                    self.label(),
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// Whether the process has ended (a failpoint's `exit`, a crash).
    pub fn exited(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(Some(_))),
            None => true,
        }
    }

    /// SIGKILL, and waits for the process to be gone.
    pub async fn kill(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill().await;
        }
    }

    /// SIGTERM, as a rolling update sends it, and waits up to `within` for the process to stop
    /// by itself: its exit status and how long it took. Still running then, it is killed and
    /// this is an error.
    pub async fn terminate(
        &mut self,
        within: std::time::Duration,
    ) -> anyhow::Result<(std::process::ExitStatus, std::time::Duration)> {
        let name = self.kind.name();
        let Some(c) = self.child.as_mut() else {
            anyhow::bail!("{name} is not running");
        };
        let Some(pid) = c.id() else {
            anyhow::bail!("{name} has already exited");
        };
        let asked = std::time::Instant::now();
        signal(pid, "TERM");
        match tokio::time::timeout(within, c.wait()).await {
            Ok(status) => Ok((status?, asked.elapsed())),
            Err(_) => {
                let _ = c.kill().await;
                anyhow::bail!("{name} still running {within:?} after SIGTERM")
            }
        }
    }

    /// SIGSTOP: the process keeps its sockets but answers nothing.
    pub fn pause(&self) {
        if let Some(pid) = self.pid() {
            signal(pid, "STOP");
        }
    }

    /// SIGCONT.
    pub fn resume(&self) {
        if let Some(pid) = self.pid() {
            signal(pid, "CONT");
        }
    }

    /// The sum of every sample of the counters named `names` (any labels) on its `/metrics`
    /// since it last started; `None` when it does not answer.
    pub async fn counters(&self, names: &[&str]) -> Option<f64> {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let scrape = async {
            let mut s = tokio::net::TcpStream::connect(("127.0.0.1", self.metrics_port)).await?;
            s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
                .await?;
            let mut body = String::new();
            s.read_to_string(&mut body).await?;
            Ok::<_, std::io::Error>(body)
        };
        let body = tokio::time::timeout(Duration::from_secs(5), scrape)
            .await
            .ok()?
            .ok()?;
        Some(
            body.lines()
                .filter(|l| {
                    let name = l.split(['{', ' ']).next().unwrap_or_default();
                    names.contains(&name)
                })
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum(),
        )
    }

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.start_kill();
        }
    }
}

async fn serving(url: &str) -> bool {
    let Ok(endpoint) = tonic::transport::Endpoint::from_shared(url.to_owned()) else {
        return false;
    };
    let Ok(channel) = endpoint
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(1))
        .connect()
        .await
    else {
        return false;
    };
    let Ok(resp) = tonic_health::pb::health_client::HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
    else {
        return false;
    };
    resp.into_inner().status
        == tonic_health::pb::health_check_response::ServingStatus::Serving as i32
}
