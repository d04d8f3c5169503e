//! A small sale driver: creates the product, then buyers arrive at an even pace over the flood
//! window; each calls CreateOrder (retrying a failed call with the same request id, as a real
//! client would), and each acknowledged buyer then pays, never pays, pays late or cancels.
//! Paying goes through the payment provider, as a real buyer's does: PayOrder starts the
//! payment, the buyer pays on the provider's checkout (`flashsale-payment-sim`, which the driver
//! runs for the sale), and the provider's signed notification pays the order; a late payer
//! starts in time and pays at the provider after the deadline, and is refunded.
//! Bounded in count (the buyers) and time (every wait has a deadline).

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context as _;
use flashsale_platform::auth::{DEV_SECRET, JwtKeys, Role};
use flashsale_proto::{
    order::v1::{
        CancelOrderRequest, CreateOrderRequest, GetOrderRequest, Order, OrderStatus,
        PayOrderRequest, order_service_client::OrderServiceClient,
    },
    payment::v1::{
        PayCheckoutRequest, payment_provider_service_client::PaymentProviderServiceClient,
    },
    product::v1::{
        AdjustStockRequest, CreateProductRequest, DeductionPolicy, ReconcileStockRequest,
        StockDrift, product_stock_service_client::ProductStockServiceClient,
    },
};
use tokio::{sync::Semaphore, time::Instant};
use tonic::{Code, transport::Channel};
use uuid::Uuid;

/// Deadline of one gRPC call.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);
/// Longest a buyer retries CreateOrder after its first call.
const CREATE_RETRY_FOR: Duration = Duration::from_secs(25);
/// Longest an acknowledged buyer waits for their order to become payable.
const AWAIT_PAYABLE_FOR: Duration = Duration::from_secs(60);
/// The simulator keeps delivering a notification through an order service's restart.
const PROVIDER_ARGS: &[&str] = &["--max-deliveries", "40", "--retry-base-ms", "250"];

/// What a buyer does once their order is acknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Intent {
    Pay,
    NeverPay,
    PayLate,
    Cancel,
}

/// The sale to drive.
#[derive(Clone, Debug)]
pub struct Sale {
    pub sku: String,
    pub units: i64,
    pub buyers: u32,
    pub concurrency: usize,
    /// The buyers arrive evenly over this window.
    pub flood: Duration,
    pub seed: u64,
    /// Where the sale's payment provider simulator listens (the order service is told it).
    pub provider_port: u16,
}

/// What the buyers saw.
#[derive(Debug, Default)]
pub struct Seen {
    /// Orders CreateOrder answered with, by order id: the buyer's intent.
    pub acknowledged: HashMap<Uuid, Intent>,
    /// Orders whose buyer paid at the provider (the money is taken).
    pub paid: HashSet<Uuid>,
    /// CreateOrder refusals (sold out, insufficient stock, user limit).
    pub refused: u32,
    /// Buyers who got neither an order nor a refusal before giving up.
    pub gave_up: u32,
    /// The payment provider of the sale, kept running while the scenario holds this (refunds
    /// are paid back after the buyers are done).
    pub provider: Provider,
    /// CreateOrder answers that made a buyer try again, by status code.
    pub retried: std::collections::BTreeMap<String, u32>,
}

/// The payment provider simulator a sale runs (none when it could not start: payments then
/// fail and the scenario with them).
#[derive(Default)]
pub struct Provider(Option<flashsale_e2e::Service>);

impl std::fmt::Debug for Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Provider(started)"
        } else {
            "Provider(none)"
        })
    }
}

/// Starts `flashsale-payment-sim` on `port` (logs in a temporary directory).
async fn provider(port: u16) -> Provider {
    let bins = match std::env::var_os("FLASHSALE_FAULTS_BIN_DIR") {
        Some(dir) => Ok(std::path::PathBuf::from(dir)),
        None => flashsale_e2e::bin_dir(),
    };
    let dir = std::env::temp_dir().join(format!("fs_faults_payment_sim_{}", std::process::id()));
    let started = match bins {
        Ok(bins) => match std::fs::create_dir_all(&dir) {
            Ok(()) => flashsale_e2e::spawn_payment_sim(&bins, &dir, port, PROVIDER_ARGS).await,
            Err(e) => Err(e.into()),
        },
        Err(e) => Err(e),
    };
    match started {
        Ok(sim) => Provider(Some(sim)),
        Err(e) => {
            eprintln!("  the payment provider simulator did not start ({e:#}); payments will fail");
            Provider(None)
        }
    }
}

