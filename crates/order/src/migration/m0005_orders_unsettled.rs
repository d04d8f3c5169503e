//! Orders PENDING or PAID by when they last changed: the stuck-order count
//! (`flashsale_orders_stuck`) and ListStuckOrders read only these, never the whole table
//! (AWAITING_PAYMENT orders are found through `orders_due`). Partial, so it holds only orders in
//! flight: an order enters it when written and leaves it when it moves past PENDING or PAID.
//!
//! Built without `CONCURRENTLY` (migrations run as one script), which blocks order writes while
//! it builds; it covers only in-flight orders, so it is small, but on a busy system create it by
//! hand first with `CREATE INDEX CONCURRENTLY orders_unsettled ON orders (status, updated_at)
//! WHERE status IN ('PENDING', 'PAID')`; this migration then does nothing.

use sea_orm_migration::{
    MigrationName, MigrationTrait, SchemaManager, async_trait,
    sea_orm::{ConnectionTrait as _, DbErr},
};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261202_000001_orders_unsettled"
    }
}

const UP: &str = "CREATE INDEX IF NOT EXISTS orders_unsettled ON orders (status, updated_at) \
                  WHERE status IN ('PENDING', 'PAID')";

#[allow(elided_lifetimes_in_paths)]
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared(UP)
            .await
            .map(drop)
    }
}
