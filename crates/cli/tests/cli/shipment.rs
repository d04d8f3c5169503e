//! `flashsale shipment get|list` against outbound, after two sales through the whole stack: one
//! whose shipments go out, one whose every shipment the warehouse fails.

use serde_json::Value;

use crate::full_stack::{FullStack, orders_with_plan, report};

/// The shipments of `shipment list` output (one JSON page per document).
fn listed(stdout: &str) -> Vec<Value> {
    serde_json::Deserializer::from_str(stdout)
        .into_iter::<Value>()
        .flat_map(|page| {
            page.unwrap()["shipments"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect()
}

fn order_ids(shipments: &[Value]) -> Vec<String> {
    let mut ids: Vec<String> = shipments
        .iter()
        .map(|s| s["orderId"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    ids
}

#[tokio::test]
async fn shipment_get_shows_a_shipped_order_and_list_filters_failed_ones() {
    let stack = FullStack::spawn(|s| s.warehouse.fail_skus = "CLI-SHIP-BAD".into()).await;
    let mut reports = Vec::new();
    for sku in ["CLI-SHIP-OK", "CLI-SHIP-BAD"] {
        let run = stack
            .sale(&[
                "--sku",
                sku,
                "--buyers",
                "5",
                "--stock",
                "3",
                "--pay",
                "1",
                "--never-pay",
                "0",
                "--pay-late",
                "0",
                "--json",
            ])
            .await;
        reports.push(report(&run));
    }
    let shipped = orders_with_plan(&reports[0], "pay");
    let failed = orders_with_plan(&reports[1], "pay");
    assert_eq!((shipped.len(), failed.len()), (3, 3));

    // The buyer sees their own shipment; an admin sees anyone's; another buyer sees nothing.
    let (id, buyer) = (
        shipped[0]["orderId"].as_str().unwrap(),
        shipped[0]["buyer"].as_str().unwrap(),
    );
    let own = stack.shipment(&["get", id, "--user", buyer]).await.json();
    let s = &own["shipment"];
    assert_eq!(s["status"], "SHIPMENT_STATUS_SHIPPED", "{own}");
    assert_eq!(
        (
            s["orderId"].as_str(),
            s["sku"].as_str(),
            s["userId"].as_str()
        ),
        (Some(id), Some("CLI-SHIP-OK"), Some(buyer))
    );
    let admin = stack.shipment(&["get", id, "--admin"]).await.json();
    assert_eq!(admin["shipment"]["status"], "SHIPMENT_STATUS_SHIPPED");
    let stranger = stack.shipment(&["get", id, "--user", "nobody"]).await;
    assert!(
        !stranger.ok && stranger.stderr.contains("NotFound"),
        "{}",
        stranger.stderr
    );

    let list = stack.shipment(&["list", "--status", "failed"]).await;
    assert!(list.ok, "{}", list.stderr);
    let fails = listed(&list.stdout);
    let want: Vec<Value> = failed.iter().map(|o| (*o).clone()).collect();
    assert_eq!(order_ids(&fails), order_ids(&want), "{}", list.stdout);
    for s in &fails {
        assert_eq!(s["status"], "SHIPMENT_STATUS_FAILED", "{s}");
        assert!(!s["failureReason"].as_str().unwrap_or("").is_empty(), "{s}");
    }
    // One page at a time, and every status without a filter.
    let page = stack
        .shipment(&["list", "--status", "failed", "--page-size", "2"])
        .await
        .json();
    assert_eq!(page["shipments"].as_array().unwrap().len(), 2, "{page}");
    assert!(!page["nextPageToken"].as_str().unwrap_or("").is_empty());
    let all = stack.shipment(&["list"]).await;
    assert_eq!(listed(&all.stdout).len(), 6, "{}", all.stdout);
    let forged = stack.shipment(&["list", "--token", "forged"]).await;
    assert!(
        !forged.ok && forged.stderr.contains("Unauthenticated"),
        "{}",
        forged.stderr
    );
}
