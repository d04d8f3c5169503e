//! Runs the three flashsale service binaries and the payment provider simulator as separate
//! processes, each service with its own database, one shared test exchange, and its own Redis
//! key prefix and queue names, for end-to-end tests. The binaries must be built
//! (`cargo build --workspace --bins`; `scripts/test.sh` does it).

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use anyhow::{Context as _, bail};
use flashsale_platform::tls::GrpcTlsSettings;
use flashsale_test_support::{
    TestDatabase, amqp_url, eventually, redis_url, tls::Pki, unique_name,
};
use tokio::process::{Child, Command};

/// One running service process; killed when dropped.
pub struct Service {
    pub name: &'static str,
    pub port: u16,
    /// Its Prometheus endpoint's port (`/metrics`); 0 for the payment simulator.
    pub metrics_port: u16,
    child: Child,
    log: PathBuf,
    _db: Option<TestDatabase>,
    /// How a client reaches it over mutual TLS; `None`: plain text.
    tls: Option<GrpcTlsSettings>,
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

impl Service {
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// A connected channel: over TLS with the test client's certificate when the stack runs
    /// mutual TLS.
    pub async fn channel(&self) -> anyhow::Result<tonic::transport::Channel> {
        let tls = self.tls.clone().unwrap_or_default();
        flashsale_platform::grpc::endpoint(&self.url(), &tls)?
            .connect()
            .await
            .with_context(|| format!("connect to {}", self.name))
    }

