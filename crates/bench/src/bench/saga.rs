//! The saga's pace: after the platform's CreateOrder calls, every accepted order is read back
//! (GetOrder as its buyer, a bounded number in flight, a bounded time) until it leaves PENDING.
//! Under both policies a confirmed order is AWAITING_PAYMENT (or later: PAID, SHIPPED); an
//! order the saga could not persist is CANCELLED; one still PENDING at the bound never was.
//! An order already confirmed when first read was confirmed at its `update_time` (the server's
//! clock on this machine), not when the sweep got to it: a sweep over many orders takes seconds.

use std::{
    sync::Arc,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use flashsale_proto::order::v1::{
    GetOrderRequest, OrderStatus, order_service_client::OrderServiceClient,
};
use serde_json::{Value, json};
use tonic::transport::Channel;

use crate::sale::read::{bounded, request, retrying};

/// GetOrder calls in flight while following.
const FOLLOW_CONCURRENCY: usize = 16;
/// Pause between two sweeps over the orders still pending.
const POLL: Duration = Duration::from_millis(50);
/// Open orders read per sweep, oldest accept first. The saga confirms roughly in accept order
/// and each confirmation is timed by the server's `update_time`, so reading only the oldest
/// open orders loses nothing — and reading all of them every sweep would load the order
/// service (and slow the very saga being measured) in proportion to its backlog.
const SWEEP_WINDOW: usize = 512;
/// Between full sweeps of the window, the follower reads from the oldest open order on, a chunk
/// at a time, and stops at the first chunk the saga has not reached: a backlog of thousands of
/// orders would otherwise be re-read every sweep, loading the saga being measured. The whole
/// window is swept this often anyway (the saga confirms roughly, not exactly, in accept order).
const FULL_SWEEP_EVERY: Duration = Duration::from_secs(1);

/// An order CreateOrder accepted, and when.
#[derive(Clone, Debug)]
pub struct Accept {
    pub order_id: String,
    pub buyer: usize,
    pub at: Instant,
}

/// What became of the accepted orders.
#[derive(Clone, Debug, Default)]
pub struct Saga {
    /// Distinct orders among the accepted calls: two calls answered with one order count once.
    pub followed: usize,
    pub confirmed: usize,
    pub cancelled: usize,
    /// Still PENDING (or unreadable) when the bound passed.
    pub unconfirmed: usize,
    /// From the first accept to the last confirmation.
    pub confirm: Option<Duration>,
    pub bound_hit: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Pending,
    Confirmed(Instant),
    Cancelled,
}

/// Where the follower reads the accepted orders' states.
#[derive(Clone)]
pub enum Source {
    /// GetOrder as each order's buyer (what a buyer polling its order sees).
    Api(OrderServiceClient<Channel>, Arc<Vec<String>>),
    /// The order service's database, one query per read of a window (loads the service under
    /// measurement far less).
    Database(sea_orm::DatabaseConnection),
}

/// Follows `accepts` until none is PENDING or `bound` has passed.
pub async fn follow(source: Source, accepts: Vec<Accept>, bound: Duration) -> Saga {
    eprintln!(
        "bench: following {} accepted orders until the saga confirms them",
        accepts.len()
    );
    let until = tokio::time::Instant::now() + bound;
    let mut states = vec![State::Pending; accepts.len()];
    let mut open: Vec<usize> = (0..accepts.len()).collect();
    let mut bound_hit = false;
    let mut last_full = tokio::time::Instant::now();
    let read = |window: Vec<usize>| {
        let items: Vec<Accept> = window.iter().map(|&i| accepts[i].clone()).collect();
        let source = source.clone();
        let sweep = async move {
            match source {
                Source::Api(client, tokens) => {
                    bounded(items, FOLLOW_CONCURRENCY, move |accept| {
                        let (client, tokens) = (client.clone(), tokens.clone());
                        async move { read_state(client, &tokens, accept).await }
                    })
                    .await
                }
                Source::Database(db) => read_states_from_db(&db, &items).await,
            }
        };
        async move {
            tokio::time::timeout_at(until, sweep)
                .await
                .ok()
                .map(|read| window.into_iter().zip(read).collect::<Vec<_>>())
        }
    };
    'follow: while !open.is_empty() {
        if last_full.elapsed() >= FULL_SWEEP_EVERY {
            // The whole window, in case the saga confirmed some orders out of accept order.
            last_full = tokio::time::Instant::now();
            let Some(read) = read(open.iter().copied().take(SWEEP_WINDOW).collect()).await else {
                bound_hit = true;
                break;
            };
            for (i, state) in read {
                if let Some(s) = state {
                    states[i] = s;
                }
            }
        } else {
            // From the oldest open order on, a chunk at a time, up to the first chunk the saga
            // has not reached yet.
            for chunk in open
                .chunks(FOLLOW_CONCURRENCY)
                .take(SWEEP_WINDOW / FOLLOW_CONCURRENCY)
            {
                let Some(read) = read(chunk.to_vec()).await else {
                    bound_hit = true;
                    break 'follow;
                };
                let mut moved = false;
                for (i, state) in read {
                    if let Some(s) = state {
                        moved |= s != State::Pending;
                        states[i] = s;
                    }
                }
                if !moved {
                    break;
                }
            }
        }
        open.retain(|&i| states[i] == State::Pending);
        if open.is_empty() {
            break;
        }
        if tokio::time::Instant::now() >= until {
            bound_hit = true;
            break;
        }
        tokio::time::sleep_until((tokio::time::Instant::now() + POLL).min(until)).await;
    }
    tally(&accepts, &states, bound_hit)
}

