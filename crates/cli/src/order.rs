//! `flashsale order create|get|list|watch|pay|cancel|stuck|timeline|refunds|refund-retry`
//! against the order service. Commands act as the buyer `--user` (a user token minted from the
//! shared secret) unless `--admin` or `--token` is given (`stuck`, `timeline`, `refunds` and
//! `refund-retry` always mint an admin token); answers print as JSON, a watch as one compact
//! JSON line per update, the stuck orders and the timeline as text unless `--json`.

use std::{process::ExitCode, time::Duration};

use anyhow::Context as _;
use clap::{Subcommand, ValueEnum};
use flashsale_platform::auth::Role;
use flashsale_proto::order::v1::{
    CancelOrderRequest, CreateOrderRequest, GetOrderRequest, ListOrdersRequest, ListRefundsRequest,
    OrderStatus, PayOrderRequest, RefundStatus, RetryRefundRequest, WatchOrderRequest,
    order_service_client::OrderServiceClient,
};
use tonic::transport::Channel;

use flashsale_bench::client::{Secret, authorized, connect, status_error};

use crate::output::{print, to_json};

/// Lifetime of a minted token; the service checks it once per call, so a long watch is fine.
const TOKEN_TTL: Duration = Duration::from_secs(600);

#[derive(clap::Args)]
pub struct Args {
    /// The order gRPC endpoint.
    #[arg(
        long,
        env = "FLASHSALE_ORDER_URL",
        default_value = "http://127.0.0.1:50052",
        global = true
    )]
    url: String,
    /// Bearer token to send; minted from the secret (see --user, --admin) when unset.
    #[arg(long, env = "FLASHSALE_TOKEN", hide_env_values = true, global = true)]
    token: Option<String>,
    /// The buyer: subject of the minted token.
    #[arg(long, default_value = "cli-user", global = true)]
    user: String,
    /// Mint an admin token (subject --user) instead of a user token: for get, list, watch and
    /// cancel of anyone's orders.
    #[arg(long, global = true)]
    admin: bool,
    #[command(flatten)]
    secret: Secret,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum Status {
    Pending,
    AwaitingPayment,
    Paid,
    Shipped,
    Cancelled,
}

#[derive(Subcommand)]
enum Command {
    /// Place an order; it answers PENDING at once (follow it with `watch`).
    Create {
        #[arg(long)]
        sku: String,
        /// Units to buy.
        #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
        quantity: i64,
        /// Idempotency key; a fresh one when unset.
        #[arg(long)]
        request_id: Option<String>,
    },
    /// Show one order.
    Get { order_id: String },
    /// List orders, newest first (every page unless --page-size is given).
    List {
        /// Whose orders (admin only; default: the caller, or everyone's for an admin).
        #[arg(long)]
        user_id: Option<String>,
        #[arg(long, value_enum)]
        status: Option<Status>,
        #[arg(long, allow_negative_numbers = true)]
        page_size: Option<i32>,
    },
    /// Print the order, then every change, one JSON line each, until it is shipped or
    /// cancelled.
    Watch {
        order_id: String,
        /// Give up (and fail) after this many seconds.
        #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..=604_800))]
        timeout_secs: u64,
    },
    /// Start paying an order awaiting payment: prints the order and where to pay (the payment
    /// provider's payment id and checkout URL). The order becomes PAID when the provider says
    /// the buyer paid; a repeat prints the same checkout.
    Pay {
        order_id: String,
        /// 0 (the default): the order's total; otherwise it must equal total_cents.
        #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
        amount_cents: i64,
        /// Deprecated and ignored (at most 64 characters): the provider names the payment.
        #[arg(long)]
        payment_id: Option<String>,
    },
    /// Cancel an order that is not yet paid.
    Cancel { order_id: String },
    /// Orders that stopped moving (admin): each with the event that would move it, as far as
    /// the order service sees it (its outbox, its dead letters), and parked messages of it at
    /// outbound (PAID orders) or product-stock (PENDING orders).
    Stuck(crate::stuck::Args),
    /// One order's whole life in time order (admin), as the three services saw it: its status
    /// changes, reservation and stock movements, payment, refund, shipment, and its events as
    /// each service wrote, published, consumed or parked them, with the trace id to open in a
    /// trace viewer.
    Timeline(crate::timeline::Args),
    /// Refunds and their attempts at the payment provider (admin), oldest first; `--status
    /// failed` shows the ones parked after the provider kept refusing them.
    Refunds {
        #[arg(long, value_enum)]
        status: Option<RefundFilter>,
        #[arg(long, allow_negative_numbers = true)]
        page_size: Option<i32>,
    },
    /// Ask the payment provider again for a refund parked FAILED (admin), once whatever made it
    /// refuse is fixed.
    RefundRetry { order_id: String },
}

