//! GetOrder, ListOrders and WatchOrder, and the service-only LookupOrders and ListPendingOrders
//! product-stock asks before it gives a gate hold away or rebuilds a gate. Watching follows every replica's changes through the
//! feed of changed orders, with a slow poll as a backstop.

use std::time::Duration;

use chrono::{DateTime, Utc};
use flashsale_platform::{
    auth::{Caller, Role},
    shutdown::Shutdown,
};
use sea_orm::DatabaseConnection;
use tokio::sync::{broadcast, mpsc};
use uuid::Uuid;

use crate::{
    domain::{Order, OrderError, Status},
    infra::{changes::OrderChanges, db},
};

pub const DEFAULT_PAGE_SIZE: u64 = 50;
pub const MAX_PAGE_SIZE: u64 = 500;
const POLL_BACKSTOP: Duration = Duration::from_secs(2);

/// GetOrder, ListOrders, WatchOrder, LookupOrders and ListPendingOrders. Cheap to clone.
#[derive(Clone)]
pub struct Queries {
    db: DatabaseConnection,
    changes: OrderChanges,
    stopping: Shutdown,
}

impl Queries {
    /// Watches end with [`OrderError::Stopping`] once `stopping` is set.
    pub fn new(db: DatabaseConnection, changes: OrderChanges, stopping: Shutdown) -> Self {
        Self {
            db,
            changes,
            stopping,
        }
    }

    /// One order the caller may see.
    pub async fn get(&self, caller: &Caller, id: Uuid) -> Result<Order, OrderError> {
        match db::order(&self.db, id, false).await? {
            Some(o) if caller.role == Role::Admin || o.user_id == caller.subject => Ok(o),
            _ => Err(OrderError::NotFound(id)),
        }
    }

    /// A page of orders, newest first, and the next page's token ("" at the end).
    pub async fn list(
        &self,
        caller: &Caller,
        user_id: &str,
        status: Option<Status>,
        page_size: i32,
        page_token: &str,
    ) -> Result<(Vec<Order>, String), OrderError> {
        let user = match (caller.role, user_id) {
            (Role::Admin, "") => None,
            (Role::Admin, u) => Some(u.to_owned()),
            (_, "") => Some(caller.subject.clone()),
            (_, u) if u == caller.subject => Some(u.to_owned()),
            _ => {
                return Err(OrderError::PermissionDenied(
                    "a user may list only their own orders".into(),
                ));
            }
        };
        let size = page_size_of(page_size)?;
        let filter = format!(
            "{}|{}",
            user.as_deref().unwrap_or("*"),
            status.map_or("*", Status::as_db)
        );
        let after = decode_token(page_token, &filter)?;
        let mut orders = db::list(&self.db, user.as_deref(), status, after, size + 1).await?;
        let next = if orders.len() as u64 > size {
            orders.truncate(size as usize);
            orders
                .last()
                .map(|o| encode_token(o.created_at, o.order_id, &filter))
                .unwrap_or_default()
        } else {
            String::new()
        };
        Ok((orders, next))
    }

    /// The orders among `ids` that exist (LookupOrders; the caller checked the ids).
    pub async fn lookup(&self, ids: &[Uuid]) -> Result<Vec<Order>, OrderError> {
        Ok(db::orders(&self.db, ids)
            .await?
            .into_iter()
            .flatten()
            .collect())
    }

    /// A page of `sku`'s PENDING orders by order id, and the next page's token ("" at the end)
    /// (ListPendingOrders).
    pub async fn pending(
        &self,
        sku: &str,
        page_size: i32,
        page_token: &str,
    ) -> Result<(Vec<Order>, String), OrderError> {
        flashsale_contract::check_sku(sku)
            .map_err(|e| OrderError::invalid("sku", e.to_string()))?;
        let size = page_size_of(page_size)?;
        let filter = format!("pending|{sku}");
        let after = decode_pending_token(page_token, &filter)?;
        let mut orders = db::pending_by_sku(&self.db, sku, after, size + 1).await?;
        let next = if orders.len() as u64 > size {
            orders.truncate(size as usize);
            orders
                .last()
                .map(|o| encode_pending_token(o.order_id, &filter))
                .unwrap_or_default()
        } else {
            String::new()
        };
        Ok((orders, next))
    }

    /// The order now, then every change, ending after a terminal state (or when the receiver
    /// goes away). When this replica stops, the watch ends with [`OrderError::Stopping`]: the
    /// client watches again and another replica answers.
    pub async fn watch(
        &self,
        caller: &Caller,
        id: Uuid,
    ) -> Result<mpsc::Receiver<Result<Order, OrderError>>, OrderError> {
        let mut changes = self.changes.subscribe();
        let first = self.get(caller, id).await?;
        let (tx, rx) = mpsc::channel(16);
        let db = self.db.clone();
        let stopping = self.stopping.clone();
        tokio::spawn(async move {
            let mut last = first;
            if tx.send(Ok(last.clone())).await.is_err() || last.status.is_terminal() {
                return;
            }
            loop {
                let reload = tokio::select! {
                    () = tx.closed() => return,
                    () = stopping.wait() => {
                        let _ = tx.send(Err(OrderError::Stopping)).await;
                        return;
                    }
                    msg = changes.recv() => match msg {
                        Ok(changed) => changed == id,
                        Err(broadcast::error::RecvError::Lagged(_)) => true,
                        // The feed ends only as the service stops.
                        Err(broadcast::error::RecvError::Closed) => {
                            let _ = tx.send(Err(OrderError::Stopping)).await;
                            return;
                        }
                    },
                    () = tokio::time::sleep(POLL_BACKSTOP) => true,
                };
                if !reload {
                    continue;
                }
                let now = match db::order(&db, id, false).await {
                    Ok(Some(o)) => o,
                    Ok(None) => return,
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                };
                if now != last {
                    let done = now.status.is_terminal();
                    if tx.send(Ok(now.clone())).await.is_err() || done {
                        return;
                    }
                    last = now;
                }
            }
        });
        Ok(rx)
    }
}

