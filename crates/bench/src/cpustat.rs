//! Where the CPU went during a bench mode (Linux `/proc`): the time each service, this process
//! (the load generator), and the servers (PostgreSQL, Redis, RabbitMQ) spent on the CPU, and
//! how the whole machine's time divided into busy, idle and stolen (by the hypervisor).
//!
//! A sampler reads it every [`SAMPLE_EVERY`]; a window between two instants of the mode (the
//! requests, or the intake up to the last accept) is then the difference of the readings at
//! its ends, each interpolated between the two samples around it. A process is known by its
//! pid and its start time, so a reused pid is a new process. A server is every process of its
//! command name (PostgreSQL's backends come and go): one that appears between two samples
//! counts whole, one that ends between two samples loses its last stretch. A group none of
//! whose processes could ever be read is unknown (`null`), never zero, and never an error.

use std::{
    collections::HashMap,
    sync::mpsc,
    time::{Duration, Instant},
};

use serde_json::{Map, Value, json};
use tokio::task::JoinHandle;

use crate::procstat::{ServicePid, TICKS_PER_SEC, parse_cpu_ticks};

/// How often the CPU times are read during a mode.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// Every this many scans of `/proc`, the names of processes outside every group are read
/// again (a pid may have been reused by a server's process).
const RENAME_EVERY: u64 = 10;
/// The servers the platform runs on, by the command name of their processes.
const SERVERS: [(&str, &str); 3] = [
    ("postgresql", "postgres"),
    ("redis", "redis-server"),
    ("rabbitmq", "beam.smp"),
];

/// Whose CPU time one figure is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub name: String,
    members: Members,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Members {
    /// One process (`None`: unknown, always zero).
    Pid(Option<u32>),
    /// Every process with this command name (`/proc/<pid>/comm`).
    Comm(String),
}

/// The machine's CPU time since boot, in ticks, summed over its cores.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MachineTicks {
    /// user, nice, system, irq and softirq.
    pub busy: u64,
    /// idle and iowait.
    pub idle: u64,
    /// Taken by the hypervisor for other guests.
    pub steal: u64,
}

/// Each group's CPU time (ticks, counted since the sampler started) and the machine's, at one
/// instant.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    pub at: Instant,
    pub groups: Vec<u64>,
    /// Whether some process of the group has been read by then.
    pub known: Vec<bool>,
    pub machine: Option<MachineTicks>,
}

/// The CPU use over one window of a mode.
#[derive(Clone, Debug, PartialEq)]
pub struct Usage {
    /// The window as sampled (the samples nearest to the asked ends).
    pub secs: f64,
    /// Each group's CPU time in the window, in seconds (`None`: none of its processes could
    /// be read).
    pub groups: Vec<(String, Option<f64>)>,
    pub machine: Option<Shares>,
}

/// How the machine's time divided over a window, as shares of all its cores' time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shares {
    pub busy: f64,
    pub idle: f64,
    pub steal: f64,
    /// The machine's busy time, in CPU seconds.
    pub busy_secs: f64,
}

/// The groups a bench reports: the services, this process, and the servers.
pub fn groups(services: &[ServicePid]) -> Vec<Group> {
    let mut groups: Vec<Group> = services
        .iter()
        .map(|s| Group {
            name: s.name.clone(),
            members: Members::Pid(s.pid),
        })
        .collect();
    groups.push(Group {
        name: "bench".into(),
        members: Members::Pid(Some(std::process::id())),
    });
    groups.extend(SERVERS.iter().map(|(name, comm)| Group::comm(name, comm)));
    groups
}

impl Group {
    pub fn comm(name: &str, comm: &str) -> Self {
        Self {
            name: name.to_owned(),
            members: Members::Comm(comm.to_owned()),
        }
    }
}

