//! The bench's report: each mode's figures, the services' memory during it, the saga's pace,
//! and the ratios of the platform to its baselines — as text or one JSON object.

use serde_json::{Value, json};

use super::{
    baselines::Load, batches::BatchFigures, invariants::Check, measure::Measurement,
    refusals::Refusals, saga::Saga,
};
use crate::{
    cpustat::{Samples, Usage},
    procstat::{self, IdleWait, Memory, ServicePid},
};

/// One mode as measured, with what was watched around it.
pub struct ModeReport {
    /// Which round of `--rounds` (from 1).
    pub round: usize,
    pub m: Measurement,
    pub saga: Option<Saga>,
    pub memory: Vec<Memory>,
    pub idle: Option<IdleWait>,
    pub cpu: Cpu,
    /// What the services' batchers did during the mode (empty when none ran or none answered).
    pub batches: Vec<BatchFigures>,
    /// The invariants checked after the mode (docs/invariants.md).
    pub checks: Vec<Check>,
    /// The servers' counters around a refusal-only stretch (the refusals mode).
    pub refusals: Option<Refusals>,
    /// The statements and commits per order, where the server counts statements.
    pub dbwork: Option<super::dbwork::DbWork>,
}

/// Where the CPU went during a mode: over its requests; over its intake (first call → last
/// accept); and, where a saga was followed, from the last accept to the last confirmation
/// (the saga's rest, beside the refusals) — the last two also per accepted order.
pub struct Cpu {
    pub requests: Option<Usage>,
    pub intake: Option<Usage>,
    pub saga: Option<Usage>,
}

impl Cpu {
    pub fn of(m: &Measurement, saga: Option<&Saga>, samples: &Samples) -> Self {
        let saga_end = match (m.first_accept, saga.and_then(|s| s.confirm)) {
            (Some(first), Some(confirm)) => Some(m.started + first + confirm),
            _ => None,
        };
        Self {
            requests: samples.window(m.started, m.started + m.elapsed),
            intake: m
                .last_accept
                .and_then(|last| samples.window(m.started, m.started + last)),
            saga: match (m.last_accept, saga_end) {
                (Some(last), Some(end)) => samples.window(m.started + last, end),
                _ => None,
            },
        }
    }
}

/// What the whole run shares.
pub struct Figures<'a> {
    pub rounds: usize,
    pub scenario: String,
    pub load: &'a Load,
    pub db_pool: u32,
    pub machine: String,
    pub services: &'a [ServicePid],
    pub order_urls: &'a [String],
    pub stock_buckets: Option<u32>,
    /// The commit, the machine, the servers' versions and settings (meta.rs).
    pub meta: Value,
    /// The bench's command line, as given.
    pub options: Vec<String>,
}

impl ModeReport {
    fn to_json(&self) -> Value {
        let mut v = self.m.to_json();
        v["round"] = json!(self.round);
        v["memory"] = self.memory.iter().map(Memory::to_json).collect();
        v["memory_over_limit"] = json!(self.memory.iter().any(Memory::over_limit));
        v["idle_wait_s"] = json!(self.idle.map(|w| w.waited.as_secs_f64()));
        v["idle_before"] = json!(self.idle.map(|w| w.idle));
        if let Some(s) = &self.saga {
            v["saga"] = s.to_json();
        }
        v["cpu"] = json!({
            "requests": self.cpu.requests.as_ref().map(|u| u.to_json(None)),
            "intake": self.cpu.intake.as_ref().map(|u| u.to_json(Some(self.m.accepted))),
            "after_intake_to_last_confirmation": self.cpu.saga.as_ref().map(|u| u.to_json(Some(self.m.accepted))),
        });
        v["batches"] = self.batches.iter().map(BatchFigures::to_json).collect();
        if let Some(w) = &self.dbwork {
            v["db_work"] = w.to_json();
        }
        v["checks"] = self.checks.iter().map(Check::to_json).collect();
        v["passed"] = json!(self.checks.iter().all(|c| c.pass));
        if let Some(r) = &self.refusals {
            v["refusals"] = r.to_json();
            if let Some(u) = &self.cpu.requests {
                let mut per = u.to_json(Some(r.refused));
                if let Some(ms) = per.get_mut("ms_per_accepted").map(Value::take) {
                    v["cpu"]["ms_per_refused"] = ms;
                }
                per["ms_per_accepted"].take();
            }
        }
        v
    }
}

