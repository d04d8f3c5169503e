//! The services' processes as the operating system sees them (Linux `/proc`): resident memory
//! (`VmRSS`, and `VmHWM`, the peak over the process's lifetime), sampled while a load runs to
//! get the peak during that load, and CPU time, to wait until the services are idle. A pid
//! that is missing or unreadable is reported as unknown, never an error.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use serde_json::{Value, json};
use tokio::{sync::oneshot, task::JoinHandle, time::Instant};

/// Resident memory above this is flagged in the reports (the per-service memory budget).
pub const MEMORY_LIMIT_MIB: f64 = 128.0;
/// How often resident memory is sampled during a load.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// The window over which CPU use is measured when waiting for idle services.
const IDLE_WINDOW: Duration = Duration::from_secs(1);
/// Idle: the services together use less than this share of one core over [`IDLE_WINDOW`].
const IDLE_CPU_SHARE: f64 = 0.05;
/// Units of `/proc/stat` and of `utime`/`stime` in `/proc/<pid>/stat`: USER_HZ, 100 in
/// Linux's ABI on x86-64 and arm64.
pub const TICKS_PER_SEC: f64 = 100.0;
/// The services `scripts/up.sh` runs, whose pid files are read by default.
const SERVICES: [&str; 3] = ["product-stock", "order", "outbound"];

/// `--service-pid` and where pid files are found otherwise.
#[derive(clap::Args, Clone, Debug)]
pub struct PidArgs {
    /// A service process to watch, as NAME=PID (repeatable). Without it, the pid files of
    /// product-stock, order and outbound in --run-dir are read, when present.
    #[arg(long = "service-pid", value_name = "NAME=PID", value_parser = parse_service_pid)]
    service_pid: Vec<ServicePid>,
    /// Where scripts/up.sh keeps the services' pid files (`<service>.pid`).
    #[arg(long, env = "FLASHSALE_RUN_DIR", default_value = ".run")]
    run_dir: PathBuf,
}

/// A named service process; `pid` is `None` when its pid file could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePid {
    pub name: String,
    pub pid: Option<u32>,
}

/// Resident memory of one process, in KiB, as `/proc/<pid>/status` tells it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Status {
    pub vm_rss_kib: Option<u64>,
    pub vm_hwm_kib: Option<u64>,
}

/// One service's memory over a load.
#[derive(Clone, Debug)]
pub struct Memory {
    pub service: ServicePid,
    /// The highest `VmRSS` sampled during the load.
    pub peak_rss_kib: Option<u64>,
    /// At the end of the load.
    pub end: Status,
}

/// How long the services took to become idle.
#[derive(Clone, Copy, Debug)]
pub struct IdleWait {
    pub waited: Duration,
    pub idle: bool,
}

/// Samples `VmRSS` of the services until stopped.
pub struct Sampler {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Vec<Option<u64>>>,
    services: Vec<ServicePid>,
}

// === impl PidArgs ===

impl PidArgs {
    /// The services named with --service-pid, or those with a pid file in --run-dir.
    pub fn services(&self) -> Vec<ServicePid> {
        if !self.service_pid.is_empty() {
            return self.service_pid.clone();
        }
        from_run_dir(&self.run_dir)
    }
}

/// `<dir>/<service>.pid` of each service whose pid file exists; unreadable or garbage → unknown.
pub fn from_run_dir(dir: &Path) -> Vec<ServicePid> {
    SERVICES
        .iter()
        .filter_map(|name| {
            let path = dir.join(format!("{name}.pid"));
            let text = match std::fs::read_to_string(&path) {
                Ok(t) => Some(t),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
                Err(_) => None,
            };
            Some(ServicePid {
                name: (*name).to_owned(),
                pid: text.and_then(|t| parse_pid(t.trim()).ok()),
            })
        })
        .collect()
}

