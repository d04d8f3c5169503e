//! `flashsale dlq list|replay|discard --service product-stock|order|outbound`: the parked
//! messages of one service through its `flashsale.admin.v1.DeadLetterService` (admin token,
//! minted from the shared secret unless `--token` is given). Listing prints every page as one
//! JSON document, each message with the correlation id (the order id) read from its envelope;
//! replaying or discarding every parked message of a queue needs `--yes`.

use std::{process::ExitCode, time::Duration};

use anyhow::Context as _;
use clap::{Subcommand, ValueEnum};
use flashsale_platform::auth::Role;
use flashsale_proto::{
    admin::v1::{
        DeadLetter, DiscardDeadLettersRequest, ListDeadLettersRequest, ReplayDeadLettersRequest,
        dead_letter_service_client::DeadLetterServiceClient,
    },
    events::v1::Envelope,
};
use prost::Message as _;
use tonic::transport::Channel;

use flashsale_bench::client::{Secret, authorized, connect, status_error};

use crate::output::to_json;

/// Lifetime of a minted token.
const TOKEN_TTL: Duration = Duration::from_secs(600);
/// Longest discard reason, in characters (the service's limit).
const MAX_REASON_CHARS: usize = 500;
/// Most ids one call may name (the service's limit).
const MAX_IDS: usize = 1000;

/// A flashsale service, each serving the dead-letter admin for its own consumer queues.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Service {
    ProductStock,
    Order,
    Outbound,
}

impl Service {
    pub fn name(self) -> &'static str {
        match self {
            Self::ProductStock => "product-stock",
            Self::Order => "order",
            Self::Outbound => "outbound",
        }
    }

    /// The service's gRPC endpoint: its `FLASHSALE_<SERVICE>_URL`, or the local default.
    pub fn default_url(self) -> String {
        let (var, port) = match self {
            Self::ProductStock => ("FLASHSALE_PRODUCT_STOCK_URL", 50051),
            Self::Order => ("FLASHSALE_ORDER_URL", 50052),
            Self::Outbound => ("FLASHSALE_OUTBOUND_URL", 50053),
        };
        std::env::var(var)
            .ok()
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| format!("http://127.0.0.1:{port}"))
    }
}

#[derive(clap::Args)]
pub struct Args {
    /// Whose parked messages: product-stock, order or outbound.
    #[arg(long, value_enum, global = true)]
    service: Option<Service>,
    /// The service's gRPC endpoint (default: FLASHSALE_PRODUCT_STOCK_URL, FLASHSALE_ORDER_URL
    /// or FLASHSALE_OUTBOUND_URL, else the local port).
    #[arg(long, global = true)]
    url: Option<String>,
    /// Bearer token to send (an admin's); minted from the secret when unset.
    #[arg(long, env = "FLASHSALE_TOKEN", hide_env_values = true, global = true)]
    token: Option<String>,
    /// Subject of the minted admin token (who is logged as acting).
    #[arg(long, default_value = "cli-admin", global = true)]
    admin_name: String,
    #[command(flatten)]
    secret: Secret,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List parked messages, oldest first (every page unless --page-size is given).
    List {
        /// Only this consumer queue (default: all of the service's queues).
        #[arg(long)]
        queue: Option<String>,
        /// Only messages whose envelope's correlation id (the order id) is this.
        #[arg(long)]
        correlation_id: Option<String>,
        /// One page of at most this many.
        #[arg(long, value_parser = clap::value_parser!(i32).range(1..=500))]
        page_size: Option<i32>,
    },
    /// Put parked messages back on the queue they were parked from.
    Replay {
        #[command(flatten)]
        target: Target,
    },
    /// Discard parked messages for good (kept as DISCARDED with the reason, and logged).
    Discard {
        #[command(flatten)]
        target: Target,
        /// Why (1..=500 characters); logged with each message.
        #[arg(long)]
        reason: String,
    },
}

#[derive(clap::Args)]
struct Target {
    /// The consumer queue the messages were parked from (see `list`).
    #[arg(long)]
    queue: String,
    /// A message to act on (repeat for several); or --all.
    #[arg(long = "id", conflicts_with = "all")]
    ids: Vec<String>,
    /// Every parked message of --queue (needs --yes).
    #[arg(long)]
    all: bool,
    /// Confirm acting on every parked message of the queue.
    #[arg(long)]
    yes: bool,
}

