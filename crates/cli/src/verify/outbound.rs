//! The outbound service's contract: `OutboundService` as a buyer and an admin, on an order the
//! suite places and pays (through the order service and the payment simulator), and the admin
//! APIs.

use anyhow::{Context as _, ensure};
use flashsale_proto::{
    admin::v1::{
        GetOrderTimelineRequest, order_timeline_service_client::OrderTimelineServiceClient,
    },
    order::v1::OrderStatus,
    outbound::v1::{
        GetShipmentRequest, ListShipmentsRequest, ShipmentStatus,
        outbound_service_client::OutboundServiceClient,
    },
};
use tonic::Code;

use super::{
    Ctx, Report, answered, bad_field, denied, order, product_stock, refused, serving, with,
};

const SERVICE: &str = "flashsale.outbound.v1.OutboundService";

pub(super) async fn run(cx: &Ctx, url: &str, report: &mut Report) -> anyhow::Result<()> {
    let channel = cx.channel(url).await?;
    serving(report, &channel, &[SERVICE]).await;
    let (admin, buyer, other) = (cx.admin()?, cx.user("shopper")?, cx.user("other")?);
    let c = OutboundServiceClient::new(channel.clone());
    let get = |order_id: &str| GetShipmentRequest {
        order_id: order_id.to_owned(),
    };

    report.record(
        "GetShipment without a token: UNAUTHENTICATED",
        refused(
            c.clone()
                .get_shipment(get(&uuid::Uuid::new_v4().to_string()))
                .await,
            Code::Unauthenticated,
            None,
        ),
    );
    report.record(
        "GetShipment of an order with no shipment: NOT_FOUND",
        refused(
            c.clone()
                .get_shipment(with(get(&uuid::Uuid::new_v4().to_string()), &buyer))
                .await,
            Code::NotFound,
            None,
        ),
    );
    report.record(
        "GetShipment of a malformed id: INVALID_ARGUMENT order_id",
        bad_field(
            c.clone()
                .get_shipment(with(get("not-a-uuid"), &buyer))
                .await,
            "order_id",
        ),
    );
    report.record(
        "ListShipments",
        answered(
            c.clone()
                .list_shipments(with(ListShipmentsRequest::default(), &admin))
                .await,
        )
        .map(drop),
    );
    report.record(
        "ListShipments as a buyer: PERMISSION_DENIED",
        denied(
            c.clone()
                .list_shipments(with(ListShipmentsRequest::default(), &buyer))
                .await,
        ),
    );
    report.record(
        "ListShipments older than 31 days: INVALID_ARGUMENT older_than_ms",
        bad_field(
            c.clone()
                .list_shipments(with(
                    ListShipmentsRequest {
                        older_than_ms: 31 * 24 * 3_600_000,
                        ..Default::default()
                    },
                    &admin,
                ))
                .await,
            "older_than_ms",
        ),
    );

    // A shipped order: placed, paid at the simulator, shipped.
    let shipped = "a paid order is shipped: GetShipment as its buyer and an admin, NOT_FOUND to another buyer, its timeline";
    match &cx.payment_sim_url {
        None => report.not_made(shipped, "no --payment-sim-url: the suite cannot pay"),
        Some(sim_url) => {
            let sku = cx.sku("ship");
            let outcome = async {
                let stock = cx.channel(&cx.product_stock_url).await?;
                let orders = cx.channel(&cx.order_url).await?;
                let sim = cx.channel(sim_url).await?;
                product_stock::create(&stock, &admin, product_stock::product(&sku, 1)).await?;
                let placed = order::place_and_confirm(cx, &orders, &buyer, &sku).await?;
                order::pay(&orders, &sim, &buyer, &placed).await?;
                order::wait_for(cx, &orders, &buyer, &placed.order_id, OrderStatus::Shipped)
                    .await?;
                for token in [&buyer, &admin] {
                    let s = answered(
                        c.clone()
                            .get_shipment(with(get(&placed.order_id), token))
                            .await,
                    )?
                    .shipment
                    .context("no shipment in the answer")?;
                    ensure!(
                        s.status() == ShipmentStatus::Shipped
                            && s.sku == sku
                            && s.quantity == 1
                            && s.stock_committed,
                        "answered {s:?}"
                    );
                }
                refused(
                    c.clone()
                        .get_shipment(with(get(&placed.order_id), &other))
                        .await,
                    Code::NotFound,
                    None,
                )?;
                let timeline = answered(
                    OrderTimelineServiceClient::new(channel.clone())
                        .get_order_timeline(with(
                            GetOrderTimelineRequest {
                                order_id: placed.order_id.clone(),
                            },
                            &admin,
                        ))
                        .await,
                )?;
                ensure!(
                    timeline.service == "outbound" && !timeline.entries.is_empty(),
                    "answered {timeline:?}"
                );
                anyhow::Ok(())
            }
            .await;
            report.record(shipped, outcome);
        }
    }
    product_stock::admin_apis(cx, report, &channel).await
}