/// The first line of `/proc/stat` (`cpu  user nice system idle iowait irq softirq steal …`);
/// `None` when it is missing or garbled.
pub fn parse_machine(text: &str) -> Option<MachineTicks> {
    let line = text.lines().next()?;
    let mut fields = line.split_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    let v: Vec<u64> = fields
        .take(8)
        .map(|f| f.parse::<u64>().ok())
        .collect::<Option<_>>()?;
    let [user, nice, system, idle, iowait, irq, softirq, steal] = v.as_slice() else {
        return None;
    };
    Some(MachineTicks {
        busy: [user, nice, system, irq, softirq]
            .into_iter()
            .try_fold(0u64, |a, b| a.checked_add(*b))?,
        idle: idle.checked_add(*iowait)?,
        steal: *steal,
    })
}

fn read_machine() -> Option<MachineTicks> {
    parse_machine(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// A process's start time (in ticks since boot) and CPU time (`utime + stime`), from its
/// `/proc/<pid>/stat`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reading {
    pub start: u64,
    pub ticks: u64,
}

/// `starttime` (field 22) and `utime + stime` of a `/proc/<pid>/stat` text.
pub fn parse_stat(text: &str) -> Option<Reading> {
    let ticks = parse_cpu_ticks(text)?;
    let (_, after) = text.rsplit_once(')')?;
    // After the name: state (field 3) … starttime (22).
    let start = after.split_whitespace().nth(19)?.parse::<u64>().ok()?;
    Some(Reading { start, ticks })
}

fn read_proc(pid: u32) -> Option<Reading> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// One process of one group, as read in one sample.
#[derive(Clone, Copy, Debug)]
struct Seen {
    pid: u32,
    group: usize,
    reading: Reading,
}

/// Follows the groups' processes from one sample to the next.
struct Tracker {
    groups: Vec<Group>,
    /// Each followed process of each group (a pid may be in two groups): its reading at the
    /// last sample.
    last: HashMap<(u32, usize), Reading>,
    /// Command-name groups: the group (and start time) of each process seen in `/proc`, or
    /// `None` for a process in no group.
    comm_of: HashMap<u32, Option<(usize, u64)>>,
    totals: Vec<u64>,
    known: Vec<bool>,
    scans: u64,
    started: bool,
}

impl Tracker {
    fn new(groups: Vec<Group>) -> Self {
        let n = groups.len();
        Self {
            groups,
            last: HashMap::new(),
            comm_of: HashMap::new(),
            totals: vec![0; n],
            known: vec![false; n],
            scans: 0,
            started: false,
        }
    }

    fn sample(&mut self) -> Snapshot {
        let mut seen: Vec<Seen> = Vec::new();
        for (group, g) in self.groups.iter().enumerate() {
            if let Members::Pid(Some(pid)) = g.members
                && let Some(reading) = read_proc(pid)
            {
                seen.push(Seen {
                    pid,
                    group,
                    reading,
                });
            }
        }
        if self
            .groups
            .iter()
            .any(|g| matches!(g.members, Members::Comm(_)))
        {
            self.scan_comm(&mut seen);
        }
        for s in &seen {
            let before = match self.last.get(&(s.pid, s.group)) {
                Some(r) if r.start == s.reading.start => r.ticks,
                // Appeared since the last sample (or its pid was reused): all its time falls
                // after it, unless this is the first sample, which only sets where counting
                // starts.
                _ if self.started => 0,
                _ => s.reading.ticks,
            };
            self.totals[s.group] =
                self.totals[s.group].saturating_add(s.reading.ticks.saturating_sub(before));
            self.known[s.group] = true;
        }
        self.last = seen
            .into_iter()
            .map(|s| ((s.pid, s.group), s.reading))
            .collect();
        self.started = true;
        Snapshot {
            at: Instant::now(),
            groups: self.totals.clone(),
            known: self.known.clone(),
            machine: read_machine(),
        }
    }

    /// The command-name group of the process `pid`, from its name.
    fn group_named(&self, pid: u32) -> Option<usize> {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        let comm = comm.trim_end();
        self.groups
            .iter()
            .position(|g| matches!(&g.members, Members::Comm(c) if c == comm))
    }

    /// Adds the processes of the command-name groups. A process's name is read once, again
    /// when its start time changes (a reused pid), and for processes in no group every
    /// [`RENAME_EVERY`] scans.
    fn scan_comm(&mut self, seen: &mut Vec<Seen>) {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return;
        };
        if self.scans.is_multiple_of(RENAME_EVERY) {
            self.comm_of.retain(|_, c| c.is_some());
        }
        self.scans += 1;
        let mut alive = HashMap::with_capacity(self.comm_of.len());
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let found = match self.comm_of.get(&pid).copied() {
                Some(None) => None,
                Some(Some((group, start))) => match read_proc(pid) {
                    Some(reading) if reading.start == start => Some((group, reading)),
                    Some(_) => self.group_named(pid).zip(read_proc(pid)),
                    None => None,
                },
                None => self
                    .group_named(pid)
                    .and_then(|g| Some((g, read_proc(pid)?))),
            };
            alive.insert(pid, found.map(|(g, r)| (g, r.start)));
            if let Some((group, reading)) = found {
                seen.push(Seen {
                    pid,
                    group,
                    reading,
                });
            }
        }
        // Ended processes are forgotten.
        self.comm_of = alive;
    }
}

