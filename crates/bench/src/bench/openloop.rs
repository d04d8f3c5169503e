//! Open-loop runs, as wrk2 measures: requests arrive at a fixed rate, each started at its
//! scheduled time whether or not the earlier ones have answered, and each call's latency counts
//! from when it was SCHEDULED to start, not from when it was sent — a stalled server makes the
//! calls queued behind it count their wait (no coordinated omission). A closed loop of N
//! workers instead stops sending while the server stalls, and reports the stall once.
//!
//! For each offered rate of `--open-loop-rates`, `--open-loop-secs` seconds of arrivals on a
//! fresh product whose stock covers every request of that rate point, each request from a buyer
//! of its own (so every call can be accepted: the curve measures the accept path, not the quick
//! refusals of a sold-out sale). Reported per rate: offered and achieved rate, p50/p99/p99.9/max
//! latency from the scheduled start (and, beside it, from the actual send), errors, and the calls
//! that could not start on time; and the highest rate whose p99 stays within `--slo-ms`.
//!
//! Bounds: at most `--open-loop-max-in-flight` calls in flight (a safety bound: a call that finds
//! the bound full waits for a slot and is counted as capped, its wait in its latency); no call is
//! started after twice `--open-loop-secs` (the ones left are counted as not started); calls still
//! running [`DRAIN`] after the last start are counted as unfinished. Nothing is dropped silently.

use std::{
    collections::BTreeMap,
    future::Future,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use flashsale_platform::auth::Role;
use flashsale_proto::{
    order::v1::order_service_client::OrderServiceClient,
    product::v1::{
        CreateProductRequest, DeductionPolicy,
        product_stock_service_client::ProductStockServiceClient,
    },
};
use hdrhistogram::Histogram;
use serde_json::{Value, json};
use tokio::{sync::Semaphore, task::JoinSet};

use super::{
    baselines::{self, NaiveVariant},
    invariants::{self, Check},
    measure::Outcome,
    sweep::{self, MAX_POOL},
};
use crate::{
    client::{Secret, authorized, connect, place_order, status_error},
    procstat::{self, ServicePid},
};

/// Highest offered rate, calls per second.
pub const MAX_RATE: u32 = 50_000;
/// Most calls one rate point may schedule (rate × seconds).
pub const MAX_POINT_REQUESTS: u64 = 1_000_000;
/// Longest `--open-loop-secs`.
pub const MAX_SECS: u64 = 120;
/// A call started later than this behind its schedule counts as late.
pub const LATE_START: Duration = Duration::from_millis(2);
/// How long the calls still in flight after the last start may take to finish.
pub const DRAIN: Duration = Duration::from_secs(30);

/// The open-loop flags.
#[derive(clap::Args, Clone, Debug)]
pub struct OpenLoopArgs {
    /// Offered rates of the open-loop modes, calls per second (each 1..=50000), separated by
    /// commas; run in this order.
    #[arg(long, value_delimiter = ',', default_value = "250,500,1000,2000,4000")]
    pub open_loop_rates: Vec<u32>,
    /// Seconds of arrivals at each rate (1..=120).
    #[arg(long, default_value_t = 5)]
    pub open_loop_secs: u64,
    /// The latency objective: the report names the highest rate whose p99 (from the scheduled
    /// start) is at most this many ms, with no errors and every call started and finished.
    #[arg(long, default_value_t = 50)]
    pub slo_ms: u64,
    /// Safety bound on the calls in flight at once (1..=100000); a call that finds it full waits
    /// for a slot (counted, its wait in its latency).
    #[arg(long, default_value_t = 4096)]
    pub open_loop_max_in_flight: usize,
    /// Pool of the open-loop-naive mode (1..=100); default: the pool of the best point of a
    /// naive-sweep run earlier in the same run, else --db-pool.
    #[arg(long)]
    pub open_loop_naive_pool: Option<usize>,
    /// Variant of the open-loop-naive mode; default: the best point's of a naive-sweep run
    /// earlier in the same run, else naive.
    #[arg(long, value_enum)]
    pub open_loop_naive_variant: Option<NaiveVariant>,
    /// Extra rates tried around the knee once the list is done: between the highest rate that
    /// met the objective and the next one that missed it, rates ×1.25 apart (at most this
    /// many, 0..=8; 0 tries none).
    #[arg(long, default_value_t = 3)]
    pub open_loop_knee_points: usize,
}

impl OpenLoopArgs {
    /// Refuses bad values, naming the flag.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            !self.open_loop_rates.is_empty(),
            "--open-loop-rates must list one or more rates"
        );
        anyhow::ensure!(
            (1..=MAX_SECS).contains(&self.open_loop_secs),
            "--open-loop-secs must be 1..={MAX_SECS} (got {})",
            self.open_loop_secs
        );
        for &r in &self.open_loop_rates {
            anyhow::ensure!(
                (1..=MAX_RATE).contains(&r),
                "--open-loop-rates: each rate must be 1..={MAX_RATE} calls per second (got {r})"
            );
            anyhow::ensure!(
                u64::from(r) * self.open_loop_secs <= MAX_POINT_REQUESTS,
                "--open-loop-rates: {r}/s for --open-loop-secs {} is more than {MAX_POINT_REQUESTS} calls",
                self.open_loop_secs
            );
        }
        anyhow::ensure!(
            (1..=60_000).contains(&self.slo_ms),
            "--slo-ms must be 1..=60000 (got {})",
            self.slo_ms
        );
        anyhow::ensure!(
            (1..=100_000).contains(&self.open_loop_max_in_flight),
            "--open-loop-max-in-flight must be 1..=100000 (got {})",
            self.open_loop_max_in_flight
        );
        anyhow::ensure!(
            self.open_loop_knee_points <= MAX_KNEE_POINTS,
            "--open-loop-knee-points must be 0..={MAX_KNEE_POINTS} (got {})",
            self.open_loop_knee_points
        );
        if let Some(p) = self.open_loop_naive_pool {
            anyhow::ensure!(
                (1..=MAX_POOL).contains(&p),
                "--open-loop-naive-pool must be 1..={MAX_POOL} (got {p}); PostgreSQL's max_connections bounds it"
            );
        }
        Ok(())
    }

    fn plan(&self, rate: u32) -> Plan {
        Plan {
            rate,
            secs: self.open_loop_secs,
            max_in_flight: self.open_loop_max_in_flight,
            drain: DRAIN,
        }
    }
}

