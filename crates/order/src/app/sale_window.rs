//! The sale-window memory (docs/adr/0008-sale-window-on-the-product.md): once the gate refuses
//! a product with `SALE_NOT_STARTED` or `SALE_ENDED`, this replica refuses further requests for
//! it from memory — no Redis, no database, no network — until the opening, or for good after
//! the end, at the cost of a sold-out refusal.
//!
//! **One clock.** The gate judges the window by the Redis server's clock. This replica's own
//! clock may run fast or slow, so it never compares the opening with its own clock: every answer
//! of the gate carries the gate's time, and [`GateClock`] keeps the offset between the two (with
//! how uncertain it is: half the round trip it was measured over). Before the opening, requests
//! are refused from memory only while the gate's clock, so estimated, is more than
//! [`OPENING_MARGIN`] (plus the uncertainty) before it; nearer the opening they go to the gate,
//! which decides. A replica whose clock runs fast asks the gate a little early; one whose clock
//! runs slow stops refusing on time.
//!
//! **Replays.** Refusing from memory must not break invariant 5 (a replay of an accepted request
//! returns its order), so, as with the sold-out memory (docs/adr/0005-sold-out-memory.md), an
//! entry refuses only once it holds the product's *possible replayers*: the gate's buyers and the
//! users with an order for it here. They can exist before an opening when a product sold before
//! (a sale that returns on a new window), and after the end. No new buyer can appear while the
//! product is outside its window, so the list holds for as long as the entry does. Their
//! requests go to the gate, which answers replays exactly; everyone else is refused at once.
//!
//! A window only changes through UpdateProduct, whose `product.updated` event makes every replica
//! forget the product.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex, RwLock},
    time::Duration,
};

use flashsale_platform::failpoint::Failpoints;
use tokio::time::Instant;

use crate::domain::Refusal;

/// The failpoint clock this replica reads (`order.clock=skew(ms)`: a clock that runs fast or
/// slow, for tests).
pub const CLOCK: &str = "order.clock";

/// How long before the opening (by the gate's clock, as estimated) this replica stops refusing
/// from memory and lets the gate decide.
pub const OPENING_MARGIN: Duration = Duration::from_millis(250);

/// Most products remembered at once (the oldest are dropped beyond it).
const MAX_ENTRIES: usize = 10_000;
/// A list still not read after this long is given up (the next refusal starts another).
const LOAD_TIMEOUT: Duration = Duration::from_secs(10);
/// An offset measured longer ago than this gives way to any newer one, however uncertain.
const SAMPLE_FRESH: Duration = Duration::from_secs(30);

/// This replica's estimate of the gate's clock. Cheap to clone; clones share it.
#[derive(Clone, Debug, Default)]
pub struct GateClock {
    best: Arc<Mutex<Option<Sample>>>,
    failpoints: Failpoints,
}

#[derive(Clone, Copy, Debug)]
struct Sample {
    /// The gate's clock minus this replica's, in milliseconds.
    offset_ms: i64,
    /// Half the round trip the sample was taken over: how far off the offset may be.
    uncertainty_ms: i64,
    taken: Instant,
}

impl GateClock {
    /// A clock read through `failpoints` (whose `order.clock` skew, in a test build, makes it run
    /// fast or slow).
    pub fn new(failpoints: Failpoints) -> Self {
        Self {
            best: Arc::default(),
            failpoints,
        }
    }

    /// This replica's clock, in milliseconds since the Unix epoch.
    pub fn local_ms(&self) -> i64 {
        chrono::Utc::now().timestamp_millis() + self.failpoints.skew_ms(CLOCK)
    }

