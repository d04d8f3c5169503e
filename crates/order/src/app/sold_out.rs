//! The sold-out short-circuit (docs/adr/0005-sold-out-memory.md,
//! docs/architecture.md#operations): once the gate answers SOLD_OUT for a product,
//! this replica refuses further requests for it from memory — no Redis, no database, no network
//! — for `saga.sold_out_cache_ms`.
//!
//! Refusing from memory must not break invariant 5 (a replay of an accepted request returns its
//! order). So the entry is only trusted once it holds the product's *possible replayers*: the
//! users the gate counts as buyers (read atomically with the counter at zero, so it includes
//! orders still being written on any replica) together with the users that have an order for it
//! in this service's database (which includes cancelled orders, whose units left the gate's
//! count). A request from one of them goes to the gate as usual — it answers replays exactly —
//! and everyone else is refused at once. While the list is being read, requests go to the gate —
//! except while a list that expired less than a TTL ago is read again: the previous one keeps
//! answering meanwhile, until one TTL after it expired (units coming back through an event
//! remove it at once).
//!
//! A new buyer can only appear after units come back (a cancellation, a restock); every replica
//! hears of that through the `stock.released`, `stock.adjusted`, `stock.reservation_failed`
//! and `stock.gate_refilled` (a repair or rebuild that raised the gate) events (a broadcast
//! subscription per replica) and forgets the product, and the entry's short life bounds the
//! rest.
//!
//! Re-reading a list when it expires would cost the gate, the database and this replica a read
//! of every buyer, every TTL, on every replica, for as long as requests keep coming (with
//! 100,000 buyers, a few tens of milliseconds of each per second). So a list keeps the gate's
//! *refills count* it was read with, and the re-read first asks the gate whether that count
//! moved (it moves whenever units may come back: a release, an adjustment, a repair, a
//! rebuild). If it did not and the counter is still at zero, nobody can have bought since, and
//! the same list is kept for another TTL without reading anything else.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, RwLock},
    time::Duration,
};

use tokio::time::Instant;

/// What the cache says about one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing known: ask the gate.
    Open,
    /// Sold out, and this user cannot be replaying an accepted request: refuse now.
    Refuse,
    /// Sold out, but this user bought (or the list is not ready): ask the gate, which answers
    /// a replay with its order.
    AskGate,
}

#[derive(Debug)]
enum Entry {
    /// Sold out; the possible replayers are being read (since then). A re-read of a list that
    /// expired less than a TTL ago keeps serving that list meanwhile (until `stale.1`, one TTL
    /// after it expired): asking the gate for every request during each re-read made a hiccup
    /// in the refusals' latency every TTL.
    Loading {
        since: Instant,
        generation: u64,
        stale: Option<(Arc<HashSet<String>>, Instant)>,
    },
    /// Sold out until `until`, with who may be replaying and the gate's refills count when
    /// they were read.
    Ready {
        until: Instant,
        replayers: Arc<HashSet<String>>,
        refills: String,
    },
}

/// A load to run: see [`SoldOutCache::begin_load`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Load {
    /// Pass back to [`SoldOutCache::install`] or [`SoldOutCache::abandon`].
    pub generation: u64,
    /// The list that just expired, with the gate's refills count it was read with: if the
    /// count has not moved and the product is still sold out, install it again as it is.
    pub previous: Option<(Arc<HashSet<String>>, String)>,
}

/// The per-replica sold-out memory. Cheap to clone.
#[derive(Clone, Debug)]
pub struct SoldOutCache {
    inner: Arc<RwLock<State>>,
    ttl: Duration,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<String, Entry>,
    /// Bumped by every [`SoldOutCache::forget`]: a list read before it is stale.
    generation: u64,
}

/// Most products remembered at once (old entries are dropped beyond it).
const MAX_ENTRIES: usize = 10_000;
/// A list still not read after this long is given up (the next SOLD_OUT starts another).
const LOAD_TIMEOUT: Duration = Duration::from_secs(10);

impl SoldOutCache {
    /// `ttl` zero disables the cache.
    pub fn new(ttl: Duration) -> Self {
        Self {
            inner: Arc::default(),
            ttl,
        }
    }

    pub fn verdict(&self, sku: &str, user_id: &str) -> Verdict {
        let Ok(state) = self.inner.read() else {
            return Verdict::Open;
        };
        match state.entries.get(sku) {
            None => Verdict::Open,
            Some(Entry::Loading {
                stale: Some((replayers, until)),
                ..
            }) if *until > Instant::now() => {
                if replayers.contains(user_id) {
                    Verdict::AskGate
                } else {
                    Verdict::Refuse
                }
            }
            Some(Entry::Loading { .. }) => Verdict::AskGate,
            Some(Entry::Ready {
                until, replayers, ..
            }) => {
                if *until <= Instant::now() {
                    Verdict::Open
                } else if replayers.contains(user_id) {
                    Verdict::AskGate
                } else {
                    Verdict::Refuse
                }
            }
        }
    }