/// Reads the groups' CPU times every [`SAMPLE_EVERY`] until finished.
pub struct Sampler {
    stop: mpsc::Sender<()>,
    task: JoinHandle<Vec<Snapshot>>,
    names: Vec<String>,
}

impl Sampler {
    pub fn start(groups: Vec<Group>) -> Self {
        let names = groups.iter().map(|g| g.name.clone()).collect();
        let (stop, stopped) = mpsc::channel::<()>();
        // Reading /proc blocks: a thread of its own, woken by the stop at once.
        let task = tokio::task::spawn_blocking(move || {
            let mut tracker = Tracker::new(groups);
            let mut snapshots = vec![tracker.sample()];
            let mut next = Instant::now() + SAMPLE_EVERY;
            loop {
                let stop = stopped.recv_timeout(next.saturating_duration_since(Instant::now()));
                snapshots.push(tracker.sample());
                if !matches!(stop, Err(mpsc::RecvTimeoutError::Timeout)) {
                    return snapshots;
                }
                next += SAMPLE_EVERY;
            }
        });
        Self { stop, task, names }
    }

    /// Stops sampling, with a last sample taken now.
    pub async fn finish(self) -> Samples {
        let _ = self.stop.send(());
        Samples {
            names: self.names,
            snapshots: self.task.await.unwrap_or_default(),
        }
    }
}

/// What a sampler read over a mode.
#[derive(Clone, Debug)]
pub struct Samples {
    pub names: Vec<String>,
    pub snapshots: Vec<Snapshot>,
}

/// The cumulative figures at one instant, interpolated between samples.
struct Point {
    at: Instant,
    groups: Vec<f64>,
    known: Vec<bool>,
    machine: Option<[f64; 3]>,
}

fn machine_array(m: Option<MachineTicks>) -> Option<[f64; 3]> {
    m.map(|m| [m.busy as f64, m.idle as f64, m.steal as f64])
}

impl Samples {
    /// The use between `from` and `to`, each end interpolated between the samples around it
    /// (an end outside the samples is moved to the nearest one); `None` when what is left is
    /// shorter than half a sample interval.
    pub fn window(&self, from: Instant, to: Instant) -> Option<Usage> {
        let (a, b) = (self.point(from)?, self.point(to)?);
        let secs = b.at.checked_duration_since(a.at)?.as_secs_f64();
        if secs < SAMPLE_EVERY.as_secs_f64() / 2.0 {
            return None;
        }
        let groups = self
            .names
            .iter()
            .enumerate()
            .map(|(g, n)| {
                let known = b.known.get(g).copied().unwrap_or(false);
                let used = match (a.groups.get(g), b.groups.get(g)) {
                    (Some(x), Some(y)) if known => Some((y - x).max(0.0) / TICKS_PER_SEC),
                    _ => None,
                };
                (n.clone(), used)
            })
            .collect();
        let machine = match (a.machine, b.machine) {
            (Some(x), Some(y)) => shares(x, y),
            _ => None,
        };
        Some(Usage {
            secs,
            groups,
            machine,
        })
    }