impl Target {
    fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            !self.queue.trim().is_empty(),
            "--queue must not be empty (see `flashsale dlq list`)"
        );
        anyhow::ensure!(
            self.all || !self.ids.is_empty(),
            "name the messages with --id (repeatable), or pass --all"
        );
        anyhow::ensure!(
            !self.all || self.yes,
            "--all acts on every parked message of {}: add --yes to confirm",
            self.queue
        );
        anyhow::ensure!(self.ids.len() <= MAX_IDS, "at most {MAX_IDS} --id per call");
        for id in &self.ids {
            anyhow::ensure!(
                uuid::Uuid::try_parse(id).is_ok(),
                "--id `{id}` is not a message id (a UUID, see `flashsale dlq list`)"
            );
        }
        Ok(())
    }
}

/// A connected dead-letter admin client with its token.
pub struct Admin {
    client: DeadLetterServiceClient<Channel>,
    token: String,
}

impl Admin {
    pub async fn connect(url: &str, token: String) -> anyhow::Result<Self> {
        Ok(Self {
            client: DeadLetterServiceClient::new(connect(url, Duration::from_secs(10)).await?),
            token,
        })
    }

    /// Every parked message of `queue` ("" = all queues), every page (or one of `page_size`).
    pub async fn list(
        &mut self,
        queue: &str,
        page_size: Option<i32>,
    ) -> anyhow::Result<Vec<DeadLetter>> {
        let (mut all, mut page_token) = (Vec::new(), String::new());
        loop {
            let req = ListDeadLettersRequest {
                queue: queue.to_owned(),
                page_size: page_size.unwrap_or(0),
                page_token,
            };
            let page = self
                .client
                .list_dead_letters(authorized(req, &self.token)?)
                .await
                .map_err(status_error)?
                .into_inner();
            all.extend(page.dead_letters);
            if page_size.is_some() || page.next_page_token.is_empty() {
                return Ok(all);
            }
            page_token = page.next_page_token;
        }
    }
}

/// The envelope's correlation id (the order id), when the parked bytes are an envelope.
pub fn correlation_id(d: &DeadLetter) -> Option<String> {
    Envelope::decode(d.payload.as_slice())
        .ok()
        .map(|e| e.correlation_id)
}

/// `d` as protobuf JSON with its `correlationId` added.
pub fn dead_letter_json(d: &DeadLetter) -> anyhow::Result<serde_json::Value> {
    let mut json = to_json(d, "flashsale.admin.v1.DeadLetter")?;
    if let (Some(obj), Some(c)) = (json.as_object_mut(), correlation_id(d)) {
        obj.insert("correlationId".to_owned(), c.into());
    }
    Ok(json)
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let service = args
        .service
        .context("--service is required: product-stock, order or outbound")?;
    if let Command::Replay { target } | Command::Discard { target, .. } = &args.command {
        target.check()?;
    }
    if let Command::Discard { reason, .. } = &args.command {
        let n = reason.trim().chars().count();
        anyhow::ensure!(
            (1..=MAX_REASON_CHARS).contains(&n),
            "--reason must be 1..={MAX_REASON_CHARS} characters"
        );
    }
    let token = match args.token.clone() {
        Some(t) => t,
        None => args.secret.mint(&args.admin_name, Role::Admin, TOKEN_TTL)?,
    };
    let url = args.url.clone().unwrap_or_else(|| service.default_url());
    let mut admin = Admin::connect(&url, token).await?;
    match args.command {
        Command::List {
            queue,
            correlation_id: only,
            page_size,
        } => {
            let listed = admin
                .list(queue.as_deref().unwrap_or(""), page_size)
                .await?;
            let shown = listed
                .iter()
                .filter(|d| only.is_none() || correlation_id(d) == only)
                .map(dead_letter_json)
                .collect::<anyhow::Result<Vec<_>>>()?;
            let doc = serde_json::json!({
                "service": service.name(),
                "deadLetters": shown,
            });
            println!("{}", serde_json::to_string_pretty(&doc)?);
        }
        Command::Replay { target } => {
            let req = ReplayDeadLettersRequest {
                queue: target.queue,
                message_ids: target.ids,
                all: target.all,
            };
            let resp = admin
                .client
                .replay_dead_letters(authorized(req, &admin.token)?)
                .await
                .map_err(status_error)?;
            crate::output::print(
                &resp.into_inner(),
                "flashsale.admin.v1.ReplayDeadLettersResponse",
            )?;
        }
        Command::Discard { target, reason } => {
            let req = DiscardDeadLettersRequest {
                queue: target.queue,
                message_ids: target.ids,
                all: target.all,
                reason,
            };
            let resp = admin
                .client
                .discard_dead_letters(authorized(req, &admin.token)?)
                .await
                .map_err(status_error)?;
            crate::output::print(
                &resp.into_inner(),
                "flashsale.admin.v1.DiscardDeadLettersResponse",
            )?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
