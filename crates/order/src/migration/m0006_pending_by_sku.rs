//! A product's PENDING orders: product-stock's gate rebuild lists them (ListPendingOrders). A
//! partial index, so it holds only the orders in flight, not the whole history.
//!
//! Built without `CONCURRENTLY` (migrations run as one script), which blocks order writes while
//! it builds; it is small (PENDING orders only), but on a busy table create it by hand first with
//! `CREATE INDEX CONCURRENTLY orders_pending_by_sku ON orders (sku, order_id) WHERE status =
//! 'PENDING'`.

use sea_orm_migration::{
    MigrationName, MigrationTrait, SchemaManager, async_trait,
    sea_orm::{ConnectionTrait as _, DbErr},
};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261202_000001_orders_pending_by_sku"
    }
}

#[allow(elided_lifetimes_in_paths)]
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared(
                "CREATE INDEX IF NOT EXISTS orders_pending_by_sku ON orders (sku, order_id) \
                 WHERE status = 'PENDING'",
            )
            .await
            .map(drop)
    }
}
