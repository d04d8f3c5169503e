//! What the order use cases call: the order database (orders; provider payments and refunds),
//! product-stock's gate, the payment provider and the feed of order changes.

pub mod changes;
pub mod db;
pub mod payment;
pub mod payment_store;
pub mod stock;
pub mod timeline;
