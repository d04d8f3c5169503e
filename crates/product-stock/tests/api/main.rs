//! Integration tests of the product-stock service against real PostgreSQL, Redis and RabbitMQ:
//! each test gets its own database, Redis key prefix, exchange and queues.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod admin_paths;
mod buckets;
mod buckets_upkeep;
mod catalog;
mod cluster;
mod commit_batch;
mod contract;
mod edge;
mod foundation;
mod helpers;
mod holds;
mod limits;
mod prop;
mod prop_dead_letters;
mod prop_page_tokens;
mod races;
mod reconcile;
mod reserve;
mod saga;
mod saga_batch;
mod sale;
mod update;
mod write_off;
