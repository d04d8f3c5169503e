//! How many stock buckets the gate splits each product's stock into
//! (docs/architecture.md#stock-buckets). Existing products keep one bucket, whose keys are the
//! ones the gate always used.

use sea_orm_migration::{
    MigrationName, MigrationTrait, SchemaManager, async_trait,
    sea_orm::{ConnectionTrait as _, DbErr},
};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261203_000002_stock_buckets"
    }
}

const UP: &str = r#"
ALTER TABLE products
    ADD COLUMN stock_buckets integer NOT NULL DEFAULT 1 CHECK (stock_buckets BETWEEN 1 AND 64);
"#;

// See m0001_stock for why the elided lifetime stays.
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