/// The clients and tokens of a sale.
#[derive(Clone)]
pub struct Clients {
    pub order: OrderServiceClient<Channel>,
    pub product: ProductStockServiceClient<Channel>,
    /// The payment provider's checkout, where buyers pay.
    pub provider: PaymentProviderServiceClient<Channel>,
    keys: Arc<JwtKeys>,
}

/// A channel to `url`, or over every replica when it lists several (comma-separated).
fn lazy(url: &str) -> anyhow::Result<Channel> {
    if url.contains(',') {
        return flashsale_platform::balance::channel(
            &flashsale_platform::balance::split_urls(url),
            Duration::from_millis(500),
            CALL_TIMEOUT,
            &Default::default(),
        );
    }
    Ok(tonic::transport::Endpoint::from_shared(url.to_owned())
        .with_context(|| format!("parse {url}"))?
        .connect_timeout(CALL_TIMEOUT)
        .timeout(CALL_TIMEOUT)
        .connect_lazy())
}

impl Clients {
    pub fn new(order_url: &str, product_url: &str, provider_url: &str) -> anyhow::Result<Self> {
        Ok(Self {
            order: OrderServiceClient::new(lazy(order_url)?),
            product: ProductStockServiceClient::new(lazy(product_url)?),
            provider: PaymentProviderServiceClient::new(lazy(provider_url)?),
            keys: Arc::new(JwtKeys::new(DEV_SECRET.as_bytes())?),
        })
    }

    /// `message` with a bearer token for `sub` with `role`.
    pub fn as_<T>(&self, sub: &str, role: Role, message: T) -> anyhow::Result<tonic::Request<T>> {
        let token = self
            .keys
            .mint(sub, role, Duration::from_secs(3600))
            .map_err(|e| anyhow::anyhow!("mint token: {e}"))?;
        let mut req = tonic::Request::new(message);
        req.metadata_mut().insert(
            "authorization",
            format!("Bearer {token}")
                .parse()
                .context("token as metadata")?,
        );
        Ok(req)
    }
}

