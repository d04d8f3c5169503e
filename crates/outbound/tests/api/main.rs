//! Integration tests of the outbound service against real PostgreSQL (one fresh database per test).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod foundation;
mod helpers;
