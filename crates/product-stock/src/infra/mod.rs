//! What the product-stock use cases call: the database, the Redis stock gate and the order
//! service.

pub mod db;
pub mod gate;
pub mod orders;
pub mod timeline;