/// The order's state as its buyer reads it; `Pending` when it cannot be read.
async fn read_state(
    client: OrderServiceClient<Channel>,
    tokens: &[String],
    accept: Accept,
) -> State {
    let Some(token) = tokens.get(accept.buyer) else {
        return State::Pending;
    };
    let answer = retrying(|| {
        let mut client = client.clone();
        let req = request(
            GetOrderRequest {
                order_id: accept.order_id.clone(),
            },
            token,
        );
        async move { client.get_order(req?).await }
    })
    .await;
    let read_at = Instant::now();
    let Some(order) = answer.ok().and_then(|r| r.into_inner().order) else {
        return State::Pending;
    };
    match OrderStatus::try_from(order.status) {
        Ok(OrderStatus::AwaitingPayment) => {
            // Unpaid, so its last change was the confirmation.
            let changed = order
                .update_time
                .and_then(|t| local_instant(t.seconds, t.nanos, read_at, SystemTime::now()));
            State::Confirmed(changed.map_or(read_at, |c| c.max(accept.at).min(read_at)))
        }
        Ok(OrderStatus::Paid | OrderStatus::Shipped) => State::Confirmed(read_at),
        Ok(OrderStatus::Cancelled) => State::Cancelled,
        _ => State::Pending,
    }
}

/// The states of `accepts` read from the order service's database in one query (`None` where an
/// order is missing or the query failed: read again at the next poll).
async fn read_states_from_db(
    db: &sea_orm::DatabaseConnection,
    accepts: &[Accept],
) -> Vec<Option<State>> {
    use sea_orm::{ConnectionTrait as _, DbBackend, Statement};
    let ids: Vec<uuid::Uuid> = accepts
        .iter()
        .filter_map(|a| a.order_id.parse().ok())
        .collect();
    let rows = db
        .query_all_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "SELECT order_id, status, updated_at FROM orders WHERE order_id = ANY($1)",
            [ids.into()],
        ))
        .await;
    let read_at = Instant::now();
    let now_wall = SystemTime::now();
    let mut found = std::collections::HashMap::new();
    for row in rows.unwrap_or_default() {
        let (Ok(id), Ok(status), Ok(at)) = (
            row.try_get::<uuid::Uuid>("", "order_id"),
            row.try_get::<String>("", "status"),
            row.try_get::<chrono::DateTime<chrono::Utc>>("", "updated_at"),
        ) else {
            continue;
        };
        found.insert(id.to_string(), (status, at));
    }
    accepts
        .iter()
        .map(|a| {
            let (status, at) = found.get(&a.order_id)?;
            Some(match status.as_str() {
                "PENDING" => State::Pending,
                "CANCELLED" => State::Cancelled,
                "AWAITING_PAYMENT" => {
                    let changed = local_instant(
                        at.timestamp(),
                        i32::try_from(at.timestamp_subsec_nanos()).unwrap_or(0),
                        read_at,
                        now_wall,
                    );
                    State::Confirmed(changed.map_or(read_at, |c| c.max(a.at).min(read_at)))
                }
                _ => State::Confirmed(read_at),
            })
        })
        .collect()
}

/// A wall-clock instant (Unix seconds and nanos) as an `Instant`, given one moment read on both.
fn local_instant(seconds: i64, nanos: i32, now: Instant, now_wall: SystemTime) -> Option<Instant> {
    let at = UNIX_EPOCH.checked_add(Duration::new(
        u64::try_from(seconds).ok()?,
        u32::try_from(nanos).ok()?,
    ))?;
    match now_wall.duration_since(at) {
        Ok(ago) => now.checked_sub(ago),
        Err(ahead) => now.checked_add(ahead.duration()),
    }
}