/// One rate point's schedule.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    pub rate: u32,
    pub secs: u64,
    pub max_in_flight: usize,
    pub drain: Duration,
}

impl Plan {
    /// Calls scheduled: rate × seconds.
    pub fn requests(&self) -> usize {
        usize::try_from(u64::from(self.rate) * self.secs).unwrap_or(usize::MAX)
    }

    /// When call `i` is due, after the start.
    pub fn due(&self, i: usize) -> Duration {
        let nanos = (i as u128) * 1_000_000_000 / u128::from(self.rate.max(1));
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// No call starts later than this after the start.
    fn issue_bound(&self) -> Duration {
        Duration::from_secs(self.secs.max(1) * 2)
    }
}

/// What one rate point measured.
#[derive(Debug)]
pub struct RatePoint {
    pub offered_rate: u32,
    /// When call 0 was due (every call's schedule counts from here; the tests check the
    /// calls' starts against it).
    #[cfg_attr(not(test), allow(dead_code))]
    pub start: Instant,
    pub scheduled: usize,
    pub started: usize,
    /// Calls never started: the issue bound passed while they waited.
    pub not_started: usize,
    pub completed: usize,
    /// Calls started but still running when the drain bound passed.
    pub unfinished: usize,
    pub accepted: usize,
    pub refused: BTreeMap<String, usize>,
    pub errors: BTreeMap<String, usize>,
    /// Calls started more than [`LATE_START`] behind their schedule.
    pub late_starts: usize,
    /// Calls that found the in-flight bound full and waited for a slot.
    pub capped: usize,
    /// How far behind its schedule each call started, µs.
    pub start_lag_us: Histogram<u64>,
    /// Latency from the scheduled start, µs.
    pub latency_us: Histogram<u64>,
    /// Latency from the actual send, µs (what a closed loop would report).
    pub service_us: Histogram<u64>,
    /// From the first call's schedule to the last completion.
    pub elapsed: Duration,
}

impl RatePoint {
    pub fn errored(&self) -> usize {
        self.errors.values().sum()
    }

