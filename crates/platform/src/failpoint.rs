//! Named failpoints at the steps of a saga, so a fault-injection suite can make a process error,
//! panic, stall or die at exactly one step.
//!
//! They exist only in builds with the cargo feature `failpoints` (the test and fault builds:
//! scripts/test.sh, scripts/faults.sh). Without it the API is the same, so call sites do not
//! change, but [`Failpoints::hit`] never fires (the code that panics or exits is not even
//! compiled) and [`from_env`] refuses to start a process whose `FLASHSALE_FAILPOINTS` is set.
//!
//! A [`Failpoints`] value is owned per service instance (not a process global), so tests running
//! in parallel in one process arm only their own. Services arm them from the `FLASHSALE_FAILPOINTS`
//! spec at start-up (`name=action;name=action`, actions `error`, `panic`, `exit`, `sleep(ms)`,
//! each optionally prefixed with a count: `1*exit` fires once). One more, `skew(ms)`, is not an
//! action but a clock's offset: `order.clock=skew(-2000)` makes that replica's clock run two
//! seconds slow, to test that a sale opens by one clock whatever the replicas' say.

use std::{
    collections::HashMap,
    sync::{
        Arc, RwLock,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

/// Whether this build has failpoints (the cargo feature `failpoints`).
pub const COMPILED: bool = cfg!(feature = "failpoints");

/// What an armed failpoint does when reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Return [`FailpointError`] from [`Failpoints::hit`].
    Error,
    /// Panic the task that reached it.
    Panic,
    /// End the whole process at once, like `kill -9` (exit code 137).
    Exit,
    /// Sleep, then go on.
    Sleep(Duration),
    /// Not reached but read: the named clock runs this many milliseconds ahead (negative:
    /// behind) of the system's ([`Failpoints::skew_ms`]). Reaching it does nothing.
    Skew(i64),
}

// Read only where failpoints fire, which a build without the feature leaves out.
#[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
#[derive(Clone, Debug)]
struct Armed {
    action: Action,
    /// `None` fires forever; `Some(n)` fires n more times.
    remaining: Option<u32>,
}

/// The error a failpoint armed with [`Action::Error`] returns.
#[derive(Debug, thiserror::Error)]
#[error("failpoint {0} triggered")]
pub struct FailpointError(pub String);

/// A set of armed failpoints; cheap to clone, free to check while none is armed.
#[derive(Clone, Default)]
pub struct Failpoints {
    any: Arc<AtomicBool>,
    armed: Arc<RwLock<HashMap<String, Armed>>>,
}

impl std::fmt::Debug for Failpoints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self
            .armed
            .read()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        f.debug_struct("Failpoints").field("armed", &names).finish()
    }
}

