//! `flashsale order stuck [--older-than 10m] [--json]`: the orders that stopped moving, each
//! with the event that would move it. The order service lists them with what it holds (an
//! unsent outbox row, a message parked by its own consumer); a PAID order's `order.paid` may be
//! parked at outbound and a PENDING order's `order.created` at product-stock, so their
//! dead-letter stores are read too and matched on the envelope's correlation id (the order id).

use std::{
    collections::HashMap,
    process::ExitCode,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use flashsale_proto::{
    admin::v1::DeadLetter,
    order::v1::{
        ListStuckOrdersRequest, OrderStatus, StuckOrder, WaitingPlace,
        order_service_client::OrderServiceClient,
    },
};
use tonic::transport::Channel;

use flashsale_bench::client::{authorized, status_error};

use crate::{
    dlq::{Admin, Service, correlation_id, dead_letter_json},
    output::to_json,
};

/// The longest `--older-than` the service accepts.
const MAX_OLDER_THAN: Duration = Duration::from_secs(30 * 86_400);

#[derive(clap::Args)]
pub struct Args {
    /// Stuck = not moved for longer than this, e.g. 90s, 10m, 2h, 1d (default: the order
    /// service's `saga.stuck_after_ms`).
    #[arg(long, value_parser = parse_age)]
    older_than: Option<Duration>,
    /// Print one JSON document instead of text.
    #[arg(long)]
    json: bool,
    /// product-stock's gRPC endpoint, for PENDING orders' parked `order.created`.
    #[arg(long, env = "FLASHSALE_PRODUCT_STOCK_URL")]
    stock_url: Option<String>,
    /// outbound's gRPC endpoint, for PAID orders' parked `order.paid`.
    #[arg(long, env = "FLASHSALE_OUTBOUND_URL")]
    outbound_url: Option<String>,
}

/// `90s`, `10m`, `2h`, `1d` or `500ms`: positive, at most 30 days.
fn parse_age(raw: &str) -> Result<Duration, String> {
    let bad = || format!("`{raw}` is not an age like 90s, 10m, 2h or 1d (at most 30d)");
    let split = raw.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (n, unit) = raw.split_at(split);
    let n: u64 = n.parse().map_err(|_| bad())?;
    let ms = match unit {
        "ms" => Some(n),
        "s" => n.checked_mul(1_000),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        "d" => n.checked_mul(86_400_000),
        _ => None,
    }
    .ok_or_else(bad)?;
    let age = Duration::from_millis(ms);
    if age.is_zero() || age > MAX_OLDER_THAN {
        return Err(bad());
    }
    Ok(age)
}

/// What another service holds for the stuck orders, by order id; or why it could not be read.
struct Elsewhere {
    service: Service,
    found: Result<HashMap<String, Vec<DeadLetter>>, String>,
}

impl Elsewhere {
    async fn read(service: Service, url: Option<String>, token: &str) -> Self {
        let url = url
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| service.default_url());
        let found = async {
            let mut admin = Admin::connect(&url, token.to_owned()).await?;
            let mut by_order: HashMap<String, Vec<DeadLetter>> = HashMap::new();
            for d in admin.list("", None).await? {
                if let Some(c) = correlation_id(&d) {
                    by_order.entry(c).or_default().push(d);
                }
            }
            anyhow::Ok(by_order)
        }
        .await
        .map_err(|e| format!("{e:#}"));
        Self { service, found }
    }

    fn of(&self, order_id: &str) -> &[DeadLetter] {
        match &self.found {
            Ok(m) => m.get(order_id).map_or(&[], Vec::as_slice),
            Err(_) => &[],
        }
    }
}

