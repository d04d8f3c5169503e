//! Reconciliation (docs/architecture.md#payments): when the order service last asked the
//! provider about a payment whose success was never applied (`checked_at`), so replicas share
//! the questions and each payment is asked about less and less often as it ages.

use sea_orm_migration::{
    MigrationName, MigrationTrait, SchemaManager, async_trait,
    sea_orm::{ConnectionTrait as _, DbErr},
};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261220_000001_payment_reconcile"
    }
}

const UP: &str = r#"
ALTER TABLE provider_payments ADD COLUMN checked_at timestamptz;
CREATE INDEX provider_payments_unconfirmed ON provider_payments (created_at)
    WHERE status = 'PENDING';
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