pub fn json(f: &Figures<'_>, results: &[ModeReport]) -> Value {
    json!({
        "scenario": f.scenario,
        "requests": f.load.requests,
        "buyers": f.load.buyers,
        "stock": f.load.stock,
        "concurrency": f.load.concurrency,
        "db_pool": f.db_pool,
        "order_urls": f.order_urls,
        "stock_buckets": f.stock_buckets,
        "machine": f.machine,
        "services": f.services.iter().map(|s| json!({"service": s.name, "pid": s.pid})).collect::<Vec<_>>(),
        "memory_limit_mib": procstat::MEMORY_LIMIT_MIB,
        "rounds": f.rounds,
        "meta": f.meta,
        "options": f.options,
        "passed": results.iter().all(|r| r.checks.iter().all(|c| c.pass)),
        "modes": results.iter().map(ModeReport::to_json).collect::<Vec<_>>(),
        "ratios": median_ratios(&by_round(results)),
        "ratios_spread": spread_ratios(&by_round(results)),
        "ratios_by_round": by_round(results),
    })
}

pub fn print_text(f: &Figures<'_>, results: &[ModeReport]) {
    let l = f.load;
    println!(
        "scenario {}: {} requests from {} buyers for {} units at concurrency {} (bench db pool {})",
        f.scenario, l.requests, l.buyers, l.stock, l.concurrency, f.db_pool
    );
    println!("machine: {}", f.machine);
    if f.order_urls.len() > 1 || f.stock_buckets.is_some() {
        println!(
            "order replicas: {}; stock buckets: {}",
            f.order_urls.join(", "),
            f.stock_buckets
                .map_or_else(|| "service default".to_owned(), |b| b.to_string())
        );
    }
    println!("{}", Measurement::header());
    for r in results {
        if f.rounds > 1
            && results
                .iter()
                .find(|x| x.round == r.round)
                .is_some_and(|first| std::ptr::eq(first, r))
        {
            println!("round {} of {}:", r.round, f.rounds);
        }
        println!("{}", r.m.row());
        if !r.m.errors.is_empty() {
            println!("    errors: {} {:?}", r.m.errored(), r.m.errors);
        }
        if let Some(last) = r.m.last_accept {
            println!(
                "    intake: {} accepted in {:.2} s (mode start → last accept); accepted p50 {:.2} ms, p99 {:.2} ms",
                r.m.accepted,
                last.as_secs_f64(),
                r.m.accepted_p(0.5),
                r.m.accepted_p(0.99)
            );
        }
        if let Some(a) = &r.m.after_intake {
            println!(
                "    after the last accept: {} calls, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
                a.requests, a.p50_ms, a.p99_ms, a.max_ms
            );
        }
        if let Some(worst) =
            r.m.timeline
                .iter()
                .max_by(|a, b| a.p99_ms.total_cmp(&b.p99_ms))
        {
            println!(
                "    slowest 250 ms of the run: from {:.2} s, {} calls ({} accepted), p99 {:.2} ms",
                worst.from.as_secs_f64(),
                worst.requests,
                worst.accepted,
                worst.p99_ms
            );
        }
        if let Some(s) = &r.saga {
            println!("    {}", s.text());
        }
        if let Some(w) = r.idle {
            println!(
                "    waited {:.1} s for idle services before the mode{}",
                w.waited.as_secs_f64(),
                if w.idle { "" } else { " (still busy)" }
            );
        }
        println!(
            "    memory (peak VmRSS during the mode): {}",
            procstat::memory_line(&r.memory)
        );
        if let Some(u) = &r.cpu.requests {
            println!("    cpu over the requests: {}", u.cores_text());
        }
        // The no-op and the raw insert accept every call: their intake is the run, per call.
        let per = if r.m.name.starts_with("no-op") || r.m.name.starts_with("raw insert") {
            "call"
        } else {
            "accepted order"
        };
        if let Some(u) = &r.cpu.intake {
            println!(
                "    cpu per {per} over the intake ({:.2} s): {}",
                u.secs,
                u.per_accepted_text(r.m.accepted)
            );
        }
        if let Some(u) = &r.cpu.saga {
            println!(
                "    cpu per accepted order from the last accept to the last confirmation ({:.2} s): {}",
                u.secs,
                u.per_accepted_text(r.m.accepted)
            );
        }
        for b in &r.batches {
            println!("    batcher {}", b.text());
        }
        if let Some(w) = &r.dbwork {
            println!("    database work {}", w.text());
        }
        if let Some(refusals) = &r.refusals {
            println!("    {}", refusals.text());
            if let Some(u) = &r.cpu.requests {
                println!(
                    "    cpu per refused request: {}",
                    u.per_accepted_text(refusals.refused)
                );
            }
        }
        for c in &r.checks {
            println!(
                "    {} {}: {}",
                if c.pass { "PASS" } else { "FAIL" },
                c.name,
                c.detail
            );
        }
    }
    let rounds = by_round(results);
    for (name, value) in median_ratios(&rounds).as_object().into_iter().flatten() {
        if rounds.len() > 1 {
            let each: Vec<String> = rounds.iter().map(|r| r[name].to_string()).collect();
            let spread = &spread_ratios(&rounds)[name.as_str()];
            println!(
                "{name:<45} {value} (median of {} rounds: {}; spread {} to {})",
                rounds.len(),
                each.join(", "),
                spread["min"],
                spread["max"]
            );
        } else {
            println!("{name:<45} {value}");
        }
    }
}

