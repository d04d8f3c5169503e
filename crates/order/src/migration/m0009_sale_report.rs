//! The sale report (GetSaleReport): when the stock gate accepted each order, by its clock (the
//! clock a sale window opens by), and each product's refusals counted per second and reason
//! (a refusal writes nothing on its own: each replica adds up its refusals in memory and writes
//! them once a second).

use sea_orm_migration::{
    MigrationName, MigrationTrait, SchemaManager, async_trait,
    sea_orm::{ConnectionTrait as _, DbErr},
};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261221_000001_sale_report"
    }
}

const UP: &str = r#"
ALTER TABLE orders ADD COLUMN accepted_at timestamptz;

CREATE TABLE sale_refusals (
    sku     text NOT NULL,
    second  timestamptz NOT NULL,
    reason  text NOT NULL,
    refused bigint NOT NULL CHECK (refused > 0),
    PRIMARY KEY (sku, second, reason)
);
"#;

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
