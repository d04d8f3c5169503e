//! The platform itself: CreateOrder through the order service's gRPC API (gate, then one
//! transaction per accepted order), as a gateway sends it for many buyers; then the accepted
//! orders followed until the saga confirms them.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use flashsale_platform::auth::Role;
use flashsale_proto::{
    order::v1::order_service_client::OrderServiceClient,
    product::v1::{
        CreateProductRequest, DeductionPolicy,
        product_stock_service_client::ProductStockServiceClient,
    },
};

use super::{
    baselines::Load,
    measure::{Measurement, Outcome, drive},
    saga::{self, Accept, Saga},
};
use crate::client::{Placed, Secret, authorized, connect, place_order, status_error};

#[allow(clippy::too_many_arguments)]
pub async fn flood(
    product_stock_url: &str,
    order_urls: &[String],
    stock_buckets: u32,
    secret: &Secret,
    load: &Load,
    sku: &str,
    per_user_limit: u32,
    ticketing: bool,
    follow_db: Option<sea_orm::DatabaseConnection>,
) -> anyhow::Result<(Measurement, Saga)> {
    let admin = secret.mint("bench", Role::Admin, Duration::from_secs(3600))?;
    let policy = if ticketing {
        DeductionPolicy::CommitAtOrder
    } else {
        DeductionPolicy::ReserveThenCommit
    };
    let create = CreateProductRequest {
        sku: sku.into(),
        name: "bench".into(),
        price_cents: 1999,
        initial_stock: load.stock,
        per_user_limit,
        deduction_policy: policy as i32,
        stock_buckets,
        ..Default::default()
    };
    ProductStockServiceClient::new(connect(product_stock_url, Duration::from_secs(10)).await?)
        .create_product(authorized(create, &admin)?)
        .await
        .map_err(status_error)?;
    // Tokens are minted before the clock starts: a gateway holds its users' tokens already.
    let tokens: Vec<String> = (0..load.buyers)
        .map(|b| secret.mint(&format!("buyer{b}"), Role::User, Duration::from_secs(3600)))
        .collect::<anyhow::Result<_>>()?;
    let tokens = Arc::new(tokens);
    // A few HTTP/2 connections, as a gateway's pool would have (as many as the no-op mode),
    // spread over the order replicas in turn.
    let mut channels = Vec::new();
    for c in 0..load.connections.max(1) {
        let url = &order_urls[c % order_urls.len().max(1)];
        channels.push(OrderServiceClient::new(
            connect(url, Duration::from_secs(30)).await?,
        ));
    }
    let (sku, buyers) = (sku.to_owned(), load.buyers.max(1));
    let accepts: Arc<Mutex<Vec<Accept>>> = Arc::default();
    let follower = channels[0].clone();
    let measurement = drive(
        "platform (CreateOrder)",
        load.requests,
        load.concurrency,
        load.deadline,
        {
            let (accepts, tokens) = (accepts.clone(), tokens.clone());
            move |i| {
                let mut c = channels[i % channels.len()].clone();
                let (tokens, sku, accepts) = (tokens.clone(), sku.clone(), accepts.clone());
                async move {
                    let request_id = format!("{sku}-{i}");
                    match place_order(&mut c, &tokens[i % buyers], sku, request_id).await {
                        Placed::Accepted(order) => {
                            let at = Instant::now();
                            if let Ok(mut list) = accepts.lock() {
                                list.push(Accept {
                                    order_id: order.order_id,
                                    buyer: i % buyers,
                                    at,
                                });
                            }
                            Outcome::Accepted
                        }
                        other => other.into(),
                    }
                }
            }
        },
    )
    .await?;
    let accepts = match Arc::try_unwrap(accepts) {
        Ok(m) => m.into_inner().unwrap_or_else(|p| p.into_inner()),
        Err(shared) => shared.lock().map(|l| l.clone()).unwrap_or_default(),
    };
    let source = match follow_db {
        Some(db) => saga::Source::Database(db),
        None => saga::Source::Api(follower, tokens),
    };
    let saga = saga::follow(source, accepts, load.deadline).await;
    Ok((measurement, saga))
}