    /// Completed calls per second, first schedule → last completion.
    pub fn achieved_rate(&self) -> f64 {
        self.completed as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    fn ms(h: &Histogram<u64>, q: f64) -> f64 {
        h.value_at_quantile(q) as f64 / 1000.0
    }

    pub fn p(&self, q: f64) -> f64 {
        Self::ms(&self.latency_us, q)
    }

    /// Within the objective: p99 at most `slo_ms`, no errors, every call started and finished.
    pub fn meets(&self, slo_ms: u64) -> bool {
        self.completed > 0
            && self.errored() == 0
            && self.not_started == 0
            && self.unfinished == 0
            && self.p(0.99) <= slo_ms as f64
    }

    pub fn to_json(&self, slo_ms: u64) -> Value {
        let lat = |h: &Histogram<u64>| {
            json!({
                "p50": round(Self::ms(h, 0.5)),
                "p90": round(Self::ms(h, 0.9)),
                "p99": round(Self::ms(h, 0.99)),
                "p999": round(Self::ms(h, 0.999)),
                "max": round(h.max() as f64 / 1000.0),
            })
        };
        json!({
            "offered_rps": self.offered_rate,
            "achieved_rps": round(self.achieved_rate()),
            "scheduled": self.scheduled,
            "started": self.started,
            "not_started": self.not_started,
            "completed": self.completed,
            "unfinished": self.unfinished,
            "accepted": self.accepted,
            "refused": self.refused,
            "errors": self.errors,
            "errored": self.errored(),
            "late_starts": self.late_starts,
            "capped": self.capped,
            "elapsed_s": round(self.elapsed.as_secs_f64()),
            "latency_ms": lat(&self.latency_us),
            "service_ms": lat(&self.service_us),
            "start_lag_ms": lat(&self.start_lag_us),
            "meets_slo": self.meets(slo_ms),
        })
    }
}

/// What the calls' tasks record.
struct Tally {
    completed: usize,
    accepted: usize,
    refused: BTreeMap<String, usize>,
    errors: BTreeMap<String, usize>,
    latency_us: Histogram<u64>,
    service_us: Histogram<u64>,
    last_done: Option<Instant>,
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

/// Runs `call(i)` for every call of `plan`, each started at its due time (see the module).
pub async fn open_loop<F, Fut>(plan: Plan, call: F) -> anyhow::Result<RatePoint>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Outcome> + Send + 'static,
{
    let n = plan.requests();
    let call = Arc::new(call);
    let tally = Arc::new(Mutex::new(Tally {
        completed: 0,
        accepted: 0,
        refused: BTreeMap::new(),
        errors: BTreeMap::new(),
        latency_us: histogram()?,
        service_us: histogram()?,
        last_done: None,
    }));
    let slots = Arc::new(Semaphore::new(plan.max_in_flight.max(1)));
    let mut tasks = JoinSet::new();
    let mut start_lag_us = histogram()?;
    let (mut started, mut late_starts, mut capped) = (0usize, 0usize, 0usize);
    let start = Instant::now();
    let issue_end = start + plan.issue_bound();
    for i in 0..n {
        let due = start + plan.due(i);
        if Instant::now() < due {
            tokio::time::sleep_until(due.into()).await;
        }
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                capped += 1;
                match tokio::time::timeout_at(issue_end.into(), slots.clone().acquire_owned()).await
                {
                    Ok(Ok(slot)) => slot,
                    _ => break,
                }
            }
        };
        let sent = Instant::now();
        if sent >= issue_end {
            break;
        }
        let lag = sent.saturating_duration_since(due);
        let _ = start_lag_us.record(micros(lag));
        if lag > LATE_START {
            late_starts += 1;
        }
        started += 1;
        let (call, tally) = (call.clone(), tally.clone());
        tasks.spawn(async move {
            let outcome = call(i).await;
            let done = Instant::now();
            drop(slot);
            if let Ok(mut t) = tally.lock() {
                let _ = t
                    .latency_us
                    .record(micros(done.saturating_duration_since(due)));
                let _ = t
                    .service_us
                    .record(micros(done.saturating_duration_since(sent)));
                t.completed += 1;
                t.last_done = Some(t.last_done.map_or(done, |l| l.max(done)));
                match outcome {
                    Outcome::Accepted => t.accepted += 1,
                    Outcome::Refused(r) => *t.refused.entry(r).or_default() += 1,
                    Outcome::Error(e) => *t.errors.entry(e).or_default() += 1,
                }
            }
        });
        while tasks.try_join_next().is_some() {}
    }
    let drain_end = tokio::time::Instant::now() + plan.drain;
    while let Ok(Some(_)) = tokio::time::timeout_at(drain_end, tasks.join_next()).await {}
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    let t = tally
        .lock()
        .map_err(|_| anyhow::anyhow!("open loop: a call panicked while recording"))?;
    Ok(RatePoint {
        offered_rate: plan.rate,
        start,
        scheduled: n,
        started,
        not_started: n - started,
        completed: t.completed,
        unfinished: started.saturating_sub(t.completed),
        accepted: t.accepted,
        refused: t.refused.clone(),
        errors: t.errors.clone(),
        late_starts,
        capped,
        start_lag_us,
        latency_us: t.latency_us.clone(),
        service_us: t.service_us.clone(),
        elapsed: t
            .last_done
            .map_or(Duration::ZERO, |d| d.saturating_duration_since(start)),
    })
}

/// 1 µs .. 1 h at three significant digits (an open loop's queue can grow long).
fn histogram() -> anyhow::Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).map_err(|e| anyhow::anyhow!("histogram: {e}"))
}

/// Most extra rates tried around the knee.
pub const MAX_KNEE_POINTS: usize = 8;
/// The step between the knee's extra rates.
pub const KNEE_STEP: f64 = 1.25;

