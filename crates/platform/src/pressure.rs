//! Foreground first: work a buyer waits for (accepting an order) marks a [`Foreground`], and
//! background work that shares the same cores (publishing the saga's events) asks it how long
//! the foreground has been quiet, and waits — never longer than its own bound — while a burst
//! is on. The state is one replica's own: every replica yields to its own callers, and nothing
//! depends on there being one replica.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::time::Instant;

/// When foreground work last happened in this process. Cheap to clone and to mark.
#[derive(Clone, Debug)]
pub struct Foreground {
    origin: Instant,
    /// Microseconds from `origin` to the last mark, plus one (0: never marked).
    last: Arc<AtomicU64>,
}

impl Default for Foreground {
    fn default() -> Self {
        Self::new()
    }
}

impl Foreground {
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
            last: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Foreground work is happening now.
    pub fn mark(&self) {
        let micros = u64::try_from(self.origin.elapsed().as_micros()).unwrap_or(u64::MAX - 1);
        self.last.fetch_max(micros + 1, Ordering::Relaxed);
    }

    /// How long ago the last foreground work was (`None`: never).
    pub fn quiet_for(&self) -> Option<Duration> {
        match self.last.load(Ordering::Relaxed) {
            0 => None,
            n => Some(
                self.origin
                    .elapsed()
                    .saturating_sub(Duration::from_micros(n - 1)),
            ),
        }
    }
}

/// How a background loop yields to a [`Foreground`]: while the foreground is busy (marked less
/// than `quiet` ago) the loop holds its work back, except work that has waited `max_lag`
/// already — so the lag stays bounded and the loop keeps pace with a load that never pauses,
/// while a short burst is answered first and its background work follows right after it.
#[derive(Clone, Debug)]
pub struct Yield {
    pub foreground: Foreground,
    pub quiet: Duration,
    pub max_lag: Duration,
}

impl Yield {
    /// How long to hold back work whose oldest item has waited `oldest` (`None`: no work):
    /// `None` means go now.
    pub fn hold(&self, oldest: Option<Duration>) -> Option<Duration> {
        let since = self.foreground.quiet_for()?;
        if since >= self.quiet || oldest.is_some_and(|age| age >= self.max_lag) {
            return None;
        }
        let until_quiet = self.quiet - since;
        // With nothing due yet, look again within `max_lag`: a row written meanwhile must not
        // wait out a long quiet period.
        Some(match oldest {
            Some(age) => until_quiet.min(self.max_lag - age),
            None => until_quiet.min(self.max_lag),
        })
    }
}

/// A [`Yield`] with a memory: a burst that outlasts `max_lag` is a sustained load, and holding
/// work back through it only delays that work by `max_lag` without ever letting the foreground
/// have the cores to itself — the work has to be done meanwhile all the same. So once work has
/// had to go out at its `max_lag` while the foreground was busy, the yielder holds nothing back
/// until the foreground has been quiet for `max_lag` too; a short burst is still answered
/// first. (A pause of `quiet` alone does not end a sustained load: under a steady load short
/// gaps come and go, and each would otherwise start another hold of `max_lag`.)
#[derive(Clone, Debug)]
pub struct Yielder {
    rule: Yield,
    sustained: bool,
}

impl Yielder {
    pub fn new(rule: Yield) -> Self {
        Self {
            rule,
            sustained: false,
        }
    }

    /// As [`Yield::hold`], but `None` throughout a sustained load.
    pub fn hold(&mut self, oldest: Option<Duration>) -> Option<Duration> {
        let quiet_for = self.rule.foreground.quiet_for();
        if quiet_for.is_none_or(|q| q >= self.rule.max_lag) {
            self.sustained = false;
        }
        if quiet_for.is_none_or(|q| q >= self.rule.quiet) || self.sustained {
            return None;
        }
        let hold = self.rule.hold(oldest);
        self.sustained = hold.is_none();
        hold
    }

    /// Whether the foreground's load has outlasted `max_lag` and work is no longer held back.
    pub fn sustained(&self) -> bool {
        self.sustained
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn work_is_held_back_while_the_foreground_is_busy_but_never_past_max_lag() {
        let fg = Foreground::new();
        let y = Yield {
            foreground: fg.clone(),
            quiet: Duration::from_millis(50),
            max_lag: Duration::from_secs(2),
        };
        // Never marked: go.
        assert_eq!(y.hold(Some(Duration::ZERO)), None);
        fg.mark();
        tokio::time::advance(Duration::from_millis(10)).await;
        // Busy: young work waits for the 40 ms left of the quiet period ...
        assert_eq!(
            y.hold(Some(Duration::from_millis(5))),
            Some(Duration::from_millis(40))
        );
        assert_eq!(y.hold(None), Some(Duration::from_millis(40)));
        // ... or less, when it reaches its lag before that ...
        assert_eq!(
            y.hold(Some(Duration::from_millis(1_990))),
            Some(Duration::from_millis(10))
        );
        // ... and work that has waited max_lag goes at once, busy or not.
        assert_eq!(y.hold(Some(Duration::from_secs(2))), None);
        tokio::time::advance(Duration::from_millis(40)).await;
        assert!(
            fg.quiet_for()
                .is_some_and(|q| q >= Duration::from_millis(50))
        );
        assert_eq!(y.hold(Some(Duration::ZERO)), None, "quiet again: go");
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_that_outlasts_max_lag_is_held_back_no_more_until_the_foreground_is_quiet() {
        let fg = Foreground::new();
        let mut y = Yielder::new(Yield {
            foreground: fg.clone(),
            quiet: Duration::from_millis(50),
            max_lag: Duration::from_secs(2),
        });
        fg.mark();
        // A burst: young work is held back.
        assert_eq!(
            y.hold(Some(Duration::from_millis(5))),
            Some(Duration::from_millis(50))
        );
        assert!(!y.sustained());
        // The burst goes on past max_lag: the oldest work goes, and from then on new work too,
        // while the foreground stays busy.
        for _ in 0..200 {
            tokio::time::advance(Duration::from_millis(10)).await;
            fg.mark();
        }
        assert_eq!(y.hold(Some(Duration::from_secs(2))), None);
        assert!(y.sustained());
        for _ in 0..10 {
            tokio::time::advance(Duration::from_millis(10)).await;
            fg.mark();
            assert_eq!(
                y.hold(Some(Duration::from_millis(1))),
                None,
                "sustained: go"
            );
            assert_eq!(y.hold(None), None);
        }
        // A short gap in the load does not end it.
        tokio::time::advance(Duration::from_millis(60)).await;
        assert_eq!(y.hold(Some(Duration::from_millis(1))), None, "quiet: go");
        assert!(y.sustained());
        fg.mark();
        assert_eq!(
            y.hold(Some(Duration::from_millis(1))),
            None,
            "still sustained"
        );
        // Quiet for max_lag: the next burst is yielded to as the first was.
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(y.hold(Some(Duration::from_millis(1))), None, "quiet: go");
        assert!(!y.sustained());
        fg.mark();
        assert_eq!(
            y.hold(Some(Duration::from_millis(1))),
            Some(Duration::from_millis(50))
        );
    }
}
