use flashsale_platform::{
    auth::{AuthInterceptor, Role, Verifier},
    error::{reason_of, violated_fields},
    grpc::{ServerRoutes, serve},
    settings::GrpcSettings,
};
use flashsale_proto::admin::v1::{
    DiscardDeadLettersRequest, ListDeadLettersRequest, ReplayDeadLettersRequest,
    dead_letter_service_client::DeadLetterServiceClient,
    dead_letter_service_server::{DeadLetterService as _, DeadLetterServiceServer},
};
use flashsale_test_support::grpc::{channel, token, with_token};
use tonic::{Code, Status, service::interceptor::InterceptedService};

use super::{Env, as_admin, as_role};
use crate::helpers::{Running, order_created};

fn replay(queue: &str, ids: &[&str], all: bool) -> ReplayDeadLettersRequest {
    ReplayDeadLettersRequest {
        queue: queue.to_owned(),
        message_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
        all,
    }
}

fn discard(queue: &str, ids: &[&str], all: bool) -> DiscardDeadLettersRequest {
    DiscardDeadLettersRequest {
        queue: queue.to_owned(),
        message_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
        all,
        reason: "test".to_owned(),
    }
}

fn assert_status(s: &Status, code: Code, reason: &str) {
    assert_eq!(s.code(), code, "{s:?}");
    assert_eq!(reason_of(s).as_deref(), Some(reason), "{s:?}");
}

#[tokio::test]
async fn callers_without_the_admin_role_or_without_identity_are_refused() {
    let env = Env::new(&["auth"]).await;
    let admin = env.admin();
    let q = env.queue(0);
    for role in [Role::User, Role::Service] {
        let s = admin
            .list_dead_letters(as_role(role, ListDeadLettersRequest::default()))
            .await
            .unwrap_err();
        assert_status(&s, Code::PermissionDenied, "PERMISSION_DENIED");
        let s = admin
            .replay_dead_letters(as_role(role, replay(&q, &[], true)))
            .await
            .unwrap_err();
        assert_status(&s, Code::PermissionDenied, "PERMISSION_DENIED");
        let s = admin
            .discard_dead_letters(as_role(role, discard(&q, &[], true)))
            .await
            .unwrap_err();
        assert_status(&s, Code::PermissionDenied, "PERMISSION_DENIED");
    }
    // Refused before the input is even looked at.
    let s = admin
        .list_dead_letters(tonic::Request::new(ListDeadLettersRequest {
            page_size: -1,
            ..Default::default()
        }))
        .await
        .unwrap_err();
    assert_status(&s, Code::Unauthenticated, "UNAUTHENTICATED");
    let s = admin
        .replay_dead_letters(tonic::Request::new(replay(&q, &[], true)))
        .await
        .unwrap_err();
    assert_status(&s, Code::Unauthenticated, "UNAUTHENTICATED");
    let s = admin
        .discard_dead_letters(tonic::Request::new(discard(&q, &[], true)))
        .await
        .unwrap_err();
    assert_status(&s, Code::Unauthenticated, "UNAUTHENTICATED");
}

