//! Phase (b), the flood: every buyer's CreateOrder calls, `concurrency` in flight at once, each
//! timed into an HdrHistogram (µs) and sorted into accepted orders, refusals by their
//! `ErrorInfo` reason and errors by gRPC code.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{
        Arc,
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
}

/// Makes `buyers × per_buyer` CreateOrder calls, round-robin over the buyers.
pub(crate) async fn run(ctx: Arc<Ctx>, per_buyer: u32, concurrency: u32) -> anyhow::Result<Flood> {
    let total = ctx.buyers.len() as u64 * u64::from(per_buyer);
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let until = ctx.flood_until.map(|d| started + d);
    let mut workers = JoinSet::new();
    for _ in 0..concurrency.min(u32::try_from(total).unwrap_or(u32::MAX)) {
        workers.spawn(worker(ctx.clone(), next.clone(), total, until));
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
async fn worker(
    ctx: Arc<Ctx>,
    next: Arc<AtomicU64>,
    total: u64,
    until: Option<Instant>,
) -> anyhow::Result<Flood> {
    let mut part = Flood::empty()?;
    let mut client = ctx.orders.clone();
    let buyers = ctx.buyers.len() as u64;
    loop {
        let now = Instant::now();
        if now >= ctx.work_deadline {
            part.cut_short = next.load(Ordering::Relaxed) < total;
            break;
        }
        if until.is_some_and(|u| now >= u) {
            part.stopped_by_duration = next.load(Ordering::Relaxed) < total;
            break;
        }
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= total {
            break;
        }
        let buyer = usize::try_from(i % buyers).context("buyer index")?;
        // Each buyer's calls go to the products in turn, starting at a different one per buyer.
        let product = usize::try_from((i % buyers + i / buyers) % ctx.skus.len() as u64)
            .context("product index")?;
        let req = CreateOrderRequest {
            request_id: uuid::Uuid::new_v4().to_string(),
            sku: ctx.skus[product].clone(),
            quantity: 1,
        };
        let req = authorized(req, &ctx.tokens[buyer])?;
        let sent = Instant::now();
        let answer = tokio::time::timeout_at(ctx.work_deadline, client.create_order(req)).await;
        let micros = u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX);
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
        Ok(())
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