/// Each round's ratios, in round order.
fn by_round(results: &[ModeReport]) -> Vec<Value> {
    let mut rounds: Vec<usize> = results.iter().map(|r| r.round).collect();
    rounds.dedup();
    rounds
        .into_iter()
        .map(|n| {
            let of_round: Vec<&ModeReport> = results.iter().filter(|r| r.round == n).collect();
            ratios(&of_round)
        })
        .collect()
}

/// Each ratio's median over the rounds that have it (the mean of the middle two for an even
/// count).
fn median_ratios(rounds: &[Value]) -> Value {
    let mut names: Vec<&String> = rounds
        .iter()
        .filter_map(Value::as_object)
        .flat_map(|m| m.keys())
        .collect();
    names.sort();
    names.dedup();
    let mut out = serde_json::Map::new();
    for name in names {
        let mut v: Vec<f64> = rounds.iter().filter_map(|r| r[name].as_f64()).collect();
        v.sort_by(f64::total_cmp);
        let median = match v.len() {
            0 => continue,
            n if n % 2 == 1 => v[n / 2],
            n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        };
        out.insert(name.clone(), json!(round(median)));
    }
    out.into()
}

/// Each ratio's lowest and highest value over the rounds that have it: how far one round
/// alone could have been from the median.
fn spread_ratios(rounds: &[Value]) -> Value {
    let mut out = serde_json::Map::new();
    for r in rounds.iter().filter_map(Value::as_object) {
        for (name, v) in r {
            let Some(v) = v.as_f64() else { continue };
            let e = out
                .entry(name.clone())
                .or_insert_with(|| json!({"min": v, "max": v, "rounds": 0}));
            let (lo, hi) = (
                e["min"].as_f64().unwrap_or(v),
                e["max"].as_f64().unwrap_or(v),
            );
            e["min"] = json!(round(lo.min(v)));
            e["max"] = json!(round(hi.max(v)));
            e["rounds"] = json!(e["rounds"].as_u64().unwrap_or(0) + 1);
        }
    }
    out.into()
}

fn find<'a>(results: &[&'a ModeReport], prefix: &str) -> Option<&'a ModeReport> {
    results
        .iter()
        .copied()
        .find(|r| r.m.name.starts_with(prefix))
}

