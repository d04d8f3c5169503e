//! The platform under load: `flashsale sale` drives one flash sale end to end through the
//! services' gRPC APIs and checks the invariants on what it reads back; `flashsale bench`
//! measures the platform back to back with the naive design it replaces and the raw ceilings
//! (gate, insert, no-op gRPC), with the services' memory and CPU read from Linux `/proc`. The
//! `flashsale` command embeds both; [`client`] is what it shares with the other commands.

pub mod bench;
pub mod client;
mod cpustat;
pub mod kept;
mod procstat;
pub mod sale;
pub mod sink;