impl Failpoints {
    /// Parses a spec such as `outbox.relay.after_publish=1*exit;order.create.after_reserve=error`.
    pub fn from_spec(spec: &str) -> Result<Self, String> {
        let fp = Self::default();
        for part in spec.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, action) = part
                .split_once('=')
                .ok_or_else(|| format!("failpoint `{part}` has no `=action`"))?;
            let name = name.trim();
            if name.is_empty() {
                return Err(format!("failpoint `{part}` has an empty name"));
            }
            let (count, action) = match action.split_once('*') {
                Some((n, a)) => (
                    Some(
                        n.trim()
                            .parse::<u32>()
                            .map_err(|_| format!("failpoint `{name}`: bad count `{n}`"))?,
                    ),
                    a.trim(),
                ),
                None => (None, action.trim()),
            };
            let action = parse_action(action).ok_or_else(|| {
                format!(
                    "failpoint `{name}`: unknown action `{action}` (error, panic, exit, sleep(ms), skew(ms))"
                )
            })?;
            fp.arm_n(name, action, count);
        }
        Ok(fp)
    }

    /// Arms `name` to fire every time it is reached.
    pub fn arm(&self, name: &str, action: Action) {
        self.arm_n(name, action, None);
    }

    /// Arms `name` to fire `count` times (forever when `None`).
    pub fn arm_n(&self, name: &str, action: Action, count: Option<u32>) {
        if let Ok(mut m) = self.armed.write() {
            m.insert(
                name.to_owned(),
                Armed {
                    action,
                    remaining: count,
                },
            );
            self.any.store(true, Ordering::Release);
        }
    }

    /// Disarms `name`.
    pub fn disarm(&self, name: &str) {
        if let Ok(mut m) = self.armed.write() {
            m.remove(name);
            self.any.store(!m.is_empty(), Ordering::Release);
        }
    }

    #[cfg(feature = "failpoints")]
    fn take(&self, name: &str) -> Option<Action> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        let mut m = self.armed.write().ok()?;
        let armed = m.get_mut(name)?;
        let action = armed.action.clone();
        match armed.remaining {
            Some(0) => return None,
            Some(ref mut n) => *n -= 1,
            None => {}
        }
        Some(action)
    }

    /// The skew armed on clock `name` with [`Action::Skew`], in milliseconds; 0 when none is
    /// armed, and always 0 in a build without the `failpoints` feature.
    pub fn skew_ms(&self, name: &str) -> i64 {
        #[cfg(feature = "failpoints")]
        if self.any.load(Ordering::Acquire)
            && let Ok(m) = self.armed.read()
            && let Some(Armed {
                action: Action::Skew(ms),
                ..
            }) = m.get(name)
        {
            return *ms;
        }
        let _ = name;
        0
    }

    /// Reaches failpoint `name`: does nothing unless it is armed (and never in a build
    /// without the `failpoints` feature).
    pub async fn hit(&self, name: &str) -> Result<(), FailpointError> {
        #[cfg(feature = "failpoints")]
        match self.take(name) {
            None => Ok(()),
            Some(Action::Sleep(d)) => {
                tokio::time::sleep(d).await;
                Ok(())
            }
            Some(Action::Skew(_)) => Ok(()),
            Some(other) => fire(name, other),
        }
        #[cfg(not(feature = "failpoints"))]
        {
            let _ = name;
            Ok(())
        }
    }
}

/// Failpoints armed by `FLASHSALE_FAILPOINTS` (none when unset); a bad spec is an error naming
/// it, and so is any spec in a build without the `failpoints` feature.
pub fn from_env() -> anyhow::Result<Failpoints> {
    from_env_value(std::env::var("FLASHSALE_FAILPOINTS").ok(), COMPILED)
}

/// [`from_env`] for the variable's value `spec` in a build with (`compiled`) or without
/// failpoints. A spec that arms nothing (empty) is accepted either way.
fn from_env_value(spec: Option<String>, compiled: bool) -> anyhow::Result<Failpoints> {
    let Some(spec) = spec.filter(|s| !s.trim().is_empty()) else {
        return Ok(Failpoints::default());
    };
    if !compiled {
        anyhow::bail!(
            "FLASHSALE_FAILPOINTS is set (`{spec}`), but this binary was built without failpoints \
             (cargo feature `failpoints`): unset it, or run a test build \
             (cargo build --features flashsale-platform/failpoints)"
        );
    }
    Failpoints::from_spec(&spec).map_err(|e| anyhow::anyhow!("FLASHSALE_FAILPOINTS: {e}"))
}

#[cfg(feature = "failpoints")]
fn fire(name: &str, action: Action) -> Result<(), FailpointError> {
    match action {
        Action::Error => Err(FailpointError(name.to_owned())),
        Action::Panic => panic!("failpoint {name} triggered"),
        Action::Exit => {
            tracing::error!(failpoint = name, "failpoint exits the process");
            std::process::exit(137)
        }
        Action::Skew(_) => Ok(()),
        Action::Sleep(d) => {
            std::thread::sleep(d);
            Ok(())
        }
    }
}