    fn point(&self, t: Instant) -> Option<Point> {
        let first = self.snapshots.first()?;
        let last = self.snapshots.last()?;
        let exact = |s: &Snapshot| Point {
            at: s.at,
            groups: s.groups.iter().map(|&v| v as f64).collect(),
            known: s.known.clone(),
            machine: machine_array(s.machine),
        };
        if t <= first.at {
            return Some(exact(first));
        }
        if t >= last.at {
            return Some(exact(last));
        }
        let i = self.snapshots.partition_point(|s| s.at <= t);
        let (a, b) = (&self.snapshots[i - 1], self.snapshots.get(i)?);
        let span = b.at.saturating_duration_since(a.at).as_secs_f64();
        let f = if span > 0.0 {
            t.saturating_duration_since(a.at).as_secs_f64() / span
        } else {
            0.0
        };
        let lerp = |x: f64, y: f64| x + (y - x) * f;
        Some(Point {
            at: t,
            groups: a
                .groups
                .iter()
                .zip(&b.groups)
                .map(|(&x, &y)| lerp(x as f64, y as f64))
                .collect(),
            // Known from the sample before: a group first read after it counts from there.
            known: a.known.clone(),
            machine: match (machine_array(a.machine), machine_array(b.machine)) {
                (Some(x), Some(y)) => Some([lerp(x[0], y[0]), lerp(x[1], y[1]), lerp(x[2], y[2])]),
                _ => None,
            },
        })
    }
}

fn shares(a: [f64; 3], b: [f64; 3]) -> Option<Shares> {
    let [busy, idle, steal] = [b[0] - a[0], b[1] - a[1], b[2] - a[2]].map(|v| v.max(0.0));
    let all = busy + idle + steal;
    (all > 0.0).then(|| Shares {
        busy: busy / all,
        idle: idle / all,
        steal: steal / all,
        busy_secs: busy / TICKS_PER_SEC,
    })
}

fn round(v: f64, places: i32) -> f64 {
    let f = 10f64.powi(places);
    (v * f).round() / f
}

impl Usage {
    /// `{"window_s", "machine": {busy, idle, steal shares}, "cores": {group: cores used}}`,
    /// and `"ms_per_accepted"` (each group's and the machine's CPU milliseconds per accepted
    /// call) when `accepted` is given and not zero. An unknown group is `null`.
    pub fn to_json(&self, accepted: Option<usize>) -> Value {
        let cores: Map<String, Value> = self
            .groups
            .iter()
            .map(|(n, s)| (n.clone(), json!(s.map(|s| round(s / self.secs, 3)))))
            .collect();
        let mut v = json!({
            "window_s": round(self.secs, 2),
            "machine": self.machine.map(|m| json!({
                "busy_share": round(m.busy, 3),
                "idle_share": round(m.idle, 3),
                "steal_share": round(m.steal, 3),
            })),
            "cores": cores,
        });
        if let Some(n) = accepted.filter(|n| *n > 0) {
            let per = |secs: f64| round(secs * 1000.0 / n as f64, 4);
            let mut ms: Map<String, Value> = self
                .groups
                .iter()
                .map(|(g, s)| (g.clone(), json!(s.map(per))))
                .collect();
            ms.insert(
                "machine".into(),
                json!(self.machine.map(|m| per(m.busy_secs))),
            );
            v["ms_per_accepted"] = Value::Object(ms);
        }
        v
    }