    /// The gate answered SOLD_OUT for `sku`: `Some(load)` when the caller should read the
    /// possible replayers (or check that the list that just expired still holds) and
    /// [`install`](Self::install) them; `None` when that is already under way or fresh (or the
    /// cache is off).
    pub fn begin_load(&self, sku: &str) -> Option<Load> {
        if self.ttl.is_zero() {
            return None;
        }
        let mut state = self.inner.write().ok()?;
        let now = Instant::now();
        let busy = match state.entries.get(sku) {
            Some(Entry::Loading { since, .. }) => now.duration_since(*since) < LOAD_TIMEOUT,
            Some(Entry::Ready { until, .. }) => *until > now,
            None => false,
        };
        if busy {
            return None;
        }
        if state.entries.len() >= MAX_ENTRIES {
            state.entries.retain(|_, e| match e {
                Entry::Loading { since, .. } => now.duration_since(*since) < LOAD_TIMEOUT,
                Entry::Ready { until, .. } => *until > now,
            });
        }
        let generation = state.generation;
        // Only a list that expired less than a TTL ago keeps answering, and only until then:
        // one that expired long ago may predate units that came back without an event.
        let (stale, previous) = match state.entries.remove(sku) {
            Some(Entry::Ready {
                replayers,
                until,
                refills,
            }) if until + self.ttl > now => (
                Some((replayers.clone(), until + self.ttl)),
                (!refills.is_empty()).then_some((replayers, refills)),
            ),
            _ => (None, None),
        };
        state.entries.insert(
            sku.to_owned(),
            Entry::Loading {
                since: now,
                generation,
                stale,
            },
        );
        Some(Load {
            generation,
            previous,
        })
    }

    /// Installs the possible replayers read for the load started at `generation`, with the
    /// gate's refills count read with them; ignored if the product was forgotten since (units
    /// came back while reading).
    pub fn install(
        &self,
        sku: &str,
        generation: u64,
        replayers: impl Into<Arc<HashSet<String>>>,
        refills: &str,
    ) {
        let Ok(mut state) = self.inner.write() else {
            return;
        };
        let current = matches!(state.entries.get(sku),
            Some(Entry::Loading { generation: g, .. }) if *g == generation);
        if !current {
            return;
        }
        if state.generation == generation {
            let until = Instant::now() + self.ttl;
            state.entries.insert(
                sku.to_owned(),
                Entry::Ready {
                    until,
                    replayers: replayers.into(),
                    refills: refills.to_owned(),
                },
            );
        } else {
            // Stale: the next SOLD_OUT starts a fresh read.
            state.entries.remove(sku);
        }
    }

    /// The load started at `generation` failed or found the product not sold out.
    pub fn abandon(&self, sku: &str, generation: u64) {
        if let Ok(mut state) = self.inner.write()
            && matches!(state.entries.get(sku),
                Some(Entry::Loading { generation: g, .. }) if *g == generation)
        {
            state.entries.remove(sku);
        }
    }

    /// Units of `sku` may have come back: stop refusing it from memory.
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

    #[tokio::test]
    async fn refuses_only_users_who_cannot_be_replaying() {
        let c = SoldOutCache::new(Duration::from_secs(60));
        assert_eq!(c.verdict("A", "bob"), Verdict::Open);
        let g = c.begin_load("A").unwrap().generation;
        assert_eq!(
            c.verdict("A", "bob"),
            Verdict::AskGate,
            "loading asks the gate"
        );
        assert_eq!(c.begin_load("A"), None, "one load at a time");
        c.install("A", g, set(&["alice"]), "");
        assert_eq!(c.verdict("A", "alice"), Verdict::AskGate);
        assert_eq!(c.verdict("A", "bob"), Verdict::Refuse);
        assert_eq!(c.verdict("B", "bob"), Verdict::Open);
    }

    #[tokio::test]
    async fn a_list_read_before_units_came_back_is_not_installed() {
        let c = SoldOutCache::new(Duration::from_secs(60));
        let g = c.begin_load("A").unwrap().generation;
        c.forget("A");
        c.install("A", g, set(&[]), "");
        assert_eq!(c.verdict("A", "bob"), Verdict::Open);
        // Forgetting another product also makes an older list stale (the generation is global).
        let g = c.begin_load("A").unwrap().generation;
        c.forget("Z");
        c.install("A", g, set(&[]), "");
        assert_eq!(
            c.verdict("A", "bob"),
            Verdict::Open,
            "a stale list is dropped"
        );
        let g = c.begin_load("A").unwrap().generation;
        c.abandon("A", g);
        assert_eq!(c.verdict("A", "bob"), Verdict::Open);
        assert!(
            c.begin_load("A").is_some(),
            "an abandoned load can start again"
        );
    }