/// The rates to try between the highest rate that met the objective and the lowest one above
/// it that missed (the knee): ×[`KNEE_STEP`] apart from the lower one, each clearly below the
/// upper one (under its ÷1.1) and not tried yet, at most `max`. None when no rate met the
/// objective, none missed it above the best, or the grid is already that fine there.
pub fn knee_rates(points: &[RatePoint], slo_ms: u64, max: usize) -> Vec<u32> {
    let Some(lo) = max_rate_within(points, slo_ms) else {
        return Vec::new();
    };
    let Some(hi) = points
        .iter()
        .filter(|p| p.offered_rate > lo && !p.meets(slo_ms))
        .map(|p| p.offered_rate)
        .min()
    else {
        return Vec::new();
    };
    let tried = |r: u32| points.iter().any(|p| p.offered_rate == r);
    let mut out = Vec::new();
    let mut r = f64::from(lo);
    while out.len() < max {
        r *= KNEE_STEP;
        let rate = r.round() as u32;
        if f64::from(rate) * 1.1 > f64::from(hi) {
            break;
        }
        if !tried(rate) {
            out.push(rate);
        }
    }
    out
}

/// The highest offered rate that met the objective.
pub fn max_rate_within(points: &[RatePoint], slo_ms: u64) -> Option<u32> {
    points
        .iter()
        .filter(|p| p.meets(slo_ms))
        .map(|p| p.offered_rate)
        .max()
}

/// One target's curve: latency against offered load.
#[derive(Debug)]
pub struct Curve {
    pub round: usize,
    pub target: String,
    pub secs: u64,
    pub slo_ms: u64,
    pub max_in_flight: usize,
    pub points: Vec<RatePoint>,
    /// Each point's product read back after it (the check's detail names the rate).
    pub checks: Vec<Check>,
}

impl Curve {
    /// Every point's product passed its checks.
    pub fn passed(&self) -> bool {
        invariants::all_pass(&self.checks)
    }

    pub fn max_rate_within_slo(&self) -> Option<u32> {
        max_rate_within(&self.points, self.slo_ms)
    }

    pub fn to_json(&self) -> Value {
        json!({
            "round": self.round,
            "target": self.target,
            "secs_per_rate": self.secs,
            "slo_ms": self.slo_ms,
            "max_in_flight": self.max_in_flight,
            "stock": "each rate point sells a fresh product whose stock is that point's scheduled calls, one call per buyer",
            "latency_from": "the scheduled start",
            "max_rate_within_slo": self.max_rate_within_slo(),
            "points": self.points.iter().map(|p| p.to_json(self.slo_ms)).collect::<Vec<_>>(),
            "checks": self.checks.iter().map(Check::to_json).collect::<Vec<_>>(),
            "passed": self.passed(),
        })
    }

    pub fn print_text(&self) {
        println!(
            "open loop (round {}): {} — {} s per rate, stock = the point's calls (one per buyer), latency from the scheduled start",
            self.round, self.target, self.secs
        );
        println!(
            "  {:>8} {:>9} {:>8} {:>8} {:>7} {:>6} {:>6} {:>6} {:>8} {:>8} {:>8} {:>8} {:>9} {:>8}",
            "offered",
            "achieved",
            "calls",
            "accepted",
            "errors",
            "late",
            "capped",
            "lost",
            "p50 ms",
            "p99 ms",
            "p99.9",
            "max ms",
            "sent p99",
            "lag p99",
        );
        for p in &self.points {
            println!(
                "  {:>8} {:>9.0} {:>8} {:>8} {:>7} {:>6} {:>6} {:>6} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>9.2} {:>8.2}{}",
                p.offered_rate,
                p.achieved_rate(),
                p.scheduled,
                p.accepted,
                p.errored(),
                p.late_starts,
                p.capped,
                p.not_started + p.unfinished,
                p.p(0.5),
                p.p(0.99),
                p.p(0.999),
                p.latency_us.max() as f64 / 1000.0,
                RatePoint::ms(&p.service_us, 0.99),
                RatePoint::ms(&p.start_lag_us, 0.99),
                if p.meets(self.slo_ms) {
                    ""
                } else {
                    "  (misses)"
                }
            );
            if !p.errors.is_empty() || !p.refused.is_empty() {
                println!("      refused {:?}, errors {:?}", p.refused, p.errors);
            }
        }
        for c in &self.checks {
            println!(
                "  check {} {}: {}",
                if c.pass { "ok  " } else { "FAIL" },
                c.name,
                c.detail
            );
        }
        match self.max_rate_within_slo() {
            Some(r) => println!(
                "  highest rate with p99 <= {} ms, no errors, nothing lost: {r}/s",
                self.slo_ms
            ),
            None => println!(
                "  no rate met p99 <= {} ms with no errors and nothing lost",
                self.slo_ms
            ),
        }
    }
}

/// Where the platform is.
pub struct PlatformTarget<'a> {
    pub product_stock_url: &'a str,
    pub order_urls: &'a [String],
    pub stock_buckets: u32,
    pub secret: &'a Secret,
    pub connections: usize,
}

/// Between rate points: the services go idle (the saga of the last point's orders).
pub struct Between<'a> {
    pub services: &'a [ServicePid],
    pub idle_bound: Duration,
}

