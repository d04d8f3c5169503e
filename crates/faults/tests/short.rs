//! The short tier of the fault suite, run by `scripts/test.sh`: a SIGKILL of the order service
//! mid-flood, a process killed by a failpoint between the gate and the order's commit, and two
//! replicas of every service with one replica of each SIGKILLed mid-sale, then SIGTERMed
//! mid-sale (a graceful stop that must exit 0), each on private servers, each checked against
//! every invariant. The full suite is `scripts/faults.sh`.

use flashsale_faults::scenario::{self, SharedBroker};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_killed_mid_flood_at_the_order_commit_and_one_replica_of_each_keeps_every_promise() {
    let broker = SharedBroker::start().await.expect("start a RabbitMQ node");
    let mut failed = Vec::new();
    for name in [
        "order_sigkill",
        "fp_order_before_write",
        "replica_kill",
        "replica_sigterm",
    ] {
        let f = scenario::run(name, 7, Some(&broker))
            .await
            .unwrap_or_else(|e| panic!("{name} could not run: {e:#}"));
        if !f.pass() {
            failed.push(f.line(name));
        }
    }
    assert!(
        failed.is_empty(),
        "scenarios failed:\n{}",
        failed.join("\n")
    );
}
