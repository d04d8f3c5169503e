use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex},
    time::Instant,
};

use flashsale_messaging::{Broker, Consumer, Incoming, Publisher, QueueTopology, broadcast, keys};
use flashsale_test_support::{eventually, rabbit_cluster::RabbitCluster};

use crate::helpers::{Running, WAIT, config, order_created};

#[tokio::test]
async fn connections_start_on_different_nodes_and_skip_a_dead_one() {
    let mut cluster = RabbitCluster::start().await.unwrap();
    let config = config(&cluster);
    let mut seen = BTreeSet::new();
    for _ in 0..20 {
        let broker = Broker::connect(config.clone()).await.unwrap();
        seen.insert(broker.node_url().unwrap());
        broker.close().await;
    }
    assert!(seen.len() > 1, "twenty connections all went to {seen:?}");

    cluster.kill(0).await.unwrap();
    for _ in 0..10 {
        let broker = Broker::connect(config.clone()).await.unwrap();
        let node = broker.node_url().unwrap();
        assert_ne!(node, cluster.url(0), "connected to the killed node");
        broker.close().await;
    }
}

#[tokio::test]
async fn a_connection_fails_over_to_a_surviving_node_when_its_node_dies() {
    let mut cluster = RabbitCluster::start().await.unwrap();
    let config = config(&cluster);
    let broker = Broker::connect(config.clone()).await.unwrap();
    let first = broker.node_url().unwrap();
    let dead = cluster.index_of(&first).unwrap();
    let t = QueueTopology::new(&config, "failover", &[keys::ORDER_CREATED]);
    t.declare(&broker.channel().await.unwrap()).await.unwrap();

    // A work-queue consumer and a broadcast subscriber on the same connection: the first
    // reads a quorum queue, the second its own exclusive classic queue on `first`'s node.
    let consumed: Arc<Mutex<Vec<String>>> = Arc::default();
    let rec = consumed.clone();
    let consumer = Consumer::new(&broker, t.clone(), move |m: Incoming| {
        rec.lock().unwrap().push(m.envelope.correlation_id.clone());
        async { Ok(()) }
    });
    let consumer = Running::spawn(|s| consumer.run(s));
    let heard: Arc<Mutex<Vec<String>>> = Arc::default();
    let subscriptions: Arc<Mutex<u32>> = Arc::default();
    let (h, n, b) = (heard.clone(), subscriptions.clone(), broker.clone());
    let subscriber = Running::spawn(move |s| {
        broadcast::run(
            b,
            vec![keys::ORDER_CREATED.to_owned()],
            move |env| h.lock().unwrap().push(env.correlation_id),
            move || *n.lock().unwrap() += 1,
            s,
        )
    });
    let has =
        |list: &Arc<Mutex<Vec<String>>>, id: &str| list.lock().unwrap().iter().any(|c| c == id);

    eventually(WAIT, "the broadcast subscription", || async {
        (*subscriptions.lock().unwrap() == 1).then_some(())
    })
    .await
    .unwrap();
    let publisher = Publisher::new(&broker);
    publisher
        .publish_envelope(&order_created("before"))
        .await
        .unwrap();
    eventually(WAIT, "the first message consumed and heard", || async {
        (has(&consumed, "before") && has(&heard, "before")).then_some(())
    })
    .await
    .unwrap();

    let killed_at = Instant::now();
    cluster.kill(dead).await.unwrap();
    let now_on = eventually(WAIT, "a connection to a surviving node", || async {
        broker.node_url().filter(|u| *u != first)
    })
    .await
    .unwrap();
    eprintln!(
        "connection moved from node {dead} to node {:?} in {:?}",
        cluster.index_of(&now_on),
        killed_at.elapsed()
    );

    // The publisher re-opens its channel; until the queue has a new leader the broker nacks.
    eventually(WAIT, "a confirmed publish after the failover", || async {
        publisher
            .publish_envelope(&order_created("after"))
            .await
            .ok()
    })
    .await
    .unwrap();
    eventually(
        WAIT,
        "the consumer and the subscriber to resume",
        || async { (has(&consumed, "after") && has(&heard, "after")).then_some(()) },
    )
    .await
    .unwrap();
    eprintln!(
        "consumer and subscriber resumed {:?} after the kill",
        killed_at.elapsed()
    );
    // The broadcast queue died with its node; the subscriber declared a new one and said so.
    assert_eq!(*subscriptions.lock().unwrap(), 2);

    // The node comes back on its data and its replica of the work queue runs again.
    cluster.restart(dead).await.unwrap();
    eventually(WAIT, "the restarted node's replica online", || async {
        let q = cluster.quorum_queue(t.queue()).await.ok()?;
        q.online.contains(&dead).then_some(())
    })
    .await
    .unwrap();
    publisher
        .publish_envelope(&order_created("back"))
        .await
        .unwrap();
    eventually(WAIT, "a message after the node came back", || async {
        (has(&consumed, "back") && has(&heard, "back")).then_some(())
    })
    .await
    .unwrap();
    assert_eq!(broker.node_url(), Some(now_on), "no move back needed");
    consumer.stop().await;
    subscriber.stop().await;
}