impl Between<'_> {
    async fn wait(&self) {
        if let Some(w) = procstat::wait_idle(self.services, self.idle_bound).await {
            eprintln!(
                "bench: services {} after {:.1} s",
                if w.idle { "idle" } else { "still busy" },
                w.waited.as_secs_f64()
            );
        }
    }
}

/// The rates of one curve in the order they run: the list, then the knee's extra rates (found
/// once, from the list's points; those within the bound on one point's calls).
struct Rates {
    queue: std::collections::VecDeque<u32>,
    refined: bool,
    knee_points: usize,
    slo_ms: u64,
    max_rate: u32,
}

impl Rates {
    fn new(args: &OpenLoopArgs) -> Self {
        let secs = args.open_loop_secs.max(1);
        Self {
            queue: args.open_loop_rates.iter().copied().collect(),
            refined: false,
            knee_points: args.open_loop_knee_points,
            slo_ms: args.slo_ms,
            max_rate: u32::try_from(MAX_POINT_REQUESTS / secs)
                .unwrap_or(MAX_RATE)
                .min(MAX_RATE),
        }
    }

    fn next(&mut self, done: &[RatePoint]) -> Option<u32> {
        if self.queue.is_empty() && !self.refined {
            self.refined = true;
            let knee = knee_rates(done, self.slo_ms, self.knee_points);
            if !knee.is_empty() {
                eprintln!("bench: open loop: around the knee, {knee:?}/s");
            }
            self.queue
                .extend(knee.into_iter().filter(|&r| r <= self.max_rate));
        }
        self.queue.pop_front()
    }
}

/// `checks` of the point at `rate`, their details naming it.
fn at_rate(rate: u32, checks: Vec<Check>) -> Vec<Check> {
    checks
        .into_iter()
        .map(|c| Check {
            detail: format!("at {rate}/s: {}", c.detail),
            ..c
        })
        .collect()
}

/// The platform's open-loop curve: CreateOrder through the order service's gRPC API.
pub async fn platform(
    args: &OpenLoopArgs,
    target: &PlatformTarget<'_>,
    per_user_limit: u32,
    between: &Between<'_>,
    round: usize,
) -> anyhow::Result<Curve> {
    let admin = target
        .secret
        .mint("bench", Role::Admin, Duration::from_secs(3600))?;
    let mut channels = Vec::new();
    for c in 0..target.connections.max(1) {
        let url = &target.order_urls[c % target.order_urls.len().max(1)];
        channels.push(OrderServiceClient::new(
            connect(url, Duration::from_secs(30)).await?,
        ));
    }
    let mut stock_client = ProductStockServiceClient::new(
        connect(target.product_stock_url, Duration::from_secs(10)).await?,
    );
    let mut points: Vec<RatePoint> = Vec::new();
    let mut checks = Vec::new();
    let mut rates = Rates::new(args);
    while let Some(rate) = rates.next(&points) {
        between.wait().await;
        let plan = args.plan(rate);
        let n = plan.requests();
        let sku = sweep::fresh_sku();
        let create = CreateProductRequest {
            sku: sku.clone(),
            name: "bench".into(),
            price_cents: 1999,
            initial_stock: i64::try_from(n).unwrap_or(i64::MAX),
            per_user_limit,
            deduction_policy: DeductionPolicy::ReserveThenCommit as i32,
            stock_buckets: target.stock_buckets,
            ..Default::default()
        };
        stock_client
            .create_product(authorized(create, &admin)?)
            .await
            .map_err(status_error)?;
        // Tokens minted before the clock starts, one buyer per call.
        let tokens: Vec<String> = (0..n)
            .map(|b| {
                target
                    .secret
                    .mint(&format!("buyer{b}"), Role::User, Duration::from_secs(3600))
            })
            .collect::<anyhow::Result<_>>()?;
        let (tokens, channels) = (Arc::new(tokens), channels.clone());
        eprintln!(
            "bench: open loop platform at {rate}/s for {} s …",
            plan.secs
        );
        let stock = i64::try_from(n).unwrap_or(i64::MAX);
        let sku_read = sku.clone();
        let point = open_loop(plan, move |i| {
            let mut c = channels[i % channels.len()].clone();
            let (tokens, sku) = (tokens.clone(), sku.clone());
            async move {
                let Some(token) = tokens.get(i) else {
                    return Outcome::Error("token".into());
                };
                let request_id = format!("{sku}-{i}");
                place_order(&mut c, token, sku, request_id).await.into()
            }
        })
        .await?;
        eprintln!(
            "bench: … achieved {:.0}/s, p99 {:.2} ms, {} errors",
            point.achieved_rate(),
            point.p(0.99),
            point.errored()
        );
        let read = invariants::open_loop_platform(
            target.product_stock_url,
            &admin,
            &sku_read,
            stock,
            point.accepted,
            point.errored() + point.unfinished,
        );
        checks.extend(at_rate(rate, read.await));
        points.push(point);
    }
    Ok(Curve {
        round,
        target: "platform (CreateOrder)".into(),
        secs: args.open_loop_secs,
        slo_ms: args.slo_ms,
        max_in_flight: args.open_loop_max_in_flight,
        points,
        checks,
    })
}

