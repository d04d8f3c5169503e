//! Stuck orders (docs/architecture.md#operations): orders that stopped moving in a state that
//! is not terminal, usually because the event that would move them is parked in a dead-letter
//! store or was never published. A gauge counts them per status; ListStuckOrders lists them
//! with the messages of theirs this service holds, so nothing stays stuck silently.

use std::{collections::HashMap, time::Duration};

use chrono::{DateTime, Utc};
use flashsale_messaging::waiting::Waiting;
use sea_orm::DatabaseConnection;
use uuid::Uuid;

use crate::{
    config::{MAX_STUCK_AFTER_MS, SagaSettings},
    domain::{OrderError, Status},
    infra::db::{self, StuckRow},
};

/// Gauge: stuck orders, per status (`status` label: PENDING, AWAITING_PAYMENT, PAID).
pub const STUCK_GAUGE: &str = "flashsale_orders_stuck";
pub const DEFAULT_STUCK_PAGE_SIZE: u64 = 50;
pub const MAX_STUCK_PAGE_SIZE: u64 = 500;

/// The statuses an order can be stuck in.
const UNSETTLED: [Status; 3] = [Status::Pending, Status::AwaitingPayment, Status::Paid];

/// A stuck order and the messages of it this service holds, oldest first.
#[derive(Clone, Debug)]
pub struct StuckOrder {
    pub order: StuckRow,
    pub events: Vec<Waiting>,
}

/// One page of ListStuckOrders.
#[derive(Clone, Debug)]
pub struct StuckPage {
    pub orders: Vec<StuckOrder>,
    pub next_page_token: String,
    /// The threshold used.
    pub older_than: Duration,
}

/// The stuck-order gauge and listing. Cheap to clone.
#[derive(Clone)]
pub struct Stuck {
    db: DatabaseConnection,
    after: Duration,
    every: Duration,
}

impl Stuck {
    pub fn new(db: DatabaseConnection, saga: &SagaSettings) -> Self {
        Self {
            db,
            after: Duration::from_millis(saga.stuck_after_ms),
            every: Duration::from_millis(saga.stuck_check_interval_ms),
        }
    }

    /// Stuck orders per status (every unsettled status, 0 when none) at the configured age.
    pub async fn count(&self) -> Result<Vec<(Status, i64)>, OrderError> {
        let found = db::count_stuck(&self.db, self.after).await?;
        Ok(UNSETTLED
            .iter()
            .map(|s| {
                let n = found.iter().filter(|(f, _)| f == s).map(|(_, n)| n).sum();
                (*s, n)
            })
            .collect())
    }

    /// Sets the gauge from [`Self::count`].
    pub async fn refresh_gauge(&self) -> Result<(), OrderError> {
        for (status, n) in self.count().await? {
            metrics::gauge!(STUCK_GAUGE, "status" => status.as_db()).set(n as f64);
            if n > 0 {
                tracing::warn!(
                    status = status.as_db(),
                    stuck = n,
                    "orders stuck; list them with ListStuckOrders (flashsale order stuck)"
                );
            }
        }
        Ok(())
    }

    /// Runs [`Self::refresh_gauge`] every `saga.stuck_check_interval_ms` until `shutdown`.
    pub async fn run_gauge(
        self,
        shutdown: flashsale_platform::shutdown::Shutdown,
    ) -> anyhow::Result<()> {
        let period = self.every;
        flashsale_platform::shutdown::every(period, shutdown, "stuck order count", || {
            self.refresh_gauge()
        })
        .await
    }

