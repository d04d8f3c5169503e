//! Integration tests of the order service against real PostgreSQL, Redis and RabbitMQ, with
//! product-stock running beside it: each test gets its own databases, key prefix, exchange and
//! queues.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod admission;
mod contract;
mod create;
mod edge;
mod foundation;
mod helpers;
mod limits;
mod load;
mod notify;
mod notify_input;
mod notify_limits;
mod pay;
mod pay_batch;
mod pay_order_batch;
mod prop;
mod prop_page_tokens;
mod prop_payments;
mod query;
mod reconcile;
mod refund_lease;
mod refunds;
mod report;
mod rpc_metrics;
mod saga;
mod saga_batch;
mod sale_window;
mod sold_out;
mod stock_balance;
mod stock_fallback;
mod stock_lookups;
mod stuck;
mod transient_write;
