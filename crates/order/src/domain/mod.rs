//! Pure order types and rules: the state machine, identifiers and input checks. No tonic,
//! sea-orm, lapin or redis here.

use std::fmt;

use chrono::{DateTime, Utc};
use flashsale_contract::{REQUEST_ID_MAX_LEN, check_sku, check_text, parse_canonical_uuid};
use uuid::Uuid;

mod error;
mod payment;

pub use error::OrderError;
/// When product-stock deducts on_hand (carried on the order's events) and why the gate refuses
/// a reservation: the contract's own types.
pub use flashsale_contract::{Policy, Refusal};
pub use payment::{
    NewPayment, Notice, PaymentAtProvider, PaymentAtProviderState, PaymentProvider, ProviderError,
    ProviderPayment, RefundCall, RefundState, StartPayment, refund_backoff,
};

/// Where an order is in the saga (docs/architecture.md#the-order-saga).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    Pending,
    AwaitingPayment,
    Paid,
    Shipped,
    Cancelled,
}

impl Status {
    pub const ALL: [Status; 5] = [
        Status::Pending,
        Status::AwaitingPayment,
        Status::Paid,
        Status::Shipped,
        Status::Cancelled,
    ];

    pub fn as_db(self) -> &'static str {
        match self {
            Self::Pending => "PENDING",
            Self::AwaitingPayment => "AWAITING_PAYMENT",
            Self::Paid => "PAID",
            Self::Shipped => "SHIPPED",
            Self::Cancelled => "CANCELLED",
        }
    }

    pub fn from_db(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|st| st.as_db() == s)
    }

    /// Shipped and cancelled orders never change again.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Shipped | Self::Cancelled)
    }

    /// Whether the state machine allows `self → to`.
    pub fn can_become(self, to: Status) -> bool {
        use Status::*;
        matches!(
            (self, to),
            (Pending, AwaitingPayment)
                | (Pending, Cancelled)
                | (AwaitingPayment, Paid)
                | (AwaitingPayment, Cancelled)
                | (Paid, Shipped)
                | (Paid, Cancelled)
        )
    }
}

/// Why an order was cancelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelReason {
    OutOfStock,
    PaymentTimeout,
    UserCancelled,
    OutboundFailed,
    HoldExpired,
}

impl CancelReason {
    pub const ALL: [CancelReason; 5] = [
        CancelReason::OutOfStock,
        CancelReason::PaymentTimeout,
        CancelReason::UserCancelled,
        CancelReason::OutboundFailed,
        CancelReason::HoldExpired,
    ];

    pub fn as_db(self) -> &'static str {
        match self {
            Self::OutOfStock => "OUT_OF_STOCK",
            Self::PaymentTimeout => "PAYMENT_TIMEOUT",
            Self::UserCancelled => "USER_CANCELLED",
            Self::OutboundFailed => "OUTBOUND_FAILED",
            Self::HoldExpired => "HOLD_EXPIRED",
        }
    }

    pub fn from_db(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_db() == s)
    }
}

/// A refund recorded for an order (at most one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refund {
    pub payment_id: String,
    pub amount_cents: i64,
    pub state: RefundState,
}

/// A refund with its attempts at the provider, as ListRefunds shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefundRecord {
    pub order_id: Uuid,
    pub payment_id: String,
    pub amount_cents: i64,
    pub currency: String,
    pub reason: Option<CancelReason>,
    pub state: RefundState,
    pub attempts: i32,
    pub last_error: String,
    pub next_attempt_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// An order as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Order {
    pub order_id: Uuid,
    pub user_id: String,
    pub request_id: String,
    pub sku: String,
    pub quantity: i64,
    pub unit_price_cents: i64,
    pub total_cents: i64,
    pub policy: Policy,
    pub status: Status,
    pub cancel_reason: Option<CancelReason>,
    pub payment_deadline: Option<DateTime<Utc>>,
    pub payment_id: Option<String>,
    pub refund: Option<Refund>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// A validated CreateOrder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlaceOrder {
    pub user_id: String,
    pub request_id: String,
    pub sku: String,
    pub quantity: i64,
}

