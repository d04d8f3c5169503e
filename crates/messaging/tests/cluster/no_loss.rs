use std::time::{Duration, Instant};

use flashsale_messaging::{
    Broker, Consumer, OutboxRelay, Publisher, QueueTopology, RelayOptions, keys, outbox,
};
use flashsale_test_support::{eventually, rabbit_cluster::RabbitCluster};
use sea_orm::TransactionTrait;

use crate::helpers::{Running, Tally, config, count, database, effect_handler, ids, order_created};

/// Orders written to the outbox, in transactions of `PER_BATCH`.
const BATCHES: usize = 80;
const PER_BATCH: usize = 25;
/// The batch after which the queue's leader is killed.
const KILL_AFTER: usize = BATCHES / 3;

#[tokio::test]
async fn killing_the_node_leading_a_queue_mid_sale_loses_no_confirmed_message() {
    let mut cluster = RabbitCluster::start().await.unwrap();
    let (_tdb, db) = database().await;
    let config = config(&cluster);
    // One connection for the service, as in production: relay and consumer share it.
    let broker = Broker::connect(config.clone()).await.unwrap();
    let home = cluster.index_of(&broker.node_url().unwrap()).unwrap();
    let t = QueueTopology::new(&config, "sale", &[keys::ORDER_CREATED]);
    t.declare(&broker.channel().await.unwrap()).await.unwrap();
    let before = cluster.quorum_queue(t.queue()).await.unwrap();
    let leader = before.leader.expect("a leader once declared");
    assert_eq!(before.members.len(), 3, "{before:?}");
    // RabbitMQ starts a quorum queue's leader on the node that declared it: killing the leader
    // also cuts the service's connection, so the relay and the consumer must fail over too.
    assert_eq!(
        leader, home,
        "the queue is led by the service's node: {before:?}"
    );

    let tally = Tally::default();
    let consumer = Consumer::new(
        &broker,
        t.clone(),
        effect_handler(db.clone(), tally.clone()),
    );
    let consumer = Running::spawn(|s| consumer.run(s));
    let relay = OutboxRelay::new(&db, Publisher::new(&broker))
        .unwrap()
        .with_options(RelayOptions {
            batch_size: 50,
            poll_interval: Duration::from_millis(200),
            ..RelayOptions::default()
        });
    let relay = Running::spawn(|s| relay.run(s));

    let mut killed_at = None;
    for b in 0..BATCHES {
        let envs: Vec<_> = (0..PER_BATCH)
            .map(|i| order_created(&format!("o-{b}-{i}")))
            .collect();
        let txn = db.begin().await.unwrap();
        outbox::enqueue_many(&txn, &envs).await.unwrap();
        txn.commit().await.unwrap();
        if b == KILL_AFTER {
            // Mid-sale: messages are flowing when the leader dies.
            eventually(Duration::from_secs(30), "the first effects", || async {
                (count(&db, "SELECT count(*) AS n FROM effects").await > 0).then_some(())
            })
            .await
            .unwrap();
            killed_at = Some(Instant::now());
            cluster.kill(leader).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let killed_at = killed_at.unwrap();
    let total = i64::try_from(BATCHES * PER_BATCH).unwrap();

    eventually(
        Duration::from_secs(120),
        "every row confirmed and applied",
        || async {
            let unconfirmed = count(
                &db,
                "SELECT count(*) AS n FROM outbox WHERE published_at IS NULL",
            )
            .await;
            let applied = count(&db, "SELECT count(DISTINCT message_id) AS n FROM effects").await;
            (unconfirmed == 0 && applied == total).then_some(())
        },
    )
    .await
    .unwrap();
    let drained = killed_at.elapsed();
    relay.stop().await;
    consumer.stop().await;

    let confirmed = ids(
        &db,
        "SELECT message_id AS id FROM outbox WHERE published_at IS NOT NULL",
    )
    .await;
    let applied = ids(&db, "SELECT message_id AS id FROM effects").await;
    assert_eq!(confirmed.len(), BATCHES * PER_BATCH);
    assert_eq!(
        applied, confirmed,
        "every confirmed message applied, nothing else"
    );
    assert_eq!(
        count(&db, "SELECT count(*) AS n FROM effects").await,
        total,
        "the inbox applied each message once"
    );
    assert_eq!(
        tally.calls(),
        tally.duplicates() + BATCHES as u64 * PER_BATCH as u64
    );
    let after = cluster.quorum_queue(t.queue()).await.unwrap();
    assert!(
        after.leader.is_some_and(|l| l != leader),
        "a surviving node leads the queue: {after:?}"
    );
    eprintln!(
        "connection on node {home}, leader node {leader} killed, new leader {:?}, now on {:?}; \
         {} confirmed, {} applied, {} handler calls, {} duplicates kept out by the inbox; \
         everything applied {drained:?} after the kill",
        after.leader,
        broker.node_url().and_then(|u| cluster.index_of(&u)),
        confirmed.len(),
        applied.len(),
        tally.calls(),
        tally.duplicates()
    );
}
