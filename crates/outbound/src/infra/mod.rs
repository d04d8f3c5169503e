//! What the outbound use cases call: the database, product-stock and the warehouse.

pub mod db;
pub mod stock;
pub mod timeline;
pub mod warehouse;
