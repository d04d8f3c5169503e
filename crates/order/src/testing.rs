//! The one door into this service's internals, for the benchmark (`flashsale bench`) and
//! nothing else, behind the `testing` feature: the intake's database write on its own, with no
//! gRPC or stock gate around it, to measure what PostgreSQL costs per accepted order.
//! Everything else of the service is reached through its gRPC contract and its events, as a
//! gateway would.

use sea_orm::DatabaseConnection;
use sea_orm_migration::MigratorTrait as _;

pub use crate::{
    app::{PendingWrite, Written, write_pending, write_pending_batch},
    domain::{OrderError, PlaceOrder, Policy},
    infra::db::Inserted,
};

/// Applies the service's migrations to `db` (what `flashsale-order migrate` does).
pub async fn migrate(db: &DatabaseConnection) -> Result<(), sea_orm::DbErr> {
    crate::migration::Migrator::up(db, None).await
}
