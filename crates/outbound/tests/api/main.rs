//! Integration tests of the outbound service against real PostgreSQL, Redis and RabbitMQ, with
//! product-stock beside it: each test gets its own databases, key prefix, exchange and queues.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod batch;
mod delays;
mod foundation;
mod helpers;
mod limits;
mod prop;
mod prop_page_tokens;
mod shipping;
mod stack;