pub async fn run(
    args: Args,
    client: &mut OrderServiceClient<Channel>,
    token: &str,
) -> anyhow::Result<ExitCode> {
    let older_than_ms = args
        .older_than
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let (mut orders, mut page_token) = (Vec::new(), String::new());
    let threshold = loop {
        let req = ListStuckOrdersRequest {
            older_than_ms,
            page_size: 0,
            page_token,
        };
        let page = client
            .list_stuck_orders(authorized(req, token)?)
            .await
            .map_err(status_error)?
            .into_inner();
        orders.extend(page.orders);
        if page.next_page_token.is_empty() {
            break page.older_than_ms;
        }
        page_token = page.next_page_token;
    };
    let wanted = |s: OrderStatus| orders.iter().any(|o| o.status == s as i32);
    let mut elsewhere = Vec::new();
    if wanted(OrderStatus::Paid) {
        elsewhere.push(Elsewhere::read(Service::Outbound, args.outbound_url, token).await);
    }
    if wanted(OrderStatus::Pending) {
        elsewhere.push(Elsewhere::read(Service::ProductStock, args.stock_url, token).await);
    }
    if args.json {
        print_json(&orders, &elsewhere, threshold)?;
    } else {
        print_text(&orders, &elsewhere, threshold);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_json(
    orders: &[StuckOrder],
    elsewhere: &[Elsewhere],
    threshold: i64,
) -> anyhow::Result<()> {
    let mut list = Vec::new();
    for o in orders {
        let mut json = to_json(o, "flashsale.order.v1.StuckOrder")?;
        let mut parked = Vec::new();
        for e in elsewhere {
            for d in e.of(&o.order_id) {
                let mut d = dead_letter_json(d)?;
                if let Some(obj) = d.as_object_mut() {
                    obj.insert("service".to_owned(), e.service.name().into());
                }
                parked.push(d);
            }
        }
        if let Some(obj) = json.as_object_mut() {
            obj.insert("parkedElsewhere".to_owned(), parked.into());
        }
        list.push(json);
    }
    let unread: Vec<_> = elsewhere
        .iter()
        .filter_map(|e| {
            e.found
                .as_ref()
                .err()
                .map(|why| serde_json::json!({ "service": e.service.name(), "error": why }))
        })
        .collect();
    let doc = serde_json::json!({
        "olderThanMs": threshold.to_string(),
        "orders": list,
        "unreadable": unread,
    });
    println!("{}", serde_json::to_string_pretty(&doc)?);
    Ok(())
}

fn print_text(orders: &[StuckOrder], elsewhere: &[Elsewhere], threshold: i64) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    // Seconds since a protobuf timestamp's `seconds`.
    let age = |s: Option<i64>| s.map_or_else(|| "?".to_owned(), |t| human(now.saturating_sub(t)));
    println!(
        "{} stuck order(s), not moved for over {}",
        orders.len(),
        human(threshold / 1_000)
    );
    for e in elsewhere {
        if let Err(why) = &e.found {
            println!(
                "note: could not read {}'s dead letters: {why}",
                e.service.name()
            );
        }
    }
    for o in orders {
        let status = OrderStatus::try_from(o.status)
            .map_or("UNKNOWN", |s| s.as_str_name())
            .trim_start_matches("ORDER_STATUS_");
        println!(
            "\n{}  {status} for {}  sku {}  user {}",
            o.order_id,
            age(o.since.as_ref().map(|t| t.seconds)),
            o.sku,
            o.user_id
        );
        let mut any = false;
        for w in &o.events {
            any = true;
            if w.place == WaitingPlace::Outbox as i32 {
                println!(
                    "  {} unsent in order's outbox for {} ({} attempts){}",
                    w.r#type,
                    age(w.time.as_ref().map(|t| t.seconds)),
                    w.attempts,
                    suffix(&w.error)
                );
            } else {
                parked_line(
                    "order",
                    &w.r#type,
                    &w.queue,
                    &w.message_id,
                    &w.error,
                    age(w.time.as_ref().map(|t| t.seconds)),
                );
            }
        }
        for e in elsewhere {
            for d in e.of(&o.order_id) {
                any = true;
                parked_line(
                    e.service.name(),
                    &d.r#type,
                    &d.queue,
                    &d.message_id,
                    &d.error,
                    age(d.parked_time.as_ref().map(|t| t.seconds)),
                );
            }
        }
        if !any {
            println!(
                "  no waiting event found in the order service{}: it may be on a delay queue or \
                 in flight",
                match o.status {
                    s if s == OrderStatus::Paid as i32 => " or outbound",
                    s if s == OrderStatus::Pending as i32 => " or product-stock",
                    _ => "",
                }
            );
        }
    }
}

fn parked_line(service: &str, kind: &str, queue: &str, id: &str, error: &str, age: String) {
    println!("  {kind} parked at {service} for {age}{}", suffix(error));
    println!("    replay: flashsale dlq replay --service {service} --queue {queue} --id {id}");
}

fn suffix(error: &str) -> String {
    if error.is_empty() {
        String::new()
    } else {
        format!(": {error}")
    }
}

/// Seconds as `3d4h`, `2h5m`, `7m`, `40s`.
fn human(secs: i64) -> String {
    let secs = secs.max(0);
    match secs {
        s if s >= 86_400 => format!("{}d{}h", s / 86_400, s % 86_400 / 3_600),
        s if s >= 3_600 => format!("{}h{}m", s / 3_600, s % 3_600 / 60),
        s if s >= 60 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_parse_with_their_unit_and_junk_is_refused() {
        assert_eq!(parse_age("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_age("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_age("2h"), Ok(Duration::from_secs(7_200)));
        assert_eq!(parse_age("1d"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_age("500ms"), Ok(Duration::from_millis(500)));
        for junk in [
            "",
            "10",
            "m",
            "-1m",
            "0s",
            "10x",
            "31d",
            "1.5h",
            "99999999999999999999d",
        ] {
            assert!(parse_age(junk).is_err(), "{junk}");
        }
    }

    #[test]
    fn ages_print_short() {
        assert_eq!(human(40), "40s");
        assert_eq!(human(420), "7m");
        assert_eq!(human(7_500), "2h5m");
        assert_eq!(human(273_600), "3d4h");
    }
}
