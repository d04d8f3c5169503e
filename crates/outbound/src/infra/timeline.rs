//! outbound's part of an order's timeline: the order's shipment (whether its stock is deducted
//! yet) and each step of each attempt to ship it.

use chrono::{DateTime, Utc};
use flashsale_contract::to_timestamp;
use flashsale_messaging::timeline::OrderStory;
use flashsale_proto::admin::v1::{TimelineEntry, TimelineEntryKind};
use futures_util::future::BoxFuture;
use sea_orm::{DatabaseConnection, DbErr, FromQueryResult};
use uuid::Uuid;

use super::db::stmt;

/// Reads the order's shipment and its attempts from the outbound database.
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
        struct Shipment {
            shipment_id: Uuid,
            sku: String,
            quantity: i64,
            status: String,
            failure_reason: Option<String>,
            stock_committed: bool,
            last_error: String,
            created_at: DateTime<Utc>,
            updated_at: DateTime<Utc>,
        }
        #[derive(FromQueryResult)]
        struct Attempt {
            attempt: i32,
            step: String,
            outcome: String,
            detail: String,
            at: DateTime<Utc>,
        }
        let Some(s) = Shipment::find_by_statement(stmt(
            "SELECT shipment_id, sku, quantity, status, failure_reason, stock_committed, \
                    last_error, created_at, updated_at \
             FROM shipments WHERE order_id = $1",
            [id.into()],
        ))
        .one(&self.db)
        .await?
        else {
            return Ok(Vec::new());
        };
        let deducted = if s.stock_committed {
            "stock deducted"
        } else {
            "stock not deducted"
        };
        let mut out = vec![
            TimelineEntry {
                time: Some(to_timestamp(s.created_at)),
                kind: TimelineEntryKind::Shipment.into(),
                summary: format!("shipment of {} x {} opened", s.quantity, s.sku),
                detail: s.shipment_id.to_string(),
                ..TimelineEntry::default()
            },
            TimelineEntry {
                time: Some(to_timestamp(s.updated_at)),
                kind: TimelineEntryKind::Shipment.into(),
                summary: format!("shipment {} ({deducted})", s.status),
                detail: s.failure_reason.unwrap_or(s.last_error),
                ..TimelineEntry::default()
            },
        ];
        let attempts = Attempt::find_by_statement(stmt(
            "SELECT attempt, step, outcome, detail, at FROM shipment_attempts \
             WHERE shipment_id = $1 ORDER BY id",
            [s.shipment_id.into()],
        ))
        .all(&self.db)
        .await?;
        for a in attempts {
            out.push(TimelineEntry {
                time: Some(to_timestamp(a.at)),
                kind: TimelineEntryKind::ShipmentAttempt.into(),
                summary: format!("attempt {}: {} {}", a.attempt, a.step, a.outcome),
                detail: a.detail,
                attempts: a.attempt,
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
