//! product-stock's part of an order's timeline: the order's reservation and every movement of
//! the stock it caused (the ledger rows whose cause is the order).

use chrono::{DateTime, Utc};
use flashsale_contract::to_timestamp;
use flashsale_messaging::timeline::OrderStory;
use flashsale_proto::admin::v1::{TimelineEntry, TimelineEntryKind};
use futures_util::future::BoxFuture;
use sea_orm::{DatabaseConnection, DbErr, FromQueryResult};
use uuid::Uuid;

use super::db::stmt;

/// Reads the order's reservation and ledger rows from the stock database.
#[derive(Clone, Debug)]
pub struct Story {
    db: DatabaseConnection,
}

impl Story {
    pub fn new(db: DatabaseConnection) -> Self {
        Self { db }
    }

    async fn read(&self, id: Uuid) -> Result<Vec<TimelineEntry>, DbErr> {
        #[derive(FromQueryResult)]
        struct Reservation {
            sku: String,
            quantity: i64,
            state: String,
            policy: String,
            cause: String,
            created_at: DateTime<Utc>,
            updated_at: DateTime<Utc>,
        }
        #[derive(FromQueryResult)]
        struct Movement {
            kind: String,
            on_hand_delta: i64,
            reserved_delta: i64,
            created_at: DateTime<Utc>,
        }
        let Some(r) = Reservation::find_by_statement(stmt(
            "SELECT sku, quantity, state, policy, cause, created_at, updated_at \
             FROM reservations WHERE order_id = $1",
            [id.into()],
        ))
        .one(&self.db)
        .await?
        else {
            return Ok(Vec::new());
        };
        let mut out = vec![TimelineEntry {
            time: Some(to_timestamp(r.updated_at)),
            kind: TimelineEntryKind::Reservation.into(),
            summary: format!(
                "{} {} unit(s) of {} ({}; first written {})",
                r.state,
                r.quantity,
                r.sku,
                r.policy,
                r.created_at.to_rfc3339()
            ),
            detail: r.cause,
            ..TimelineEntry::default()
        }];
        // The ledger is read by product (its index), then by cause.
        let moves = Movement::find_by_statement(stmt(
            "SELECT kind, on_hand_delta, reserved_delta, created_at FROM stock_ledger \
             WHERE sku = $1 AND cause = $2 ORDER BY id",
            [r.sku.clone().into(), id.to_string().into()],
        ))
        .all(&self.db)
        .await?;
        for m in moves {
            out.push(TimelineEntry {
                time: Some(to_timestamp(m.created_at)),
                kind: TimelineEntryKind::StockMoved.into(),
                summary: format!(
                    "{} of {}: on hand {:+}, reserved {:+}",
                    m.kind, r.sku, m.on_hand_delta, m.reserved_delta
                ),
                ..TimelineEntry::default()
            });
        }
        Ok(out)
    }
}

impl OrderStory for Story {
    fn entries(&self, order_id: Uuid) -> BoxFuture<'_, Result<Option<Vec<TimelineEntry>>, DbErr>> {
        Box::pin(async move { self.read(order_id).await.map(Some) })
    }
}