/// A deterministic 64-bit mix (splitmix64) of the seed and a buyer's number.
pub fn mix(seed: u64, i: u64) -> u64 {
    let mut z = seed
        .wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn intent(seed: u64, i: u32) -> Intent {
    match mix(seed, u64::from(i)) % 10 {
        0..=5 => Intent::Pay,
        6 | 7 => Intent::NeverPay,
        8 => Intent::PayLate,
        _ => Intent::Cancel,
    }
}

/// Creates the product (RESERVE_THEN_COMMIT, one unit per buyer), retrying while product-stock
/// warms up.
pub async fn create_product(c: &Clients, sku: &str, units: i64) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let req = c.as_(
            "faults-admin",
            Role::Admin,
            CreateProductRequest {
                sku: sku.to_owned(),
                name: format!("fault drill {sku}"),
                price_cents: 1000,
                initial_stock: units,
                per_user_limit: 1,
                deduction_policy: DeductionPolicy::ReserveThenCommit as i32,
                stock_buckets: 0,
                ..Default::default()
            },
        )?;
        match c.product.clone().create_product(req).await {
            Ok(_) => return Ok(()),
            Err(s) if s.code() == Code::AlreadyExists => return Ok(()),
            Err(s) if Instant::now() >= deadline => {
                anyhow::bail!("CreateProduct failed: {:?} {}", s.code(), s.message())
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

fn transient(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Internal
            | Code::Unknown
            | Code::Cancelled
            | Code::ResourceExhausted
            | Code::Aborted
    )
}

/// Runs the whole sale: the flood and every buyer's follow-up, each bounded in time.
pub async fn run(c: Clients, sale: Sale) -> Seen {
    let provider = provider(sale.provider_port).await;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let gate = Arc::new(Semaphore::new(sale.concurrency.max(1)));
    let start = Instant::now();
    let step = sale.flood / sale.buyers.max(1);
    let mut tasks = Vec::with_capacity(sale.buyers as usize);
    for i in 0..sale.buyers {
        tokio::time::sleep_until(start + step * i).await;
        let Ok(permit) = gate.clone().acquire_owned().await else {
            break;
        };
        let (c, sale, seen) = (c.clone(), sale.clone(), seen.clone());
        tasks.push(tokio::spawn(async move {
            let order = buy(&c, &sale, i, &seen).await;
            drop(permit);
            let user = format!("buyer-{i}");
            match order {
                Bought::Order(o) => {
                    let want = intent(sale.seed, i);
                    if let Ok(id) = Uuid::parse_str(&o.order_id)
                        && let Ok(mut s) = seen.lock()
                    {
                        s.acknowledged.insert(id, want);
                    }
                    if follow(&c, &user, &o, want).await
                        && let Ok(id) = Uuid::parse_str(&o.order_id)
                        && let Ok(mut s) = seen.lock()
                    {
                        s.paid.insert(id);
                    }
                }
                Bought::Refused => {
                    if let Ok(mut s) = seen.lock() {
                        s.refused += 1;
                    }
                }
                Bought::GaveUp => {
                    if let Ok(mut s) = seen.lock() {
                        s.gave_up += 1;
                    }
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let mut seen = match Arc::try_unwrap(seen) {
        Ok(m) => m.into_inner().unwrap_or_default(),
        Err(arc) => arc.lock().map(|s| clone_seen(&s)).unwrap_or_default(),
    };
    seen.provider = provider;
    seen
}

fn clone_seen(s: &Seen) -> Seen {
    Seen {
        acknowledged: s.acknowledged.clone(),
        paid: s.paid.clone(),
        refused: s.refused,
        gave_up: s.gave_up,
        provider: Provider::default(),
        retried: s.retried.clone(),
    }
}

enum Bought {
    Order(Box<Order>),
    Refused,
    GaveUp,
}

async fn buy(c: &Clients, sale: &Sale, i: u32, seen: &Mutex<Seen>) -> Bought {
    let user = format!("buyer-{i}");
    let deadline = Instant::now() + CREATE_RETRY_FOR;
    loop {
        let Ok(req) = c.as_(
            &user,
            Role::User,
            CreateOrderRequest {
                request_id: format!("r-{i}"),
                sku: sale.sku.clone(),
                quantity: 1,
            },
        ) else {
            return Bought::GaveUp;
        };
        match c.order.clone().create_order(req).await {
            Ok(resp) => match resp.into_inner().order {
                Some(o) => return Bought::Order(Box::new(o)),
                None => return Bought::GaveUp,
            },
            Err(s) if s.code() == Code::FailedPrecondition => return Bought::Refused,
            Err(s) if transient(s.code()) && Instant::now() < deadline => {
                if let Ok(mut seen) = seen.lock() {
                    *seen.retried.entry(format!("{:?}", s.code())).or_default() += 1;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(_) => return Bought::GaveUp,
        }
    }
}

async fn get(c: &Clients, user: &str, id: &str) -> Option<Order> {
    let req = c
        .as_(
            user,
            Role::User,
            GetOrderRequest {
                order_id: id.to_owned(),
            },
        )
        .ok()?;
    c.order
        .clone()
        .get_order(req)
        .await
        .ok()?
        .into_inner()
        .order
}

fn terminal(o: &Order) -> bool {
    o.status == OrderStatus::Shipped as i32 || o.status == OrderStatus::Cancelled as i32
}

/// Carries out the buyer's intent; true when the buyer paid at the provider (the money is
/// taken: the order ends paid, or cancelled and refunded).
async fn follow(c: &Clients, user: &str, o: &Order, want: Intent) -> bool {
    if want == Intent::Cancel {
        let deadline = Instant::now() + AWAIT_PAYABLE_FOR;
        while Instant::now() < deadline {
            let Ok(req) = c.as_(
                user,
                Role::User,
                CancelOrderRequest {
                    order_id: o.order_id.clone(),
                },
            ) else {
                return false;
            };
            match c.order.clone().cancel_order(req).await {
                Ok(_) => return false,
                Err(s) if transient(s.code()) => {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                Err(_) => return false,
            }
        }
        return false;
    }
    if want == Intent::NeverPay {
        return false;
    }
    // Wait until the order is payable (or ends).
    let deadline = Instant::now() + AWAIT_PAYABLE_FOR;
    let payable = loop {
        if Instant::now() >= deadline {
            return false;
        }
        match get(c, user, &o.order_id).await {
            Some(cur) if cur.status == OrderStatus::AwaitingPayment as i32 => break cur,
            Some(cur) if terminal(&cur) => return false,
            _ => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    };
    // Start the payment (PayOrder), in time even for a late payer.
    let deadline = Instant::now() + Duration::from_secs(30);
    let payment_id = loop {
        if Instant::now() >= deadline {
            return false;
        }
        let Ok(req) = c.as_(
            user,
            Role::User,
            PayOrderRequest {
                order_id: o.order_id.clone(),
                ..Default::default()
            },
        ) else {
            return false;
        };
        match c.order.clone().pay_order(req).await {
            Ok(resp) => match resp.into_inner().checkout {
                Some(checkout) => break checkout.provider_payment_id,
                None => return false,
            },
            Err(s) if transient(s.code()) => {
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            Err(_) => return false,
        }
    };
    if want == Intent::PayLate {
        let due = payable
            .payment_deadline
            .map(|t| t.seconds * 1000 + i64::from(t.nanos) / 1_000_000)
            .unwrap_or(0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        let wait = (due - now + 1500).clamp(0, 30_000) as u64;
        tokio::time::sleep(Duration::from_millis(wait)).await;
    }
    // The buyer pays on the provider's checkout; the provider notifies the order service.
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let req = PayCheckoutRequest {
            payment_id: payment_id.clone(),
        };
        match c.provider.clone().pay_checkout(req).await {
            Ok(_) => return true,
            Err(s) if transient(s.code()) => {
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            Err(_) => return false,
        }
    }
    false
}

/// AdjustStock (as an admin) with `request_id`, retried with the same request id while the
/// failure is transient, for at most `retry_for`: `(replayed, on_hand after)`.
pub async fn adjust_stock(
    c: &Clients,
    sku: &str,
    request_id: &str,
    delta: i64,
    retry_for: Duration,
) -> anyhow::Result<(bool, i64)> {
    let deadline = Instant::now() + retry_for;
    loop {
        let req = c.as_(
            "faults-admin",
            Role::Admin,
            AdjustStockRequest {
                request_id: request_id.to_owned(),
                sku: sku.to_owned(),
                delta,
                reason: "fault drill restock".to_owned(),
            },
        )?;
        match c.product.clone().adjust_stock(req).await {
            Ok(resp) => {
                let r = resp.into_inner();
                let on_hand = r.product.map(|p| p.on_hand).unwrap_or(-1);
                return Ok((r.replayed, on_hand));
            }
            Err(s) if transient(s.code()) && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(s) => anyhow::bail!("AdjustStock {request_id}: {:?} {}", s.code(), s.message()),
        }
    }
}

/// ReconcileStock of `sku` (as an admin), retried while the failure is transient for at most
/// `retry_for`: the product's drift report.
pub async fn reconcile(
    c: &Clients,
    sku: &str,
    repair: bool,
    retry_for: Duration,
) -> anyhow::Result<StockDrift> {
    let deadline = Instant::now() + retry_for;
    loop {
        let req = c.as_(
            "faults-admin",
            Role::Admin,
            ReconcileStockRequest {
                skus: vec![sku.to_owned()],
                repair,
            },
        )?;
        match c.product.clone().reconcile_stock(req).await {
            Ok(resp) => {
                return resp
                    .into_inner()
                    .reports
                    .into_iter()
                    .next()
                    .ok_or_else(|| anyhow::anyhow!("ReconcileStock answered no report"));
            }
            Err(s) if transient(s.code()) && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(s) => anyhow::bail!("ReconcileStock: {:?} {}", s.code(), s.message()),
        }
    }
}

/// One CreateOrder of one unit for `user` with `request_id`, retried with the same request id
/// while the failure is transient, for at most `retry_for`.
pub async fn create_order(
    c: &Clients,
    user: &str,
    request_id: &str,
    sku: &str,
    retry_for: Duration,
) -> Result<Order, tonic::Status> {
    let deadline = Instant::now() + retry_for;
    loop {
        let req = c
            .as_(
                user,
                Role::User,
                CreateOrderRequest {
                    request_id: request_id.to_owned(),
                    sku: sku.to_owned(),
                    quantity: 1,
                },
            )
            .map_err(|e| tonic::Status::internal(e.to_string()))?;
        match c.order.clone().create_order(req).await {
            Ok(resp) => {
                return resp
                    .into_inner()
                    .order
                    .ok_or_else(|| tonic::Status::internal("CreateOrder answered no order"));
            }
            Err(s) if transient(s.code()) && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(s) => return Err(s),
        }
    }
}
