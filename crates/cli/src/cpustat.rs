//! Where the CPU went during a bench mode (Linux `/proc`): the time each service, this process
//! (the load generator), and the servers (PostgreSQL, Redis, RabbitMQ) spent on the CPU, and
//! how the whole machine's time divided into busy, idle and stolen (by the hypervisor).
//!
//! A sampler reads it every [`SAMPLE_EVERY`]; a window between two instants of the mode (the
//! requests, or the intake up to the last accept) is then the difference of the samples
//! nearest to its ends. A server is every process of its command name (PostgreSQL's backends
//! come and go): one that appears between two samples counts whole, one that ends between two
//! samples loses its last stretch. What cannot be read is unknown, never an error.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use serde_json::{Map, Value, json};
use tokio::{sync::oneshot, task::JoinHandle};

use crate::procstat::{ServicePid, parse_cpu_ticks};

/// How often the CPU times are read during a mode.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// Units of `/proc/stat` and `/proc/<pid>/stat`: USER_HZ, fixed at 100 in Linux's ABI.
const TICKS_PER_SEC: f64 = 100.0;
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
    pub machine: Option<MachineTicks>,
}

/// The CPU use over one window of a mode.
#[derive(Clone, Debug, PartialEq)]
pub struct Usage {
    /// The window as sampled (the samples nearest to the asked ends).
    pub secs: f64,
    /// Each group's CPU time in the window, in seconds.
    pub groups: Vec<(String, f64)>,
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

fn read_ticks(pid: u32) -> Option<u64> {
    parse_cpu_ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Follows the groups' processes from one sample to the next.
struct Tracker {
    groups: Vec<Group>,
    /// Each followed process: its group and its ticks at the last sample.
    last: HashMap<u32, (usize, u64)>,
    /// Command-name groups: which group each process seen in `/proc` belongs to, if any.
    comm_of: HashMap<u32, Option<usize>>,
    totals: Vec<u64>,
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
            started: false,
        }
    }

    fn sample(&mut self) -> Snapshot {
        let mut seen: Vec<(u32, usize, u64)> = Vec::new();
        for (g, group) in self.groups.iter().enumerate() {
            if let Members::Pid(Some(pid)) = group.members
                && let Some(t) = read_ticks(pid)
            {
                seen.push((pid, g, t));
            }
        }
        if self
            .groups
            .iter()
            .any(|g| matches!(g.members, Members::Comm(_)))
        {
            self.scan_comm(&mut seen);
        }
        for &(pid, g, ticks) in &seen {
            let before = match self.last.get(&pid) {
                Some(&(was, t)) if was == g => t,
                // Appeared since the last sample: all its time falls after it, unless this is
                // the first sample, which only sets where counting starts.
                _ if self.started => 0,
                _ => ticks,
            };
            self.totals[g] = self.totals[g].saturating_add(ticks.saturating_sub(before));
        }
        self.last = seen.into_iter().map(|(p, g, t)| (p, (g, t))).collect();
        self.started = true;
        Snapshot {
            at: Instant::now(),
            groups: self.totals.clone(),
            machine: read_machine(),
        }
    }

    /// Adds the processes of the command-name groups; a process's name is read once.
    fn scan_comm(&mut self, seen: &mut Vec<(u32, usize, u64)>) {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return;
        };
        let mut alive = HashMap::with_capacity(self.comm_of.len());
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let group = match self.comm_of.get(&pid) {
                Some(g) => *g,
                None => std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .ok()
                    .and_then(|comm| {
                        let comm = comm.trim_end();
                        self.groups
                            .iter()
                            .position(|g| matches!(&g.members, Members::Comm(c) if c == comm))
                    }),
            };
            alive.insert(pid, group);
            if let Some(g) = group
                && let Some(t) = read_ticks(pid)
            {
                seen.push((pid, g, t));
            }
        }
        // Forget the ended processes, so a reused pid has its name read again.
        self.comm_of = alive;
    }
}

/// Reads the groups' CPU times every [`SAMPLE_EVERY`] until finished.
pub struct Sampler {
    stop: oneshot::Sender<()>,
    task: JoinHandle<(Tracker, Vec<Snapshot>)>,
    names: Vec<String>,
}

impl Sampler {
    pub fn start(groups: Vec<Group>) -> Self {
        let names = groups.iter().map(|g| g.name.clone()).collect();
        let (stop, mut stopped) = oneshot::channel();
        let task = tokio::task::spawn_blocking(move || {
            let mut tracker = Tracker::new(groups);
            let mut snapshots = vec![tracker.sample()];
            let mut next = Instant::now() + SAMPLE_EVERY;
            loop {
                match stopped.try_recv() {
                    Err(oneshot::error::TryRecvError::Empty) => {}
                    _ => return (tracker, snapshots),
                }
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
                next += SAMPLE_EVERY;
                snapshots.push(tracker.sample());
            }
        });
        Self { stop, task, names }
    }

    /// Stops sampling, with a last sample taken now.
    pub async fn finish(self) -> Samples {
        let _ = self.stop.send(());
        let snapshots = match self.task.await {
            Ok((mut tracker, mut snapshots)) => {
                snapshots.push(tracker.sample());
                snapshots
            }
            Err(_) => Vec::new(),
        };
        Samples {
            names: self.names,
            snapshots,
        }
    }
}

/// What a sampler read over a mode.
#[derive(Clone, Debug)]
pub struct Samples {
    pub names: Vec<String>,
    pub snapshots: Vec<Snapshot>,
}

