//! The order database's schema, applied at start-up.

use sea_orm_migration::{MigrationTrait, MigratorTrait, async_trait::async_trait};

pub mod m0001_orders;
pub mod m0002_orders_by_sku;
pub mod m0003_statement_notify;
pub mod m0004_payment_id_partial;
pub mod m0005_orders_unsettled;
pub mod m0006_pending_by_sku;
pub mod m0007_provider_payments;
pub mod m0008_payment_reconcile;
pub mod m0009_sale_report;

pub struct Migrator;

#[async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(flashsale_messaging::migration::CreateOutboxAndInbox),
            Box::new(flashsale_messaging::migration::CreateDeadLetters),
            Box::new(m0001_orders::Migration),
            Box::new(m0002_orders_by_sku::Migration),
            Box::new(m0003_statement_notify::Migration),
            Box::new(m0004_payment_id_partial::Migration),
            Box::new(m0005_orders_unsettled::Migration),
            Box::new(m0006_pending_by_sku::Migration),
            Box::new(m0007_provider_payments::Migration),
            Box::new(m0008_payment_reconcile::Migration),
            Box::new(flashsale_messaging::migration::AddCorrelation),
            Box::new(flashsale_messaging::migration::AddDeadLetterCorrelation),
            Box::new(m0009_sale_report::Migration),
        ]
    }
}
