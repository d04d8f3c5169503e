//! The sustained sale's call latencies: CreateOrder accepted, refused for stock and refused by
//! admission control (`OVERLOADED`), and PayOrder, each in an HdrHistogram (µs). A refusal by
//! admission control must be answered at once: its p99 is one of the run's checks.

use std::{sync::Mutex, time::Duration};

use hdrhistogram::Histogram;
use serde_json::{Value, json};

use super::checks::Check;

/// The longest an `OVERLOADED` refusal may take at the 99th percentile.
pub const OVERLOADED_P99_MAX: Duration = Duration::from_millis(100);
/// Latencies are recorded up to an hour.
const MAX_US: u64 = 3_600_000_000;

/// Which call a latency is of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    Accepted,
    Refused,
    Overloaded,
    PayOrder,
}

const CALLS: [(Call, &str); 4] = [
    (Call::Accepted, "createOrderAccepted"),
    (Call::Refused, "createOrderRefused"),
    (Call::Overloaded, "createOrderOverloaded"),
    (Call::PayOrder, "payOrder"),
];

/// Latencies being recorded by the buyers.
pub struct Latencies {
    each: [Mutex<Histogram<u64>>; 4],
}

/// One call's figures (ms).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Figures {
    pub count: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// The figures of every call, once the run is over.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    each: [Figures; 4],
}

fn index(call: Call) -> usize {
    CALLS.iter().position(|(c, _)| *c == call).unwrap_or(0)
}

impl Latencies {
    pub fn new() -> anyhow::Result<Self> {
        let h = || Histogram::new_with_bounds(1, MAX_US, 3).map(Mutex::new);
        Ok(Self {
            each: [h()?, h()?, h()?, h()?],
        })
    }

    pub fn record(&self, call: Call, took: Duration) {
        let us = u64::try_from(took.as_micros())
            .unwrap_or(MAX_US)
            .clamp(1, MAX_US);
        if let Ok(mut h) = self.each[index(call)].lock() {
            let _ = h.record(us);
        }
    }

    pub fn summary(&self) -> Summary {
        let ms = |us: u64| us as f64 / 1000.0;
        let mut out = Summary::default();
        for (i, h) in self.each.iter().enumerate() {
            if let Ok(h) = h.lock()
                && !h.is_empty()
            {
                out.each[i] = Figures {
                    count: h.len(),
                    p50_ms: ms(h.value_at_quantile(0.5)),
                    p99_ms: ms(h.value_at_quantile(0.99)),
                    max_ms: ms(h.max()),
                };
            }
        }
        out
    }
}

impl Summary {
    pub fn of(&self, call: Call) -> Figures {
        self.each[index(call)]
    }

    /// The admission check: `OVERLOADED` refusals answered within [`OVERLOADED_P99_MAX`] at the
    /// 99th percentile (passes with none).
    pub fn check(&self) -> Check {
        let f = self.of(Call::Overloaded);
        let max = OVERLOADED_P99_MAX.as_secs_f64() * 1000.0;
        Check {
            name: "OVERLOADED refusals answered at once",
            pass: f.count == 0 || f.p99_ms < max,
            detail: if f.count == 0 {
                "no call refused OVERLOADED".into()
            } else {
                format!(
                    "{} refused, p99 {:.1} ms (at most {max:.0} ms)",
                    f.count, f.p99_ms
                )
            },
        }
    }

    pub fn to_json(&self) -> Value {
        let mut v = json!({});
        for (call, name) in CALLS {
            let f = self.of(call);
            v[name] = json!({
                "count": f.count, "p50Ms": f.p50_ms, "p99Ms": f.p99_ms, "maxMs": f.max_ms,
            });
        }
        v
    }

    /// `name  count, p50 x ms, p99 y ms, max z ms` lines.
    pub fn lines(&self) -> Vec<String> {
        CALLS
            .iter()
            .map(|(call, name)| {
                let f = self.of(*call);
                format!(
                    "{name:<22} {:>7} calls, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
                    f.count, f.p50_ms, f.p99_ms, f.max_ms
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_overloaded_refusals_fail_the_check_and_none_pass_it() -> anyhow::Result<()> {
        let l = Latencies::new()?;
        assert!(l.summary().check().pass, "no refusal, nothing to fail");
        for _ in 0..98 {
            l.record(Call::Overloaded, Duration::from_millis(2));
        }
        l.record(Call::Accepted, Duration::from_secs(3));
        assert!(l.summary().check().pass);
        for _ in 0..5 {
            l.record(Call::Overloaded, Duration::from_millis(250));
        }
        let s = l.summary();
        assert_eq!(s.of(Call::Overloaded).count, 103);
        assert!(!s.check().pass, "{}", s.check().detail);
        assert!(s.of(Call::Accepted).p99_ms >= 2_999.0);
        assert_eq!(s.to_json()["createOrderOverloaded"]["count"], 103);
        Ok(())
    }
}
