//! The per-user read limit: one buyer reading GetProduct and ListProducts in a loop is refused
//! RESOURCE_EXHAUSTED with a retry delay, while another buyer, an admin and the services are
//! served.

use std::time::Duration;

use flashsale_platform::{auth::Role, error::reason_of};
use flashsale_proto::product::v1::{DeductionPolicy, GetProductRequest, ListProductsRequest};
use flashsale_test_support::{
    TestDatabase,
    grpc::{token, with_token},
};
use tonic::Code;
use tonic_types::StatusExt as _;

use crate::helpers::{spawn_with, test_settings};

#[tokio::test]
async fn a_buyer_reading_products_in_a_loop_is_rate_limited_while_others_are_served() {
    let db = TestDatabase::create().await.unwrap();
    let mut settings = test_settings(&db);
    settings.limits.read_per_sec = 2;
    settings.limits.read_burst = 5;
    let app = spawn_with(settings, db).await;
    app.create("READ", 10, 0, DeductionPolicy::ReserveThenCommit)
        .await;
    let c = app.client().await;
    let flooder = token("flooder", Role::User);
    let mut flood = tokio::task::JoinSet::new();
    for i in 0..200 {
        let (mut c, t) = (c.clone(), flooder.clone());
        flood.spawn(async move {
            if i % 2 == 0 {
                let req = GetProductRequest { sku: "READ".into() };
                c.get_product(with_token(req, &t)).await.map(drop)
            } else {
                let req = ListProductsRequest {
                    page_size: 500,
                    page_token: String::new(),
                };
                c.list_products(with_token(req, &t)).await.map(drop)
            }
        });
    }
    let (mut served, mut limited) = (0, 0);
    while let Some(answer) = flood.join_next().await {
        match answer.unwrap() {
            Ok(()) => served += 1,
            Err(status) => {
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                assert_eq!(reason_of(&status).as_deref(), Some("RATE_LIMITED"));
                let wait = status
                    .get_details_retry_info()
                    .and_then(|r| r.retry_delay)
                    .expect("a retry delay");
                assert!(wait > Duration::ZERO && wait <= Duration::from_secs(1));
                limited += 1;
            }
        }
    }
    assert!(served >= 5, "the burst is served: {served}");
    assert!(limited >= 150, "{limited} of 200 refused, {served} served");
    // Another buyer has their own count; admin and service calls are never counted.
    for (who, role, calls) in [
        ("calm", Role::User, 5),
        ("ops", Role::Admin, 50),
        ("order", Role::Service, 50),
    ] {
        let t = token(who, role);
        for _ in 0..calls {
            let req = GetProductRequest { sku: "READ".into() };
            let answer = c.clone().get_product(with_token(req, &t)).await;
            assert!(answer.is_ok(), "{who}: {answer:?}");
        }
    }
}