    /// `machine 96% busy, 1% idle, 3% stolen; cores used: order 0.62, …` (largest first,
    /// unknown groups left out).
    pub fn cores_text(&self) -> String {
        let machine = self.machine.map_or("machine ?".to_owned(), |m| {
            format!(
                "machine {:.0}% busy, {:.0}% idle, {:.0}% stolen",
                m.busy * 100.0,
                m.idle * 100.0,
                m.steal * 100.0
            )
        });
        let groups = self
            .largest_first()
            .map(|(n, s)| format!("{n} {:.2}", s / self.secs))
            .collect::<Vec<_>>()
            .join(", ");
        format!("{machine}; cores used: {groups}")
    }

    /// `0.61 ms on the machine = postgresql 0.20 + order 0.15 + … (+ 0.06 elsewhere)`.
    pub fn per_accepted_text(&self, accepted: usize) -> String {
        if accepted == 0 {
            return "none accepted".into();
        }
        let per = |s: f64| s * 1000.0 / accepted as f64;
        let parts = self
            .largest_first()
            .map(|(n, s)| format!("{n} {:.3}", per(s)))
            .collect::<Vec<_>>()
            .join(" + ");
        match self.machine {
            Some(m) => {
                let named: f64 = self.groups.iter().filter_map(|(_, s)| *s).sum();
                format!(
                    "{:.3} ms on the machine = {parts} (+ {:.3} elsewhere)",
                    per(m.busy_secs),
                    per((m.busy_secs - named).max(0.0))
                )
            }
            None => format!("{parts} ms"),
        }
    }

