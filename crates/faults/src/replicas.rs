//! What the replica scenarios check beyond the invariants: that every replica carried part of
//! the sale. Each service's share is read from its own `/metrics` (counted since it last
//! started): product-stock's reservations answered, the order service's CreateOrder outcomes,
//! outbound's messages consumed.

use crate::{
    scenario::World,
    services::{Kind, Service},
};

/// The counters that say a replica of `kind` did work.
fn work(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::ProductStock => &[
            "flashsale_reserve_accepted_total",
            "flashsale_reserve_refused_total",
        ],
        Kind::Order => &[
            "flashsale_orders_accepted_total",
            "flashsale_orders_refused_total",
        ],
        Kind::Outbound => &["flashsale_messages_consumed_total"],
    }
}

async fn share(s: &Service) -> String {
    match s.counters(work(s.kind)).await {
        Some(n) => format!("{}={n}", s.label()),
        None => format!("{}=?", s.label()),
    }
}

/// Notes each replica's share of the work (`served=…`). With `all_must_work`, a replica that
/// did none is a violation (a balancer pinned to one, a consumer that never got a message);
/// otherwise (a scenario restarted the first replicas late in the sale) only the second
/// replicas, which ran throughout, must have worked.
pub(crate) async fn shares(w: &mut World, all_must_work: bool) {
    let mut notes = Vec::new();
    let mut idle = Vec::new();
    for s in w.services() {
        notes.push(share(s).await);
        let must = all_must_work || s.replica > 1;
        if must && s.counters(work(s.kind)).await.is_none_or(|n| n <= 0.0) {
            idle.push(s.label());
        }
    }
    w.notes.push(format!("served={}", notes.join(",")));
    if !idle.is_empty() {
        w.violations
            .push(format!("replicas that did no work: {}", idle.join(", ")));
    }
}
