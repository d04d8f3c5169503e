//! GetOrder, ListOrders and WatchOrder: own orders only, paging, the stream of changes.

use flashsale_proto::order::v1::{
    CancelOrderRequest, GetOrderRequest, ListOrdersRequest, OrderStatus, WatchOrderRequest,
};
use tonic::Code;

use crate::helpers::{as_admin, as_user, reason, spawn_app, spawn_stack};

#[tokio::test]
async fn a_user_sees_only_their_own_orders_and_admins_see_all() {
    let app = spawn_stack(|_| {}).await;
    app.product("Q1", 20, 0).await;
    for i in 0..5 {
        app.order("alice", &format!("a{i}"), "Q1", 1).await.unwrap();
    }
    let bobs = app.order("bob", "b", "Q1", 1).await.unwrap();
    let mut c = app.client().await;
    let hidden = c
        .get_order(as_user(
            "alice",
            GetOrderRequest {
                order_id: bobs.order_id.clone(),
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(hidden.code(), Code::NotFound);
    let seen = c
        .get_order(as_admin(GetOrderRequest {
            order_id: bobs.order_id.clone(),
        }))
        .await
        .unwrap();
    assert_eq!(seen.into_inner().order.unwrap().user_id, "bob");

    let (mut ids, mut token) = (Vec::new(), String::new());
    loop {
        let req = ListOrdersRequest {
            page_size: 2,
            page_token: token,
            ..Default::default()
        };
        let page = c
            .list_orders(as_user("alice", req))
            .await
            .unwrap()
            .into_inner();
        assert!(page.orders.iter().all(|o| o.user_id == "alice"));
        ids.extend(page.orders.into_iter().map(|o| o.order_id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(ids.len(), 5);
    assert_eq!(
        ids.iter().collect::<std::collections::BTreeSet<_>>().len(),
        5,
        "no order twice"
    );

    let other = ListOrdersRequest {
        user_id: "bob".into(),
        ..Default::default()
    };
    let err = c
        .list_orders(as_user("alice", other.clone()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    let bob = c.list_orders(as_admin(other)).await.unwrap().into_inner();
    assert_eq!(bob.orders.len(), 1);
    let all = c
        .list_orders(as_admin(ListOrdersRequest::default()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(all.orders.len(), 6);
}

#[tokio::test]
async fn bad_queries_are_invalid_argument() {
    let app = spawn_app().await;
    let mut c = app.client().await;
    let err = c
        .get_order(as_user(
            "alice",
            GetOrderRequest {
                order_id: "42".into(),
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    for req in [
        ListOrdersRequest {
            page_size: -1,
            ..Default::default()
        },
        ListOrdersRequest {
            page_token: "forged".into(),
            ..Default::default()
        },
        ListOrdersRequest {
            status: 99,
            ..Default::default()
        },
    ] {
        let err = c.list_orders(as_user("alice", req)).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
    }
    let err = c
        .watch_order(as_user(
            "alice",
            WatchOrderRequest {
                order_id: "x".into(),
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let unknown = uuid::Uuid::new_v4().to_string();
    let err = c
        .watch_order(as_user("alice", WatchOrderRequest { order_id: unknown }))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
}

#[tokio::test]
async fn watch_streams_every_change_until_the_order_is_terminal() {
    let app = spawn_stack(|_| {}).await;
    app.product("W1", 5, 0).await;
    let o = app.order("alice", "w", "W1", 1).await.unwrap();
    let mut c = app.client().await;
    let mut stream = c
        .watch_order(as_user(
            "alice",
            WatchOrderRequest {
                order_id: o.order_id.clone(),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    let mut statuses = Vec::new();
    let mut cancelled = false;
    let watch = async {
        while let Some(msg) = stream.message().await.unwrap() {
            let status = msg.order.unwrap().status;
            if statuses.last() != Some(&status) {
                statuses.push(status);
            }
            if status == OrderStatus::AwaitingPayment as i32 && !cancelled {
                cancelled = true;
                let req = CancelOrderRequest {
                    order_id: o.order_id.clone(),
                };
                app.client()
                    .await
                    .cancel_order(as_user("alice", req))
                    .await
                    .unwrap();
            }
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(20), watch)
        .await
        .expect("stream did not end");
    assert!(
        [
            OrderStatus::Pending as i32,
            OrderStatus::AwaitingPayment as i32
        ]
        .contains(&statuses[0]),
        "the stream starts with the current state: {statuses:?}"
    );
    assert_eq!(statuses.last(), Some(&(OrderStatus::Cancelled as i32)));
    assert!(
        statuses.contains(&(OrderStatus::AwaitingPayment as i32)),
        "{statuses:?}"
    );
}

#[tokio::test]
async fn a_watch_ends_unavailable_server_stopping_when_its_replica_stops() {
    let app = spawn_stack(|_| {}).await;
    app.product("W2", 5, 0).await;
    let o = app.order("alice", "w", "W2", 1).await.unwrap();
    let mut c = app.client().await;
    let mut stream = c
        .watch_order(as_user(
            "alice",
            WatchOrderRequest {
                order_id: o.order_id.clone(),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().expect("the current state");
    assert_eq!(first.order.unwrap().order_id, o.order_id);
    app.shutdown.trigger();
    // Changes the saga made meanwhile may come first; then the stream ends with the reason.
    let end = tokio::time::timeout(std::time::Duration::from_secs(20), async {
        loop {
            match stream.message().await {
                Ok(Some(msg)) => {
                    let status = msg.order.unwrap().status;
                    assert_ne!(status, OrderStatus::Cancelled as i32, "nothing cancels it");
                }
                Ok(None) => return None,
                Err(e) => return Some(e),
            }
        }
    })
    .await
    .expect("the stream did not end after the stop");
    let e = end.expect("the stream ended without saying why");
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert_eq!(reason(&e), "SERVER_STOPPING");
}