    /// The gate answered at `gate_ms` (its clock) a call sent at `sent_ms` and answered at
    /// `received_ms` (this replica's clock). The least uncertain recent sample is kept.
    pub fn observe(&self, gate_ms: i64, sent_ms: i64, received_ms: i64) {
        let half = (received_ms - sent_ms).max(0) / 2;
        let sample = Sample {
            offset_ms: gate_ms - (sent_ms + half),
            uncertainty_ms: half + 1,
            taken: Instant::now(),
        };
        if let Ok(mut best) = self.best.lock() {
            let keep_old = best.is_some_and(|b| {
                b.uncertainty_ms < sample.uncertainty_ms && b.taken.elapsed() < SAMPLE_FRESH
            });
            if !keep_old {
                *best = Some(sample);
            }
        }
    }

    /// The gate's clock now, as estimated, and how far off that may be; `None` before the
    /// gate's clock was ever seen.
    pub fn gate_now(&self) -> Option<(i64, i64)> {
        let best = (*self.best.lock().ok()?)?;
        Some((self.local_ms() + best.offset_ms, best.uncertainty_ms))
    }
}

/// What the memory says about one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WindowVerdict {
    /// Nothing known, or near the opening: ask the gate.
    Open,
    /// Outside the window, and this user cannot be replaying an accepted request: refuse now.
    Refuse {
        refusal: Refusal,
        at_ms: i64,
        gate_ms: i64,
    },
}

#[derive(Debug)]
struct Entry {
    refusal: Refusal,
    /// The opening (`SaleNotStarted`) or the closing (`SaleEnded`), by the gate's clock.
    at_ms: i64,
    /// The possible replayers; `None` while they are read (since `since`).
    replayers: Option<Arc<HashSet<String>>>,
    since: Instant,
    generation: u64,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<String, Entry>,
    /// Bumped by every [`SaleWindows::forget`]: a list read before it is stale.
    generation: u64,
}

/// The per-replica sale-window memory. Cheap to clone; clones share it.
#[derive(Clone, Debug)]
pub struct SaleWindows {
    inner: Arc<RwLock<State>>,
    clock: GateClock,
}

impl SaleWindows {
    pub fn new(clock: GateClock) -> Self {
        Self {
            inner: Arc::default(),
            clock,
        }
    }

    /// The gate's clock as this replica knows it.
    pub fn clock(&self) -> &GateClock {
        &self.clock
    }

    pub fn verdict(&self, sku: &str, user_id: &str) -> WindowVerdict {
        let Ok(state) = self.inner.read() else {
            return WindowVerdict::Open;
        };
        let Some(entry) = state.entries.get(sku) else {
            return WindowVerdict::Open;
        };
        let Some(replayers) = &entry.replayers else {
            return WindowVerdict::Open;
        };
        if replayers.contains(user_id) {
            return WindowVerdict::Open;
        }
        let Some((gate_ms, uncertainty_ms)) = self.clock.gate_now() else {
            return WindowVerdict::Open;
        };
        let margin = i64::try_from(OPENING_MARGIN.as_millis()).unwrap_or(i64::MAX);
        let closed = match entry.refusal {
            Refusal::SaleNotStarted => gate_ms + uncertainty_ms + margin < entry.at_ms,
            // Nothing reopens a window but UpdateProduct, which makes every replica forget.
            _ => true,
        };
        if closed {
            WindowVerdict::Refuse {
                refusal: entry.refusal,
                at_ms: entry.at_ms,
                gate_ms,
            }
        } else {
            WindowVerdict::Open
        }
    }

    /// The gate refused `sku` by its window: `Some(generation)` when the caller should read
    /// the possible replayers and [`install`](Self::install) them; `None` when that is under
    /// way or done for this same window.
    pub fn begin_load(&self, sku: &str, refusal: Refusal, at_ms: i64) -> Option<u64> {
        let mut state = self.inner.write().ok()?;
        let now = Instant::now();
        if let Some(e) = state.entries.get(sku)
            && e.refusal == refusal
            && e.at_ms == at_ms
            && (e.replayers.is_some() || now.duration_since(e.since) < LOAD_TIMEOUT)
        {
            return None;
        }
        if state.entries.len() >= MAX_ENTRIES {
            // The products whose sale opened long ago are of no use any more.
            let gate_now = self.clock.gate_now().map_or(i64::MIN, |(g, _)| g);
            state
                .entries
                .retain(|_, e| e.refusal != Refusal::SaleNotStarted || e.at_ms > gate_now);
            if state.entries.len() >= MAX_ENTRIES
                && let Some(oldest) = state
                    .entries
                    .iter()
                    .min_by_key(|(_, e)| e.since)
                    .map(|(k, _)| k.clone())
            {
                state.entries.remove(&oldest);
            }
        }
        let generation = state.generation;
        state.entries.insert(
            sku.to_owned(),
            Entry {
                refusal,
                at_ms,
                replayers: None,
                since: now,
                generation,
            },
        );
        Some(generation)
    }