/// The naive design's open-loop curve, in `variant` with a pool of `pool`.
#[allow(clippy::too_many_arguments)]
pub async fn naive(
    args: &OpenLoopArgs,
    postgres_url: &str,
    naive_db: &str,
    pool: usize,
    variant: NaiveVariant,
    per_user_limit: u32,
    between: &Between<'_>,
    round: usize,
) -> anyhow::Result<Curve> {
    let pool_size = u32::try_from(pool.clamp(1, MAX_POOL)).unwrap_or(1);
    let db = Arc::new(baselines::bench_db(postgres_url, naive_db, pool_size).await?);
    let limit = i64::from(per_user_limit);
    let mut points: Vec<RatePoint> = Vec::new();
    let mut checks = Vec::new();
    let mut rates = Rates::new(args);
    while let Some(rate) = rates.next(&points) {
        between.wait().await;
        let plan = args.plan(rate);
        let n = plan.requests();
        let sku = sweep::fresh_sku();
        let stock = i64::try_from(n).unwrap_or(i64::MAX);
        baselines::prepare_naive(&db, stock, &sku).await?;
        let tag = uuid::Uuid::new_v4().simple().to_string();
        eprintln!(
            "bench: open loop {} (pool {pool}) at {rate}/s for {} s …",
            variant.label(),
            plan.secs
        );
        let (db_read, sku_read) = (db.clone(), sku.clone());
        let db = db.clone();
        let point = open_loop(plan, move |i| {
            let (db, sku, tag) = (db.clone(), sku.clone(), tag.clone());
            async move {
                baselines::naive_call(
                    &db,
                    variant,
                    &sku,
                    &format!("buyer{i}"),
                    &format!("{tag}-{i}"),
                    limit,
                )
                .await
            }
        })
        .await?;
        eprintln!(
            "bench: … achieved {:.0}/s, p99 {:.2} ms, {} errors",
            point.achieved_rate(),
            point.p(0.99),
            point.errored()
        );
        let read = invariants::naive_database(
            &db_read,
            &sku_read,
            stock,
            (point.accepted, point.errored() + point.unfinished),
            per_user_limit,
        );
        checks.extend(at_rate(rate, read.await));
        points.push(point);
    }
    if let Ok(db) = Arc::try_unwrap(db) {
        db.close().await.ok();
    }
    Ok(Curve {
        round,
        target: format!("naive ({}, pool {pool})", variant.label()),
        secs: args.open_loop_secs,
        slo_ms: args.slo_ms,
        max_in_flight: args.open_loop_max_in_flight,
        points,
        checks,
    })
}

/// One open-loop mode of `flashsale bench`: the platform's curve, or the naive design's — in
/// the variant and pool given by --open-loop-naive-variant/--open-loop-naive-pool, else those of
/// `best` (the best point of a naive-sweep run before it), else naive at --db-pool.
pub async fn run_mode(
    args: &super::Args,
    platform_target: bool,
    services: &[ServicePid],
    per_user_limit: u32,
    round: usize,
    best: Option<&sweep::Point>,
) -> anyhow::Result<Curve> {
    let between = Between {
        services,
        idle_bound: Duration::from_secs(args.max_idle_wait_secs),
    };
    let o = &args.open_loop;
    if platform_target {
        let target = PlatformTarget {
            product_stock_url: &args.product_stock_url,
            order_urls: &args.order_url,
            stock_buckets: args.stock_buckets.unwrap_or(0),
            secret: &args.secret,
            connections: args.connections,
        };
        return platform(o, &target, per_user_limit, &between, round).await;
    }
    let pool = match (o.open_loop_naive_pool, best) {
        (Some(p), _) => p,
        (None, Some(b)) => b.pool,
        (None, None) => usize::try_from(args.db_pool()?).unwrap_or(1),
    };
    let variant = o
        .open_loop_naive_variant
        .or(best.map(|b| b.variant))
        .unwrap_or(NaiveVariant::Naive);
    naive(
        o,
        &args.postgres_url,
        &args.naive_db,
        pool,
        variant,
        per_user_limit,
        &between,
        round,
    )
    .await
}