/// `NAME=PID`, for `--service-pid`.
pub fn parse_service_pid(s: &str) -> Result<ServicePid, String> {
    let (name, pid) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}` is not NAME=PID"))?;
    let name = name.trim();
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(format!(
            "`{name}` is not a service name (letters, digits, - and _)"
        ));
    }
    Ok(ServicePid {
        name: name.to_owned(),
        pid: Some(parse_pid(pid.trim())?),
    })
}

fn parse_pid(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(0) | Err(_) => Err(format!("`{s}` is not a process id (1..={})", u32::MAX)),
        Ok(pid) => Ok(pid),
    }
}

// === /proc ===

/// `VmRSS` and `VmHWM` of a `/proc/<pid>/status` text; a field missing or garbled is `None`.
pub fn parse_status(text: &str) -> Status {
    let field = |key: &str| {
        text.lines().find_map(|l| {
            let rest = l.strip_prefix(key)?.strip_prefix(':')?;
            let mut parts = rest.split_whitespace();
            let kib = parts.next()?.parse::<u64>().ok()?;
            matches!(parts.next(), Some("kB") | None).then_some(kib)
        })
    };
    Status {
        vm_rss_kib: field("VmRSS"),
        vm_hwm_kib: field("VmHWM"),
    }
}

/// `utime + stime` (in ticks) of a `/proc/<pid>/stat` text. The command name may hold spaces
/// and parentheses, so fields are counted after its last `)`.
pub fn parse_cpu_ticks(text: &str) -> Option<u64> {
    let (_, after) = text.rsplit_once(')')?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After the name: state (field 3) … utime (14), stime (15).
    let utime = fields.get(11)?.parse::<u64>().ok()?;
    let stime = fields.get(12)?.parse::<u64>().ok()?;
    utime.checked_add(stime)
}

pub fn read_status(pid: Option<u32>) -> Status {
    pid.and_then(|p| std::fs::read_to_string(format!("/proc/{p}/status")).ok())
        .map(|t| parse_status(&t))
        .unwrap_or_default()
}

fn read_cpu_ticks(pid: Option<u32>) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{}/stat", pid?)).ok()?;
    parse_cpu_ticks(&text)
}

// === idle ===

/// Waits (at most `bound`) until the services together use less than 5% of one core over a
/// one-second window. Returns at once when no service process can be read.
pub async fn wait_idle(services: &[ServicePid], bound: Duration) -> Option<IdleWait> {
    let started = Instant::now();
    let ticks = |svcs: &[ServicePid]| -> Vec<Option<u64>> {
        svcs.iter().map(|s| read_cpu_ticks(s.pid)).collect()
    };
    let mut before = ticks(services);
    if before.iter().all(Option::is_none) || bound.is_zero() {
        return None;
    }
    loop {
        let t0 = Instant::now();
        tokio::time::sleep(IDLE_WINDOW).await;
        let after = ticks(services);
        let window = t0.elapsed().as_secs_f64().max(1e-3);
        let used: u64 = before
            .iter()
            .zip(&after)
            .filter_map(|(b, a)| Some(a.as_ref()?.saturating_sub(*b.as_ref()?)))
            .sum();
        let share = used as f64 / TICKS_PER_SEC / window;
        if share < IDLE_CPU_SHARE {
            return Some(IdleWait {
                waited: started.elapsed(),
                idle: true,
            });
        }
        if started.elapsed() >= bound {
            return Some(IdleWait {
                waited: started.elapsed(),
                idle: false,
            });
        }
        before = after;
    }
}

// === impl Sampler ===

impl Sampler {
    /// Starts sampling `VmRSS` of `services` every 100 ms.
    pub fn start(services: Vec<ServicePid>) -> Self {
        let (stop, mut stopped) = oneshot::channel();
        let pids: Vec<Option<u32>> = services.iter().map(|s| s.pid).collect();
        let task = tokio::spawn(async move {
            let mut peaks: Vec<Option<u64>> = vec![None; pids.len()];
            let mut tick = tokio::time::interval(SAMPLE_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                for (peak, pid) in peaks.iter_mut().zip(&pids) {
                    if let Some(rss) = read_status(*pid).vm_rss_kib {
                        *peak = Some(peak.map_or(rss, |p| p.max(rss)));
                    }
                }
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = &mut stopped => return peaks,
                }
            }
        });
        Self {
            stop,
            task,
            services,
        }
    }

    /// Stops sampling: each service's peak during the load and its figures now.
    pub async fn finish(self) -> Vec<Memory> {
        let _ = self.stop.send(());
        let peaks = self
            .task
            .await
            .unwrap_or_else(|_| vec![None; self.services.len()]);
        self.services
            .into_iter()
            .zip(peaks)
            .map(|(service, peak)| {
                let end = read_status(service.pid);
                // The last sample may predate the end of the load.
                let peak_rss_kib = match (peak, end.vm_rss_kib) {
                    (Some(p), Some(now)) => Some(p.max(now)),
                    (p, now) => p.or(now),
                };
                Memory {
                    service,
                    peak_rss_kib,
                    end,
                }
            })
            .collect()
    }
}

// === impl Memory ===

fn mib(kib: Option<u64>) -> Option<f64> {
    kib.map(|k| (k as f64 / 1024.0 * 10.0).round() / 10.0)
}

impl Memory {
    pub fn peak_rss_mib(&self) -> Option<f64> {
        mib(self.peak_rss_kib)
    }

    /// Over [`MEMORY_LIMIT_MIB`] during the load (or over the process's life, by `VmHWM`).
    pub fn over_limit(&self) -> bool {
        [self.peak_rss_kib, self.end.vm_hwm_kib]
            .into_iter()
            .flatten()
            .any(|k| k as f64 / 1024.0 > MEMORY_LIMIT_MIB)
    }

    pub fn to_json(&self) -> Value {
        json!({
            "service": self.service.name,
            "pid": self.service.pid,
            "peak_rss_mib": self.peak_rss_mib(),
            "vm_hwm_mib": mib(self.end.vm_hwm_kib),
            "vm_rss_mib": mib(self.end.vm_rss_kib),
            "over_limit": self.over_limit(),
        })
    }

    /// `order 41.2 MiB (lifetime peak 57.0, now 40.1)`, `?` where unknown, flagged above the limit.
    pub fn text(&self) -> String {
        let f = |v: Option<f64>| v.map_or("?".to_owned(), |v| format!("{v:.1}"));
        let flag = if self.over_limit() {
            format!(" OVER {MEMORY_LIMIT_MIB:.0} MiB")
        } else {
            String::new()
        };
        format!(
            "{} {} MiB (lifetime peak {}, now {}){flag}",
            self.service.name,
            f(self.peak_rss_mib()),
            f(mib(self.end.vm_hwm_kib)),
            f(mib(self.end.vm_rss_kib)),
        )
    }
}

/// The memory of several services on one line, or a note that none is known.
pub fn memory_line(memory: &[Memory]) -> String {
    if memory.is_empty() {
        return "no service pids known (--service-pid NAME=PID, or pid files in --run-dir)".into();
    }
    memory
        .iter()
        .map(Memory::text)
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "Name:\tflashsale-order\nUmask:\t0022\nState:\tS (sleeping)\n\
        VmPeak:\t  912340 kB\nVmHWM:\t   58204 kB\nVmRSS:\t   41216 kB\nThreads:\t5\n";

    #[test]
    fn status_gives_resident_and_peak_memory_in_kib() {
        assert_eq!(
            parse_status(STATUS),
            Status {
                vm_rss_kib: Some(41_216),
                vm_hwm_kib: Some(58_204)
            }
        );
    }

    #[test]
    fn garbage_status_gives_unknown_figures_not_a_panic() {
        for text in [
            "",
            "\0\0\u{fffd}",
            "VmRSS:\nVmHWM:",
            "VmRSS:\tmany kB\nVmHWM:\t-3 kB",
            "VmRSS:\t12 MB\nVmHWM:\t99999999999999999999999 kB",
            "VmRSSx:\t12 kB",
        ] {
            assert_eq!(parse_status(text), Status::default(), "{text:?}");
        }
        let half = parse_status("VmHWM:  2048 kB\nVmRSS: lots\n");
        assert_eq!((half.vm_hwm_kib, half.vm_rss_kib), (Some(2048), None));
    }

    #[test]
    fn stat_cpu_time_is_found_after_a_name_with_spaces_and_parens() {
        let stat = "4242 (flashsale (x) y) S 1 4242 4242 0 -1 4194304 101 0 0 0 \
            250 17 0 0 20 0 5 0 22562 3133440 409";
        assert_eq!(parse_cpu_ticks(stat), Some(267));
        assert_eq!(parse_cpu_ticks(""), None);
        assert_eq!(parse_cpu_ticks("12 (x) S 1 2"), None);
        assert_eq!(parse_cpu_ticks("12 (x) S 1 2 3 4 5 6 7 8 9 ten 11"), None);
        assert_eq!(parse_cpu_ticks("no parens at all 1 2 3 4 5 6 7 8 9"), None);
    }

    #[test]
    fn this_process_can_be_read() {
        let me = Some(std::process::id());
        assert!(read_status(me).vm_rss_kib.is_some_and(|k| k > 0));
        assert!(read_cpu_ticks(me).is_some());
        assert_eq!(read_status(None), Status::default());
    }

    #[test]
    fn service_pids_are_name_equals_pid() {
        assert_eq!(
            parse_service_pid("order=123"),
            Ok(ServicePid {
                name: "order".into(),
                pid: Some(123)
            })
        );
        assert_eq!(
            parse_service_pid(" product-stock = 7 ").map(|s| (s.name, s.pid)),
            Ok(("product-stock".into(), Some(7)))
        );
        for bad in [
            "",
            "order",
            "order=",
            "=12",
            "order=0",
            "order=-1",
            "order=12x",
            "order=99999999999",
            "or der=1",
            "a=b=1",
        ] {
            assert!(parse_service_pid(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn pid_files_that_are_missing_are_skipped_and_garbage_is_unknown() {
        let dir = std::env::temp_dir().join(format!("fs-procstat-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("order.pid"), "4321\n").unwrap();
        std::fs::write(dir.join("outbound.pid"), "not a pid").unwrap();
        let found = from_run_dir(&dir);
        std::fs::remove_dir_all(&dir).ok();
        assert_eq!(
            found,
            vec![
                ServicePid {
                    name: "order".into(),
                    pid: Some(4321)
                },
                ServicePid {
                    name: "outbound".into(),
                    pid: None
                },
            ]
        );
        assert!(from_run_dir(Path::new("/nonexistent/fs-run")).is_empty());
    }

    #[test]
    fn memory_over_the_limit_is_flagged() {
        let m = |peak: u64, hwm: u64| Memory {
            service: ServicePid {
                name: "order".into(),
                pid: Some(1),
            },
            peak_rss_kib: Some(peak),
            end: Status {
                vm_rss_kib: Some(peak),
                vm_hwm_kib: Some(hwm),
            },
        };
        assert!(!m(100 * 1024, 120 * 1024).over_limit());
        assert!(m(129 * 1024, 130 * 1024).over_limit());
        assert!(m(10 * 1024, 200 * 1024).text().contains("OVER 128 MiB"));
        let unknown = Memory {
            service: ServicePid {
                name: "outbound".into(),
                pid: None,
            },
            peak_rss_kib: None,
            end: Status::default(),
        };
        assert!(!unknown.over_limit());
        assert_eq!(unknown.to_json()["peak_rss_mib"], Value::Null);
        assert!(unknown.text().starts_with("outbound ? MiB"));
    }

    #[tokio::test]
    async fn no_readable_pid_means_no_idle_wait() {
        let none = [ServicePid {
            name: "gone".into(),
            pid: None,
        }];
        assert!(wait_idle(&none, Duration::from_secs(5)).await.is_none());
        assert!(wait_idle(&[], Duration::from_secs(5)).await.is_none());
    }
}
