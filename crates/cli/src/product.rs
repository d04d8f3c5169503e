//! `flashsale product create|update|get|list|restock|reconcile` against product-stock, and
//! `flashsale product report` against the order service. Commands mint
//! an admin token from the shared secret unless `--token` is given; answers print as JSON.

use std::{process::ExitCode, time::Duration};

use clap::{Subcommand, ValueEnum};
use flashsale_platform::auth::Role;
use flashsale_proto::order::v1::{GetSaleReportRequest, order_service_client::OrderServiceClient};
use flashsale_proto::product::v1::{
    AdjustStockRequest, CreateProductRequest, DeductionPolicy, GetProductRequest,
    ListProductsRequest, Product, ReconcileStockRequest, UpdateProductRequest,
    product_stock_service_client::ProductStockServiceClient,
};

use flashsale_bench::client::{Secret, authorized, connect, status_error};

use crate::output::print;

#[derive(clap::Args)]
pub struct Args {
    /// The product-stock gRPC endpoint.
    #[arg(
        long,
        env = "FLASHSALE_PRODUCT_STOCK_URL",
        default_value = "http://127.0.0.1:50051",
        global = true
    )]
    url: String,
    /// Bearer token to send; minted as admin `cli` from the secret when unset.
    #[arg(long, env = "FLASHSALE_TOKEN", hide_env_values = true, global = true)]
    token: Option<String>,
    #[command(flatten)]
    secret: Secret,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum Policy {
    /// Retail: reserve at order, deduct at shipment.
    ReserveThenCommit,
    /// Ticketing: deduct at order.
    CommitAtOrder,
}

#[derive(Subcommand)]
enum Command {
    /// Create a product with its initial stock.
    Create {
        #[arg(long)]
        sku: String,
        #[arg(long)]
        name: String,
        /// Unit price in cents.
        #[arg(long, allow_negative_numbers = true)]
        price_cents: i64,
        /// Initial stock in units.
        #[arg(long, allow_negative_numbers = true)]
        stock: i64,
        /// Most units one user may buy; 0 = no limit.
        #[arg(long, default_value_t = 0)]
        per_user_limit: u32,
        #[arg(long, value_enum, default_value = "reserve-then-commit")]
        policy: Policy,
        /// Stock buckets the gate splits the stock into, 1..=64, each on its own Redis Cluster
        /// slot (for hot products; docs/architecture.md#stock-buckets).
        #[arg(long, default_value_t = 1)]
        stock_buckets: u32,
        /// When the sale opens: RFC 3339 (2026-12-24T20:00:00Z) or from now (+90s, +15m, +2h);
        /// before it, orders are refused SALE_NOT_STARTED. On sale at once when unset.
        #[arg(long, value_parser = parse_instant)]
        sale_start: Option<i64>,
        /// When the sale closes (as --sale-start); from it on, orders are refused SALE_ENDED.
        #[arg(long, value_parser = parse_instant)]
        sale_end: Option<i64>,
        /// The unit price in cents of every order accepted (at most --price-cents).
        #[arg(long, allow_negative_numbers = true)]
        sale_price_cents: Option<i64>,
    },
    /// Change a product's terms: only the fields given change (UpdateProduct); idempotent on
    /// --request-id, and with --etag only if the product is still that version.
    Update {
        #[arg(long)]
        sku: String,
        #[arg(long)]
        name: Option<String>,
        #[arg(long, allow_negative_numbers = true)]
        price_cents: Option<i64>,
        /// 0 = no limit; a lower limit applies to new orders only.
        #[arg(long)]
        per_user_limit: Option<u32>,
        /// A new opening (RFC 3339 or +90s, +15m, +2h).
        #[arg(long, value_parser = parse_instant, conflicts_with = "no_sale_start")]
        sale_start: Option<i64>,
        /// Remove the opening: on sale until the window's end.
        #[arg(long)]
        no_sale_start: bool,
        /// A new closing (RFC 3339 or +90s, +15m, +2h); closes an open sale early.
        #[arg(long, value_parser = parse_instant, conflicts_with = "no_sale_end")]
        sale_end: Option<i64>,
        /// Remove the closing.
        #[arg(long)]
        no_sale_end: bool,
        #[arg(long, allow_negative_numbers = true, conflicts_with = "no_sale_price")]
        sale_price_cents: Option<i64>,
        /// Remove the sale price: orders are accepted at the price.
        #[arg(long)]
        no_sale_price: bool,
        /// The etag GetProduct answered: change only that version of the product.
        #[arg(long)]
        etag: Option<String>,
        /// Idempotency key; a fresh one when unset.
        #[arg(long)]
        request_id: Option<String>,
    },
    /// Show one product with its database and gate figures.
    Get { sku: String },
    /// The sale report of one product (GetSaleReport, asked of the order service): units,
    /// orders accepted, confirmed, paid, shipped and cancelled by reason, refunds, revenue at
    /// the accepted prices, refusals by reason, the time from the opening to sold out, and
    /// each second's accepted and refused calls.
    Report {
        sku: String,
        /// The order service's gRPC endpoint.
        #[arg(
            long,
            env = "FLASHSALE_ORDER_URL",
            default_value = "http://127.0.0.1:50052"
        )]
        order_url: String,
    },
    /// List products by sku (every page unless --page-size is given).
    List {
        #[arg(long)]
        page_size: Option<i32>,
    },
    /// Restock (positive delta) or write off (negative delta); idempotent on --request-id.
    Restock {
        #[arg(long)]
        sku: String,
        #[arg(long, allow_negative_numbers = true)]
        delta: i64,
        #[arg(long, default_value = "restock from the command line")]
        reason: String,
        /// Idempotency key; a fresh one when unset.
        #[arg(long)]
        request_id: Option<String>,
    },
    /// Compare the Redis gate with the database; --repair fixes drift.
    Reconcile {
        /// Products to check (all when none is given).
        #[arg(long = "sku")]
        skus: Vec<String>,
        #[arg(long)]
        repair: bool,
    },
}

