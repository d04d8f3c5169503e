//! The fault suite: each scenario runs a small flash sale on private PostgreSQL, Redis and
//! RabbitMQ servers, injects one fault mid-flood (a SIGKILL, a restart, a network cut, a
//! failpoint at a saga step, duplicated or poison messages), waits for quiescence, then checks
//! the platform's promises (docs/invariants.md) by reading every store directly and prints one
//! line of figures; the soak (`soak`) runs one long sale through a seeded mix of those faults.
//! docs/reliability.md has the fault matrix and the commands.

pub mod check;
pub mod driver;
pub mod proxy;
pub mod replicas;
pub mod scenario;
pub mod servers;
pub mod services;
pub mod soak;
pub mod tap;