fn parse_action(s: &str) -> Option<Action> {
    match s {
        "error" => Some(Action::Error),
        "panic" => Some(Action::Panic),
        "exit" => Some(Action::Exit),
        _ => {
            if let Some(ms) = s.strip_prefix("skew(") {
                return Some(Action::Skew(ms.strip_suffix(')')?.trim().parse().ok()?));
            }
            let ms = s.strip_prefix("sleep(")?.strip_suffix(')')?;
            Some(Action::Sleep(Duration::from_millis(
                ms.trim().parse().ok()?,
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_without_failpoints_refuses_a_spec_and_one_with_them_arms_it() {
        let e = from_env_value(Some("order.create.before_write=exit".into()), false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("FLASHSALE_FAILPOINTS"), "{e}");
        assert!(e.contains("built without failpoints"), "{e}");
        assert!(from_env_value(None, false).is_ok());
        assert!(from_env_value(Some("  ".into()), false).is_ok());
        let armed = from_env_value(Some("a=error".into()), true).unwrap();
        assert!(format!("{armed:?}").contains("[\"a\"]"), "{armed:?}");
        let e = from_env_value(Some("a=boom".into()), true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("boom"), "{e}");
    }

    #[cfg(not(feature = "failpoints"))]
    #[tokio::test]
    async fn without_the_feature_an_armed_failpoint_never_fires() {
        let fp = Failpoints::from_spec("a=error;b=exit;c=panic").unwrap();
        fp.arm("d", Action::Exit);
        for name in ["a", "b", "c", "d"] {
            assert!(fp.hit(name).await.is_ok(), "{name} fired");
        }
    }

    #[tokio::test]
    async fn a_skewed_clock_reads_its_skew_only_in_a_build_with_failpoints() {
        let fp = Failpoints::from_spec("order.clock=skew(-2000);other=skew( 150 )").unwrap();
        let want = |ms: i64| if COMPILED { ms } else { 0 };
        assert_eq!(fp.skew_ms("order.clock"), want(-2000));
        assert_eq!(fp.skew_ms("other"), want(150));
        assert_eq!(fp.skew_ms("unarmed"), 0);
        assert!(fp.hit("order.clock").await.is_ok(), "a skew never fails");
        assert_eq!(fp.skew_ms("order.clock"), want(-2000), "nor is it used up");
        assert!(Failpoints::from_spec("c=skew(soon)").is_err());
    }

    #[tokio::test]
    async fn unarmed_failpoint_does_nothing() {
        let fp = Failpoints::default();
        assert!(fp.hit("x").await.is_ok());
    }

    #[cfg(feature = "failpoints")]
    #[tokio::test]
    async fn counted_failpoint_fires_only_that_many_times() {
        let fp = Failpoints::from_spec("a=2*error").unwrap();
        assert!(fp.hit("a").await.is_err());
        assert!(fp.hit("a").await.is_err());
        assert!(fp.hit("a").await.is_ok());
        assert!(fp.hit("b").await.is_ok());
    }

    #[cfg(feature = "failpoints")]
    #[tokio::test]
    async fn disarmed_failpoint_stops_firing() {
        let fp = Failpoints::default();
        fp.arm("a", Action::Error);
        assert!(fp.hit("a").await.is_err());
        fp.disarm("a");
        assert!(fp.hit("a").await.is_ok());
    }

    #[test]
    fn bad_specs_are_rejected_with_the_name() {
        assert!(Failpoints::from_spec("a").unwrap_err().contains("`a`"));
        assert!(
            Failpoints::from_spec("a=boom")
                .unwrap_err()
                .contains("boom")
        );
        assert!(
            Failpoints::from_spec("a=x*error")
                .unwrap_err()
                .contains("count")
        );
        assert!(Failpoints::from_spec("=error").is_err());
        assert!(Failpoints::from_spec("a=sleep(5);b=1*panic").is_ok());
    }
}
