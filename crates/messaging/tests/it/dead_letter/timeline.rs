//! One order's timeline in one service: its events in the outbox (waiting with the broker's
//! refusal, or published and kept), in the inbox (consumed, after how many deliveries, in which
//! trace) and parked by the real drainer, found by their correlation id and merged with the
//! service's own records in time order; another order's rows stay out of it.

use std::collections::BTreeMap;

use flashsale_messaging::{
    inbox::{self, Claim},
    outbox,
    timeline::{OrderStory, TimelineAdmin},
};
use flashsale_platform::auth::Role;
use flashsale_proto::admin::v1::{
    GetOrderTimelineRequest, TimelineEntry, TimelineEntryKind,
    order_timeline_service_server::OrderTimelineService as _,
};
use futures_util::future::BoxFuture;
use sea_orm::{ConnectionTrait, DbBackend, DbErr, Statement};
use uuid::Uuid;

use super::{Env, TRACEPARENT, as_admin, as_role};
use crate::helpers::order_created;

/// The service's own record of the order: one entry at the epoch, or NOT_FOUND.
struct Story {
    known: bool,
}

impl OrderStory for Story {
    fn entries(&self, _: Uuid) -> BoxFuture<'_, Result<Option<Vec<TimelineEntry>>, DbErr>> {
        let entries = self.known.then(|| {
            vec![TimelineEntry {
                time: Some(Default::default()),
                kind: TimelineEntryKind::StatusChanged.into(),
                summary: "PENDING: 1 x SKU".into(),
                ..TimelineEntry::default()
            }]
        });
        Box::pin(async move { Ok(entries) })
    }
}

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

fn traced() -> outbox::TraceHeaders {
    BTreeMap::from([(
        "traceparent".to_owned(),
        format!("00-{TRACE}-00f067aa0ba902b7-01"),
    )])
}

#[tokio::test]
async fn an_orders_events_in_outbox_inbox_and_dead_letters_are_its_timeline() {
    let env = Env::new(&["timeline"]).await;
    let db = &env.db;
    let order = Uuid::new_v4().to_string();
    let other = Uuid::new_v4().to_string();

    // Written and published (kept); written and still waiting, refused twice by the broker.
    let (published, waiting) = (order_created(&order), order_created(&order));
    outbox::enqueue_many_traced(
        db,
        &[(published.clone(), traced()), (waiting.clone(), traced())],
        None,
    )
    .await
    .unwrap();
    outbox::enqueue(db, &order_created(&other)).await.unwrap();
    let set = |sql: &str, id: &str| {
        Statement::from_sql_and_values(
            DbBackend::Postgres,
            sql,
            [Uuid::parse_str(id).unwrap().into()],
        )
    };
    db.execute_raw(set(
        "UPDATE outbox SET published_at = now() WHERE message_id = $1",
        &published.message_id,
    ))
    .await
    .unwrap();
    db.execute_raw(set(
        "UPDATE outbox SET attempts = 2, last_error = 'NO_ROUTE' WHERE message_id = $1",
        &waiting.message_id,
    ))
    .await
    .unwrap();
    // Consumed on its third delivery; another order's event consumed too.
    let consumed = order_created(&order);
    let claim = Claim::of(&consumed, 3, &traced()).unwrap();
    assert!(inbox::claim(db, "it.consumer", claim).await.unwrap());
    let elsewhere = Claim::of(&order_created(&other), 1, &traced()).unwrap();
    assert!(inbox::claim(db, "it.consumer", elsewhere).await.unwrap());
    // Parked through the broker and the drainer, as a failing consumer parks it.
    let draining = env.drainer();
    let parked = order_created(&order);
    let now_ms = chrono::Utc::now().timestamp_millis();
    env.park(0, &parked, now_ms, "ledger is locked").await;
    env.wait_parked(0, 1).await;
    draining.stop().await;

    let admin = TimelineAdmin::new(db, "order", Story { known: true }).unwrap();
    let id = Uuid::parse_str(&order).unwrap();
    let entries = admin.timeline(id).await.unwrap().unwrap();
    let seen: Vec<(TimelineEntryKind, &str, i32)> = entries
        .iter()
        .map(|e| (e.kind(), e.message_id.as_str(), e.attempts))
        .collect();
    let mut want = vec![
        (TimelineEntryKind::StatusChanged, "", 0),
        (
            TimelineEntryKind::EventWritten,
            published.message_id.as_str(),
            0,
        ),
        (
            TimelineEntryKind::EventWritten,
            waiting.message_id.as_str(),
            2,
        ),
        (
            TimelineEntryKind::EventPublished,
            published.message_id.as_str(),
            0,
        ),
        (
            TimelineEntryKind::EventConsumed,
            consumed.message_id.as_str(),
            3,
        ),
        (
            TimelineEntryKind::EventParked,
            parked.message_id.as_str(),
            5,
        ),
    ];
    let mut got = seen.clone();
    got.sort();
    want.sort();
    assert_eq!(got, want, "{entries:#?}");
    let times: Vec<_> = entries
        .iter()
        .map(|e| e.time.map(|t| (t.seconds, t.nanos)))
        .collect();
    assert!(times.is_sorted(), "oldest first: {entries:#?}");
    assert!(entries.iter().all(|e| e.service == "order"));

    let of = |kind: TimelineEntryKind| entries.iter().find(|e| e.kind() == kind).unwrap();
    let written = entries
        .iter()
        .find(|e| e.message_id == waiting.message_id)
        .unwrap();
    assert!(
        written.summary.contains("waiting to be published") && written.detail == "NO_ROUTE",
        "{written:?}"
    );
    let c = of(TimelineEntryKind::EventConsumed);
    assert_eq!(
        (
            c.detail.as_str(),
            c.event_type.as_str(),
            c.trace_id.as_str()
        ),
        ("it.consumer", "order.created", TRACE)
    );
    assert!(c.summary.contains("retried 2 time(s)"), "{c:?}");
    let p = of(TimelineEntryKind::EventParked);
    assert_eq!(p.detail, "ledger is locked");
    assert!(p.summary.contains("still parked"), "{p:?}");
    assert_eq!(p.trace_id, TRACEPARENT.split('-').nth(1).unwrap());
    assert_eq!(of(TimelineEntryKind::EventPublished).trace_id, TRACE);

    // Over gRPC: the same entries and the first trace id they name; admins only.
    let answer = admin
        .get_order_timeline(as_admin(GetOrderTimelineRequest {
            order_id: order.clone(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.service, "order");
    assert_eq!(answer.entries, entries);
    assert!(answer.trace_id == TRACE || answer.trace_id == p.trace_id);
    let refused = admin
        .get_order_timeline(as_role(
            Role::User,
            GetOrderTimelineRequest {
                order_id: order.clone(),
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);

    // A service that does not know the order: NOT_FOUND, whatever its messages say.
    let unknown = TimelineAdmin::new(db, "order", Story { known: false }).unwrap();
    assert!(unknown.timeline(id).await.unwrap().is_none());
    let status = unknown
        .get_order_timeline(as_admin(GetOrderTimelineRequest { order_id: order }))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::NotFound);
}