/// An instant given on the command line, in milliseconds since the Unix epoch: RFC 3339, or a
/// whole number of seconds, minutes or hours from now (`+90s`, `+15m`, `+2h`).
pub fn parse_instant(s: &str) -> Result<i64, String> {
    let wanted = "an RFC 3339 instant (2026-12-24T20:00:00Z) or a time from now (+90s, +15m, +2h)";
    if let Some(rel) = s.strip_prefix('+') {
        let (n, unit) = rel.split_at(rel.len().saturating_sub(1));
        let per = match unit {
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            _ => return Err(format!("`{s}` is not {wanted}")),
        };
        let n: i64 = n
            .parse()
            .ok()
            .filter(|n| (0..=100 * 365 * 24 * 3_600).contains(n))
            .ok_or_else(|| format!("`{s}` is not {wanted}"))?;
        return Ok(chrono::Utc::now().timestamp_millis() + n * per);
    }
    flashsale_contract::parse_rfc3339_ms(s).ok_or_else(|| format!("`{s}` is not {wanted}"))
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let token = match args.token.clone() {
        Some(t) => t,
        None => args
            .secret
            .mint("cli", Role::Admin, Duration::from_secs(600))?,
    };
    if let Command::Report { sku, order_url } = &args.command {
        let mut orders =
            OrderServiceClient::new(connect(order_url, Duration::from_secs(10)).await?);
        let req = GetSaleReportRequest { sku: sku.clone() };
        let resp = orders
            .get_sale_report(authorized(req, &token)?)
            .await
            .map_err(status_error)?;
        print(
            &resp.into_inner(),
            "flashsale.order.v1.GetSaleReportResponse",
        )?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut client =
        ProductStockServiceClient::new(connect(&args.url, Duration::from_secs(10)).await?);
    match args.command {
        Command::Create {
            sku,
            name,
            price_cents,
            stock,
            per_user_limit,
            policy,
            stock_buckets,
            sale_start,
            sale_end,
            sale_price_cents,
        } => {
            let deduction_policy = match policy {
                Policy::ReserveThenCommit => DeductionPolicy::ReserveThenCommit,
                Policy::CommitAtOrder => DeductionPolicy::CommitAtOrder,
            } as i32;
            let req = CreateProductRequest {
                sku,
                name,
                price_cents,
                initial_stock: stock,
                per_user_limit,
                deduction_policy,
                stock_buckets,
                sale_start: sale_start.and_then(flashsale_contract::ms_to_timestamp),
                sale_end: sale_end.and_then(flashsale_contract::ms_to_timestamp),
                sale_price_cents,
            };
            let resp = client
                .create_product(authorized(req, &token)?)
                .await
                .map_err(status_error)?;
            print(
                &resp.into_inner(),
                "flashsale.product.v1.CreateProductResponse",
            )?;
        }
        Command::Update {
            sku,
            name,
            price_cents,
            per_user_limit,
            sale_start,
            no_sale_start,
            sale_end,
            no_sale_end,
            sale_price_cents,
            no_sale_price,
            etag,
            request_id,
        } => {
            let mut paths = Vec::new();
            let mut named = |path: &str, given: bool| {
                if given {
                    paths.push(path.to_owned());
                }
            };
            named("name", name.is_some());
            named("price_cents", price_cents.is_some());
            named("per_user_limit", per_user_limit.is_some());
            named("sale_start", sale_start.is_some() || no_sale_start);
            named("sale_end", sale_end.is_some() || no_sale_end);
            named(
                "sale_price_cents",
                sale_price_cents.is_some() || no_sale_price,
            );
            anyhow::ensure!(
                !paths.is_empty(),
                "nothing to change: give at least one of --name, --price-cents, --per-user-limit, \
                 --sale-start/--no-sale-start, --sale-end/--no-sale-end, \
                 --sale-price-cents/--no-sale-price"
            );
            let product = Product {
                sku,
                name: name.unwrap_or_default(),
                price_cents: price_cents.unwrap_or_default(),
                per_user_limit: per_user_limit.unwrap_or_default(),
                sale_start: sale_start.and_then(flashsale_contract::ms_to_timestamp),
                sale_end: sale_end.and_then(flashsale_contract::ms_to_timestamp),
                sale_price_cents,
                etag: etag.unwrap_or_default(),
                ..Product::default()
            };
            let req = UpdateProductRequest {
                request_id: request_id.unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
                product: Some(product),
                update_mask: Some(flashsale_contract::FieldMask { paths }),
            };
            let resp = client
                .update_product(authorized(req, &token)?)
                .await
                .map_err(status_error)?;
            print(
                &resp.into_inner(),
                "flashsale.product.v1.UpdateProductResponse",
            )?;
        }
        // Answered above, by the order service.
        Command::Report { .. } => {}
        Command::Get { sku } => {
            let resp = client
                .get_product(authorized(GetProductRequest { sku }, &token)?)
                .await
                .map_err(status_error)?;
            print(
                &resp.into_inner(),
                "flashsale.product.v1.GetProductResponse",
            )?;
        }
        Command::List { page_size } => {
            let mut page_token = String::new();
            loop {
                let req = ListProductsRequest {
                    page_size: page_size.unwrap_or(0),
                    page_token,
                };
                let page = client
                    .list_products(authorized(req, &token)?)
                    .await
                    .map_err(status_error)?
                    .into_inner();
                print(&page, "flashsale.product.v1.ListProductsResponse")?;
                if page_size.is_some() || page.next_page_token.is_empty() {
                    break;
                }
                page_token = page.next_page_token;
            }
        }
        Command::Restock {
            sku,
            delta,
            reason,
            request_id,
        } => {
            let request_id = request_id.unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
            let req = AdjustStockRequest {
                request_id,
                sku,
                delta,
                reason,
            };
            let resp = client
                .adjust_stock(authorized(req, &token)?)
                .await
                .map_err(status_error)?;
            print(
                &resp.into_inner(),
                "flashsale.product.v1.AdjustStockResponse",
            )?;
        }
        Command::Reconcile { skus, repair } => {
            let resp = client
                .reconcile_stock(authorized(ReconcileStockRequest { skus, repair }, &token)?)
                .await
                .map_err(status_error)?;
            print(
                &resp.into_inner(),
                "flashsale.product.v1.ReconcileStockResponse",
            )?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