#[derive(Clone, Copy, ValueEnum)]
enum RefundFilter {
    /// Requested from the provider, retried until it pays.
    Requested,
    /// Paid back by the provider.
    Completed,
    /// Parked after refund_max_attempts: needs a person.
    Failed,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let admin = args.admin
        || matches!(
            args.command,
            Command::Stuck(_)
                | Command::Timeline(_)
                | Command::Refunds { .. }
                | Command::RefundRetry { .. }
        );
    let token = match args.token.clone() {
        Some(t) => t,
        None => {
            let role = if admin { Role::Admin } else { Role::User };
            args.secret.mint(&args.user, role, TOKEN_TTL)?
        }
    };
    let channel = connect(&args.url, Duration::from_secs(10)).await?;
    let mut client = OrderServiceClient::new(channel.clone());
    match args.command {
        Command::Create {
            sku,
            quantity,
            request_id,
        } => {
            let req = CreateOrderRequest {
                request_id: request_id.unwrap_or_else(fresh_id),
                sku,
                quantity,
            };
            let resp = client
                .create_order(authorized(req, &token)?)
                .await
                .map_err(status_error)?;
            print(&resp.into_inner(), "flashsale.order.v1.CreateOrderResponse")?;
        }
        Command::Get { order_id } => {
            let resp = client
                .get_order(authorized(GetOrderRequest { order_id }, &token)?)
                .await
                .map_err(status_error)?;
            print(&resp.into_inner(), "flashsale.order.v1.GetOrderResponse")?;
        }
        Command::List {
            user_id,
            status,
            page_size,
        } => {
            let mut page_token = String::new();
            loop {
                let req = ListOrdersRequest {
                    user_id: user_id.clone().unwrap_or_default(),
                    status: status.map_or(OrderStatus::Unspecified, Status::to_proto) as i32,
                    page_size: page_size.unwrap_or(0),
                    page_token,
                };
                let page = client
                    .list_orders(authorized(req, &token)?)
                    .await
                    .map_err(status_error)?
                    .into_inner();
                print(&page, "flashsale.order.v1.ListOrdersResponse")?;
                if page_size.is_some() || page.next_page_token.is_empty() {
                    break;
                }
                page_token = page.next_page_token;
            }
        }
        Command::Watch {
            order_id,
            timeout_secs,
        } => {
            let limit = Duration::from_secs(timeout_secs);
            tokio::time::timeout(limit, watch(&mut client, order_id.clone(), &token, limit))
                .await
                .map_err(|_| {
                    anyhow::anyhow!("order {order_id} did not end within {timeout_secs} s")
                })??;
        }
        Command::Pay {
            order_id,
            amount_cents,
            payment_id,
        } => {
            let req = PayOrderRequest {
                order_id,
                payment_id: payment_id.unwrap_or_default(),
                amount_cents,
            };
            let resp = client
                .pay_order(authorized(req, &token)?)
                .await
                .map_err(status_error)?;
            print(&resp.into_inner(), "flashsale.order.v1.PayOrderResponse")?;
        }
        Command::Stuck(stuck) => return crate::stuck::run(stuck, &mut client, &token).await,
        Command::Timeline(t) => return crate::timeline::run(t, channel, &token).await,
        Command::RefundRetry { order_id } => {
            let resp = client
                .retry_refund(authorized(RetryRefundRequest { order_id }, &token)?)
                .await
                .map_err(status_error)?;
            print(&resp.into_inner(), "flashsale.order.v1.RetryRefundResponse")?;
        }
        Command::Refunds { status, page_size } => {
            let status = status.map_or(RefundStatus::Unspecified, |s| match s {
                RefundFilter::Requested => RefundStatus::Recorded,
                RefundFilter::Completed => RefundStatus::Completed,
                RefundFilter::Failed => RefundStatus::Failed,
            });
            let mut page_token = String::new();
            loop {
                let req = ListRefundsRequest {
                    status: status as i32,
                    page_size: page_size.unwrap_or(0),
                    page_token,
                };
                let page = client
                    .list_refunds(authorized(req, &token)?)
                    .await
                    .map_err(status_error)?
                    .into_inner();
                print(&page, "flashsale.order.v1.ListRefundsResponse")?;
                if page_size.is_some() || page.next_page_token.is_empty() {
                    break;
                }
                page_token = page.next_page_token;
            }
        }
        Command::Cancel { order_id } => {
            let resp = client
                .cancel_order(authorized(CancelOrderRequest { order_id }, &token)?)
                .await
                .map_err(status_error)?;
            print(&resp.into_inner(), "flashsale.order.v1.CancelOrderResponse")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints each message of the WatchOrder stream as a JSON line until the server ends it.
async fn watch(
    client: &mut OrderServiceClient<Channel>,
    order_id: String,
    token: &str,
    deadline: Duration,
) -> anyhow::Result<()> {
    let mut req = authorized(WatchOrderRequest { order_id }, token)?;
    // The server learns the deadline too (`grpc-timeout`), so it can drop the watch with us.
    req.set_timeout(deadline);
    let mut stream = client
        .watch_order(req)
        .await
        .map_err(status_error)?
        .into_inner();
    while let Some(update) = stream.message().await.map_err(status_error)? {
        let json = to_json(&update, "flashsale.order.v1.WatchOrderResponse")?;
        println!(
            "{}",
            serde_json::to_string(&json).context("encode an update")?
        );
    }
    Ok(())
}

fn fresh_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

// === impl Status ===

impl Status {
    fn to_proto(self) -> OrderStatus {
        match self {
            Status::Pending => OrderStatus::Pending,
            Status::AwaitingPayment => OrderStatus::AwaitingPayment,
            Status::Paid => OrderStatus::Paid,
            Status::Shipped => OrderStatus::Shipped,
            Status::Cancelled => OrderStatus::Cancelled,
        }
    }
}