    /// The known groups that used any CPU, largest first (the text leaves out the idle ones;
    /// the JSON has them all).
    fn largest_first(&self) -> impl Iterator<Item = (&str, f64)> {
        let mut v: Vec<(&str, f64)> = self
            .groups
            .iter()
            .filter_map(|(n, s)| Some((n.as_str(), (*s)?)))
            .filter(|(_, s)| *s > 0.0)
            .collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1));
        v.into_iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROC_STAT: &str = "cpu  1000 20 300 5000 40 5 6 70 0 0\n\
        cpu0 500 10 150 2500 20 2 3 35 0 0\nintr 1 2 3\n";

    #[test]
    fn the_machine_line_splits_into_busy_idle_and_stolen() {
        assert_eq!(
            parse_machine(PROC_STAT),
            Some(MachineTicks {
                busy: 1000 + 20 + 300 + 5 + 6,
                idle: 5000 + 40,
                steal: 70
            })
        );
    }

    #[test]
    fn a_garbled_machine_line_is_unknown_not_a_panic() {
        for text in [
            "",
            "cpu0 1 2 3 4 5 6 7 8",
            "cpu 1 2 3 4 5 6 7",
            "cpu 1 2 3 x 5 6 7 8",
            "cpu 18446744073709551615 1 0 0 0 0 0 0",
            "intr 1 2\ncpu 1 2 3 4 5 6 7 8",
        ] {
            assert_eq!(parse_machine(text), None, "{text:?}");
        }
    }

    fn snap(at: Instant, groups: &[u64], machine: (u64, u64, u64)) -> Snapshot {
        Snapshot {
            at,
            groups: groups.to_vec(),
            known: vec![true; groups.len()],
            machine: Some(MachineTicks {
                busy: machine.0,
                idle: machine.1,
                steal: machine.2,
            }),
        }
    }

    fn samples(t0: Instant) -> Samples {
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        Samples {
            names: vec!["order".into(), "postgresql".into()],
            snapshots: vec![
                snap(at(0), &[0, 0], (0, 0, 0)),
                snap(at(100), &[5, 9], (14, 5, 1)),
                snap(at(1100), &[105, 69], (194, 5, 1)),
                snap(at(2100), &[106, 70], (196, 198, 6)),
            ],
        }
    }

    #[test]
    fn a_window_is_the_difference_of_its_ends() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let samples = samples(t0);
        let u = samples.window(at(100), at(1100)).expect("a window");
        assert!((u.secs - 1.0).abs() < 1e-9, "{}", u.secs);
        assert_eq!(
            u.groups,
            vec![
                ("order".to_owned(), Some(1.0)),
                ("postgresql".to_owned(), Some(0.6))
            ]
        );
        let m = u.machine.expect("machine shares");
        assert!((m.busy - 1.0).abs() < 1e-9 && m.idle == 0.0 && m.steal == 0.0);
        assert!((m.busy_secs - 1.8).abs() < 1e-9);
        let j = u.to_json(Some(200));
        assert_eq!(j["cores"]["order"], json!(1.0));
        assert_eq!(j["ms_per_accepted"]["postgresql"], json!(3.0));
        assert_eq!(j["ms_per_accepted"]["machine"], json!(9.0));
        assert_eq!(
            u.per_accepted_text(200),
            "9.000 ms on the machine = order 5.000 + postgresql 3.000 (+ 1.000 elsewhere)"
        );
        assert!(u.to_json(Some(0)).get("ms_per_accepted").is_none());
        // The last stretch: mostly idle, some stolen.
        let tail = samples.window(at(1100), at(2100)).expect("a window");
        let m = tail.machine.expect("machine shares");
        assert!((m.idle - 193.0 / 200.0).abs() < 1e-9 && (m.steal - 5.0 / 200.0).abs() < 1e-9);
    }

    #[test]
    fn a_window_s_ends_are_interpolated_between_samples_and_kept_within_them() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let samples = samples(t0);
        // Halfway from 100 ms to 1100 ms: order at 55 ticks, postgresql at 39.
        let u = samples.window(at(600), at(1100)).expect("a window");
        assert!((u.secs - 0.5).abs() < 1e-6, "{}", u.secs);
        let order = u.groups[0].1.expect("known");
        let pg = u.groups[1].1.expect("known");
        assert!(
            (order - 0.5).abs() < 1e-6 && (pg - 0.3).abs() < 1e-6,
            "{u:?}"
        );
        // Past the last sample: the last sample.
        let late = samples
            .window(at(1100), at(9000))
            .expect("a window up to the last sample");
        assert!((late.secs - 1.0).abs() < 1e-6, "{}", late.secs);
        assert!((late.groups[0].1.expect("known") - 0.01).abs() < 1e-9);
    }

    #[test]
    fn no_window_without_two_samples_apart() {
        let t0 = Instant::now();
        let one = Samples {
            names: vec!["order".into()],
            snapshots: vec![snap(t0, &[3], (1, 1, 0))],
        };
        assert_eq!(one.window(t0, t0 + Duration::from_secs(5)), None);
        let none = Samples {
            names: vec![],
            snapshots: vec![],
        };
        assert_eq!(none.window(t0, t0 + Duration::from_secs(1)), None);
        let short = samples(t0);
        assert_eq!(
            short.window(
                t0 + Duration::from_millis(100),
                t0 + Duration::from_millis(120)
            ),
            None
        );
    }

    #[test]
    fn a_group_never_read_is_unknown_not_zero() {
        let t0 = Instant::now();
        let mut s = samples(t0);
        for snap in &mut s.snapshots {
            snap.known[1] = false;
        }
        let u = s
            .window(t0, t0 + Duration::from_millis(2100))
            .expect("a window");
        assert_eq!(u.groups[1], ("postgresql".to_owned(), None));
        let j = u.to_json(Some(10));
        assert!(j["cores"]["postgresql"].is_null() && j["ms_per_accepted"]["postgresql"].is_null());
        assert!(j["cores"]["order"].is_number());
        assert!(!u.cores_text().contains("postgresql"), "{}", u.cores_text());
        assert!(u.cores_text().contains("order 0.50"), "{}", u.cores_text());
        // A group that used nothing is left out of the text too.
        let mut idle = s.clone();
        for snap in &mut idle.snapshots {
            snap.groups[0] = 0;
        }
        let u = idle
            .window(t0, t0 + Duration::from_millis(2100))
            .expect("a window");
        assert!(!u.cores_text().contains("order"), "{}", u.cores_text());
        assert_eq!(u.to_json(None)["cores"]["order"], json!(0.0));
    }

    #[test]
    fn the_start_time_is_read_after_a_name_with_spaces_and_parens() {
        let stat = "4242 (flashsale (x) y) S 1 4242 4242 0 -1 4194304 101 0 0 0 \
            250 17 0 0 20 0 5 0 22562 3133440 409";
        assert_eq!(
            parse_stat(stat),
            Some(Reading {
                start: 22562,
                ticks: 267
            })
        );
        assert_eq!(
            parse_stat("12 (x) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16"),
            None
        );
    }

    /// Spins until this process has used `ticks` more CPU ticks, for at most 10 s of wall
    /// time (a loaded machine gives it less than a core).
    fn burn(ticks: u64) {
        let me = std::process::id();
        let from = read_proc(me).expect("this process").ticks;
        let until = Instant::now() + Duration::from_secs(10);
        let mut x = 0u64;
        while read_proc(me).expect("this process").ticks < from + ticks {
            assert!(
                Instant::now() < until,
                "could not burn {ticks} ticks in 10 s"
            );
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
        }
    }

    #[test]
    fn this_process_and_the_machine_are_read_from_proc() {
        let mut t = Tracker::new(groups(&[ServicePid {
            name: "gone".into(),
            pid: None,
        }]));
        let a = t.sample();
        burn(30);
        let b = t.sample();
        let names: Vec<&str> = t.groups.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(names, ["gone", "bench", "postgresql", "redis", "rabbitmq"]);
        // `gone` has no pid: never read, unknown.
        assert_eq!((b.groups[0], b.known[0]), (0, false));
        assert!(b.known[1]);
        assert!(b.groups[1] - a.groups[1] >= 30, "{a:?} {b:?}");
        let (ma, mb) = (a.machine.expect("machine"), b.machine.expect("machine"));
        assert!(mb.busy - ma.busy >= 20, "{ma:?} {mb:?}");
    }

    #[test]
    fn a_process_in_two_groups_is_counted_once_in_each() {
        let me = Some(std::process::id());
        let mut t = Tracker::new(groups(&[
            ServicePid {
                name: "one".into(),
                pid: me,
            },
            ServicePid {
                name: "two".into(),
                pid: me,
            },
        ]));
        // A lifetime of CPU already used, which a miscount would add again at every sample.
        burn(50);
        t.sample();
        burn(20);
        t.sample();
        burn(20);
        let end = t.sample();
        for g in 0..3 {
            let counted = end.groups[g];
            assert!(
                (40..=70).contains(&counted),
                "group {g}: {counted} ticks, {end:?}"
            );
        }
    }

    #[test]
    fn a_command_name_group_counts_a_process_that_started_between_samples() {
        // A shell under a name of its own (its command name is the name it was started by).
        let dir = std::env::temp_dir().join(format!("fs-cpustat-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let name = format!("fsburn{}", std::process::id() % 100_000);
        let link = dir.join(&name);
        std::os::unix::fs::symlink("/bin/sh", &link).expect("symlink");
        let mut t = Tracker::new(vec![
            Group::comm("burner", &name),
            Group::comm("none", "no-such-command"),
        ]);
        let before = t.sample();
        assert_eq!(before.groups, vec![0, 0]);
        assert_eq!(before.known, vec![false, false]);
        // Busy for some seconds at most (a bounded count), killed once counted.
        let mut child = std::process::Command::new(&link)
            .args(["-c", "i=0; while [ $i -lt 3000000 ]; do i=$((i+1)); done"])
            .spawn()
            .expect("spawn the burner");
        let until = Instant::now() + Duration::from_secs(10);
        let mut during = t.sample();
        while during.groups[0] == 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(100));
            during = t.sample();
        }
        let _ = child.kill();
        let _ = child.wait();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(during.groups[0] > 0 && during.known[0], "{during:?}");
        assert_eq!((during.groups[1], during.known[1]), (0, false));
    }
}
