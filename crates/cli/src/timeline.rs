//! `flashsale order timeline <order_id> [--json]`: one order's whole life in time order, as the
//! three services saw it. Each service answers `GetOrderTimeline` from its own database (the
//! order service its status history, payments and refund; product-stock its reservation and
//! stock movements; outbound its shipment), each with the order's events as it saw them
//! (written, published, consumed, parked); this merges the answers and names the trace to open
//! in a trace viewer.

use std::{process::ExitCode, time::Duration};

use flashsale_proto::admin::v1::{
    GetOrderTimelineRequest, GetOrderTimelineResponse, TimelineEntry, TimelineEntryKind,
    order_timeline_service_client::OrderTimelineServiceClient,
};
use tonic::transport::Channel;

use flashsale_bench::client::{authorized, connect, status_error};

use crate::{dlq::Service, output::to_json};

#[derive(clap::Args)]
pub struct Args {
    /// The order (its id).
    order_id: String,
    /// Print one JSON document instead of text.
    #[arg(long)]
    json: bool,
    /// product-stock's gRPC endpoint (default: FLASHSALE_PRODUCT_STOCK_URL, else the local
    /// port).
    #[arg(long, env = "FLASHSALE_PRODUCT_STOCK_URL")]
    stock_url: Option<String>,
    /// outbound's gRPC endpoint (default: FLASHSALE_OUTBOUND_URL, else the local port).
    #[arg(long, env = "FLASHSALE_OUTBOUND_URL")]
    outbound_url: Option<String>,
}

/// One service's answer, or why it could not be had.
struct Answer {
    service: Service,
    got: Result<GetOrderTimelineResponse, String>,
}

async fn ask(
    channel: Channel,
    order_id: &str,
    token: &str,
) -> anyhow::Result<GetOrderTimelineResponse> {
    let req = GetOrderTimelineRequest {
        order_id: order_id.to_owned(),
    };
    Ok(OrderTimelineServiceClient::new(channel)
        .get_order_timeline(authorized(req, token)?)
        .await
        .map_err(status_error)?
        .into_inner())
}

async fn ask_at(service: Service, url: Option<String>, order_id: &str, token: &str) -> Answer {
    let url = url
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| service.default_url());
    let got = async {
        let channel = connect(&url, Duration::from_secs(10)).await?;
        ask(channel, order_id, token).await
    }
    .await
    .map_err(|e| format!("{e:#}"));
    Answer { service, got }
}

/// Asks the order service (over `order`) first: an order it does not have fails the command.
/// The other two services' answers are merged in; one that cannot be read is named, and the
/// command then exits with 1 after printing the rest.
pub async fn run(args: Args, order: Channel, token: &str) -> anyhow::Result<ExitCode> {
    let own = ask(order, &args.order_id, token).await?;
    let others = [
        ask_at(Service::ProductStock, args.stock_url, &args.order_id, token).await,
        ask_at(Service::Outbound, args.outbound_url, &args.order_id, token).await,
    ];
    let mut trace_id = own.trace_id.clone();
    let mut entries = own.entries;
    let mut unread = Vec::new();
    for a in others {
        match a.got {
            Ok(r) => {
                if trace_id.is_empty() {
                    trace_id = r.trace_id;
                }
                entries.extend(r.entries);
            }
            Err(why) => unread.push((a.service, why)),
        }
    }
    // Stable: one instant's entries keep their service's order.
    entries.sort_by_key(|e| e.time.map(|t| (t.seconds, t.nanos)));
    if args.json {
        let mut list = Vec::with_capacity(entries.len());
        for e in &entries {
            list.push(to_json(e, "flashsale.admin.v1.TimelineEntry")?);
        }
        let unread: Vec<_> = unread
            .iter()
            .map(|(s, why)| serde_json::json!({ "service": s.name(), "error": why }))
            .collect();
        let doc = serde_json::json!({
            "orderId": args.order_id,
            "traceId": trace_id,
            "entries": list,
            "unreadable": unread,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        let trace = if trace_id.is_empty() {
            "no trace recorded".to_owned()
        } else {
            format!("trace {trace_id}")
        };
        println!(
            "order {} ({trace}), {} entries",
            args.order_id,
            entries.len()
        );
        for (service, why) in &unread {
            println!("! {} could not be read: {why}", service.name());
        }
        for e in &entries {
            println!("{}", line(e));
        }
    }
    Ok(if unread.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// One entry as a line of text: time, service, what, and its detail in brackets.
fn line(e: &TimelineEntry) -> String {
    let time = e
        .time
        .and_then(|t| {
            chrono::DateTime::from_timestamp(t.seconds, u32::try_from(t.nanos).unwrap_or(0))
        })
        .map_or_else(
            || "?".to_owned(),
            |t| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
        );
    let kind = TimelineEntryKind::try_from(e.kind)
        .map_or("?", |k| k.as_str_name())
        .trim_start_matches("TIMELINE_ENTRY_KIND_");
    let mut out = format!("{time}  {:<13}  {kind:<16}  {}", e.service, e.summary);
    if !e.detail.is_empty() {
        out.push_str(&format!(" [{}]", e.detail));
    }
    if !e.message_id.is_empty() {
        out.push_str(&format!(" message {}", e.message_id));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_names_time_service_kind_summary_detail_and_message() {
        let mut e = TimelineEntry {
            time: Some(Default::default()),
            service: "product-stock".to_owned(),
            kind: TimelineEntryKind::EventConsumed.into(),
            summary: "order.created consumed".to_owned(),
            detail: "product-stock.order-events".to_owned(),
            message_id: "m-1".to_owned(),
            ..TimelineEntry::default()
        };
        if let Some(t) = e.time.as_mut() {
            (t.seconds, t.nanos) = (1_796_000_000, 5_000_000);
        }
        assert_eq!(
            line(&e),
            "2026-11-30T00:53:20.005Z  product-stock  EVENT_CONSUMED    order.created consumed \
             [product-stock.order-events] message m-1"
        );
    }
}