    /// Installs the possible replayers read for the load started at `generation`; ignored if
    /// the product was forgotten since.
    pub fn install(&self, sku: &str, generation: u64, replayers: impl Into<Arc<HashSet<String>>>) {
        let Ok(mut state) = self.inner.write() else {
            return;
        };
        let fresh = state.generation == generation;
        match state.entries.get_mut(sku) {
            Some(e) if e.generation == generation && e.replayers.is_none() && fresh => {
                e.replayers = Some(replayers.into());
            }
            Some(e) if e.generation == generation => {
                state.entries.remove(sku);
            }
            _ => {}
        }
    }

    /// The load started at `generation` failed (or found too many buyers to list): ask the
    /// gate meanwhile.
    pub fn abandon(&self, sku: &str, generation: u64) {
        if let Ok(mut state) = self.inner.write()
            && state
                .entries
                .get(sku)
                .is_some_and(|e| e.generation == generation && e.replayers.is_none())
        {
            state.entries.remove(sku);
        }
    }

    /// The product's window may have changed: stop refusing it from memory.
    pub fn forget(&self, sku: &str) {
        if let Ok(mut state) = self.inner.write() {
            state.generation += 1;
            state.entries.remove(sku);
        }
    }

    /// Forget everything (e.g. after missing events while the broker was away).
    pub fn clear(&self) {
        if let Ok(mut state) = self.inner.write() {
            state.generation += 1;
            state.entries.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(users: &[&str]) -> HashSet<String> {
        users.iter().map(|u| (*u).to_owned()).collect()
    }

    /// A memory whose clock is `skew_ms` off the system's, with the gate's clock seen once,
    /// exactly (a zero round trip), as the system's.
    fn windows(skew_ms: i64) -> SaleWindows {
        let fp = Failpoints::default();
        fp.arm(CLOCK, flashsale_platform::failpoint::Action::Skew(skew_ms));
        let clock = GateClock::new(fp);
        let local = clock.local_ms();
        clock.observe(local - skew_ms, local, local);
        SaleWindows::new(clock)
    }

    fn system_ms() -> i64 {
        chrono::Utc::now().timestamp_millis()
    }

    #[test]
    fn before_the_opening_everyone_but_a_possible_replayer_is_refused() {
        let w = windows(0);
        let start = system_ms() + 60_000;
        assert_eq!(w.verdict("A", "bob"), WindowVerdict::Open);
        let g = w.begin_load("A", Refusal::SaleNotStarted, start).unwrap();
        assert_eq!(
            w.verdict("A", "bob"),
            WindowVerdict::Open,
            "the gate decides while the list is read"
        );
        assert_eq!(
            w.begin_load("A", Refusal::SaleNotStarted, start),
            None,
            "one load at a time"
        );
        w.install("A", g, set(&["alice"]));
        match w.verdict("A", "bob") {
            WindowVerdict::Refuse {
                refusal: Refusal::SaleNotStarted,
                at_ms,
                gate_ms,
            } => {
                assert_eq!(at_ms, start);
                assert!((start - gate_ms - 60_000).abs() < 5_000, "{gate_ms}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(w.verdict("A", "alice"), WindowVerdict::Open);
        assert_eq!(w.verdict("B", "bob"), WindowVerdict::Open);
    }

    #[test]
    fn near_the_opening_the_gate_decides_whatever_this_replica_s_clock_says() {
        // A clock two seconds slow or fast, corrected by the offset to the gate's clock.
        for skew in [-2_000, 0, 2_000] {
            let w = windows(skew);
            let far = system_ms() + 5_000;
            let g = w.begin_load("FAR", Refusal::SaleNotStarted, far).unwrap();
            w.install("FAR", g, set(&[]));
            assert!(
                matches!(w.verdict("FAR", "bob"), WindowVerdict::Refuse { .. }),
                "skew {skew}: five seconds before the opening is refused from memory"
            );
            let near = system_ms() + 100;
            let g = w.begin_load("NEAR", Refusal::SaleNotStarted, near).unwrap();
            w.install("NEAR", g, set(&[]));
            assert_eq!(
                w.verdict("NEAR", "bob"),
                WindowVerdict::Open,
                "skew {skew}: within the margin of the opening the gate decides"
            );
        }
    }

    #[test]
    fn the_offset_kept_is_the_least_uncertain_one() {
        let clock = GateClock::new(Failpoints::default());
        assert_eq!(clock.gate_now(), None);
        let local = clock.local_ms();
        // 10 s ahead, over a 2 ms round trip.
        clock.observe(local + 10_001, local, local + 2);
        let (gate, uncertainty) = clock.gate_now().unwrap();
        assert!((gate - clock.local_ms() - 10_000).abs() <= 5, "{gate}");
        assert_eq!(uncertainty, 2);
        // A wider round trip does not replace it ...
        clock.observe(local + 50_000, local, local + 400);
        assert!((clock.gate_now().unwrap().0 - clock.local_ms() - 10_000).abs() <= 5);
        // ... a narrower one does.
        clock.observe(local - 3_000, local, local);
        let (gate, uncertainty) = clock.gate_now().unwrap();
        assert!((gate - clock.local_ms() + 3_000).abs() <= 5, "{gate}");
        assert_eq!(uncertainty, 1);
    }

    #[test]
    fn an_ended_sale_is_refused_until_forgotten() {
        let w = windows(0);
        let end = system_ms() - 1_000;
        let g = w.begin_load("A", Refusal::SaleEnded, end).unwrap();
        w.install("A", g, set(&["alice"]));
        assert!(matches!(
            w.verdict("A", "bob"),
            WindowVerdict::Refuse {
                refusal: Refusal::SaleEnded,
                ..
            }
        ));
        assert_eq!(w.verdict("A", "alice"), WindowVerdict::Open);
        w.forget("A");
        assert_eq!(w.verdict("A", "bob"), WindowVerdict::Open);
    }

    #[test]
    fn a_list_read_before_a_forget_is_not_installed() {
        let w = windows(0);
        let start = system_ms() + 60_000;
        let g = w.begin_load("A", Refusal::SaleNotStarted, start).unwrap();
        w.forget("Z");
        w.install("A", g, set(&[]));
        assert_eq!(w.verdict("A", "bob"), WindowVerdict::Open);
        let g = w.begin_load("A", Refusal::SaleNotStarted, start).unwrap();
        w.abandon("A", g);
        assert_eq!(w.verdict("A", "bob"), WindowVerdict::Open);
        assert!(w.begin_load("A", Refusal::SaleNotStarted, start).is_some());
        // A new window (another opening) starts a new read.
        let g = w.begin_load("B", Refusal::SaleNotStarted, start).unwrap();
        w.install("B", g, set(&[]));
        assert!(
            w.begin_load("B", Refusal::SaleNotStarted, start + 1)
                .is_some()
        );
        w.clear();
        assert_eq!(w.verdict("B", "bob"), WindowVerdict::Open);
    }

    #[test]
    fn without_the_gate_s_clock_nothing_is_refused() {
        let w = SaleWindows::new(GateClock::new(Failpoints::default()));
        let g = w
            .begin_load("A", Refusal::SaleNotStarted, system_ms() + 60_000)
            .unwrap();
        w.install("A", g, set(&[]));
        assert_eq!(w.verdict("A", "bob"), WindowVerdict::Open);
    }
}
