//! What the order use cases call: the order database, product-stock's gate and the feed of
//! order changes.

pub mod changes;
pub mod db;
pub mod stock;
