//! RabbitMQ plumbing shared by the flashsale services (docs/architecture.md#messaging): one
//! [`Broker`] connection that heals itself, the event exchange and per-consumer queues with a retry
//! ladder and a parking lot ([`topology`]), the protobuf [`envelope`], a confirming [`Publisher`],
//! the transactional [`outbox`] with its relay, the [`inbox`] for idempotent handlers, and the
//! retry/DLQ [`Consumer`] loop. Trace context rides along in a `traceparent` header.
//!
//! A service wires it all with [`wiring::start`] (or `start_with` for relay options): the
//! broker, its topology, the outbox relay, the consumers and the dead-letter drainer, in one
//! call from its `startup`. Inside, its use cases write events with the state change and its
//! handlers claim each delivery once:
//!
//! ```text
//! // in a use case's transaction:
//! outbox::enqueue(&txn, &envelope::new(payload, order_id, "", "order")).await?;
//! // in a handler's transaction:
//! if !inbox::claim(&txn, "order.stock-events", inbox::Claim::current(&msg.envelope)?).await? {
//!     return Ok(());
//! }
//! ```

pub mod broadcast;
pub mod broker;
pub mod bundle;
pub mod config;
pub mod consumer;
pub mod dead_letter;
pub mod envelope;
pub mod headers;
pub mod inbox;
pub mod metrics;
pub mod migration;
pub mod outbox;
pub mod publisher;
pub mod timeline;
pub mod topology;
pub mod trace;
pub mod waiting;
pub mod wiring;

pub use broker::{Broker, BrokerError};
pub use config::{AmqpConfig, QueueType};
pub use consumer::{Consumer, Handler, HandlerError, Incoming};
pub use dead_letter::{DeadLetterAdmin, DeadLetterDrainer};
pub use envelope::{DecodeError, keys};
pub use outbox::{OutboxRelay, RelayOptions};
pub use publisher::{OutgoingMessage, PublishError, Publisher};
pub use topology::{DelayQueue, QueueTopology};
