//! Private PostgreSQL, Redis and RabbitMQ servers on loopback ports of their own, with or without
//! TLS, for tests that need a server configured unlike the shared ones (5432/6379/5672). Each is
//! stopped and its files removed when its value is dropped. PostgreSQL and RabbitMQ run as their
//! own system users when this process is root (as the fault suite's servers do).

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, bail};

use crate::tls::{CertFiles, Pki};

/// A free loopback port (the kernel's choice; free when this returns).
pub fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("bind a free port")?;
    Ok(l.local_addr()?.port())
}

/// A free loopback port below the kernel's ephemeral range (32768 and up), for a server that
/// binds it later: a port `bind(0)` handed out and gave back may meanwhile become the local port
/// of any test's outgoing connection, which one below that range never does.
pub fn port_outside_the_ephemeral_range() -> anyhow::Result<u16> {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
        ^ std::process::id().rotate_left(16);
    (0..2_000u32)
        .map(|i| 20_000 + ((seed.wrapping_add(i.wrapping_mul(7_919))) % 12_000) as u16)
        .find(|port| std::net::TcpListener::bind(("127.0.0.1", *port)).is_ok())
        .context("no free port in 20000..32000")
}

/// A PostgreSQL server program (Debian's layout; `FLASHSALE_TEST_PG_BIN`, or the fault suite's
/// `FLASHSALE_FAULTS_PG_BIN`, names another directory).
pub fn pg_bin(program: &str) -> PathBuf {
    let dir = std::env::var("FLASHSALE_TEST_PG_BIN")
        .or_else(|_| std::env::var("FLASHSALE_FAULTS_PG_BIN"))
        .unwrap_or_else(|_| "/usr/lib/postgresql/15/bin".to_owned());
    Path::new(&dir).join(program)
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// `program` run as `user` when this process is root (PostgreSQL refuses to run as root, and
/// RabbitMQ's files belong to its own user), else as ourselves.
pub fn as_user(user: &str, program: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", user, "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

/// Gives `path` (recursively) to `user` when this process is root.
pub fn chown(path: &Path, user: &str) -> anyhow::Result<()> {
    if is_root() {
        let ok = Command::new("chown")
            .args(["-R", user])
            .arg(path)
            .status()
            .context("chown")?
            .success();
        anyhow::ensure!(ok, "chown {} to {user} failed", path.display());
    }
    Ok(())
}

/// A fresh temporary directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(prefix: &str) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(crate::unique_name(prefix));
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        Ok(Self(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Waits until `port` accepts TCP connections.
pub async fn wait_port(port: u16, timeout: Duration, what: &str) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("{what} did not accept connections on port {port} within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Copies `files` into `dir` as `name.pem` / `name.key` (private key mode 0600).
fn copy_pair(files: &CertFiles, dir: &Path, name: &str) -> anyhow::Result<(PathBuf, PathBuf)> {
    use std::os::unix::fs::PermissionsExt as _;
    let (cert, key) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}.key")),
    );
    std::fs::copy(&files.cert, &cert).context("copy certificate")?;
    std::fs::copy(&files.key, &key).context("copy key")?;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).context("chmod key")?;
    Ok((cert, key))
}

// ---------------------------------------------------------------------------------------------

/// A PostgreSQL cluster of its own. With TLS it accepts only TLS connections authenticated by a
/// client certificate (`hostssl … cert`: the certificate's common name is the user).
pub struct Postgres {
    pub port: u16,
    dir: TempDir,
}

impl Postgres {
    /// A plain-text cluster (trust authentication).
    pub async fn start_plain() -> anyhow::Result<Self> {
        Self::start(None).await
    }

    /// A cluster with `ssl = on`, its certificate from `pki`, client certificates required.
    pub async fn start_tls(pki: &Pki) -> anyhow::Result<Self> {
        Self::start(Some(pki)).await
    }

    async fn start(pki: Option<&Pki>) -> anyhow::Result<Self> {
        let dir = TempDir::new("fs_pg")?;
        let data = dir.0.join("data");
        chown(&dir.0, "postgres")?;
        let bin = pg_bin;
        let out = as_user("postgres", &bin("initdb"))
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
            .stdout(Stdio::null())
            .output()
            .context("run initdb")?;
        if !out.status.success() {
            bail!("initdb failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        let port = free_port()?;
        let mut opts = format!(
            "-c listen_addresses=127.0.0.1 -p {port} -k {} -c fsync=off",
            dir.0.display()
        );
        if let Some(pki) = pki {
            let (cert, key) = copy_pair(&pki.server("postgres")?, &data, "server")?;
            std::fs::copy(&pki.ca_file, data.join("ca.pem")).context("copy CA")?;
            std::fs::write(
                data.join("pg_hba.conf"),
                "local all all trust\nhostssl all all 127.0.0.1/32 cert\n",
            )?;
            opts.push_str(&format!(
                " -c ssl=on -c ssl_cert_file={} -c ssl_key_file={} -c ssl_ca_file={}",
                cert.display(),
                key.display(),
                data.join("ca.pem").display()
            ));
        } else {
            opts.push_str(" -c ssl=off");
        }
        chown(&dir.0, "postgres")?;
        let out = as_user("postgres", &bin("pg_ctl"))
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(dir.0.join("server.log"))
            .args(["-w", "-t", "60", "-o", &opts, "start"])
            .output()
            .context("run pg_ctl start")?;
        if !out.status.success() {
            let log = std::fs::read_to_string(dir.0.join("server.log")).unwrap_or_default();
            bail!(
                "pg_ctl start failed: {}\n{log}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        wait_port(port, Duration::from_secs(30), "PostgreSQL").await?;
        Ok(Self { port, dir })
    }

    /// `postgres://postgres@127.0.0.1:PORT/<db>`.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = as_user("postgres", &pg_bin("pg_ctl"))
            .arg("-D")
            .arg(self.dir.0.join("data"))
            .args(["-m", "immediate", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

// ---------------------------------------------------------------------------------------------

/// A Redis server of its own that speaks only TLS (`--port 0 --tls-port …`) and requires a
/// client certificate signed by the CA.
pub struct TlsRedis {
    pub port: u16,
    child: Child,
    _dir: TempDir,
}

impl TlsRedis {
    pub async fn start(pki: &Pki) -> anyhow::Result<Self> {
        use std::os::unix::process::CommandExt as _;
        let dir = TempDir::new("fs_redis_tls")?;
        let (cert, key) = copy_pair(&pki.server("redis")?, &dir.0, "server")?;
        let port = free_port()?;
        let child = Command::new("redis-server")
            .args(["--port", "0", "--tls-port", &port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--tls-cert-file")
            .arg(&cert)
            .arg("--tls-key-file")
            .arg(&key)
            .arg("--tls-ca-cert-file")
            .arg(&pki.ca_file)
            .args(["--tls-auth-clients", "yes"])
            .arg("--dir")
            .arg(&dir.0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .context("start redis-server with TLS")?;
        let redis = Self {
            port,
            child,
            _dir: dir,
        };
        wait_port(port, Duration::from_secs(15), "Redis (TLS)").await?;
        Ok(redis)
    }

    /// `rediss://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.port)
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------------

/// A RabbitMQ node of its own beside the default one, with only a TLS listener that requires a
/// client certificate signed by the CA. It takes several seconds to accept connections.
pub struct TlsRabbit {
    pub port: u16,
    dir: TempDir,
    child: Option<Child>,
}

impl TlsRabbit {
    pub async fn start(pki: &Pki) -> anyhow::Result<Self> {
        use std::os::unix::process::CommandExt as _;
        let dir = TempDir::new("fs_rmq_tls")?;
        let d = dir.0.clone();
        let (cert, key) = copy_pair(&pki.server("rabbitmq")?, &d, "server")?;
        std::fs::copy(&pki.ca_file, d.join("ca.pem")).context("copy CA")?;
        let port = free_port()?;
        std::fs::write(
            d.join("rabbitmq.conf"),
            format!(
                "listeners.tcp = none\nlisteners.ssl.1 = 127.0.0.1:{port}\nloopback_users = none\n\
                 ssl_options.cacertfile = {}\nssl_options.certfile = {}\nssl_options.keyfile = {}\n\
                 ssl_options.verify = verify_peer\nssl_options.fail_if_no_peer_cert = true\n",
                d.join("ca.pem").display(),
                cert.display(),
                key.display()
            ),
        )?;
        std::fs::write(d.join("env.conf"), "ERL_EPMD_ADDRESS=127.0.0.1\n")?;
        std::fs::write(d.join("enabled_plugins"), "[].\n")?;
        chown(&d, "rabbitmq")?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(d.join("server.out"))?;
        let child = as_user("rabbitmq", Path::new("/usr/sbin/rabbitmq-server"))
            .env("HOME", &d)
            .env("RABBITMQ_CONF_ENV_FILE", d.join("env.conf"))
            .env("RABBITMQ_CONFIG_FILE", d.join("rabbitmq.conf"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", d.join("enabled_plugins"))
            .env("RABBITMQ_NODENAME", format!("rabbit_tls_{port}@localhost"))
            .env("RABBITMQ_DIST_PORT", free_port()?.to_string())
            .env("RABBITMQ_MNESIA_BASE", d.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", d.join("log"))
            .env("RABBITMQ_PID_FILE", d.join("pid"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .spawn()
            .context("start rabbitmq-server")?;
        let rabbit = Self {
            port,
            dir,
            child: Some(child),
        };
        if let Err(e) = wait_port(port, Duration::from_secs(90), "RabbitMQ (TLS)").await {
            let out = std::fs::read_to_string(d.join("server.out")).unwrap_or_default();
            bail!("{e}\n{out}");
        }
        Ok(rabbit)
    }

    /// `amqps://guest:guest@127.0.0.1:PORT/%2f`.
    pub fn url(&self) -> String {
        format!("amqps://guest:guest@127.0.0.1:{}/%2f", self.port)
    }
}

impl Drop for TlsRabbit {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let group = format!("-{}", c.id());
            let _ = Command::new("kill")
                .args(["-KILL", "--", &group])
                .stderr(Stdio::null())
                .status();
            let _ = c.wait();
        }
        // The Erlang VM may outlive the script that started it.
        if let Some(pid) = std::fs::read_to_string(self.dir.0.join("pid"))
            .ok()
            .and_then(|p| p.trim().parse::<u32>().ok())
        {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
    }
}
