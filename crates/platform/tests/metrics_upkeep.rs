//! A service nobody scrapes keeps flat memory: what its histograms record is drained into their
//! buckets by the recorder's upkeep, not held as a list of samples until a scrape comes. This
//! test runs in a process of its own, so the resident memory it reads is the recorder's and
//! its samples', and it never renders `/metrics`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use flashsale_platform::metrics::{UPKEEP, handle, process_usage, upkeeps};

/// Samples per round: at least 16 MiB of them, were they kept (about 31 MiB when the upkeep
/// is taken out).
const PER_ROUND: u32 = 2_000_000;
const MIB: f64 = 1024.0 * 1024.0;

fn resident_mib() -> f64 {
    process_usage().expect("/proc/self is readable").1 / MIB
}

/// Blocks until two upkeeps have run from now: the second began after every sample recorded
/// before this call, so it drained them.
fn wait_for_upkeep() {
    let seen = upkeeps();
    let deadline = Instant::now() + UPKEEP * 4;
    while upkeeps() < seen + 2 {
        assert!(
            Instant::now() < deadline,
            "no upkeep ran in {:?}",
            UPKEEP * 4
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn an_unscraped_recorders_memory_stays_flat_while_its_histograms_record() {
    handle().unwrap();
    let latency = metrics::histogram!("flashsale_upkeep_test_seconds", "method" => "Test");
    let round = || {
        for i in 0..PER_ROUND {
            latency.record(f64::from(i % 1_000) / 10_000.0);
        }
        wait_for_upkeep();
        resident_mib()
    };
    // The first round grows what the process needs once (the recorder, its buckets, the
    // allocator's arenas); the rounds after it must not add to that.
    let first = round();
    let mut after = Vec::new();
    for _ in 0..3 {
        after.push(round());
    }
    let grown = after.last().copied().unwrap_or(first) - first;
    println!("resident after each round: {first:.1} MiB, then {after:.1?} MiB");
    assert!(
        grown < 8.0,
        "resident memory grew by {grown:.1} MiB over {} unscraped rounds of {PER_ROUND} samples \
         (each would keep at least 16 MiB): {first:.1} MiB, then {after:.1?} MiB",
        after.len()
    );
}