    #[tokio::test]
    async fn entries_expire_and_can_be_cleared() {
        let c = SoldOutCache::new(Duration::from_millis(30));
        let g = c.begin_load("A").unwrap().generation;
        c.install("A", g, set(&[]), "");
        assert_eq!(c.verdict("A", "bob"), Verdict::Refuse);
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert_eq!(c.verdict("A", "bob"), Verdict::Open);
        let g = c.begin_load("A").unwrap().generation;
        c.install("A", g, set(&[]), "");
        c.clear();
        assert_eq!(c.verdict("A", "bob"), Verdict::Open);
    }

    #[tokio::test]
    async fn an_expired_list_keeps_refusing_while_it_is_read_again_unless_units_came_back() {
        let ttl = Duration::from_millis(200);
        let c = SoldOutCache::new(ttl);
        let g = c.begin_load("A").unwrap().generation;
        c.install("A", g, set(&["alice"]), "");
        tokio::time::sleep(Duration::from_millis(250)).await;
        // Expired (50 ms ago): the next request asks the gate, whose SOLD_OUT starts a re-read ...
        assert_eq!(c.verdict("A", "bob"), Verdict::Open);
        let g = c.begin_load("A").unwrap().generation;
        // ... during which the previous list still answers.
        assert_eq!(c.verdict("A", "bob"), Verdict::Refuse);
        assert_eq!(c.verdict("A", "alice"), Verdict::AskGate);
        c.install("A", g, set(&["alice", "carol"]), "");
        assert_eq!(c.verdict("A", "carol"), Verdict::AskGate);
        // Units coming back during a re-read drop the old list at once.
        tokio::time::sleep(Duration::from_millis(250)).await;
        let _ = c.begin_load("A").unwrap().generation;
        assert_eq!(c.verdict("A", "bob"), Verdict::Refuse);
        c.forget("A");
        assert_eq!(c.verdict("A", "bob"), Verdict::Open);
        // A list that expired more than a TTL ago answers nothing: the re-read asks the gate.
        let g = c.begin_load("A").unwrap().generation;
        c.install("A", g, set(&[]), "");
        tokio::time::sleep(Duration::from_millis(450)).await;
        let _ = c.begin_load("A").unwrap().generation;
        assert_eq!(c.verdict("A", "bob"), Verdict::AskGate);
        // A re-read that takes too long stops serving the old list one TTL after it expired.
        c.forget("A");
        let g = c.begin_load("A").unwrap().generation;
        c.install("A", g, set(&[]), "");
        tokio::time::sleep(Duration::from_millis(250)).await;
        let _ = c.begin_load("A").unwrap().generation;
        assert_eq!(c.verdict("A", "bob"), Verdict::Refuse);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(c.verdict("A", "bob"), Verdict::AskGate);
    }

    #[tokio::test]
    async fn an_expired_list_is_offered_back_with_its_refills_count_to_check() {
        let ttl = Duration::from_millis(200);
        let c = SoldOutCache::new(ttl);
        let g = c.begin_load("A").unwrap();
        assert_eq!(g.previous, None, "nothing to check the first time");
        c.install("A", g.generation, set(&["alice"]), "42");
        tokio::time::sleep(Duration::from_millis(250)).await;
        let load = c.begin_load("A").unwrap();
        let (list, refills) = load.previous.clone().unwrap();
        assert_eq!((*list).clone(), set(&["alice"]));
        assert_eq!(refills, "42");
        // Kept as it is: the same list answers for another TTL.
        c.install("A", load.generation, list, &refills);
        assert_eq!(c.verdict("A", "bob"), Verdict::Refuse);
        assert_eq!(c.verdict("A", "alice"), Verdict::AskGate);
        // A list read from a gate without a refills count is never kept: always read again.
        c.forget("A");
        let g = c.begin_load("A").unwrap();
        c.install("A", g.generation, set(&[]), "");
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(c.begin_load("A").unwrap().previous, None);
        // Nor one that expired more than a TTL ago.
        c.forget("A");
        let g = c.begin_load("A").unwrap();
        c.install("A", g.generation, set(&[]), "7");
        tokio::time::sleep(Duration::from_millis(450)).await;
        assert_eq!(c.begin_load("A").unwrap().previous, None);
        // Units coming back while the check runs drop whatever it installs.
        c.forget("A");
        let g = c.begin_load("A").unwrap();
        c.install("A", g.generation, set(&[]), "7");
        tokio::time::sleep(Duration::from_millis(250)).await;
        let load = c.begin_load("A").unwrap();
        c.forget("A");
        let (list, refills) = load.previous.unwrap();
        c.install("A", load.generation, list, &refills);
        assert_eq!(c.verdict("A", "bob"), Verdict::Open);
    }

    #[tokio::test]
    async fn a_zero_ttl_disables_the_cache() {
        let c = SoldOutCache::new(Duration::ZERO);
        assert_eq!(c.begin_load("A"), None);
        assert_eq!(c.verdict("A", "bob"), Verdict::Open);
    }
}
