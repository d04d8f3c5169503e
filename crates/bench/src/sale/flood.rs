//! Phase (b), the flood: every buyer's CreateOrder calls, `concurrency` in flight at once, each
//! timed into an HdrHistogram (µs) and sorted into accepted orders, refusals by their
//! `ErrorInfo` reason and errors by gRPC code.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use anyhow::Context as _;
use flashsale_proto::order::v1::CreateOrderRequest;
use hdrhistogram::Histogram;
use tokio::{task::JoinSet, time::Instant};

use super::Ctx;
use crate::client::authorized;

/// The longest latency the histogram tells apart (one hour, in µs); longer ones saturate.
const HISTOGRAM_MAX_US: u64 = 3_600_000_000;

/// An order CreateOrder acknowledged.
pub(crate) struct Accepted {
    pub order_id: String,
    pub buyer: usize,
    pub at: Instant,
}

/// What the flood did.
pub(crate) struct Flood {
    pub requests: u64,
    /// Acknowledged orders, in the order they were accepted.
    pub accepted: Vec<Accepted>,
    pub refused: BTreeMap<String, u64>,
    pub errors: BTreeMap<String, u64>,
    /// Buyers with a failed call: it may have created an order the sale never heard of.
    pub unsure: BTreeSet<usize>,
    pub latency: Histogram<u64>,
    pub elapsed: Duration,
    pub last_accept: Option<Instant>,
    /// True when the time bound stopped the flood before every call was made.
    pub cut_short: bool,
    /// True when `--duration-secs` ended the flood before every call was made.
    pub stopped_by_duration: bool,
    /// The calls the flood was to make: buyers × requests per buyer.
    pub planned: u64,
    /// The calls refused `SALE_NOT_STARTED` (each pressed again until the sale opened), and
    /// their latency in µs; not in `requests`, `refused` or `latency`.
    pub early: Early,
}

/// The calls made before the sale opened (`--opens-in-secs`).
pub(crate) struct Early {
    /// Refused `SALE_NOT_STARTED`.
    pub refused: u64,
    /// Of those, refused from the order service's memory (its message says so).
    pub remembered: u64,
    /// Any other answer received before the opening, by this machine's clock: accepted
    /// orders above all, which must not exist.
    pub other_before_opening: BTreeMap<String, u64>,
    /// `SALE_NOT_STARTED` for calls sent after the opening, by this machine's clock.
    pub after_opening: u64,
    pub latency: Histogram<u64>,
}

/// How long a buyer refused `SALE_NOT_STARTED` waits before pressing buy again: under the order
/// service's default per-user rate (10 calls a second).
pub(crate) const PRESS_AGAIN: Duration = Duration::from_millis(150);

/// The calls to take: each planned call in turn, and the calls refused `SALE_NOT_STARTED` again
/// once their buyer's pause is over.
struct Calls {
    next: AtomicU64,
    total: u64,
    again: Mutex<VecDeque<(u64, Instant)>>,
}

enum Take {
    Call(u64),
    /// Nothing to call before this instant (only buyers pausing are left).
    WaitUntil(Instant),
    Done,
}