#[tokio::test]
async fn over_grpc_only_an_admin_token_gets_through() {
    let env = Env::new(&["grpc"]).await;
    let draining = env.drainer();
    let event = order_created("o-grpc");
    env.park(0, &event, super::at(1), "boom").await;
    env.wait_parked(0, 1).await;
    draining.stop().await;

    let settings = GrpcSettings::on_port(0);
    let listener = flashsale_platform::grpc::bind(&GrpcSettings {
        addr: "127.0.0.1:0".to_owned(),
        ..settings.clone()
    })
    .await
    .unwrap();
    let port = listener.local_addr().unwrap().port();
    let routes = ServerRoutes::new().with_service(InterceptedService::new(
        DeadLetterServiceServer::new(env.admin()),
        AuthInterceptor::new(Verifier::development()),
    ));
    let server =
        Running::spawn(move |s| async move { serve(listener, &settings, routes, s).await });
    let mut client = DeadLetterServiceClient::new(channel(port).await.unwrap());

    let s = client
        .list_dead_letters(ListDeadLettersRequest::default())
        .await
        .unwrap_err();
    assert_status(&s, Code::Unauthenticated, "UNAUTHENTICATED");
    let s = client
        .replay_dead_letters(with_token(
            replay(&env.queue(0), &[], true),
            &token("alice", Role::User),
        ))
        .await
        .unwrap_err();
    assert_status(&s, Code::PermissionDenied, "PERMISSION_DENIED");
    let listed = client
        .list_dead_letters(with_token(
            ListDeadLettersRequest::default(),
            &token("root", Role::Admin),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.dead_letters.len(), 1);
    assert_eq!(listed.dead_letters[0].message_id, event.message_id);
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn unknown_queue_is_not_found() {
    let env = Env::new(&["known"]).await;
    let admin = env.admin();
    let unknown = format!("{}.other", env.queue(0));
    let s = admin
        .list_dead_letters(as_admin(ListDeadLettersRequest {
            queue: unknown.clone(),
            ..Default::default()
        }))
        .await
        .unwrap_err();
    assert_status(&s, Code::NotFound, "NOT_FOUND");
    let s = admin
        .replay_dead_letters(as_admin(replay(&unknown, &[], true)))
        .await
        .unwrap_err();
    assert_status(&s, Code::NotFound, "NOT_FOUND");
    let s = admin
        .discard_dead_letters(as_admin(discard(&unknown, &[], true)))
        .await
        .unwrap_err();
    assert_status(&s, Code::NotFound, "NOT_FOUND");
    // The parking lot itself is no consumer queue either.
    let s = admin
        .replay_dead_letters(as_admin(replay(
            &env.topology(0).dead_letter_queue(),
            &[],
            true,
        )))
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::NotFound);
}

#[tokio::test]
async fn ids_and_all_together_neither_of_them_or_a_bad_uuid_are_invalid_arguments() {
    let env = Env::new(&["input"]).await;
    let admin = env.admin();
    let q = env.queue(0);
    let id = uuid::Uuid::new_v4().to_string();
    let cases: [(ReplayDeadLettersRequest, Vec<&str>); 4] = [
        (replay(&q, &[&id], true), vec!["all"]),
        (replay(&q, &[], false), vec!["message_ids"]),
        (
            replay(&q, &[&id, "not-a-uuid"], false),
            vec!["message_ids[1]"],
        ),
        (replay("", &[], true), vec!["queue"]),
    ];
    for (req, fields) in cases {
        let s = admin.replay_dead_letters(as_admin(req)).await.unwrap_err();
        assert_status(&s, Code::InvalidArgument, "INVALID_ARGUMENT");
        assert_eq!(violated_fields(&s), fields);
    }
    let s = admin
        .discard_dead_letters(as_admin(discard(&q, &[&id], true)))
        .await
        .unwrap_err();
    assert_eq!(violated_fields(&s), vec!["all"]);
    let s = admin
        .discard_dead_letters(as_admin(discard(&q, &["nope"], false)))
        .await
        .unwrap_err();
    assert_eq!(violated_fields(&s), vec!["message_ids[0]"]);
    // Valid but unknown ids are simply not parked.
    let ok = admin
        .replay_dead_letters(as_admin(replay(&q, &[&id], false)))
        .await
        .unwrap();
    assert_eq!(ok.into_inner().replayed, 0);
}

#[tokio::test]
async fn list_refuses_a_negative_page_size_and_tokens_it_did_not_issue() {
    let env = Env::new(&["paging"]).await;
    let admin = env.admin();
    let list = |page_size: i32, page_token: &str| {
        admin.list_dead_letters(as_admin(ListDeadLettersRequest {
            queue: String::new(),
            page_size,
            page_token: page_token.to_owned(),
        }))
    };
    let s = list(-1, "").await.unwrap_err();
    assert_status(&s, Code::InvalidArgument, "INVALID_ARGUMENT");
    assert_eq!(violated_fields(&s), vec!["page_size"]);
    let forged = format!("01{}", "0".repeat(64));
    for token in ["garbage", forged.as_str(), "ééé"] {
        let s = list(10, token).await.unwrap_err();
        assert_eq!(s.code(), Code::InvalidArgument, "{token}");
        assert_eq!(violated_fields(&s), vec!["page_token"]);
    }
    // An empty list has no next page.
    let page = list(0, "").await.unwrap().into_inner();
    assert!(page.dead_letters.is_empty());
    assert_eq!(page.next_page_token, "");
}
