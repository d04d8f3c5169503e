//! `flashsale shipment get|list` against the outbound service. `get` acts as the buyer `--user`
//! (a user token minted from the shared secret) unless `--admin` or `--token` is given; `list`
//! needs an admin and mints an admin token by default. Answers print as JSON.

use std::{process::ExitCode, time::Duration};

use clap::{Subcommand, ValueEnum};
use flashsale_platform::auth::Role;
use flashsale_proto::outbound::v1::{
    GetShipmentRequest, ListShipmentsRequest, ShipmentStatus,
    outbound_service_client::OutboundServiceClient,
};

use flashsale_bench::client::{Secret, authorized, connect, status_error};

use crate::output::print;

/// Lifetime of a minted token.
const TOKEN_TTL: Duration = Duration::from_secs(600);

#[derive(clap::Args)]
pub struct Args {
    /// The outbound gRPC endpoint.
    #[arg(
        long,
        env = "FLASHSALE_OUTBOUND_URL",
        default_value = "http://127.0.0.1:50053",
        global = true
    )]
    url: String,
    /// Bearer token to send; minted from the secret (see --user, --admin) when unset.
    #[arg(long, env = "FLASHSALE_TOKEN", hide_env_values = true, global = true)]
    token: Option<String>,
    /// The buyer: subject of the minted token (`get` sees only this buyer's shipments).
    #[arg(long, default_value = "cli-user", global = true)]
    user: String,
    /// Mint an admin token (subject --user): `get` of anyone's shipment. `list` always mints
    /// one.
    #[arg(long, global = true)]
    admin: bool,
    #[command(flatten)]
    secret: Secret,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum Status {
    Picking,
    Shipped,
    Failed,
}

#[derive(Subcommand)]
enum Command {
    /// Show the shipment of one order.
    Get { order_id: String },
    /// List shipments, newest first (every page unless --page-size is given); admin only.
    List {
        #[arg(long, value_enum)]
        status: Option<Status>,
        #[arg(long, allow_negative_numbers = true)]
        page_size: Option<i32>,
        /// Only shipments created longer ago than this many milliseconds; with `--status
        /// picking`, the shipments delayed that long, each with its last error.
        #[arg(long, allow_negative_numbers = true, default_value_t = 0)]
        older_than_ms: i64,
    },
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let admin = args.admin || matches!(args.command, Command::List { .. });
    let token = match args.token.clone() {
        Some(t) => t,
        None => {
            let role = if admin { Role::Admin } else { Role::User };
            args.secret.mint(&args.user, role, TOKEN_TTL)?
        }
    };
    let mut client = OutboundServiceClient::new(connect(&args.url, Duration::from_secs(10)).await?);
    match args.command {
        Command::Get { order_id } => {
            let resp = client
                .get_shipment(authorized(GetShipmentRequest { order_id }, &token)?)
                .await
                .map_err(status_error)?;
            print(
                &resp.into_inner(),
                "flashsale.outbound.v1.GetShipmentResponse",
            )?;
        }
        Command::List {
            status,
            page_size,
            older_than_ms,
        } => {
            let mut page_token = String::new();
            loop {
                let req = ListShipmentsRequest {
                    status: status.map_or(ShipmentStatus::Unspecified, Status::to_proto) as i32,
                    page_size: page_size.unwrap_or(0),
                    page_token,
                    older_than_ms,
                };
                let page = client
                    .list_shipments(authorized(req, &token)?)
                    .await
                    .map_err(status_error)?
                    .into_inner();
                print(&page, "flashsale.outbound.v1.ListShipmentsResponse")?;
                if page_size.is_some() || page.next_page_token.is_empty() {
                    break;
                }
                page_token = page.next_page_token;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

// === impl Status ===

impl Status {
    fn to_proto(self) -> ShipmentStatus {
        match self {
            Status::Picking => ShipmentStatus::Picking,
            Status::Shipped => ShipmentStatus::Shipped,
            Status::Failed => ShipmentStatus::Failed,
        }
    }
}
