use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use flashsale_messaging::{AmqpConfig, Consumer, Incoming, Publisher, keys};
use flashsale_test_support::eventually;
use tokio::{
    net::{TcpListener, TcpStream},
    task::JoinHandle,
};

use crate::helpers::{Amqp, Recorder, Running, WAIT, config, order_created};

/// A TCP proxy to the broker whose connections the test can cut.
struct Proxy {
    addr: SocketAddr,
    accept: JoinHandle<()>,
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Proxy {
    async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let conns: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let tracked = conns.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let task = tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                tracked.lock().unwrap().push(task);
            }
        });
        Self {
            addr,
            accept,
            conns,
        }
    }

    /// Drops every proxied connection (both sockets close); new ones are still accepted.
    fn cut(&self) {
        for c in self.conns.lock().unwrap().drain(..) {
            c.abort();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

#[tokio::test]
async fn consumer_and_publisher_resume_after_the_connection_drops() {
    let direct = config();
    let broker_addr: SocketAddr = {
        let u = url::Url::parse(&direct.url).unwrap();
        let host = u.host_str().unwrap().to_owned();
        tokio::net::lookup_host((host, u.port().unwrap_or(5672)))
            .await
            .unwrap()
            .next()
            .unwrap()
    };
    let proxy = Proxy::start(broker_addr).await;
    let mut via_proxy = url::Url::parse(&direct.url).unwrap();
    via_proxy.set_port(Some(proxy.addr.port())).unwrap();
    via_proxy.set_host(Some("127.0.0.1")).unwrap();
    // `amqp` (direct) owns the names and the clean-up; `flaky` goes through the proxy.
    let amqp = Amqp::new(direct.clone()).await;
    let t = amqp.topology("resilient", &[keys::ORDER_CREATED]).await;
    let flaky = Amqp::new(AmqpConfig {
        url: via_proxy.to_string(),
        ..direct
    })
    .await;

    let handled = Recorder::default();
    let rec = handled.clone();
    let consumer = Consumer::new(&flaky.broker, t.clone(), move |m: Incoming| {
        rec.push(m.envelope.correlation_id.clone());
        async { Ok(()) }
    });
    let consumer = Running::spawn(|s| consumer.run(s));
    let publisher = Publisher::new(&flaky.broker);
    publisher
        .publish_envelope(&order_created("before"))
        .await
        .unwrap();
    eventually(WAIT, "the first message", || async {
        (handled.len() == 1).then_some(())
    })
    .await
    .unwrap();

    proxy.cut();
    eventually(WAIT, "the broker handle to notice", || async {
        (!flaky.broker.is_connected()).then_some(())
    })
    .await
    .unwrap_or(()); // it may already have reconnected
    eventually(WAIT, "the broker handle to reconnect", || async {
        flaky.broker.is_connected().then_some(())
    })
    .await
    .unwrap();

    // The publisher re-opens its channel; the first try may still hit the dead one.
    eventually(WAIT, "a publish through the new connection", || async {
        publisher
            .publish_envelope(&order_created("after"))
            .await
            .ok()
    })
    .await
    .unwrap();
    eventually(WAIT, "the consumer to resume", || async {
        handled.all().contains(&"after".to_owned()).then_some(())
    })
    .await
    .unwrap();
    consumer.stop().await;
    drop(flaky);
}

#[tokio::test]
async fn connect_within_gives_up_after_its_patience() {
    let closed_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let cfg = AmqpConfig {
        url: format!("amqp://guest:guest@127.0.0.1:{closed_port}/%2f"),
        ..config()
    };
    let started = std::time::Instant::now();
    let res =
        flashsale_messaging::Broker::connect_within(cfg, std::time::Duration::from_millis(500))
            .await;
    assert!(res.is_err());
    let took = started.elapsed();
    assert!(
        took < std::time::Duration::from_secs(3),
        "gave up after {took:?}"
    );

    let ok =
        flashsale_messaging::Broker::connect_within(config(), std::time::Duration::from_secs(5))
            .await;
    assert!(ok.unwrap().is_connected());
}

#[tokio::test]
async fn a_lost_connection_moves_on_to_the_next_node_and_a_dead_node_is_skipped() {
    let direct = config();
    let broker_addr: SocketAddr = {
        let u = url::Url::parse(&direct.url).unwrap();
        let host = u.host_str().unwrap().to_owned();
        tokio::net::lookup_host((host, u.port().unwrap_or(5672)))
            .await
            .unwrap()
            .next()
            .unwrap()
    };
    let via = |port: u16| {
        let mut u = url::Url::parse(&direct.url).unwrap();
        u.set_host(Some("127.0.0.1")).unwrap();
        u.set_port(Some(port)).unwrap();
        u.to_string()
    };
    // Two "nodes": two proxies to the same broker, each cut on its own.
    let (a, b) = (
        Proxy::start(broker_addr).await,
        Proxy::start(broker_addr).await,
    );
    let nodes = vec![via(a.addr.port()), via(b.addr.port())];
    let amqp = Amqp::new(AmqpConfig {
        urls: nodes.clone(),
        ..direct.clone()
    })
    .await;
    let first = amqp.broker.node_url().unwrap();
    let (on, other) = if first == nodes[0] {
        (&a, &nodes[1])
    } else {
        (&b, &nodes[0])
    };
    on.cut();
    let moved = eventually(WAIT, "a connection through the other node", || async {
        amqp.broker.node_url().filter(|u| u != &first)
    })
    .await
    .unwrap();
    assert_eq!(&moved, other);
    assert!(amqp.broker.channel().await.is_ok());

    // A node that refuses connections is skipped, wherever the random start falls.
    let closed_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    for _ in 0..6 {
        let broker = flashsale_messaging::Broker::connect(AmqpConfig {
            urls: vec![via(closed_port), nodes[0].clone()],
            ..direct.clone()
        })
        .await
        .unwrap();
        assert_eq!(broker.node_url(), Some(nodes[0].clone()));
        broker.close().await;
    }
}