fn round(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use clap::Parser;

    use super::*;

    fn plan(rate: u32, secs: u64, max_in_flight: usize) -> Plan {
        Plan {
            rate,
            secs,
            max_in_flight,
            drain: DRAIN,
        }
    }

    #[tokio::test]
    async fn calls_start_on_schedule_and_count_from_it() {
        // 200 calls over one second, each taking 20 ms: all run, none early, none in a burst.
        let p = plan(200, 1, 4096);
        let sent: Arc<Mutex<Vec<(usize, Instant)>>> = Arc::default();
        let point = open_loop(p, {
            let sent = sent.clone();
            move |i| {
                let sent = sent.clone();
                async move {
                    if let Ok(mut s) = sent.lock() {
                        s.push((i, Instant::now()));
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Outcome::Accepted
                }
            }
        })
        .await
        .unwrap();
        assert_eq!(
            (
                point.scheduled,
                point.started,
                point.completed,
                point.accepted
            ),
            (200, 200, 200, 200)
        );
        assert_eq!(
            (point.not_started, point.unfinished, point.capped),
            (0, 0, 0)
        );
        let sent = sent.lock().unwrap().clone();
        assert_eq!(sent.len(), 200);
        for &(i, at) in &sent {
            assert!(
                at >= point.start + p.due(i),
                "call {i} started before it was due"
            );
        }
        // The arrivals span the second: the last is due 995 ms after the first.
        let last = sent.iter().map(|&(_, at)| at).max().unwrap();
        assert!(last.duration_since(point.start) >= Duration::from_millis(995));
        // Every latency holds the call's 20 ms, counted from its due time.
        assert!(
            point.latency_us.min() >= 20_000,
            "{}",
            point.latency_us.min()
        );
        assert!(point.service_us.min() >= 20_000);
        assert!(point.elapsed >= Duration::from_millis(1_015));
        assert_eq!(point.latency_us.len(), 200);
    }

    #[tokio::test]
    async fn a_stalled_call_makes_the_calls_behind_it_count_their_wait() {
        // One call in flight at most, 100 calls over a second; the first stalls 300 ms. The
        // calls due meanwhile cannot start: they start late, and their latency from the
        // schedule holds the wait, while their time from the send does not.
        let p = plan(100, 1, 1);
        let point = open_loop(p, |i| async move {
            let ms = if i == 0 { 300 } else { 1 };
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Outcome::Accepted
        })
        .await
        .unwrap();
        assert_eq!(
            (point.started, point.completed, point.not_started),
            (100, 100, 0)
        );
        // Calls 1..=29 were due within the stall.
        assert!(point.capped >= 20, "capped {}", point.capped);
        assert!(point.late_starts >= 20, "late {}", point.late_starts);
        // Calls 1..=20 were due by 200 ms and started after 300 ms: 100 ms or more each.
        let waited = point.latency_us.count_between(100_000, u64::MAX);
        assert!(waited >= 20, "{waited} calls counted a 100 ms wait");
        assert!(point.latency_us.max() >= 290_000);
        // From the send, only the stalled call itself took that long.
        let slow_sends = point.service_us.count_between(100_000, u64::MAX);
        assert!(
            slow_sends < waited,
            "{slow_sends} slow sends, {waited} waits"
        );
        assert!(point.start_lag_us.max() >= 250_000);
    }

    #[tokio::test]
    async fn calls_that_cannot_start_or_finish_are_counted() {
        // Two slots, calls that never answer: two start, the rest wait until the issue bound
        // (twice the second) and are counted as not started; the two as unfinished.
        let p = Plan {
            rate: 10,
            secs: 1,
            max_in_flight: 2,
            drain: Duration::from_millis(100),
        };
        let calls = Arc::new(AtomicUsize::new(0));
        let point = open_loop(p, {
            let calls = calls.clone();
            move |_| {
                calls.fetch_add(1, Ordering::Relaxed);
                std::future::pending::<Outcome>()
            }
        })
        .await
        .unwrap();
        assert_eq!(point.scheduled, 10);
        assert_eq!((point.started, point.not_started), (2, 8));
        assert_eq!((point.completed, point.unfinished), (0, 2));
        assert_eq!(calls.load(Ordering::Relaxed), 2);
        assert!(!point.meets(1_000_000));
    }

    fn point_with(rate: u32, p99_ms: u64, errors: usize) -> RatePoint {
        let mut latency_us = histogram().unwrap();
        latency_us.record(p99_ms * 1000).unwrap();
        let mut errs = BTreeMap::new();
        if errors > 0 {
            errs.insert("Unavailable".to_owned(), errors);
        }
        RatePoint {
            offered_rate: rate,
            start: Instant::now(),
            scheduled: 10,
            started: 10,
            not_started: 0,
            completed: 10,
            unfinished: 0,
            accepted: 10 - errors,
            refused: BTreeMap::new(),
            errors: errs,
            late_starts: 0,
            capped: 0,
            start_lag_us: histogram().unwrap(),
            latency_us,
            service_us: histogram().unwrap(),
            elapsed: Duration::from_secs(1),
        }
    }

    #[test]
    fn the_knee_is_tried_at_steps_of_a_quarter_between_the_last_met_and_the_first_missed() {
        let grid = [
            point_with(500, 5, 0),
            point_with(1000, 9, 0),
            point_with(2000, 30, 0),
            point_with(4000, 400, 0),
        ];
        // 2000 met 50 ms, 4000 missed: 2500, 3125 (3906 is within a tenth of 4000).
        assert_eq!(knee_rates(&grid, 50, 8), vec![2500, 3125]);
        assert_eq!(knee_rates(&grid, 50, 1), vec![2500]);
        assert_eq!(knee_rates(&grid, 50, 0), Vec::<u32>::new());
        // A rate that missed because of errors is a miss too.
        let errored = [point_with(1000, 5, 0), point_with(2000, 5, 3)];
        assert_eq!(knee_rates(&errored, 50, 8), vec![1250, 1563]);
        // No knee: every rate met it, none did, or the grid is already fine there.
        assert!(knee_rates(&grid[..3], 50, 8).is_empty());
        assert!(knee_rates(&grid[3..], 50, 8).is_empty());
        let fine = [point_with(1000, 5, 0), point_with(1100, 80, 0)];
        assert!(knee_rates(&fine, 50, 8).is_empty());
        // Rates already tried are not tried again.
        let tried = [
            point_with(1000, 5, 0),
            point_with(1250, 80, 0),
            point_with(2000, 80, 0),
        ];
        assert!(knee_rates(&tried, 50, 8).is_empty());
    }

    #[test]
    fn the_highest_rate_within_the_objective_is_reported() {
        let points = vec![
            point_with(500, 5, 0),
            point_with(1_000, 20, 0),
            point_with(2_000, 49, 0),
            point_with(4_000, 400, 0),
            // Fast but with errors: misses.
            point_with(8_000, 10, 3),
        ];
        assert_eq!(max_rate_within(&points, 50), Some(2_000));
        assert_eq!(max_rate_within(&points, 10), Some(500));
        assert_eq!(max_rate_within(&points, 1), None);
        let j = points[2].to_json(50);
        assert_eq!(j["meets_slo"], true);
        assert_eq!(j["offered_rps"], 2_000);
        assert_eq!(points[4].to_json(50)["meets_slo"], false);
    }

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        open: OpenLoopArgs,
    }

    fn refused(args: &[&str]) -> String {
        let mut all = vec!["t"];
        all.extend_from_slice(args);
        match Cli::try_parse_from(all) {
            Ok(cli) => match cli.open.validate() {
                Ok(()) => panic!("{args:?} was accepted"),
                Err(e) => e.to_string(),
            },
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn bad_open_loop_flags_are_refused_by_name() {
        assert!(refused(&["--open-loop-rates", ""]).contains("--open-loop-rates"));
        assert!(refused(&["--open-loop-rates", "0"]).contains("--open-loop-rates"));
        assert!(refused(&["--open-loop-rates", "500,0"]).contains("--open-loop-rates"));
        assert!(refused(&["--open-loop-rates", "50001"]).contains("--open-loop-rates"));
        assert!(refused(&["--open-loop-rates=-5"]).contains("--open-loop-rates"));
        // 50,000/s for 60 s is more calls than a point may schedule.
        assert!(
            refused(&["--open-loop-rates", "50000", "--open-loop-secs", "60"])
                .contains("--open-loop-rates")
        );
        assert!(refused(&["--open-loop-secs", "0"]).contains("--open-loop-secs"));
        assert!(refused(&["--open-loop-secs", "121"]).contains("--open-loop-secs"));
        assert!(refused(&["--slo-ms", "0"]).contains("--slo-ms"));
        assert!(refused(&["--open-loop-max-in-flight", "0"]).contains("--open-loop-max-in-flight"));
        assert!(refused(&["--open-loop-naive-pool", "0"]).contains("--open-loop-naive-pool"));
        assert!(refused(&["--open-loop-naive-pool", "101"]).contains("--open-loop-naive-pool"));
        assert!(
            refused(&["--open-loop-naive-variant", "fast"]).contains("--open-loop-naive-variant")
        );
        assert!(refused(&["--open-loop-knee-points", "9"]).contains("--open-loop-knee-points"));
        assert!(refused(&["--open-loop-knee-points=-1"]).contains("--open-loop-knee-points"));
        let ok = Cli::try_parse_from([
            "t",
            "--open-loop-rates",
            "100,50000",
            "--open-loop-secs",
            "2",
            "--open-loop-naive-variant",
            "naive-fn",
        ])
        .unwrap();
        ok.open.validate().unwrap();
        assert_eq!(ok.open.open_loop_naive_variant, Some(NaiveVariant::NaiveFn));
        Cli::try_parse_from(["t"]).unwrap().open.validate().unwrap();
    }

    #[test]
    fn calls_are_due_at_even_intervals() {
        let p = plan(3, 2, 1);
        assert_eq!(p.requests(), 6);
        assert_eq!(p.due(0), Duration::ZERO);
        assert_eq!(p.due(1), Duration::from_nanos(333_333_333));
        assert_eq!(p.due(3), Duration::from_secs(1));
    }
}