/// Namespace of order ids (UUID v5 of the buyer, their key and the payload).
const ORDER_NAMESPACE: Uuid = Uuid::from_u128(0x6f3c_1d2e_8a4b_4c5d_9e6f_7a8b_9c0d_1e2f);

impl PlaceOrder {
    pub fn new(
        user_id: &str,
        request_id: &str,
        sku: &str,
        quantity: i64,
        max_quantity: i64,
    ) -> Result<Self, OrderError> {
        let mut bad = Vec::new();
        if let Err(v) = check_text("request_id", request_id, REQUEST_ID_MAX_LEN) {
            bad.push(v);
        }
        if let Err(e) = check_sku(sku) {
            bad.push(("sku".to_owned(), e.to_string()));
        }
        if quantity < 1 || quantity > max_quantity {
            bad.push(("quantity".to_owned(), format!("must be 1..={max_quantity}")));
        }
        if !bad.is_empty() {
            return Err(OrderError::Invalid(bad));
        }
        Ok(Self {
            user_id: user_id.to_owned(),
            request_id: request_id.to_owned(),
            sku: sku.to_owned(),
            quantity,
        })
    }

    /// The order id: the same buyer, key and payload always give the same id, so a retried or
    /// concurrent duplicate is the same order (and the same gate hold) everywhere, with no
    /// lookup first; another payload under the same key gives another id, which the database's
    /// `UNIQUE (user_id, request_id)` then refuses.
    pub fn order_id(&self) -> Uuid {
        let name = format!(
            "{}\n{}\n{}\n{}",
            self.user_id, self.request_id, self.sku, self.quantity
        );
        Uuid::new_v5(&ORDER_NAMESPACE, name.as_bytes())
    }
}

/// An order's total, `unit_price_cents × quantity`; a product of out-of-range figures is
/// refused rather than wrapped.
pub fn order_total(unit_price_cents: i64, quantity: i64) -> Result<i64, OrderError> {
    unit_price_cents
        .checked_mul(quantity)
        .filter(|t| *t >= 0)
        .ok_or_else(|| OrderError::invalid("quantity", "the order total is out of range"))
}

/// A canonical hyphenated UUID.
pub fn parse_order_id(raw: &str) -> Result<Uuid, OrderError> {
    parse_canonical_uuid(raw).ok_or_else(|| {
        let why = if Uuid::try_parse(raw).is_ok() {
            "must be a UUID in canonical hyphenated form"
        } else {
            "must be a UUID"
        };
        OrderError::invalid("order_id", why)
    })
}

/// Most order ids one LookupOrders may ask about (one sweep batch of product-stock).
pub const MAX_LOOKUP_IDS: usize = 500;

/// The ids of a LookupOrders: 1..=[`MAX_LOOKUP_IDS`] canonical UUIDs, each bad one reported as
/// its own field violation (`order_ids[i]`).
pub fn parse_order_ids(raw: &[String]) -> Result<Vec<Uuid>, OrderError> {
    if raw.is_empty() || raw.len() > MAX_LOOKUP_IDS {
        return Err(OrderError::invalid(
            "order_ids",
            format!("must list 1..={MAX_LOOKUP_IDS} order ids"),
        ));
    }
    let mut ids = Vec::with_capacity(raw.len());
    let mut bad = Vec::new();
    for (i, r) in raw.iter().enumerate() {
        match parse_order_id(r) {
            Ok(id) => ids.push(id),
            Err(e) => bad.extend(
                e.violations()
                    .into_iter()
                    .map(|(_, why)| (format!("order_ids[{i}]"), why)),
            ),
        }
    }
    if bad.is_empty() {
        Ok(ids)
    } else {
        Err(OrderError::Invalid(bad))
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_db())
    }
}

#[cfg(test)]
mod tests;
