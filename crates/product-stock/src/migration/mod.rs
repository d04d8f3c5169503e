//! The product database's schema, applied at start-up.

use sea_orm_migration::{MigrationTrait, MigratorTrait, async_trait::async_trait};

mod m0001_stock;
mod m0002_stock_buckets;
mod m0003_sale_window;
mod m0004_product_updates;

pub struct Migrator;

#[async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(flashsale_messaging::migration::CreateOutboxAndInbox),
            Box::new(flashsale_messaging::migration::CreateDeadLetters),
            Box::new(m0001_stock::Migration),
            Box::new(m0002_stock_buckets::Migration),
            Box::new(flashsale_messaging::migration::AddCorrelation),
            Box::new(flashsale_messaging::migration::AddDeadLetterCorrelation),
            Box::new(m0003_sale_window::Migration),
            Box::new(m0004_product_updates::Migration),
        ]
    }
}
