use flashsale_messaging::{AmqpConfig, Broker, QueueTopology, QueueType, keys};
use flashsale_test_support::{rabbit_cluster::RabbitCluster, unique_name};

#[tokio::test]
async fn quorum_queues_get_a_replica_on_every_node_whichever_node_declares_them() {
    let cluster = RabbitCluster::start().await.unwrap();
    eprintln!(
        "cluster of {} nodes started in {:?}",
        cluster.len(),
        cluster.started_in()
    );
    let config = AmqpConfig {
        url: cluster.url(1),
        exchange: unique_name("fs_cl_ex"),
        queue_prefix: format!("{}.", unique_name("fs_cl")),
        queue_type: QueueType::Quorum,
        max_attempts: 2,
        retry_base_ms: 50,
        ..AmqpConfig::default()
    };
    let broker = Broker::connect(config.clone()).await.unwrap();
    let t = QueueTopology::new(&config, "orders", &[keys::ORDER_CREATED]);
    t.declare(&broker.channel().await.unwrap()).await.unwrap();
    let q = cluster.quorum_queue(t.queue()).await.unwrap();
    eprintln!("{q:?}");
    let mut members = q.members.clone();
    members.sort_unstable();
    assert_eq!(members, vec![0, 1, 2]);
    assert!(q.leader.is_some());
}