    /// Its whole log.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last lines of its log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

/// Where cargo put the binaries: next to the directory of this test executable.
pub fn bin_dir() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("current exe")?;
    let deps = exe.parent().context("exe dir")?;
    let dir = if deps.ends_with("deps") {
        deps.parent().context("target dir")?
    } else {
        deps
    };
    Ok(dir.to_path_buf())
}

/// A port nothing listens on right now.
pub fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// The three services, wired to each other, and the payment provider the order service uses.
pub struct Stack {
    pub product_stock: Service,
    pub order: Service,
    pub outbound: Service,
    pub payment_sim: Service,
    pub dir: PathBuf,
}

impl Drop for Stack {
    fn drop(&mut self) {
        // Keep the logs of a failed test for whoever investigates.
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Stack {
    /// Starts product-stock, order and outbound with `extra` env vars (each service its own
    /// `FLASHSALE_<SERVICE>__…` settings, e.g. timeouts, and `RUST_LOG` for all) and waits
    /// until each is SERVING.
    pub async fn start(extra: &[(&str, &str)]) -> anyhow::Result<Self> {
        Self::start_with(extra, &[], None).await
    }

    /// [`Stack::start`] with `sim_args` for `flashsale-payment-sim` (delays, duplicates, …).
    pub async fn start_with_sim(extra: &[(&str, &str)], sim_args: &[&str]) -> anyhow::Result<Self> {
        Self::start_with(extra, sim_args, None).await
    }

    /// [`Stack::start`] with mutual TLS on every gRPC server and client: each service gets a
    /// certificate from `pki` for both ends and requires one signed by `pki`'s CA of its
    /// clients; the test's clients present a certificate `pki` issued for `e2e-client`.
    pub async fn start_tls(extra: &[(&str, &str)], pki: &Pki) -> anyhow::Result<Self> {
        Self::start_with(extra, &[], Some(pki)).await
    }

    async fn start_with(
        extra: &[(&str, &str)],
        sim_args: &[&str],
        pki: Option<&Pki>,
    ) -> anyhow::Result<Self> {
        let bins = bin_dir()?;
        let dir = std::env::temp_dir().join(unique_name("fs_e2e"));
        std::fs::create_dir_all(&dir)?;
        // Under mutual TLS the simulator notifies the order service with a client certificate.
        let mut sim_args: Vec<String> = sim_args.iter().map(|a| (*a).to_owned()).collect();
        if let Some(pki) = pki {
            let sim = pki.client("payment-sim")?;
            sim_args.extend([
                "--tls-ca-file".to_owned(),
                pki.ca_path(),
                "--tls-cert-file".to_owned(),
                sim.cert_path(),
                "--tls-key-file".to_owned(),
                sim.key_path(),
            ]);
        }
        let sim_args: Vec<&str> = sim_args.iter().map(String::as_str).collect();
        let payment_sim = spawn_payment_sim(&bins, &dir, free_port()?, &sim_args).await?;
        let sim_url = payment_sim.url();
        let exchange = unique_name("fs_e2e_ex");
        let config_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config");
        // product-stock asks the order service about orders, and starts first: the order
        // service's port is chosen now.
        let order_port = free_port()?;
        let scheme = if pki.is_some() { "https" } else { "http" };
        let order_url = format!("{scheme}://127.0.0.1:{order_port}");
        let stock_extra: Vec<(&str, &str)> = extra
            .iter()
            .copied()
            .chain([(
                "FLASHSALE_PRODUCT_STOCK__ORDER_SERVICE__URL",
                order_url.as_str(),
            )])
            .collect();
        let product_stock = spawn(
            &bins,
            "product-stock",
            "PRODUCT_STOCK",
            &exchange,
            &config_dir,
            &dir,
            None,
            None,
            &stock_extra,
            pki,
        )
        .await?;
        let up = product_stock.url();
        let order_extra: Vec<(&str, &str)> = extra
            .iter()
            .copied()
            .chain([("FLASHSALE_ORDER__PAYMENT__PROVIDER_URL", sim_url.as_str())])
            .collect();
        let order = spawn(
            &bins,
            "order",
            "ORDER",
            &exchange,
            &config_dir,
            &dir,
            Some(&up),
            Some(order_port),
            &order_extra,
            pki,
        )
        .await?;
        let outbound = spawn(
            &bins,
            "outbound",
            "OUTBOUND",
            &exchange,
            &config_dir,
            &dir,
            Some(&up),
            None,
            extra,
            pki,
        )
        .await?;
        Ok(Self {
            product_stock,
            order,
            outbound,
            payment_sim,
            dir,
        })
    }

    pub fn logs(&self) -> String {
        [
            &self.product_stock,
            &self.order,
            &self.outbound,
            &self.payment_sim,
        ]
        .iter()
        .map(|s| format!("--- {} ---\n{}", s.name, s.log_tail()))
        .collect::<Vec<_>>()
        .join("\n")
    }
}

#[allow(clippy::too_many_arguments)]
async fn spawn(
    bins: &Path,
    name: &'static str,
    key: &str,
    exchange: &str,
    config_dir: &Path,
    dir: &Path,
    upstream: Option<&str>,
    port: Option<u16>,
    extra: &[(&str, &str)],
    pki: Option<&Pki>,
) -> anyhow::Result<Service> {
    let exe = bins.join(format!("flashsale-{name}"));
    if !exe.exists() {
        bail!(
            "{} is missing: run `cargo build --workspace --bins` first",
            exe.display()
        );
    }
    let db = TestDatabase::create().await?;
    let port = match port {
        Some(p) => p,
        None => free_port()?,
    };
    let p = |k: &str| format!("FLASHSALE_{key}__{k}");
    let metrics_port = free_port()?;
    let log = dir.join(format!("{name}.log"));
    let mut cmd = Command::new(&exe);
    cmd.env("FLASHSALE_CONFIG_DIR", config_dir)
        .env("RUST_LOG", "warn,flashsale=info")
        .env(p("GRPC__ADDR"), format!("127.0.0.1:{port}"))
        .env(p("METRICS__ADDR"), format!("127.0.0.1:{metrics_port}"))
        .env(p("DATABASE__URL"), &db.url)
        .env(p("DATABASE__MAX_CONNECTIONS"), "10")
        .env(p("AMQP__URL"), amqp_url())
        .env(p("AMQP__EXCHANGE"), exchange)
        .env(
            p("AMQP__QUEUE_PREFIX"),
            format!("{}.", unique_name("fs_e2e_q")),
        )
        .env(p("AMQP__QUEUE_EXPIRES_MS"), "60000")
        .env(p("AMQP__QUEUE_TYPE"), "classic")
        .env(p("AMQP__RETRY_BASE_MS"), "100")
        .env(p("AUTH__ALLOW_DEVELOPMENT_SECRET"), "true")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log)?)
        .stderr(std::fs::File::create(dir.join(format!("{name}.err")))?)
        .kill_on_drop(true);
    // Only product-stock reaches Redis (the gate); the others have no such setting.
    if name == "product-stock" {
        cmd.env(p("REDIS__URL"), redis_url()).env(
            p("REDIS__KEY_PREFIX"),
            format!("{}:", unique_name("fs_e2e")),
        );
    }
    if let Some(up) = upstream {
        cmd.env(p("UPSTREAM__PRODUCT_STOCK_URL"), up);
    }
    let tls = match pki {
        Some(pki) => {
            let own = pki.service(name)?;
            let ca = pki.ca_path();
            for (k, v) in [
                ("GRPC__TLS__CERT_FILE", own.cert_path()),
                ("GRPC__TLS__KEY_FILE", own.key_path()),
                ("GRPC__TLS__CLIENT_CA_FILE", ca.clone()),
                ("GRPC__TLS__CA_FILE", ca.clone()),
                ("GRPC__TLS__CLIENT_CERT_FILE", own.cert_path()),
                ("GRPC__TLS__CLIENT_KEY_FILE", own.key_path()),
            ] {
                cmd.env(p(k), v);
            }
            let client = pki.client("e2e-client")?;
            Some(GrpcTlsSettings {
                ca_file: ca,
                client_cert_file: client.cert_path(),
                client_key_file: client.key_path(),
                ..GrpcTlsSettings::default()
            })
        }
        None => None,
    };
    // The service's own settings, and the log filter, which goes to every service.
    for (k, v) in extra {
        if k.starts_with(&format!("FLASHSALE_{key}__")) || *k == "RUST_LOG" {
            cmd.env(k, v);
        }
    }
    let child = cmd
        .spawn()
        .with_context(|| format!("start {}", exe.display()))?;
    let service = Service {
        name,
        port,
        metrics_port,
        child,
        log,
        _db: Some(db),
        tls,
    };
    wait_serving(service, dir).await
}

/// `flashsale-payment-sim` on `port` with the development secrets (the ones
/// `config/default.toml` gives the order service) and `args`; logs go to `dir`.
pub async fn spawn_payment_sim(
    bins: &Path,
    dir: &Path,
    port: u16,
    args: &[&str],
) -> anyhow::Result<Service> {
    let name = "payment-sim";
    let exe = bins.join("flashsale-payment-sim");
    if !exe.exists() {
        bail!(
            "{} is missing: run `cargo build --workspace --bins` first",
            exe.display()
        );
    }
    let log = dir.join(format!("{name}.log"));
    let child = Command::new(&exe)
        .arg("--addr")
        .arg(format!("127.0.0.1:{port}"))
        .args(args)
        .env("RUST_LOG", "warn,flashsale=info")
        .env_remove("FLASHSALE_PAYMENT_SIM_API_KEY")
        .env_remove("FLASHSALE_PAYMENT_SIM_WEBHOOK_SECRET")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log)?)
        .stderr(std::fs::File::create(dir.join(format!("{name}.err")))?)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("start {}", exe.display()))?;
    let service = Service {
        name,
        port,
        metrics_port: 0,
        child,
        log,
        _db: None,
        tls: None,
    };
    wait_serving(service, dir).await
}

/// Waits until `service` answers its health check SERVING.
async fn wait_serving(service: Service, dir: &Path) -> anyhow::Result<Service> {
    let name = service.name;
    let ready = eventually(Duration::from_secs(60), "service SERVING", || async {
        let channel = service.channel().await.ok()?;
        let resp = tonic_health::pb::health_client::HealthClient::new(channel)
            .check(tonic_health::pb::HealthCheckRequest {
                service: String::new(),
            })
            .await
            .ok()?;
        (resp.into_inner().status
            == tonic_health::pb::health_check_response::ServingStatus::Serving as i32)
            .then_some(())
    })
    .await;
    if ready.is_err() {
        let err = std::fs::read_to_string(dir.join(format!("{name}.err"))).unwrap_or_default();
        bail!(
            "{name} did not become SERVING:\n{}\n{err}",
            service.log_tail()
        );
    }
    Ok(service)
}