#[tokio::test]
async fn a_consumer_on_a_surviving_node_keeps_consuming_when_its_queue_leader_dies() {
    let mut cluster = RabbitCluster::start().await.unwrap();
    let config = config(&cluster);
    let t = QueueTopology::new(&config, "follower", &[keys::ORDER_CREATED]);
    let declarer = Broker::connect(config.clone()).await.unwrap();
    t.declare(&declarer.channel().await.unwrap()).await.unwrap();
    declarer.close().await;
    let leader = cluster
        .quorum_queue(t.queue())
        .await
        .unwrap()
        .leader
        .unwrap();
    // The consumer's and the publisher's connections go to the other two nodes only.
    let survivors = flashsale_messaging::AmqpConfig {
        urls: (0..cluster.len())
            .filter(|i| *i != leader)
            .map(|i| cluster.url(i))
            .collect(),
        ..config.clone()
    };
    let broker = Broker::connect(survivors).await.unwrap();
    let node = broker.node_url().unwrap();

    let consumed: Arc<Mutex<Vec<String>>> = Arc::default();
    let rec = consumed.clone();
    let consumer = Consumer::new(&broker, t.clone(), move |m: Incoming| {
        rec.lock().unwrap().push(m.envelope.correlation_id.clone());
        async { Ok(()) }
    });
    let consumer = Running::spawn(|s| consumer.run(s));
    let has = |id: &str| consumed.lock().unwrap().iter().any(|c| c == id);
    let publisher = Publisher::new(&broker);
    publisher
        .publish_envelope(&order_created("before"))
        .await
        .unwrap();
    eventually(WAIT, "the first message", || async {
        has("before").then_some(())
    })
    .await
    .unwrap();

    let killed_at = Instant::now();
    cluster.kill(leader).await.unwrap();
    eventually(WAIT, "a confirmed publish after the election", || async {
        publisher
            .publish_envelope(&order_created("after"))
            .await
            .ok()
    })
    .await
    .unwrap();
    eventually(
        WAIT,
        "the consumer to get the message published after",
        || async { has("after").then_some(()) },
    )
    .await
    .unwrap();
    eprintln!(
        "leader node {leader} killed; the consumer on node {:?} got a new message {:?} later",
        cluster.index_of(&node),
        killed_at.elapsed()
    );
    assert_eq!(
        broker.node_url(),
        Some(node),
        "the connection never had to move"
    );
    let placement = cluster.quorum_queue(t.queue()).await.unwrap();
    assert!(
        placement.leader.is_some_and(|l| l != leader),
        "{placement:?}"
    );
    consumer.stop().await;
}
