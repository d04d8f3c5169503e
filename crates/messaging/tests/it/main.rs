//! Integration tests of flashsale-messaging against the real RabbitMQ and PostgreSQL; each test
//! has its own exchange, queue prefix and database, so they run in parallel.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod bundle;
mod consumer;
mod dead_letter;
mod delay;
mod helpers;
mod inbox;
mod outbox;
mod publisher;
mod reconnect;
mod relay_yield;
mod topology;
mod trace;
