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

impl From<crate::client::Placed> for Outcome {
    fn from(p: crate::client::Placed) -> Self {
        match p {
            crate::client::Placed::Accepted(_) => Outcome::Accepted,
            crate::client::Placed::Refused(r) => Outcome::Refused(r),
            // A burst that meets admission control was refused units the gate still had: an
            // error of the run, not a refusal of stock.
            crate::client::Placed::Overloaded => {
                Outcome::Error("ResourceExhausted OVERLOADED".into())
            }
            crate::client::Placed::Error(e) => Outcome::Error(e),
        }
    }
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
    /// When the first call was sent (where `elapsed`, `first_accept` and `last_accept` count
    /// from).
    pub started: Instant,
    /// Since the mode started, when the first and the last accepted call completed.
    pub first_accept: Option<Duration>,
    pub last_accept: Option<Duration>,
    /// Every call of the mode.
    pub latency_us: Histogram<u64>,
    /// The accepted calls only.
    pub accepted_latency_us: Histogram<u64>,
    /// The calls by when they completed, in slots of [`SLOT`]: where in the run the slow ones
    /// were (the intake, the sell-out, the saga behind it).
    pub timeline: Vec<Slot>,
    /// The calls that completed after the last accept (the refusals once sold out).
    pub after_intake: Option<Slot>,
}

/// Width of one [`Slot`] of the timeline.
pub const SLOT: Duration = Duration::from_millis(250);

/// The calls that completed in one stretch of the run.
#[derive(Clone, Debug, PartialEq)]
pub struct Slot {
    /// Start of the stretch, since the mode started.
    pub from: Duration,
    pub requests: usize,
    pub accepted: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Slot {
    /// The figures of `samples` (latencies in µs, sorted ascending).
    fn of(from: Duration, sorted_us: &[u32], accepted: usize) -> Option<Self> {
        let q = |q: f64| {
            let i = ((sorted_us.len() as f64 * q).ceil() as usize).clamp(1, sorted_us.len()) - 1;
            f64::from(sorted_us[i]) / 1000.0
        };
        let last = *sorted_us.last()?;
        Some(Self {
            from,
            requests: sorted_us.len(),
            accepted,
            p50_ms: q(0.5),
            p99_ms: q(0.99),
            max_ms: f64::from(last) / 1000.0,
        })
    }

    pub fn to_json(&self) -> Value {
        json!({
            "from_s": self.from.as_secs_f64(),
            "requests": self.requests,
            "accepted": self.accepted,
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
            "max_ms": self.max_ms,
        })
    }
}

/// One call as the timeline sees it: completion since the start, latency, accepted.
#[derive(Clone, Copy)]
struct Sample {
    done: Duration,
    us: u32,
    accepted: bool,
}

/// The timeline slots and the after-intake figures of `samples`.
fn timeline(mut samples: Vec<Sample>, last_accept: Option<Duration>) -> (Vec<Slot>, Option<Slot>) {
    samples.sort_by_key(|s| s.done);
    let mut slots = Vec::new();
    let mut rest = samples.as_slice();
    let mut from = Duration::ZERO;
    while !rest.is_empty() {
        let end = from + SLOT;
        let n = rest.partition_point(|s| s.done < end);
        let (this, tail) = rest.split_at(n);
        let mut us: Vec<u32> = this.iter().map(|s| s.us).collect();
        us.sort_unstable();
        if let Some(slot) = Slot::of(from, &us, this.iter().filter(|s| s.accepted).count()) {
            slots.push(slot);
        }
        rest = tail;
        from = end;
    }
    let after = last_accept.and_then(|last| {
        let mut us: Vec<u32> = samples
            .iter()
            .filter(|s| s.done > last)
            .map(|s| s.us)
            .collect();
        us.sort_unstable();
        Slot::of(last, &us, 0)
    });
    (slots, after)
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
            "after_intake": self.after_intake.as_ref().map(Slot::to_json),
            "timeline": self.timeline.iter().map(Slot::to_json).collect::<Vec<_>>(),
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
                samples: Vec::new(),
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
                part.samples.push(Sample {
                    done: done.saturating_duration_since(started),
                    us: u32::try_from(us).unwrap_or(u32::MAX),
                    accepted: o == Outcome::Accepted,
                });
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
        started,
        first_accept: None,
        last_accept: None,
        latency_us: histogram()?,
        accepted_latency_us: histogram()?,
        timeline: Vec::new(),
        after_intake: None,
    };
    let mut samples = Vec::new();
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
        samples.extend(part.samples);
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
    (m.timeline, m.after_intake) = timeline(samples, m.last_accept);
    Ok(m)
}

/// What one worker saw.
struct Part {
    all: Option<Histogram<u64>>,
    accepted: Option<Histogram<u64>>,
    outcomes: Vec<Outcome>,
    samples: Vec<Sample>,
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
        // The timeline holds every call once, the accepts where they happened; after the
        // intake only the slow refusals remain.
        assert_eq!(m.timeline.iter().map(|s| s.requests).sum::<usize>(), 12);
        assert_eq!(m.timeline.iter().map(|s| s.accepted).sum::<usize>(), 4);
        assert_eq!(m.timeline[0].from, Duration::ZERO);
        assert!(m.timeline.windows(2).all(|w| w[0].from < w[1].from));
        let after = m.after_intake.clone().unwrap();
        assert_eq!((after.requests, after.accepted), (8, 0));
        assert!(after.p50_ms >= 20.0, "{after:?}");
        assert!(
            m.timeline
                .iter()
                .all(|s| s.p50_ms <= s.p99_ms && s.p99_ms <= s.max_ms)
        );
    }

    #[test]
    fn slots_split_calls_by_completion_and_rank_their_latencies() {
        let at = |ms: u64, us: u32, accepted: bool| Sample {
            done: Duration::from_millis(ms),
            us,
            accepted,
        };
        let mut samples: Vec<Sample> = (1..=100).map(|i| at(10, i * 10, false)).collect();
        samples.push(at(600, 5_000, true));
        samples.push(at(700, 1_000, false));
        let (slots, after) = timeline(samples, Some(Duration::from_millis(600)));
        // 0–250 ms: the hundred calls; 250–500 ms: none (no slot); 500–750 ms: two.
        assert_eq!(slots.len(), 2, "{slots:?}");
        assert_eq!((slots[0].requests, slots[0].accepted), (100, 0));
        assert_eq!(
            (slots[0].p50_ms, slots[0].p99_ms, slots[0].max_ms),
            (0.5, 0.99, 1.0)
        );
        assert_eq!(slots[1].from, Duration::from_millis(500));
        assert_eq!((slots[1].requests, slots[1].accepted), (2, 1));
        assert_eq!(slots[1].max_ms, 5.0);
        let after = after.unwrap();
        assert_eq!((after.requests, after.max_ms), (1, 1.0));
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
