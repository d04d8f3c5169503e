//! The three service binaries with mutual TLS on every gRPC server and client: an order is
//! placed, paid and shipped; a client without a certificate is refused; the admin's calls are in
//! the audit log.

use std::time::Duration;

use flashsale_e2e::Stack;
use flashsale_platform::auth::Role;
use flashsale_proto::{
    order::v1::{
        CreateOrderRequest, GetOrderRequest, OrderStatus, PayOrderRequest,
        order_service_client::OrderServiceClient,
    },
    outbound::v1::{
        GetShipmentRequest, ShipmentStatus, outbound_service_client::OutboundServiceClient,
    },
    payment::v1::{
        PayCheckoutRequest, payment_provider_service_client::PaymentProviderServiceClient,
    },
    product::v1::{
        CreateProductRequest, DeductionPolicy,
        product_stock_service_client::ProductStockServiceClient,
    },
};
use flashsale_test_support::{
    eventually,
    grpc::{token, with_token},
    tls::Pki,
};

#[tokio::test]
async fn the_services_sell_pay_and_ship_over_mutual_tls() {
    let pki = Pki::new("flashsale-ca").unwrap();
    let stack = Stack::start_tls(&[], &pki).await.unwrap();
    assert!(stack.order.url().starts_with("https://"));

    let mut products = ProductStockServiceClient::new(stack.product_stock.channel().await.unwrap());
    let mut orders = OrderServiceClient::new(stack.order.channel().await.unwrap());
    let mut shipments = OutboundServiceClient::new(stack.outbound.channel().await.unwrap());
    let admin = token("ops-tls", Role::Admin);
    products
        .create_product(with_token(
            CreateProductRequest {
                sku: "TLS-1".into(),
                name: "over TLS".into(),
                price_cents: 700,
                initial_stock: 3,
                per_user_limit: 1,
                deduction_policy: DeductionPolicy::ReserveThenCommit as i32,
                stock_buckets: 0,
                ..Default::default()
            },
            &admin,
        ))
        .await
        .unwrap();

    let alice = token("alice", Role::User);
    let order = orders
        .create_order(with_token(
            CreateOrderRequest {
                request_id: "tls-1".into(),
                sku: "TLS-1".into(),
                quantity: 1,
            },
            &alice,
        ))
        .await
        .unwrap()
        .into_inner()
        .order
        .unwrap();

    // order → product-stock (reservation) and back over mutual TLS, then payable.
    let watcher = orders.clone();
    let status = |want: OrderStatus| {
        let (orders, alice, id) = (watcher.clone(), alice.clone(), order.order_id.clone());
        async move {
            eventually(Duration::from_secs(60), "order status", || {
                let (mut orders, alice, id) = (orders.clone(), alice.clone(), id.clone());
                async move {
                    let o = orders
                        .get_order(with_token(GetOrderRequest { order_id: id }, &alice))
                        .await
                        .ok()?
                        .into_inner()
                        .order?;
                    (o.status == want as i32).then_some(())
                }
            })
            .await
        }
    };
    status(OrderStatus::AwaitingPayment)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", stack.logs()));
    // PayOrder starts the payment; the buyer pays on the provider's checkout, and the
    // provider's signed notification reaches the order service over mutual TLS.
    let started = orders
        .pay_order(with_token(
            PayOrderRequest {
                order_id: order.order_id.clone(),
                ..Default::default()
            },
            &alice,
        ))
        .await
        .unwrap()
        .into_inner();
    let mut provider =
        PaymentProviderServiceClient::new(stack.payment_sim.channel().await.unwrap());
    provider
        .pay_checkout(PayCheckoutRequest {
            payment_id: started.checkout.unwrap().provider_payment_id,
        })
        .await
        .unwrap();
    // outbound → product-stock (commit) over mutual TLS: the order ships.
    status(OrderStatus::Shipped)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", stack.logs()));
    let shipment = shipments
        .get_shipment(with_token(
            GetShipmentRequest {
                order_id: order.order_id.clone(),
            },
            &alice,
        ))
        .await
        .unwrap()
        .into_inner()
        .shipment
        .unwrap();
    assert_eq!(shipment.status, ShipmentStatus::Shipped as i32);

    // A client without a certificate is refused by every service.
    for service in [&stack.product_stock, &stack.order, &stack.outbound] {
        let no_cert = flashsale_platform::tls::GrpcTlsSettings {
            ca_file: pki.ca_path(),
            ..Default::default()
        };
        let refused = async {
            let channel = flashsale_platform::grpc::endpoint(&service.url(), &no_cert)?
                .connect()
                .await?;
            tonic_health::pb::health_client::HealthClient::new(channel)
                .check(tonic_health::pb::HealthCheckRequest::default())
                .await?;
            anyhow::Ok(())
        };
        assert!(
            refused.await.is_err(),
            "{} served a client without a certificate",
            service.name
        );
    }

    // The admin's call is in product-stock's audit log with its caller and arguments.
    let log = stack.product_stock.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("admin action") && l.contains("CreateProduct"))
        .unwrap_or_else(|| panic!("no audit line for CreateProduct:\n{log}"));
    assert!(line.contains("ops-tls") && line.contains("TLS-1"), "{line}");
}