    /// A page of stuck orders unchanged for longer than `older_than_ms` (0: the configured
    /// age), longest stuck first, with their waiting messages.
    pub async fn list(
        &self,
        older_than_ms: i64,
        page_size: i32,
        page_token: &str,
    ) -> Result<StuckPage, OrderError> {
        let mut bad = Vec::new();
        let older_than = match u64::try_from(older_than_ms) {
            Ok(0) => Some(self.after),
            Ok(ms) if ms <= MAX_STUCK_AFTER_MS => Some(Duration::from_millis(ms)),
            _ => {
                bad.push((
                    "older_than_ms".to_owned(),
                    format!("must be 0 (the server default) to {MAX_STUCK_AFTER_MS} (30 days)"),
                ));
                None
            }
        };
        let size = match u64::try_from(page_size) {
            Ok(0) => DEFAULT_STUCK_PAGE_SIZE,
            Ok(n) if n <= MAX_STUCK_PAGE_SIZE => n,
            _ => {
                bad.push((
                    "page_size".to_owned(),
                    format!("must be 0 (the server default) to {MAX_STUCK_PAGE_SIZE}"),
                ));
                0
            }
        };
        let (older_than, after) = match older_than {
            Some(o) => {
                let filter = u64::try_from(o.as_millis()).unwrap_or(u64::MAX);
                match decode_token(page_token, filter) {
                    Ok(after) => (o, after),
                    Err(e) => {
                        bad.extend(e.violations());
                        (o, None)
                    }
                }
            }
            None => (self.after, None),
        };
        if !bad.is_empty() {
            return Err(OrderError::Invalid(bad));
        }
        let filter = u64::try_from(older_than.as_millis()).unwrap_or(u64::MAX);
        let mut rows = db::stuck(&self.db, older_than, after, size + 1).await?;
        let next_page_token = if rows.len() as u64 > size {
            rows.truncate(usize::try_from(size).unwrap_or(usize::MAX));
            rows.last()
                .map(|r| encode_token(r.since, r.order_id, filter))
                .unwrap_or_default()
        } else {
            String::new()
        };
        let ids: Vec<Uuid> = rows.iter().map(|r| r.order_id).collect();
        let mut events: HashMap<String, Vec<Waiting>> = HashMap::new();
        for w in db::waiting_events(&self.db, &ids).await? {
            events.entry(w.correlation_id.clone()).or_default().push(w);
        }
        let orders = rows
            .into_iter()
            .map(|order| {
                let mut events = events
                    .remove(&order.order_id.to_string())
                    .unwrap_or_default();
                events.sort_by_key(|w| w.at);
                StuckOrder { order, events }
            })
            .collect();
        Ok(StuckPage {
            orders,
            next_page_token,
            older_than,
        })
    }
}

fn encode_token(since: DateTime<Utc>, id: Uuid, older_than_ms: u64) -> String {
    super::page::encode("s1", since, id, older_than_ms)
}

/// The cursor of `token`, which must have been issued for the same `older_than_ms`.
fn decode_token(
    token: &str,
    older_than_ms: u64,
) -> Result<Option<(DateTime<Utc>, Uuid)>, OrderError> {
    super::page::decode(token, "s1", older_than_ms, "this older_than_ms")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_only_for_their_threshold() {
        let (at, id) = (Utc::now(), Uuid::new_v4());
        let t = encode_token(at, id, 600_000);
        let (at2, id2) = decode_token(&t, 600_000).unwrap().unwrap();
        assert_eq!((at2.timestamp_micros(), id2), (at.timestamp_micros(), id));
        assert!(decode_token(&t, 60_000).is_err());
        for junk in [
            "x",
            "s1.1.2",
            "s1.abc.def.0",
            "o1.1.2.3",
            "s1.1.nope.927c0",
            "s1.1.2.3.4",
        ] {
            assert!(decode_token(junk, 600_000).is_err(), "{junk}");
        }
        assert_eq!(decode_token("", 1).unwrap(), None);
    }

    #[test]
    fn no_generated_token_panics_the_decoder_or_passes_unless_the_encoder_wrote_it() {
        let at = DateTime::<Utc>::from_timestamp_micros(1_700_000_000_123_456).unwrap();
        let issued = vec![encode_token(at, Uuid::new_v4(), 600_000)];
        flashsale_test_support::page_tokens::check_decoder(issued, 1024, |t| {
            let (at, id) = decode_token(t, 600_000).ok()??;
            Some(encode_token(at, id, 600_000))
        })
        .unwrap();
    }
}
