//! The work queue each service consumes from, by name. Operators watch their depth (the broker
//! adds the deployment's `amqp.queue_prefix` in front), and `flashsale sale` reads it to follow a
//! sale's backlog.

/// The order service's saga queue: the stock outcome, the payment timeout, the shipment outcome.
pub const ORDER_SAGA_EVENTS: &str = "order.saga-events";
/// Product-stock's saga queue: `order.created` and `order.cancelled`.
pub const PRODUCT_STOCK_ORDER_EVENTS: &str = "product-stock.order-events";
/// Product-stock's queue of its own `stock.adjusted` events (to update the gate).
pub const PRODUCT_STOCK_STOCK_ADJUSTED: &str = "product-stock.stock-adjusted";
/// The outbound service's queue of `order.paid`.
pub const OUTBOUND_PAID_ORDERS: &str = "outbound.paid-orders";
