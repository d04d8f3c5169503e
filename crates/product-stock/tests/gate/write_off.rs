//! An admin's write-off against the gate: refused without a trace unless its units are free,
//! spread over stock buckets so that the `stock.adjusted` replay changes nothing, and a refusal
//! gives back what an earlier attempt of the same request took.

use deadpool_redis::redis;
use flashsale_product_stock::infra::gate::{AdjustOutcome, At, LoadOutcome, WriteOffOutcome};

use crate::helpers::{NOW, SKU, TestGate};

impl TestGate {
    async fn bucket_avails(&self, buckets: u32) -> Vec<(i64, i64)> {
        self.gate
            .bucket_states(SKU, buckets)
            .await
            .unwrap()
            .into_iter()
            .map(|s| {
                let s = s.expect("every bucket is loaded");
                (s.available, s.held)
            })
            .collect()
    }
}

#[tokio::test]
async fn a_write_off_counts_unpersisted_holds_and_a_refusal_leaves_no_marker() {
    let t = TestGate::new();
    t.loaded(SKU, 10).await;
    for user in ["a", "b", "c"] {
        t.reserve(SKU, user, 1).await;
    }
    let generation = t.gate.product_generation(SKU, 1).await.unwrap();
    // The database has 10 free: the gate's 7 available are what a write-off may take.
    assert_eq!(
        t.gate
            .write_off_product(SKU, 1, "w", 8, &generation, 10)
            .await
            .unwrap(),
        WriteOffOutcome::Refused { free: 7 }
    );
    // A database figure below the gate's (a write-off committed whose gate step failed)
    // bounds it too.
    assert_eq!(
        t.gate
            .write_off_product(SKU, 1, "w", 7, &generation, 9)
            .await
            .unwrap(),
        WriteOffOutcome::Refused { free: 6 }
    );
    let marker: Option<String> = t
        .query(redis::cmd("GET").arg(t.keys(SKU).adjustment("w")))
        .await;
    assert_eq!(marker, None);
    assert_eq!(
        t.gate
            .write_off_product(SKU, 1, "w", 7, &generation, 10)
            .await
            .unwrap(),
        WriteOffOutcome::Applied
    );
    assert_eq!(t.snapshot(SKU).await.available, 0);
    assert_eq!(t.snapshot(SKU).await.held, 3);
    // The stock.adjusted event's replay changes nothing.
    assert_eq!(
        t.gate
            .adjust_in_generation(SKU, "w", -7, &generation)
            .await
            .unwrap(),
        AdjustOutcome::Duplicate
    );
    assert_eq!(t.snapshot(SKU).await.available, 0);
    t.cleanup().await;
}

#[tokio::test]
async fn a_bucketed_write_off_replays_to_nothing_and_a_refusal_gives_back_an_earlier_attempt() {
    let t = TestGate::new();
    let loaded = t
        .gate
        .load_product(SKU, 4, 12, &[], &[], NOW)
        .await
        .unwrap();
    assert!(matches!(loaded, LoadOutcome::Loaded { .. }), "{loaded:?}");
    let generation = t.gate.product_generation(SKU, 4).await.unwrap();
    // Bucket 0 is empty: the write-off passes it by and takes from the next ones.
    t.gate.adjust(At::new(SKU, 0), "empty", -3).await.unwrap();
    assert_eq!(
        t.gate
            .write_off_product(SKU, 4, "w", 5, &generation, 9)
            .await
            .unwrap(),
        WriteOffOutcome::Applied
    );
    assert_eq!(t.bucket_avails(4).await, [(0, 0), (0, 0), (1, 0), (3, 0)]);
    // A unit back in bucket 0 meanwhile: the replay still takes exactly what each bucket
    // took the first time.
    t.gate.adjust(At::new(SKU, 0), "back", 1).await.unwrap();
    assert_eq!(
        t.gate
            .adjust_product(SKU, 4, "w", -5, &generation)
            .await
            .unwrap(),
        AdjustOutcome::Duplicate
    );
    assert_eq!(t.bucket_avails(4).await, [(1, 0), (0, 0), (1, 0), (3, 0)]);

    // An attempt that took its units and whose commit then failed, retried when it no longer
    // fits: refused, and its units go back, so a retry after is judged afresh.
    assert_eq!(
        t.gate
            .write_off_product(SKU, 4, "x", 4, &generation, 5)
            .await
            .unwrap(),
        WriteOffOutcome::Applied
    );
    assert_eq!(t.bucket_avails(4).await, [(0, 0), (0, 0), (0, 0), (1, 0)]);
    assert_eq!(
        t.gate
            .write_off_product(SKU, 4, "x", 4, &generation, 0)
            .await
            .unwrap(),
        WriteOffOutcome::Refused { free: 0 }
    );
    assert_eq!(t.bucket_avails(4).await, [(1, 0), (0, 0), (1, 0), (3, 0)]);
    assert_eq!(
        t.gate
            .write_off_product(SKU, 4, "x", 2, &generation, 5)
            .await
            .unwrap(),
        WriteOffOutcome::Applied
    );
    assert_eq!(t.bucket_avails(4).await, [(0, 0), (0, 0), (0, 0), (3, 0)]);
    t.cleanup().await;
}
