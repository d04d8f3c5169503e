//! Integration tests of the Redis stock gate against a real Redis. Each test works under its own
//! key prefix and deletes its keys at the end.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod buckets;
mod cluster;
mod concurrency;
mod helpers;
mod lifecycle;
mod operations;
mod pool;
mod release;
mod reserve;
mod restart;
mod transfers;
mod write_off;
