//! The order service's part of an order's timeline: the order as accepted, every status change
//! with its reason, the payment at the provider and the answers to PayOrder, and the refund.

use chrono::{DateTime, Utc};
use flashsale_contract::to_timestamp;
use flashsale_messaging::timeline::OrderStory;
use flashsale_proto::admin::v1::{TimelineEntry, TimelineEntryKind};
use futures_util::future::BoxFuture;
use sea_orm::{DatabaseConnection, DbErr, FromQueryResult};
use uuid::Uuid;

use super::db::stmt;

/// Reads the order's records from the order database.
#[derive(Clone, Debug)]
pub struct Story {
    db: DatabaseConnection,
}

impl Story {
    pub fn new(db: DatabaseConnection) -> Self {
        Self { db }
    }

    async fn read(&self, id: Uuid) -> Result<Option<Vec<TimelineEntry>>, DbErr> {
        #[derive(FromQueryResult)]
        struct Order {
            sku: String,
            quantity: i64,
            total_cents: i64,
            created_at: DateTime<Utc>,
        }
        #[derive(FromQueryResult)]
        struct Change {
            from_status: Option<String>,
            to_status: String,
            reason: String,
            at: DateTime<Utc>,
        }
        #[derive(FromQueryResult)]
        struct ProviderPayment {
            provider_payment_id: String,
            amount_cents: i64,
            currency: String,
            created_at: DateTime<Utc>,
            confirmed_at: Option<DateTime<Utc>>,
        }
        #[derive(FromQueryResult)]
        struct Answered {
            payment_id: String,
            amount_cents: i64,
            accepted: bool,
            created_at: DateTime<Utc>,
        }
        #[derive(FromQueryResult)]
        struct Refund {
            payment_id: String,
            amount_cents: i64,
            reason: String,
            status: String,
            attempts: i32,
            last_error: String,
            created_at: DateTime<Utc>,
            updated_at: DateTime<Utc>,
        }

        let key = || [id.into()];
        let Some(order) = Order::find_by_statement(stmt(
            "SELECT sku, quantity, total_cents, created_at FROM orders WHERE order_id = $1",
            key(),
        ))
        .one(&self.db)
        .await?
        else {
            return Ok(None);
        };
        let entry = |at: DateTime<Utc>, kind: TimelineEntryKind, summary: String, detail: String| {
            TimelineEntry {
                time: Some(to_timestamp(at)),
                kind: kind.into(),
                summary,
                detail,
                ..TimelineEntry::default()
            }
        };
        let mut out = Vec::new();
        let changes = Change::find_by_statement(stmt(
            "SELECT from_status, to_status, reason, at FROM order_status_history \
             WHERE order_id = $1 ORDER BY id",
            key(),
        ))
        .all(&self.db)
        .await?;
        for c in changes {
            let summary = match c.from_status {
                None => format!(
                    "{}: {} x {} for {} cents",
                    c.to_status, order.quantity, order.sku, order.total_cents
                ),
                Some(from) => format!("{from} -> {}", c.to_status),
            };
            out.push(entry(c.at, TimelineEntryKind::StatusChanged, summary, c.reason));
        }
        if out.is_empty() {
            let summary = format!(
                "accepted: {} x {} for {} cents",
                order.quantity, order.sku, order.total_cents
            );
            out.push(entry(
                order.created_at,
                TimelineEntryKind::StatusChanged,
                summary,
                String::new(),
            ));
        }
        let payments = ProviderPayment::find_by_statement(stmt(
            "SELECT provider_payment_id, amount_cents, currency, created_at, confirmed_at \
             FROM provider_payments WHERE order_id = $1",
            key(),
        ))
        .all(&self.db)
        .await?;
        for p in payments {
            let amount = format!("{} {}", p.amount_cents, p.currency);
            out.push(entry(
                p.created_at,
                TimelineEntryKind::Payment,
                format!("payment of {amount} started at the provider"),
                p.provider_payment_id.clone(),
            ));
            if let Some(at) = p.confirmed_at {
                out.push(entry(
                    at,
                    TimelineEntryKind::Payment,
                    format!("the provider says {amount} was paid"),
                    p.provider_payment_id,
                ));
            }
        }
        let answered = Answered::find_by_statement(stmt(
            "SELECT payment_id, amount_cents, accepted, created_at FROM payments \
             WHERE order_id = $1 ORDER BY created_at",
            key(),
        ))
        .all(&self.db)
        .await?;
        for a in answered {
            let answer = if a.accepted { "accepted" } else { "refused" };
            out.push(entry(
                a.created_at,
                TimelineEntryKind::Payment,
                format!("payment of {} cents {answer}", a.amount_cents),
                a.payment_id,
            ));
        }
        let refunds = Refund::find_by_statement(stmt(
            "SELECT payment_id, amount_cents, reason, status, attempts, last_error, created_at, \
                    updated_at \
             FROM refunds WHERE order_id = $1",
            key(),
        ))
        .all(&self.db)
        .await?;
        for r in refunds {
            out.push(entry(
                r.created_at,
                TimelineEntryKind::Refund,
                format!("refund of {} cents requested ({})", r.amount_cents, r.reason),
                r.payment_id,
            ));
            if r.status != "REQUESTED" || r.attempts > 0 {
                out.push(TimelineEntry {
                    attempts: r.attempts,
                    ..entry(
                        r.updated_at,
                        TimelineEntryKind::Refund,
                        format!("refund {} after {} attempt(s)", r.status, r.attempts),
                        r.last_error,
                    )
                });
            }
        }
        Ok(Some(out))
    }
}

impl OrderStory for Story {
    fn entries(&self, order_id: Uuid) -> BoxFuture<'_, Result<Option<Vec<TimelineEntry>>, DbErr>> {
        Box::pin(self.read(order_id))
    }
}