impl Samples {
    /// The use between `from` and `to`, from the samples nearest to each; `None` when the
    /// samples do not make a window of at least one sample interval.
    pub fn window(&self, from: Instant, to: Instant) -> Option<Usage> {
        let nearest = |t: Instant| {
            self.snapshots
                .iter()
                .min_by_key(|s| if s.at >= t { s.at - t } else { t - s.at })
        };
        let (a, b) = (nearest(from)?, nearest(to)?);
        let secs = b.at.checked_duration_since(a.at)?.as_secs_f64();
        if secs < SAMPLE_EVERY.as_secs_f64() / 2.0 {
            return None;
        }
        let groups = self
            .names
            .iter()
            .zip(a.groups.iter().zip(&b.groups))
            .map(|(n, (x, y))| (n.clone(), y.saturating_sub(*x) as f64 / TICKS_PER_SEC))
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
}

fn shares(a: MachineTicks, b: MachineTicks) -> Option<Shares> {
    let busy = b.busy.checked_sub(a.busy)? as f64;
    let idle = b.idle.checked_sub(a.idle)? as f64;
    let steal = b.steal.checked_sub(a.steal)? as f64;
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
    /// order) when `accepted` is given and not zero.
    pub fn to_json(&self, accepted: Option<usize>) -> Value {
        let cores: Map<String, Value> = self
            .groups
            .iter()
            .map(|(n, s)| (n.clone(), json!(round(s / self.secs, 3))))
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
                .map(|(g, s)| (g.clone(), json!(per(*s))))
                .collect();
            ms.insert(
                "machine".into(),
                json!(self.machine.map(|m| per(m.busy_secs))),
            );
            v["ms_per_accepted"] = Value::Object(ms);
        }
        v
    }

    /// `machine 96% busy, 1% idle, 3% stolen; order 0.62 cores, …` (largest first).
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
            .map(|(n, s)| format!("{n} {:.2}", *s / self.secs))
            .collect::<Vec<_>>()
            .join(", ");
        format!("{machine}; cores used: {groups}")
    }

    /// `0.61 ms on the machine = postgresql 0.20 + order 0.15 + … (+ 0.06 elsewhere)`.
    pub fn per_accepted_text(&self, accepted: usize) -> String {
        if accepted == 0 {
            return "no accepted order".into();
        }
        let per = |s: f64| s * 1000.0 / accepted as f64;
        let parts = self
            .largest_first()
            .map(|(n, s)| format!("{n} {:.3}", per(*s)))
            .collect::<Vec<_>>()
            .join(" + ");
        match self.machine {
            Some(m) => {
                let named: f64 = self.groups.iter().map(|(_, s)| s).sum();
                format!(
                    "{:.3} ms on the machine = {parts} (+ {:.3} elsewhere)",
                    per(m.busy_secs),
                    per((m.busy_secs - named).max(0.0))
                )
            }
            None => format!("{parts} ms"),
        }
    }

    fn largest_first(&self) -> impl Iterator<Item = &(String, f64)> {
        let mut v: Vec<&(String, f64)> = self.groups.iter().collect();
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
            machine: Some(MachineTicks {
                busy: machine.0,
                idle: machine.1,
                steal: machine.2,
            }),
        }
    }

    #[test]
    fn a_window_takes_the_samples_nearest_to_its_ends() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let samples = Samples {
            names: vec!["order".into(), "postgresql".into()],
            snapshots: vec![
                snap(at(0), &[0, 0], (0, 0, 0)),
                snap(at(100), &[5, 9], (14, 5, 1)),
                snap(at(1100), &[105, 69], (194, 5, 1)),
                snap(at(2100), &[106, 70], (196, 198, 6)),
            ],
        };
        let u = samples.window(at(120), at(1080)).expect("a window");
        assert!((u.secs - 1.0).abs() < 1e-9, "{}", u.secs);
        assert_eq!(
            u.groups,
            vec![("order".to_owned(), 1.0), ("postgresql".to_owned(), 0.6)]
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
    }

    fn spin(for_: Duration) -> u64 {
        let until = Instant::now() + for_;
        let mut x = 0u64;
        while Instant::now() < until {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        x
    }

    #[test]
    fn this_process_and_the_machine_are_read_from_proc() {
        let mut t = Tracker::new(groups(&[ServicePid {
            name: "gone".into(),
            pid: None,
        }]));
        let a = t.sample();
        spin(Duration::from_millis(400));
        let b = t.sample();
        let names: Vec<&str> = t.groups.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(names, ["gone", "bench", "postgresql", "redis", "rabbitmq"]);
        // `gone` has no pid: nothing. This process spun for 0.4 s: at least ~0.2 s counted
        // even on a machine busy with other work.
        assert_eq!(b.groups[0], 0);
        assert!(b.groups[1] - a.groups[1] >= 20, "{a:?} {b:?}");
        let (ma, mb) = (a.machine.expect("machine"), b.machine.expect("machine"));
        assert!(mb.busy - ma.busy >= 20, "{ma:?} {mb:?}");
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
        // Busy for a few seconds at most (a bounded count), killed once sampled.
        let mut child = std::process::Command::new(&link)
            .args(["-c", "i=0; while [ $i -lt 3000000 ]; do i=$((i+1)); done"])
            .spawn()
            .expect("spawn the burner");
        std::thread::sleep(Duration::from_millis(300));
        let during = t.sample();
        let _ = child.kill();
        let _ = child.wait();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(during.groups[0] > 0, "{during:?}");
        assert_eq!(during.groups[1], 0);
    }
}