fn page_size_of(page_size: i32) -> Result<u64, OrderError> {
    Ok(match page_size {
        n if n < 0 => return Err(OrderError::invalid("page_size", "must not be negative")),
        0 => DEFAULT_PAGE_SIZE,
        n => u64::try_from(n).unwrap_or(MAX_PAGE_SIZE).min(MAX_PAGE_SIZE),
    })
}

/// The last order id of the previous page of ListPendingOrders.
fn decode_pending_token(token: &str, filter: &str) -> Result<Option<Uuid>, OrderError> {
    if token.is_empty() {
        return Ok(None);
    }
    let bad = || OrderError::invalid("page_token", "not a token this server issued for this sku");
    let mut parts = token.split('.');
    let (Some("p1"), Some(id), Some(hash), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad());
    };
    if u64::from_str_radix(hash, 16).ok() != Some(filter_hash(filter)) {
        return Err(bad());
    }
    let id = Uuid::try_parse(id).map_err(|_| bad())?;
    // Only the spelling `encode_pending_token` writes: no `+`, uppercase or hyphenated id.
    if encode_pending_token(id, filter) != token {
        return Err(bad());
    }
    Ok(Some(id))
}

fn encode_pending_token(last: Uuid, filter: &str) -> String {
    format!("p1.{}.{:x}", last.simple(), filter_hash(filter))
}

fn filter_hash(filter: &str) -> u64 {
    // A token is only valid for the filter it was issued with.
    super::page::filter_hash(filter)
}

fn encode_token(at: DateTime<Utc>, id: Uuid, filter: &str) -> String {
    super::page::encode("o1", at, id, filter_hash(filter))
}

fn decode_token(token: &str, filter: &str) -> Result<Option<(DateTime<Utc>, Uuid)>, OrderError> {
    super::page::decode(token, "o1", filter_hash(filter), "this filter")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_only_for_their_filter() {
        let (at, id) = (Utc::now(), Uuid::new_v4());
        let t = encode_token(at, id, "alice|*");
        let (at2, id2) = decode_token(&t, "alice|*").unwrap().unwrap();
        assert_eq!((at2.timestamp_micros(), id2), (at.timestamp_micros(), id));
        assert!(decode_token(&t, "bob|*").is_err());
        for junk in ["x", "o1.1.2", "o1.abc.def.0", "o2.1.2.3.4"] {
            assert!(decode_token(junk, "alice|*").is_err(), "{junk}");
        }
    }

    #[test]
    fn pending_tokens_are_only_for_their_sku() {
        let id = Uuid::new_v4();
        let t = format!("p1.{}.{:x}", id.simple(), filter_hash("pending|A"));
        assert_eq!(decode_pending_token(&t, "pending|A").unwrap(), Some(id));
        assert!(decode_pending_token(&t, "pending|B").is_err());
        for junk in ["x", "p1.x.0", "o1.1.2.3", &format!("p1.{}", id.simple())] {
            assert!(decode_pending_token(junk, "pending|A").is_err(), "{junk}");
        }
    }

    #[test]
    fn no_generated_token_panics_the_decoders_or_passes_unless_the_encoder_wrote_it() {
        use flashsale_test_support::page_tokens::{check_cut_or_extended_refused, check_decoder};
        let at = DateTime::<Utc>::from_timestamp_micros(1_700_000_000_123_456).unwrap();
        let issued = vec![
            encode_token(at, Uuid::new_v4(), "alice|*"),
            encode_token(at, Uuid::from_u128(9), "alice|*"),
        ];
        check_decoder(issued.clone(), 1024, |t| {
            let (at, id) = decode_token(t, "alice|*").ok()??;
            Some(encode_token(at, id, "alice|*"))
        })
        .unwrap();
        check_cut_or_extended_refused(&issued[0], 256, |t| decode_token(t, "alice|*").is_ok())
            .unwrap();

        let pending = vec![
            encode_pending_token(Uuid::new_v4(), "pending|A"),
            encode_pending_token(Uuid::from_u128(3), "pending|A"),
        ];
        check_decoder(pending.clone(), 1024, |t| {
            let id = decode_pending_token(t, "pending|A").ok()??;
            Some(encode_pending_token(id, "pending|A"))
        })
        .unwrap();
        check_cut_or_extended_refused(&pending[0], 256, |t| {
            decode_pending_token(t, "pending|A").is_ok()
        })
        .unwrap();
        let id = Uuid::from_u128(3);
        let hash = filter_hash("pending|A");
        for junk in [
            format!("p1.{}.+{hash:x}", id.simple()),
            format!("p1.{}.{hash:X}", id.simple()),
            format!("p1.{}.{hash:x}", id.hyphenated()),
        ] {
            assert!(decode_pending_token(&junk, "pending|A").is_err(), "{junk}");
        }
    }
}
