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
    /// Since the mode started, when the first and the last accepted call completed.
    pub first_accept: Option<Duration>,
    pub last_accept: Option<Duration>,
    /// Every call of the mode.
    pub latency_us: Histogram<u64>,
    /// The accepted calls only.
    pub accepted_latency_us: Histogram<u64>,
}

impl Measurement {
    /// Calls per second over the whole mode.
    pub fn throughput(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Accepted calls per second over the intake window (mode start → last accept), so the
    /// quick refusals after a sell-out do not dilute it.
    pub fn accepted_per_sec(&self) -> f64 {
        match self.last_accept {
            Some(w) => self.accepted as f64 / w.as_secs_f64().max(1e-9),
            None => 0.0,
        }
    }

    pub fn errored(&self) -> usize {
        self.errors.values().sum()
    }

    /// The quantile `q` of every call's latency, in ms.
    pub fn p(&self, q: f64) -> f64 {
        self.latency_us.value_at_quantile(q) as f64 / 1000.0
    }

    /// The quantile `q` of the accepted calls' latency, in ms.
    pub fn accepted_p(&self, q: f64) -> f64 {
        self.accepted_latency_us.value_at_quantile(q) as f64 / 1000.0
    }

    pub fn to_json(&self) -> Value {
        json!({
            "mode": self.name,
            "requests": self.requests,
            "accepted": self.accepted,
            "refused": self.refused,
            "errors": self.errors,
            "errored": self.errored(),
            "elapsed_s": self.elapsed.as_secs_f64(),
            "throughput_rps": self.throughput(),
            "accepted_per_s": self.accepted_per_sec(),
            "intake_s": self.last_accept.map(|d| d.as_secs_f64()),
            "first_accept_s": self.first_accept.map(|d| d.as_secs_f64()),
            "latency_ms": {
                "p50": self.p(0.5), "p90": self.p(0.9), "p99": self.p(0.99), "p999": self.p(0.999),
                "max": self.latency_us.max() as f64 / 1000.0,
            },
            "accepted_latency_ms": {
                "p50": self.accepted_p(0.5), "p99": self.accepted_p(0.99),
            },
        })
    }

    pub fn row(&self) -> String {
        format!(
            "{:<22} {:>8} {:>8} {:>7} {:>10.0} {:>10.0} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>9.2}",
            self.name,
            self.requests,
            self.accepted,
            self.errored(),
            self.throughput(),
            self.accepted_per_sec(),
            self.p(0.5),
            self.p(0.99),
            self.p(0.999),
            self.latency_us.max() as f64 / 1000.0,
            self.accepted_p(0.99),
        )
    }

    pub fn header() -> String {
        format!(
            "{:<22} {:>8} {:>8} {:>7} {:>10} {:>10} {:>8} {:>8} {:>8} {:>8} {:>9}",
            "mode",
            "requests",
            "accepted",
            "errors",
            "req/s",
            "accept/s",
            "p50 ms",
            "p99 ms",
            "p99.9",
            "max ms",
            "acc p99",
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
            let mut part = Part {
                all: histogram().ok(),
                accepted: histogram().ok(),
                outcomes: Vec::new(),
                first_accept: None,
                last_accept: None,
            };
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= requests || Instant::now() >= stop_at {
                    break;
                }
                let t = Instant::now();
                let o = call(i).await;
                let done = Instant::now();
                let us = u64::try_from(done.duration_since(t).as_micros())
                    .unwrap_or(u64::MAX)
                    .max(1);
                if let Some(h) = part.all.as_mut() {
                    let _ = h.record(us);
                }
                if o == Outcome::Accepted {
                    if let Some(h) = part.accepted.as_mut() {
                        let _ = h.record(us);
                    }
                    part.first_accept.get_or_insert(done);
                    part.last_accept = Some(done);
                }
                part.outcomes.push(o);
            }
            part
        });
    }
    let mut m = Measurement {
        name: name.to_owned(),
        requests: 0,
        accepted: 0,
        refused: BTreeMap::new(),
        errors: BTreeMap::new(),
        elapsed: Duration::ZERO,
        first_accept: None,
        last_accept: None,
        latency_us: histogram()?,
        accepted_latency_us: histogram()?,
    };
    while let Some(joined) = workers.join_next().await {
        let Ok(part) = joined else {
            continue;
        };
        if let Some(h) = part.all {
            let _ = m.latency_us.add(h);
        }
        if let Some(h) = part.accepted {
            let _ = m.accepted_latency_us.add(h);
        }
        let since = |t: Instant| t.saturating_duration_since(started);
        if let Some(f) = part.first_accept.map(since) {
            m.first_accept = Some(m.first_accept.map_or(f, |x| x.min(f)));
        }
        if let Some(l) = part.last_accept.map(since) {
            m.last_accept = Some(m.last_accept.map_or(l, |x| x.max(l)));
        }
        for o in part.outcomes {
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

/// What one worker saw.
struct Part {
    all: Option<Histogram<u64>>,
    accepted: Option<Histogram<u64>>,
    outcomes: Vec<Outcome>,
    first_accept: Option<Instant>,
    last_accept: Option<Instant>,
}

/// 1 µs .. 60 s at three significant digits.
fn histogram() -> anyhow::Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, 60_000_000, 3).map_err(|e| anyhow::anyhow!("histogram: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn accepts_per_second_count_only_the_intake_window() {
        // Four quick accepts, then slow refusals: the refusals stretch the mode, not the intake.
        let m = drive("t", 12, 1, Duration::from_secs(30), |i| async move {
            if i < 4 {
                Outcome::Accepted
            } else {
                tokio::time::sleep(Duration::from_millis(25)).await;
                Outcome::Refused("SOLD_OUT".into())
            }
        })
        .await
        .unwrap();
        assert_eq!((m.requests, m.accepted), (12, 4));
        let (first, last) = (m.first_accept.unwrap(), m.last_accept.unwrap());
        assert!(
            first <= last && last < m.elapsed,
            "{first:?} {last:?} {m:?}"
        );
        assert!(m.accepted_per_sec() > 4.0 / m.elapsed.as_secs_f64() * 5.0);
        assert_eq!(m.accepted_latency_us.len(), 4);
        assert_eq!(m.latency_us.len(), 12);
        assert!(m.accepted_p(0.99) < m.p(0.99));
        assert_eq!(m.errored(), 0);
    }

    #[tokio::test]
    async fn a_mode_without_accepts_has_no_intake_window() {
        let m = drive("t", 3, 2, Duration::from_secs(30), |_| async {
            Outcome::Error("Unavailable".into())
        })
        .await
        .unwrap();
        assert_eq!((m.accepted, m.errored()), (0, 3));
        assert_eq!(m.accepted_per_sec(), 0.0);
        assert!(m.last_accept.is_none());
        assert!(m.to_json()["intake_s"].is_null());
    }
}
