use flashsale_messaging::{Broker, DelayQueue, QueueTopology, keys};
use flashsale_test_support::rabbit_cluster::RabbitCluster;

use crate::helpers::config;

#[tokio::test]
async fn quorum_queues_get_a_replica_on_every_node_whichever_node_declares_them() {
    let cluster = RabbitCluster::start().await.unwrap();
    eprintln!(
        "cluster of {} nodes started in {:?}",
        cluster.len(),
        cluster.started_in()
    );
    let config = config(&cluster);
    let t = QueueTopology::new(&config, "orders", &[keys::ORDER_CREATED]);
    let dq = DelayQueue::new(
        &config,
        keys::ORDER_CREATED,
        std::time::Duration::from_secs(5),
    );
    // The same declarations through each node in turn: the first creates the queues, the other
    // two find them identical (a different argument would close the channel).
    for node in 0..cluster.len() {
        let one = flashsale_messaging::AmqpConfig {
            urls: vec![cluster.url(node)],
            ..config.clone()
        };
        let broker = Broker::connect(one).await.unwrap();
        assert_eq!(broker.node_url(), Some(cluster.url(node)));
        let channel = broker.channel().await.unwrap();
        t.declare(&channel).await.unwrap();
        dq.declare(&channel).await.unwrap();
        broker.close().await;
    }
    let mut queues = vec![
        t.queue().to_owned(),
        t.dead_letter_queue(),
        dq.name().to_owned(),
    ];
    queues.extend((1..=t.retries()).map(|i| t.retry_queue(i)));
    for q in queues {
        let placement = cluster.quorum_queue(&q).await.unwrap();
        let mut members = placement.members.clone();
        members.sort_unstable();
        assert_eq!(members, vec![0, 1, 2], "{q}: {placement:?}");
        assert!(placement.leader.is_some(), "{q}: {placement:?}");
    }
}