fn tally(accepts: &[Accept], states: &[State], bound_hit: bool) -> Saga {
    let first_accept = accepts.iter().map(|a| a.at).min();
    let last_confirmed = states
        .iter()
        .filter_map(|s| match s {
            State::Confirmed(at) => Some(*at),
            _ => None,
        })
        .max();
    let count = |want: fn(&State) -> bool| states.iter().filter(|s| want(s)).count();
    Saga {
        followed: accepts
            .iter()
            .map(|a| a.order_id.as_str())
            .collect::<std::collections::HashSet<_>>()
            .len(),
        confirmed: count(|s| matches!(s, State::Confirmed(_))),
        cancelled: count(|s| *s == State::Cancelled),
        unconfirmed: count(|s| *s == State::Pending),
        confirm: first_accept
            .zip(last_confirmed)
            .map(|(a, c)| c.saturating_duration_since(a)),
        bound_hit,
    }
}

// === impl Saga ===

impl Saga {
    /// Confirmed orders per second, first accept → last confirmation.
    pub fn confirmed_per_sec(&self) -> f64 {
        match self.confirm {
            Some(d) if self.confirmed > 0 => self.confirmed as f64 / d.as_secs_f64().max(1e-9),
            _ => 0.0,
        }
    }

    pub fn to_json(&self) -> Value {
        json!({
            "followed": self.followed,
            "confirmed": self.confirmed,
            "cancelled": self.cancelled,
            "unconfirmed": self.unconfirmed,
            "confirm_s": self.confirm.map(|d| d.as_secs_f64()),
            "confirmed_per_s": self.confirmed_per_sec(),
            "bound_hit": self.bound_hit,
        })
    }

    pub fn text(&self) -> String {
        let mut line = format!(
            "saga: {} of {} accepted orders confirmed in {} s (first accept → last confirmation): {:.0} confirmed/s",
            self.confirmed,
            self.followed,
            self.confirm
                .map_or("?".into(), |d| format!("{:.2}", d.as_secs_f64())),
            self.confirmed_per_sec()
        );
        if self.cancelled > 0 {
            line.push_str(&format!("; {} cancelled", self.cancelled));
        }
        if self.unconfirmed > 0 {
            line.push_str(&format!(
                "; {} NEVER CONFIRMED{}",
                self.unconfirmed,
                if self.bound_hit {
                    " (--max-seconds-per-mode passed)"
                } else {
                    ""
                }
            ));
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn confirmation_runs_from_the_first_accept_to_the_last_confirmation() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let accept = |ms: u64| Accept {
            order_id: format!("order-{ms}"),
            buyer: 0,
            at: at(ms),
        };
        let accepts = [accept(10), accept(0), accept(20), accept(30)];
        let states = [
            State::Confirmed(at(500)),
            State::Confirmed(at(2_000)),
            State::Cancelled,
            State::Pending,
        ];
        let saga = tally(&accepts, &states, true);
        assert_eq!(
            (
                saga.followed,
                saga.confirmed,
                saga.cancelled,
                saga.unconfirmed
            ),
            (4, 2, 1, 1)
        );
        assert_eq!(saga.confirm, Some(Duration::from_secs(2)));
        assert!((saga.confirmed_per_sec() - 1.0).abs() < 1e-9);
        assert!(saga.text().contains("1 NEVER CONFIRMED"));
        assert_eq!(saga.to_json()["confirm_s"], 2.0);
    }

    #[test]
    fn two_calls_answered_with_one_order_are_followed_as_one() {
        let at = Instant::now();
        let accept = |id: &str, buyer| Accept {
            order_id: id.to_owned(),
            buyer,
            at,
        };
        let accepts = [accept("a", 0), accept("b", 1), accept("a", 2)];
        let states = [State::Confirmed(at); 3];
        assert_eq!(tally(&accepts, &states, false).followed, 2);
    }

    #[test]
    fn server_timestamps_map_onto_this_clock() {
        let (now, wall) = (Instant::now(), SystemTime::now());
        let secs = |t: SystemTime| {
            let d = t.duration_since(UNIX_EPOCH).unwrap();
            (
                i64::try_from(d.as_secs()).unwrap(),
                i32::try_from(d.subsec_nanos()).unwrap(),
            )
        };
        let (s, n) = secs(wall - Duration::from_millis(1500));
        assert_eq!(
            local_instant(s, n, now, wall),
            Some(now - Duration::from_millis(1500))
        );
        let (s, n) = secs(wall + Duration::from_secs(2));
        assert_eq!(
            local_instant(s, n, now, wall),
            Some(now + Duration::from_secs(2))
        );
        assert_eq!(local_instant(-5, 0, now, wall), None);
        assert_eq!(local_instant(5, -1, now, wall), None);
        // Far beyond any clock: no panic, and never before now (read_state clamps it).
        assert!(local_instant(i64::MAX, 999_999_999, now, wall).is_none_or(|t| t > now));
    }

    #[test]
    fn nothing_confirmed_has_no_rate() {
        let saga = tally(&[], &[], false);
        assert_eq!(saga.confirm, None);
        assert_eq!(saga.confirmed_per_sec(), 0.0);
        assert!(saga.to_json()["confirm_s"].is_null());
    }
}
