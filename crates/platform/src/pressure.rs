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

/// How a background loop yields to a [`Foreground`]: it waits until the foreground has been
/// quiet for `quiet`, but defers its work by at most `max_lag` at a time, so it always makes
/// progress (one unit of work per `max_lag` during a burst that never pauses).
#[derive(Clone, Debug)]
pub struct Yield {
    pub foreground: Foreground,
    pub quiet: Duration,
    pub max_lag: Duration,
}

impl Yield {
    /// Waits (from `since`, the moment the work became due) until the foreground is quiet or
    /// `max_lag` has passed; returns how long it waited.
    pub async fn wait(&self, since: Instant) -> Duration {
        let start = Instant::now();
        let deadline = since + self.max_lag;
        loop {
            let remaining = match self.foreground.quiet_for() {
                Some(q) if q < self.quiet => self.quiet - q,
                _ => break,
            };
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            tokio::time::sleep_until((now + remaining).min(deadline)).await;
        }
        start.elapsed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_background_loop_waits_for_the_foreground_to_be_quiet() {
        let fg = Foreground::new();
        let y = Yield {
            foreground: fg.clone(),
            quiet: Duration::from_millis(50),
            max_lag: Duration::from_secs(2),
        };
        // Never marked: no wait at all.
        assert_eq!(y.wait(Instant::now()).await, Duration::ZERO);
        fg.mark();
        tokio::time::advance(Duration::from_millis(10)).await;
        // Marked 10 ms ago: waits the 40 ms left of the quiet period.
        assert_eq!(y.wait(Instant::now()).await, Duration::from_millis(40));
        assert!(
            fg.quiet_for()
                .is_some_and(|q| q >= Duration::from_millis(50))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_that_never_pauses_defers_work_by_at_most_max_lag() {
        let fg = Foreground::new();
        let y = Yield {
            foreground: fg.clone(),
            quiet: Duration::from_millis(50),
            max_lag: Duration::from_millis(300),
        };
        let marker = {
            let fg = fg.clone();
            tokio::spawn(async move {
                for _ in 0..1_000 {
                    fg.mark();
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
        };
        let since = Instant::now();
        tokio::time::advance(Duration::from_millis(100)).await;
        let waited = y.wait(since).await;
        // Due 100 ms ago: 200 ms more, then it goes ahead although the burst goes on.
        assert_eq!(waited, Duration::from_millis(200));
        assert!(
            fg.quiet_for()
                .is_some_and(|q| q < Duration::from_millis(50))
        );
        marker.abort();
    }
}