impl Calls {
    fn take(&self) -> Take {
        let Ok(mut again) = self.again.lock() else {
            return Take::Done;
        };
        if let Some(&(i, at)) = again.front()
            && at <= Instant::now()
        {
            again.pop_front();
            return Take::Call(i);
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        if i < self.total {
            return Take::Call(i);
        }
        match again.front() {
            Some(&(_, at)) => Take::WaitUntil(at),
            None => Take::Done,
        }
    }

    /// Call `i` again once its buyer's pause is over.
    fn press_again(&self, i: u64) {
        if let Ok(mut again) = self.again.lock() {
            again.push_back((i, Instant::now() + PRESS_AGAIN));
        }
    }

    /// Calls planned, or waiting to be made again.
    fn left(&self) -> bool {
        self.next.load(Ordering::Relaxed) < self.total
            || self.again.lock().is_ok_and(|a| !a.is_empty())
    }
}

/// Makes `buyers × per_buyer` CreateOrder calls, round-robin over the buyers.
pub(crate) async fn run(ctx: Arc<Ctx>, per_buyer: u32, concurrency: u32) -> anyhow::Result<Flood> {
    let total = ctx.buyers.len() as u64 * u64::from(per_buyer);
    let next = Arc::new(Calls {
        next: AtomicU64::new(0),
        total,
        again: Mutex::new(VecDeque::new()),
    });
    let started = Instant::now();
    let until = ctx.flood_until.map(|d| started + d);
    let mut workers = JoinSet::new();
    for _ in 0..concurrency.min(u32::try_from(total).unwrap_or(u32::MAX)) {
        workers.spawn(worker(ctx.clone(), next.clone(), until));
    }
    let mut flood = Flood::empty()?;
    flood.planned = total;
    while let Some(part) = workers.join_next().await {
        flood.merge(part.context("a flood worker died")??)?;
    }
    flood.elapsed = started.elapsed();
    flood.accepted.sort_by_key(|a| a.at);
    flood.last_accept = flood.accepted.last().map(|a| a.at);
    Ok(flood)
}

/// Takes the next call until every call is made, the flood's duration is over or the run's
/// work deadline passes.
async fn worker(ctx: Arc<Ctx>, next: Arc<Calls>, until: Option<Instant>) -> anyhow::Result<Flood> {
    let mut part = Flood::empty()?;
    let mut client = ctx.orders.clone();
    let buyers = ctx.buyers.len() as u64;
    loop {
        let now = Instant::now();
        if now >= ctx.work_deadline {
            part.cut_short = next.left();
            break;
        }
        if until.is_some_and(|u| now >= u) {
            part.stopped_by_duration = next.left();
            break;
        }
        let i = match next.take() {
            Take::Call(i) => i,
            Take::WaitUntil(at) => {
                tokio::time::sleep_until(at.min(ctx.work_deadline)).await;
                continue;
            }
            Take::Done => break,
        };
        let buyer = usize::try_from(i % buyers).context("buyer index")?;
        // Each buyer's calls go to the products in turn, starting at a different one per buyer.
        let product = usize::try_from((i % buyers + i / buyers) % ctx.skus.len() as u64)
            .context("product index")?;
        let msg = CreateOrderRequest {
            request_id: uuid::Uuid::new_v4().to_string(),
            sku: ctx.skus[product].clone(),
            quantity: 1,
        };
        let req = authorized(msg, &ctx.tokens[buyer])?;
        let sent = Instant::now();
        let sent_ms = now_ms();
        let answer = tokio::time::timeout_at(ctx.work_deadline, client.create_order(req)).await;
        let micros = u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX);
        match &answer {
            Ok(Err(status)) if is_not_started(status) => {
                // Before the opening: the buyer presses buy again after a pause.
                part.early.record(status, micros, sent_ms, ctx.opening_ms);
                next.press_again(i);
                continue;
            }
            other => part.early.check_not_before(other, ctx.opening_ms),
        }
        part.latency.saturating_record(micros.max(1));
        part.requests += 1;
        match answer {
            Ok(Ok(resp)) => match resp.into_inner().order {
                Some(order) => part.accepted.push(Accepted {
                    order_id: order.order_id,
                    buyer,
                    at: Instant::now(),
                }),
                None => part.error(buyer, "EMPTY_RESPONSE"),
            },
            Ok(Err(status)) => {
                let reason = flashsale_platform::error::reason_of(&status);
                match reason {
                    Some(r) if status.code() == tonic::Code::FailedPrecondition => {
                        *part.refused.entry(r).or_default() += 1;
                    }
                    _ => part.error(buyer, &format!("{:?}", status.code())),
                }
            }
            Err(_) => {
                part.error(buyer, "CutByTimeBound");
                part.cut_short = true;
            }
        }
    }
    Ok(part)
}

