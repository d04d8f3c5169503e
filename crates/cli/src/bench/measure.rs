//! Driving one mode of the benchmark: `requests` calls at `concurrency`, each timed into an
//! HDR histogram, counted by outcome.

use std::{
    collections::BTreeMap,
    future::Future,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use hdrhistogram::Histogram;
use serde_json::{Value, json};

/// How one call ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Accepted,
    Refused(String),
    Error(String),
}

/// The figures of one mode.
#[derive(Debug)]
pub struct Measurement {
    pub name: String,
    pub requests: usize,
    pub accepted: usize,
    pub refused: BTreeMap<String, usize>,
    pub errors: BTreeMap<String, usize>,
    pub elapsed: Duration,
    pub latency_us: Histogram<u64>,
}

impl Measurement {
    pub fn throughput(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn accepted_per_sec(&self) -> f64 {
        self.accepted as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn p(&self, q: f64) -> f64 {
        self.latency_us.value_at_quantile(q) as f64 / 1000.0
    }

    pub fn to_json(&self) -> Value {
        json!({
            "mode": self.name,
            "requests": self.requests,
            "accepted": self.accepted,
            "refused": self.refused,
            "errors": self.errors,
            "elapsed_s": self.elapsed.as_secs_f64(),
            "throughput_rps": self.throughput(),
            "accepted_per_s": self.accepted_per_sec(),
            "latency_ms": {
                "p50": self.p(0.5), "p90": self.p(0.9), "p99": self.p(0.99), "p999": self.p(0.999),
                "max": self.latency_us.max() as f64 / 1000.0,
            },
        })
    }

    pub fn row(&self) -> String {
        format!(
            "{:<22} {:>8} {:>8} {:>10.0} {:>10.0} {:>8.2} {:>8.2} {:>8.2} {:>8.2}",
            self.name,
            self.requests,
            self.accepted,
            self.throughput(),
            self.accepted_per_sec(),
            self.p(0.5),
            self.p(0.99),
            self.p(0.999),
            self.latency_us.max() as f64 / 1000.0
        )
    }

    pub fn header() -> String {
        format!(
            "{:<22} {:>8} {:>8} {:>10} {:>10} {:>8} {:>8} {:>8} {:>8}",
            "mode",
            "requests",
            "accepted",
            "req/s",
            "accept/s",
            "p50 ms",
            "p99 ms",
            "p99.9",
            "max ms"
        )
    }
}

/// Runs `call(i)` for i in 0..requests with at most `concurrency` in flight, stopping early
/// (and counting what ran) if `deadline` passes.
pub async fn drive<F, Fut>(
    name: &str,
    requests: usize,
    concurrency: usize,
    deadline: Duration,
    call: F,
) -> anyhow::Result<Measurement>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Outcome> + Send + 'static,
{
    let call = Arc::new(call);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let stop_at = started + deadline;
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..concurrency.max(1) {
        let (call, next) = (call.clone(), next.clone());
        workers.spawn(async move {
            let mut hist = histogram().ok();
            let mut outcomes = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= requests || Instant::now() >= stop_at {
                    break;
                }
                let t = Instant::now();
                let o = call(i).await;
                if let Some(h) = hist.as_mut() {
                    let _ = h.record(
                        u64::try_from(t.elapsed().as_micros())
                            .unwrap_or(u64::MAX)
                            .max(1),
                    );
                }
                outcomes.push(o);
            }
            (hist, outcomes)
        });
    }
    let mut m = Measurement {
        name: name.to_owned(),
        requests: 0,
        accepted: 0,
        refused: BTreeMap::new(),
        errors: BTreeMap::new(),
        elapsed: Duration::ZERO,
        latency_us: histogram()?,
    };
    while let Some(joined) = workers.join_next().await {
        let Ok((hist, outcomes)) = joined else {
            continue;
        };
        if let Some(h) = hist {
            let _ = m.latency_us.add(h);
        }
        for o in outcomes {
            m.requests += 1;
            match o {
                Outcome::Accepted => m.accepted += 1,
                Outcome::Refused(r) => *m.refused.entry(r).or_default() += 1,
                Outcome::Error(e) => *m.errors.entry(e).or_default() += 1,
            }
        }
    }
    m.elapsed = started.elapsed();
    Ok(m)
}

/// 1 µs .. 60 s at three significant digits.
fn histogram() -> anyhow::Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, 60_000_000, 3).map_err(|e| anyhow::anyhow!("histogram: {e}"))
}
