//! `flashsale verify --service <name> --endpoint <url>`: a service's black-box contract suite,
//! over gRPC, against a running deployment. It asks the service whether it serves (health) and
//! what it serves (reflection), then calls every rpc on its happy path and with the errors the
//! contract documents (bad input, an unknown id, a missing token, the wrong role, a refusal by
//! reason), on products and buyers of its own: skus and user ids start with `verify-<run>-`,
//! nothing else is touched. At the end it cancels the orders it left open and writes off the
//! stock left on its products (the API deletes nothing: the products stay, with no stock).
//!
//! Every check prints one line (`ok`, `FAIL` with what was answered, or `--` when it could not
//! be made, and why); the command exits 0 only when no check failed and every one was made.
//! Tokens are minted from the deployment's token secrets (`--user-secret`, `--service-secret`,
//! as `flashsale token` does).

mod order;
mod outbound;
mod product_stock;

use std::{fmt::Debug, process::ExitCode, time::Duration};

use anyhow::{Context as _, bail, ensure};
use flashsale_bench::client::{Secret, ServiceUrls, connect, status_error};
use flashsale_platform::auth::Role;
use tonic::{Code, Status, transport::Channel};

#[derive(clap::Args)]
pub struct Args {
    /// The service whose contract to check; `all` checks the three, each at its own URL.
    #[arg(long, value_enum)]
    service: Target,
    /// The checked service's gRPC endpoint (default: its URL below).
    #[arg(long)]
    endpoint: Option<String>,
    /// The services (product-stock: where the order and outbound suites create their products;
    /// order: where the outbound suite places the order it ships).
    #[command(flatten)]
    urls: ServiceUrls,
    /// The payment simulator, whose checkout page the order and outbound suites pay on; without
    /// it a payment cannot be made, and the checks that need one are reported as not made.
    #[arg(long, env = "FLASHSALE_VERIFY_PAYMENT_SIM_URL")]
    payment_sim_url: Option<String>,
    /// Per-call timeout in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    timeout_ms: u64,
    /// Longest wait, in seconds, for the saga to move an order on (confirmed, shipped).
    #[arg(long, default_value_t = 60)]
    saga_timeout_secs: u64,
    #[command(flatten)]
    secret: Secret,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Target {
    ProductStock,
    Order,
    Outbound,
    All,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    ensure!(
        (1..=600_000).contains(&args.timeout_ms),
        "--timeout-ms must be 1..=600000"
    );
    ensure!(
        (1..=3600).contains(&args.saga_timeout_secs),
        "--saga-timeout-secs must be 1..=3600"
    );
    ensure!(
        args.endpoint.is_none() || args.service != Target::All,
        "--endpoint names one service's endpoint; with --service all each service's URL applies"
    );
    let endpoint = |default: &str| args.endpoint.clone().unwrap_or_else(|| default.to_owned());
    let cx = Ctx {
        run: format!(
            "verify-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..10]
        ),
        secret: args.secret.clone(),
        timeout: Duration::from_millis(args.timeout_ms),
        saga_timeout: Duration::from_secs(args.saga_timeout_secs),
        product_stock_url: args.urls.product_stock_url.clone(),
        order_url: args.urls.order_url.clone(),
        payment_sim_url: args.payment_sim_url.clone(),
    };
    println!("run {} (its skus and users start with {}-)", cx.run, cx.run);
    let mut report = Report::default();
    let targets: &[Target] = match args.service {
        Target::All => &[Target::ProductStock, Target::Order, Target::Outbound],
        one => &[one][..],
    };
    for target in targets {
        let outcome = match target {
            Target::ProductStock => {
                println!(
                    "\nproduct-stock at {}",
                    endpoint(&args.urls.product_stock_url)
                );
                product_stock::run(&cx, &endpoint(&args.urls.product_stock_url), &mut report).await
            }
            Target::Order => {
                println!("\norder at {}", endpoint(&args.urls.order_url));
                order::run(&cx, &endpoint(&args.urls.order_url), &mut report).await
            }
            Target::Outbound => {
                println!("\noutbound at {}", endpoint(&args.urls.outbound_url));
                outbound::run(&cx, &endpoint(&args.urls.outbound_url), &mut report).await
            }
            Target::All => unreachable!("expanded above"),
        };
        // A suite that cannot go on (the service is out of reach) is one failed check.
        report.record("the suite ran to its end", outcome);
    }
    println!(
        "\n{} passed, {} failed, {} not made",
        report.passed,
        report.failed.len(),
        report.not_made.len()
    );
    Ok(if report.failed.is_empty() && report.not_made.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// What every suite shares: where the other services are, how long to wait, and the run's
/// own names and tokens.
pub(crate) struct Ctx {
    run: String,
    secret: Secret,
    timeout: Duration,
    saga_timeout: Duration,
    product_stock_url: String,
    order_url: String,
    payment_sim_url: Option<String>,
}

impl Ctx {
    /// A sku of this run's own.
    fn sku(&self, name: &str) -> String {
        format!("{}-{name}", self.run)
    }

    /// A buyer of this run's own.
    fn user_id(&self, name: &str) -> String {
        format!("{}-{name}", self.run)
    }

    fn user(&self, name: &str) -> anyhow::Result<String> {
        self.mint(&self.user_id(name), Role::User)
    }

    fn admin(&self) -> anyhow::Result<String> {
        self.mint("flashsale-verify", Role::Admin)
    }

    fn service(&self) -> anyhow::Result<String> {
        self.mint("flashsale-verify", Role::Service)
    }

    fn mint(&self, sub: &str, role: Role) -> anyhow::Result<String> {
        self.secret.mint(sub, role, Duration::from_secs(3600))
    }

    async fn channel(&self, url: &str) -> anyhow::Result<Channel> {
        connect(url, self.timeout).await
    }
}

/// The checks made so far.
#[derive(Default)]
pub(crate) struct Report {
    passed: usize,
    failed: Vec<String>,
    not_made: Vec<String>,
}

impl Report {
    /// Prints and counts one check.
    fn record(&mut self, name: &str, outcome: anyhow::Result<()>) {
        match outcome {
            Ok(()) => {
                self.passed += 1;
                println!("ok    {name}");
            }
            Err(e) => {
                println!("FAIL  {name}: {e:#}");
                self.failed.push(name.to_owned());
            }
        }
    }

    /// A check that could not be made, and why.
    fn not_made(&mut self, name: &str, why: &str) {
        println!("--    {name}: not made ({why})");
        self.not_made.push(name.to_owned());
    }
}

/// `message` as `token`'s caller (a minted token is always valid metadata; were it not, the
/// call would go without one and its check fail).
fn with<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    if let Ok(value) = format!("Bearer {token}").parse() {
        req.metadata_mut().insert("authorization", value);
    }
    req
}

/// The answer of a call that should succeed, or what was answered instead.
fn answered<T>(result: Result<tonic::Response<T>, Status>) -> anyhow::Result<T> {
    result
        .map(tonic::Response::into_inner)
        .map_err(status_error)
}

/// A call refused with `code` and, where given, the `ErrorInfo` reason `reason`.
fn refused<T: Debug>(
    result: Result<tonic::Response<T>, Status>,
    code: Code,
    reason: Option<&str>,
) -> anyhow::Result<()> {
    let status = match result {
        Ok(answer) => bail!("answered {:?}, not {code:?}", answer.into_inner()),
        Err(s) => s,
    };
    if status.code() != code {
        bail!("expected {code:?}, got {:#}", status_error(status));
    }
    if let Some(want) = reason {
        let got = flashsale_platform::error::reason_of(&status);
        ensure!(
            got.as_deref() == Some(want),
            "expected reason {want}, got {:#}",
            status_error(status)
        );
    }
    Ok(())
}

/// A call refused for its caller's role: `PERMISSION_DENIED`.
fn denied<T: Debug>(result: Result<tonic::Response<T>, Status>) -> anyhow::Result<()> {
    refused(result, Code::PermissionDenied, None)
}

/// A refusal of bad input: `INVALID_ARGUMENT` whose `BadRequest` names `field`.
fn bad_field<T: Debug>(
    result: Result<tonic::Response<T>, Status>,
    field: &str,
) -> anyhow::Result<()> {
    let status = match result {
        Ok(answer) => bail!("answered {:?}, not INVALID_ARGUMENT", answer.into_inner()),
        Err(s) => s,
    };
    ensure!(
        status.code() == Code::InvalidArgument,
        "expected InvalidArgument naming {field}, got {:#}",
        status_error(status)
    );
    let fields = flashsale_platform::error::violated_fields(&status);
    ensure!(
        fields.iter().any(|f| f == field),
        "expected a violation of {field}, got {fields:?} ({})",
        status.message()
    );
    Ok(())
}

/// The admin APIs every service serves.
const ADMIN_APIS: [&str; 2] = [
    "flashsale.admin.v1.DeadLetterService",
    "flashsale.admin.v1.OrderTimelineService",
];

/// The checks every service answers the same way: it is SERVING its first API `own[0]`
/// (grpc.health.v1), and its reflection lists its APIs `own` and the admin APIs.
async fn serving(report: &mut Report, channel: &Channel, own: &[&str]) {
    let service = own.first().copied().unwrap_or_default();
    report.record(
        &format!("health: {service} is SERVING"),
        health(channel.clone(), service).await,
    );
    let listed: Vec<&str> = own.iter().chain(&ADMIN_APIS).copied().collect();
    report.record(
        "reflection lists the service's APIs",
        reflection(channel.clone(), &listed).await,
    );
}

async fn health(channel: Channel, service: &str) -> anyhow::Result<()> {
    use tonic_health::pb::{
        HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
    };
    let status = answered(
        HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: service.to_owned(),
            })
            .await,
    )?
    .status();
    ensure!(status == ServingStatus::Serving, "answered {status:?}");
    Ok(())
}

async fn reflection(channel: Channel, listed: &[&str]) -> anyhow::Result<()> {
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let ask = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = answered(
        ServerReflectionClient::new(channel)
            .server_reflection_info(tokio_stream::iter([ask]))
            .await,
    )?;
    let answer = answers
        .message()
        .await
        .map_err(status_error)?
        .context("the reflection stream ended without an answer")?;
    let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
        bail!("answered {answer:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    let missing: Vec<&&str> = listed
        .iter()
        .filter(|want| !names.iter().any(|n| n == **want))
        .collect();
    ensure!(missing.is_empty(), "missing {missing:?} from {names:?}");
    Ok(())
}

/// Waits, up to the saga timeout, for `check` to give an answer.
async fn eventually<T, F, Fut>(cx: &Ctx, what: &str, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = tokio::time::Instant::now() + cx.saga_timeout;
    let mut pause = Duration::from_millis(50);
    loop {
        if let Some(found) = check().await? {
            return Ok(found);
        }
        if tokio::time::Instant::now() + pause > deadline {
            bail!("{what}: not within {:?}", cx.saga_timeout);
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}
