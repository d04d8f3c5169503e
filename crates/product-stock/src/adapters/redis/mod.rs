//! The Redis stock gate (ARCHITECTURE §4).

pub mod gate;