/// platform / baseline, for throughput, accepted orders per second and p99 latency; and the
/// saga's confirmations per second against the raw insert ceiling.
fn ratios(results: &[&ModeReport]) -> Value {
    let mut out = serde_json::Map::new();
    let Some(pr) = find(results, "platform") else {
        return out.into();
    };
    let p = &pr.m;
    let bases = [
        "naive",
        "naive-fn",
        "bare naive",
        "no-op",
        "raw gate",
        "raw insert",
        "batched insert",
    ];
    for base in bases {
        // The naive baseline is the best point of a naive sweep, run at full size, when there
        // is one; else the plain naive run.
        let found = if base == "naive" {
            find(results, "naive best").or_else(|| find(results, "naive ("))
        } else {
            find(results, base)
        };
        let Some(b) = found.map(|r| &r.m) else {
            continue;
        };
        let key = base.replace(' ', "_").replace('-', "");
        out.insert(
            format!("platform/{key} throughput"),
            json!(round(p.throughput() / b.throughput().max(1e-9))),
        );
        out.insert(
            format!("platform/{key} p99"),
            json!(round(p.p(0.99) / b.p(0.99).max(1e-3))),
        );
        if base.contains("naive") {
            out.insert(
                format!("platform/{key} accepted per second"),
                json!(round(p.accepted_per_sec() / b.accepted_per_sec().max(1e-9))),
            );
            // To the same durable state: the naive order is in its database when answered,
            // the platform's once the saga confirmed it.
            if let Some(saga) = pr.saga.as_ref().filter(|s| s.confirmed > 0) {
                out.insert(
                    format!("platform confirmed/{key} accepted per second"),
                    json!(round(
                        saga.confirmed_per_sec() / b.accepted_per_sec().max(1e-9)
                    )),
                );
                let naive_pg = found
                    .and_then(|r| group_secs(r.cpu.requests.as_ref(), POSTGRES))
                    .filter(|_| b.accepted > 0)
                    .map(|secs| secs / b.accepted as f64);
                let platform_pg = group_secs(pr.cpu.intake.as_ref(), POSTGRES)
                    .zip(group_secs(pr.cpu.saga.as_ref(), POSTGRES))
                    .map(|(intake, rest)| (intake + rest) / saga.confirmed as f64);
                if let Some((pl, nv)) = platform_pg.zip(naive_pg).filter(|(_, nv)| *nv > 0.0) {
                    out.insert(
                        format!("platform/{key} postgresql cpu per durable order"),
                        json!(round(pl / nv)),
                    );
                }
            }
            out.insert(
                format!("platform/{key} accepted p99"),
                json!(round(p.accepted_p(0.99) / b.accepted_p(0.99).max(1e-3))),
            );
        }
        if (base == "raw insert" || base == "batched insert")
            && let Some(saga) = &pr.saga
        {
            out.insert(
                format!("platform saga confirmed/{base} throughput"),
                json!(round(saga.confirmed_per_sec() / b.throughput().max(1e-9))),
            );
        }
    }
    out.into()
}

/// The CPU group of the PostgreSQL server's processes.
const POSTGRES: &str = "postgresql";

/// A group's CPU seconds over a window, when both were read.
fn group_secs(usage: Option<&crate::cpustat::Usage>, group: &str) -> Option<f64> {
    usage?.groups.iter().find(|(n, _)| n == group)?.1
}