fn is_not_started(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::FailedPrecondition
        && flashsale_platform::error::reason_of(status).as_deref() == Some("SALE_NOT_STARTED")
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

// === impl Early ===

impl Early {
    fn empty() -> anyhow::Result<Self> {
        Ok(Self {
            refused: 0,
            remembered: 0,
            other_before_opening: BTreeMap::new(),
            after_opening: 0,
            latency: Histogram::new_with_bounds(1, HISTOGRAM_MAX_US, 3)
                .context("early latency histogram")?,
        })
    }

    fn record(
        &mut self,
        status: &tonic::Status,
        micros: u64,
        sent_ms: i64,
        opening_ms: Option<i64>,
    ) {
        self.refused += 1;
        if status.message().ends_with("(remembered by this replica)") {
            self.remembered += 1;
        }
        if opening_ms.is_some_and(|o| sent_ms >= o) {
            self.after_opening += 1;
        }
        self.latency.saturating_record(micros.max(1));
    }

    /// An answer other than `SALE_NOT_STARTED`, received before the opening: none may be an
    /// order.
    fn check_not_before<T>(
        &mut self,
        answer: &Result<Result<T, tonic::Status>, tokio::time::error::Elapsed>,
        opening_ms: Option<i64>,
    ) {
        let Some(opening) = opening_ms else {
            return;
        };
        if now_ms() >= opening {
            return;
        }
        let what = match answer {
            Ok(Ok(_)) => "ACCEPTED".to_owned(),
            Ok(Err(s)) => {
                flashsale_platform::error::reason_of(s).unwrap_or_else(|| format!("{:?}", s.code()))
            }
            Err(_) => "CutByTimeBound".to_owned(),
        };
        *self.other_before_opening.entry(what).or_default() += 1;
    }

    fn merge(&mut self, part: Early) -> anyhow::Result<()> {
        self.refused += part.refused;
        self.remembered += part.remembered;
        self.after_opening += part.after_opening;
        for (k, n) in part.other_before_opening {
            *self.other_before_opening.entry(k).or_default() += n;
        }
        self.latency
            .add(&part.latency)
            .context("merge early latency")?;
        Ok(())
    }
}

// === impl Flood ===

impl Flood {
    fn empty() -> anyhow::Result<Self> {
        Ok(Self {
            requests: 0,
            accepted: Vec::new(),
            refused: BTreeMap::new(),
            errors: BTreeMap::new(),
            unsure: BTreeSet::new(),
            latency: Histogram::new_with_bounds(1, HISTOGRAM_MAX_US, 3)
                .context("create the latency histogram")?,
            elapsed: Duration::ZERO,
            last_accept: None,
            cut_short: false,
            stopped_by_duration: false,
            planned: 0,
            early: Early::empty()?,
        })
    }

    fn error(&mut self, buyer: usize, code: &str) {
        *self.errors.entry(code.to_owned()).or_default() += 1;
        self.unsure.insert(buyer);
    }

    fn merge(&mut self, part: Flood) -> anyhow::Result<()> {
        self.requests += part.requests;
        self.accepted.extend(part.accepted);
        for (k, v) in part.refused {
            *self.refused.entry(k).or_default() += v;
        }
        for (k, v) in part.errors {
            *self.errors.entry(k).or_default() += v;
        }
        self.unsure.extend(part.unsure);
        self.latency
            .add(&part.latency)
            .context("merge latency histograms")?;
        self.cut_short |= part.cut_short;
        self.stopped_by_duration |= part.stopped_by_duration;
        self.early.merge(part.early)
    }

    /// Requests per second of the flood.
    pub fn throughput(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 {
            self.requests as f64 / secs
        } else {
            0.0
        }
    }
}
