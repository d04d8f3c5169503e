//! What the product-stock use cases call: the database and the Redis stock gate.

pub mod db;
pub mod gate;