fn round(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{
        bench::measure::{Outcome, drive},
        cpustat::{MachineTicks, Snapshot},
    };

    #[tokio::test]
    async fn the_cpu_windows_follow_the_intake_and_the_saga() {
        // Two accepts, 20 ms apart at least, then refusals.
        let mut m = drive("platform", 6, 1, Duration::from_secs(10), |i| async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            if i < 2 {
                Outcome::Accepted
            } else {
                Outcome::Refused("SOLD_OUT".into())
            }
        })
        .await
        .unwrap();
        // Place the marks where the samples below are, as a longer run would have them.
        m.first_accept = Some(Duration::from_millis(100));
        m.last_accept = Some(Duration::from_secs(2));
        m.elapsed = Duration::from_secs(3);
        let at = |ms: u64| m.started + Duration::from_millis(ms);
        let snap = |ms: u64, ticks: u64| Snapshot {
            at: at(ms),
            groups: vec![ticks],
            known: vec![true],
            machine: Some(MachineTicks {
                busy: ticks * 2,
                idle: 0,
                steal: 0,
            }),
        };
        let samples = Samples {
            names: vec!["order".into()],
            snapshots: (0..=60).map(|k| snap(k * 100, k * k)).collect(),
        };
        let saga = Saga {
            followed: 2,
            confirmed: 2,
            cancelled: 0,
            unconfirmed: 0,
            confirm: Some(Duration::from_millis(4_900)),
            bound_hit: false,
        };
        let cpu = Cpu::of(&m, Some(&saga), &samples);
        let secs = |u: &Option<Usage>| u.as_ref().map(|u| (u.secs * 10.0).round() / 10.0);
        let order = |u: &Option<Usage>| u.as_ref().and_then(|u| u.groups[0].1);
        // ticks at sample k are k²: 0 → 20 (intake) is 400 ticks, 20 → 50 (saga) 2,100.
        assert_eq!(
            (secs(&cpu.requests), order(&cpu.requests)),
            (Some(3.0), Some(9.0))
        );
        assert_eq!(
            (secs(&cpu.intake), order(&cpu.intake)),
            (Some(2.0), Some(4.0))
        );
        assert_eq!((secs(&cpu.saga), order(&cpu.saga)), (Some(3.0), Some(21.0)));
        let report = ModeReport {
            round: 1,
            m,
            saga: Some(saga),
            memory: Vec::new(),
            idle: None,
            cpu,
            batches: Vec::new(),
            checks: Vec::new(),
            refusals: None,
            dbwork: None,
        };
        let j = report.to_json();
        assert_eq!(j["cpu"]["intake"]["ms_per_accepted"]["order"], 2000.0);
        assert_eq!(
            j["cpu"]["after_intake_to_last_confirmation"]["ms_per_accepted"]["machine"],
            21_000.0
        );
        // Without a followed saga (a baseline), there is no saga window.
        let none = Cpu::of(&report.m, None, &samples);
        assert!(none.saga.is_none() && none.intake.is_some());
    }

    /// A mode of `accepted` orders, the last accepted after `secs`, with PostgreSQL's CPU
    /// seconds in each window given.
    async fn mode(name: &str, accepted: usize, secs: u64, pg: [Option<f64>; 3]) -> ModeReport {
        let mut m = drive(name, accepted, 1, Duration::from_secs(10), |_| async {
            Outcome::Accepted
        })
        .await
        .unwrap();
        m.last_accept = Some(Duration::from_secs(secs));
        let usage = |s: Option<f64>| {
            s.map(|s| Usage {
                secs: 1.0,
                groups: vec![(POSTGRES.into(), Some(s))],
                machine: None,
            })
        };
        ModeReport {
            round: 1,
            m,
            saga: None,
            memory: Vec::new(),
            idle: None,
            cpu: Cpu {
                requests: usage(pg[0]),
                intake: usage(pg[1]),
                saga: usage(pg[2]),
            },
            batches: Vec::new(),
            checks: Vec::new(),
            refusals: None,
            dbwork: None,
        }
    }

    #[tokio::test]
    async fn the_platform_is_also_compared_with_naive_once_its_orders_are_confirmed() {
        // Naive: 100 accepted in 1 s, 0.04 s of PostgreSQL (0.4 ms each, durable when answered).
        let naive = mode(
            "naive best of sweep (naive-fn)",
            100,
            1,
            [Some(0.04), None, None],
        )
        .await;
        // Platform: 100 answered in 1 s; confirmed 4 s after the first accept; PostgreSQL
        // 0.01 s during the intake and 0.05 s after it: 0.6 ms per confirmed order.
        let mut platform = mode(
            "platform (CreateOrder)",
            100,
            1,
            [None, Some(0.01), Some(0.05)],
        )
        .await;
        platform.saga = Some(Saga {
            followed: 100,
            confirmed: 100,
            cancelled: 0,
            unconfirmed: 0,
            confirm: Some(Duration::from_secs(4)),
            bound_hit: false,
        });
        let r = ratios(&[&naive, &platform]);
        assert_eq!(r["platform/naive accepted per second"], 1.0);
        assert_eq!(r["platform confirmed/naive accepted per second"], 0.25);
        assert_eq!(r["platform/naive postgresql cpu per durable order"], 1.5);
        // Without a followed saga there is no durable comparison.
        platform.saga = None;
        let r = ratios(&[&naive, &platform]);
        assert!(
            r.get("platform confirmed/naive accepted per second")
                .is_none()
        );
        assert!(
            r.get("platform/naive postgresql cpu per durable order")
                .is_none()
        );
    }

    #[test]
    fn the_ratios_of_several_rounds_are_their_medians() {
        let rounds = vec![
            json!({"a": 1.0, "b": 10.0, "c": 3.0}),
            json!({"a": 3.0, "b": 30.0}),
            json!({"a": 2.0, "b": 20.0, "c": 4.0}),
        ];
        assert_eq!(
            median_ratios(&rounds),
            json!({"a": 2.0, "b": 20.0, "c": 3.5})
        );
        assert_eq!(median_ratios(&rounds[..1]), rounds[0]);
        assert_eq!(median_ratios(&[]), json!({}));
        assert_eq!(
            spread_ratios(&rounds),
            json!({
                "a": {"min": 1.0, "max": 3.0, "rounds": 3},
                "b": {"min": 10.0, "max": 30.0, "rounds": 3},
                "c": {"min": 3.0, "max": 4.0, "rounds": 2},
            })
        );
        assert_eq!(spread_ratios(&[]), json!({}));
    }
}
