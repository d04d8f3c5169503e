//! One `NOTIFY` per statement instead of one per order row: a batch of CreateOrders or of
//! saga confirmations changes dozens of orders in one statement, and each row's notification
//! cost a trigger call, a queue entry and a message to the listener. The payload is now the
//! changed order ids joined by commas (at most 200 per notification, under PostgreSQL's 8,000
//! byte limit); a single id, as the refunds trigger still sends, is the one-element case.

use sea_orm_migration::{
    MigrationName, MigrationTrait, SchemaManager, async_trait,
    sea_orm::{ConnectionTrait as _, DbErr},
};

/// Most order ids in one notification's payload (37 bytes each with the comma).
pub const IDS_PER_NOTIFICATION: usize = 200;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261130_000002_orders_statement_notify"
    }
}

fn up_sql() -> String {
    format!(
        r#"
CREATE OR REPLACE FUNCTION flashsale_orders_changed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ids text;
BEGIN
    FOR ids IN
        SELECT string_agg(order_id::text, ',')
        FROM (SELECT order_id, (row_number() OVER ()) - 1 AS n FROM changed) AS c
        GROUP BY n / {IDS_PER_NOTIFICATION}
    LOOP
        PERFORM pg_notify('flashsale_order_changes', ids);
    END LOOP;
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS orders_notify ON orders;
DROP TRIGGER IF EXISTS orders_notify_insert ON orders;
DROP TRIGGER IF EXISTS orders_notify_update ON orders;
CREATE TRIGGER orders_notify_insert AFTER INSERT ON orders
    REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION flashsale_orders_changed();
CREATE TRIGGER orders_notify_update AFTER UPDATE ON orders
    REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION flashsale_orders_changed();
"#
    )
}

#[allow(elided_lifetimes_in_paths)]
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared(&up_sql())
            .await
            .map(drop)
    }
}
