//! flashsale-messaging against a private three-node RabbitMQ cluster
//! (flashsale_test_support::rabbit_cluster): quorum queues replicated on every node, a service
//! connection that fails over when its node dies, and no confirmed message lost when the node
//! leading a queue is killed mid-sale. Each test starts (and removes) its own cluster, which
//! takes about fifteen seconds; .config/nextest.toml runs them one at a time.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod failover;
mod helpers;
mod no_loss;
mod replication;
