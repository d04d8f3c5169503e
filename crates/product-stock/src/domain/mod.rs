//! Pure product-stock types and rules: no tonic, sea-orm, lapin or redis here. Values that exist
//! are valid (a [`Sku`] is always well-formed, a [`ProductDraft`] always acceptable), so the
//! layers below never re-check them.

mod buyers;
mod error;
mod sale;
mod update;

pub use buyers::{GateBuyers, REFILLS_MAX_LEN, check_known_refills};
pub use error::StockError;
pub use sale::{MAX_SALE_MS, Sale};
pub use update::{NewTerms, ProductUpdate, UPDATABLE, UpdateValues, etag_of};
/// When on_hand is deducted; its database, event and API names are the contract's.
pub use flashsale_contract::Policy as DeductionPolicy;
/// Why the gate refused a reservation; its reasons are the contract's.
pub use flashsale_contract::Refusal;
/// A product identifier: 1..=64 ASCII letters, digits, `-`, `_` or `.` (the contract's sku). No
/// braces, spaces or colons, so it can sit inside a Redis hash tag and a key without escaping.
pub use flashsale_contract::Sku;

use flashsale_contract::{
    MAX_PRICE_CENTS, MAX_UNITS, NAME_MAX_LEN, REASON_MAX_LEN, REQUEST_ID_MAX_LEN, USER_ID_MAX_LEN,
    check_text,
};

/// A free-text field: no control character anywhere in it as sent (one is refused, not trimmed
/// away), and 1..=`max` characters once trimmed.
fn check_trimmed(field: &str, raw: &str, max: usize) -> Result<(), (String, String)> {
    check_text(field, raw, usize::MAX).and_then(|()| check_text(field, raw.trim(), max))
}

/// The field violation of a string that is not a sku.
fn sku_violation(e: flashsale_contract::SkuError) -> (String, String) {
    ("sku".to_owned(), e.to_string())
}

/// A product to create.
#[derive(Clone, Debug)]
pub struct ProductDraft {
    pub sku: Sku,
    pub name: String,
    pub price_cents: i64,
    pub initial_stock: i64,
    pub per_user_limit: u32,
    pub policy: DeductionPolicy,
    /// How many stock buckets the gate splits the product's stock into (1 = one bucket).
    pub stock_buckets: u32,
    /// When it is on sale, and at what price.
    pub sale: Sale,
}

/// Most stock buckets one product may have.
pub const MAX_STOCK_BUCKETS: u32 = 64;

/// The bucket of a product that holds `user_id`'s orders, per-user count and reservations:
/// FNV-1a (64 bit) of the user id's bytes, modulo `buckets`. Stable across replicas and
/// versions: every order of one user lives in one bucket, so the gate checks the per-user limit
/// inside one atomic script (docs/architecture.md#stock-buckets).
pub fn bucket_of(user_id: &str, buckets: u32) -> u32 {
    if buckets <= 1 {
        return 0;
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in user_id.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h % u64::from(buckets)) as u32
}

/// `total` split over `parts` as evenly as possible, the remainder going to the first ones.
pub fn split_evenly(total: i64, parts: u32) -> Vec<i64> {
    let n = i64::from(parts.max(1));
    let (each, rest) = (total.div_euclid(n), total.rem_euclid(n));
    (0..n).map(|i| each + i64::from(i < rest)).collect()
}

impl ProductDraft {
    /// Checks every field and reports every bad one at once.
    pub fn new(
        sku: &str,
        name: &str,
        price_cents: i64,
        initial_stock: i64,
        per_user_limit: u32,
        policy: Option<DeductionPolicy>,
        stock_buckets: u32,
    ) -> Result<Self, StockError> {
        let mut bad = Vec::new();
        let sku = Sku::parse(sku).map_err(|e| bad.push(sku_violation(e))).ok();
        if let Err(v) = check_trimmed("name", name, NAME_MAX_LEN) {
            bad.push(v);
        }
        let name = name.trim();
        if !(0..=MAX_PRICE_CENTS).contains(&price_cents) {
            bad.push(("price_cents".into(), "must be >= 0 (and sane)".into()));
        }
        if !(0..=MAX_UNITS).contains(&initial_stock) {
            bad.push(("initial_stock".into(), format!("must be 0..={MAX_UNITS}")));
        }
        if i64::from(per_user_limit) > MAX_UNITS {
            bad.push(("per_user_limit".into(), format!("must be 0..={MAX_UNITS}")));
        }
        if policy.is_none() {
            bad.push((
                "deduction_policy".into(),
                "must be RESERVE_THEN_COMMIT or COMMIT_AT_ORDER".into(),
            ));
        }
        // 0 is the field's default when left out: one bucket.
        let stock_buckets = stock_buckets.max(1);
        if stock_buckets > MAX_STOCK_BUCKETS {
            bad.push((
                "stock_buckets".into(),
                format!("must be 0..={MAX_STOCK_BUCKETS} (0 = 1 bucket)"),
            ));
        }
        match (sku, policy) {
            (Some(sku), Some(policy)) if bad.is_empty() => Ok(Self {
                sku,
                name: name.to_owned(),
                price_cents,
                initial_stock,
                per_user_limit,
                policy,
                stock_buckets,
                sale: Sale::default(),
            }),
            _ => Err(StockError::Invalid(bad)),
        }
    }

    /// `draft` on `sale`, judged at `now_ms`: every bad field of both reported at once.
    /// `unreadable` names the sale's fields that could not be read off the wire (left unset in
    /// `sale`).
    pub fn on_sale(
        draft: Result<Self, StockError>,
        sale: Sale,
        mut unreadable: Vec<(String, String)>,
        now_ms: i64,
    ) -> Result<Self, StockError> {
        match draft {
            Ok(mut d) => {
                unreadable.extend(sale.violations(d.price_cents, now_ms));
                if !unreadable.is_empty() {
                    return Err(StockError::Invalid(unreadable));
                }
                d.sale = sale;
                Ok(d)
            }
            Err(e) => {
                let mut bad = e.violations();
                bad.extend(unreadable);
                bad.extend(sale.violations(flashsale_contract::MAX_PRICE_CENTS, now_ms));
                Err(StockError::Invalid(bad))
            }
        }
    }
}

/// A product with its database stock figures.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Product {
    pub sku: Sku,
    pub name: String,
    pub price_cents: i64,
    pub per_user_limit: u32,
    pub policy: DeductionPolicy,
    pub on_hand: i64,
    pub reserved: i64,
    /// How many stock buckets the gate splits the stock into (1..=[`MAX_STOCK_BUCKETS`]).
    pub stock_buckets: u32,
    /// When it is on sale, and at what price.
    pub sale: Sale,
    /// The version of its terms, bumped by every UpdateProduct (its etag).
    pub version: i64,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub updated_at: chrono::DateTime<chrono::Utc>,
}

impl Product {
    /// Units the database still sells.
    pub fn available(&self) -> i64 {
        self.on_hand - self.reserved
    }

    /// What the gate's counter plus its unpersisted holds must equal
    /// (docs/architecture.md#the-stock-model, docs/invariants.md invariant 3).
    pub fn gate_target(&self) -> i64 {
        match self.policy {
            DeductionPolicy::ReserveThenCommit => self.on_hand - self.reserved,
            DeductionPolicy::CommitAtOrder => self.on_hand,
        }
    }
}

/// The fields of a product the hot path needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProductTerms {
    pub sku: Sku,
    pub price_cents: i64,
    pub per_user_limit: u32,
    pub policy: DeductionPolicy,
    pub stock_buckets: u32,
    pub sale: Sale,
}

impl ProductTerms {
    /// The unit price of an order the gate accepts now (it accepts only in the window).
    pub fn unit_price(&self) -> i64 {
        self.sale.unit_price(self.price_cents)
    }

    /// The bucket holding `user_id`'s orders of this product.
    pub fn bucket_of(&self, user_id: &str) -> u32 {
        bucket_of(user_id, self.stock_buckets)
    }
}

/// A stock adjustment to apply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Adjustment {
    pub request_id: String,
    pub sku: Sku,
    pub delta: i64,
    pub reason: String,
}

impl Adjustment {
    pub fn new(request_id: &str, sku: &str, delta: i64, reason: &str) -> Result<Self, StockError> {
        let mut bad = Vec::new();
        // Its bytes are bounded too: the key ends up in a Redis key.
        match check_text("request_id", request_id, REQUEST_ID_MAX_LEN) {
            Err(v) => bad.push(v),
            Ok(()) if request_id.len() > REQUEST_ID_MAX_LEN => bad.push((
                "request_id".into(),
                format!("must be at most {REQUEST_ID_MAX_LEN} bytes"),
            )),
            Ok(()) => {}
        }
        let sku = Sku::parse(sku).map_err(|e| bad.push(sku_violation(e))).ok();
        // A range, not `delta.abs()`: the absolute value of i64::MIN does not exist.
        if delta == 0 || !(-MAX_UNITS..=MAX_UNITS).contains(&delta) {
            bad.push((
                "delta".into(),
                format!("must be non-zero and within ±{MAX_UNITS}"),
            ));
        }
        if let Err(v) = check_trimmed("reason", reason, REASON_MAX_LEN) {
            bad.push(v);
        }
        let reason = reason.trim();
        match sku {
            Some(sku) if bad.is_empty() => Ok(Self {
                request_id: request_id.to_owned(),
                sku,
                delta,
                reason: reason.to_owned(),
            }),
            _ => Err(StockError::Invalid(bad)),
        }
    }
}

/// One order's request for units through the gate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReserveRequest {
    pub order_id: uuid::Uuid,
    pub user_id: String,
    pub sku: Sku,
    pub quantity: i64,
}

impl ReserveRequest {
    pub fn new(
        order_id: &str,
        user_id: &str,
        sku: &str,
        quantity: i64,
        max_quantity: i64,
    ) -> Result<Self, StockError> {
        let mut bad = Vec::new();
        let order_id = parse_order_id(order_id)
            .map_err(|e| bad.extend(e.violations()))
            .ok();
        match check_text("user_id", user_id, USER_ID_MAX_LEN) {
            Err(v) => bad.push(v),
            Ok(()) if user_id.len() > USER_ID_MAX_LEN => bad.push((
                "user_id".into(),
                format!("must be at most {USER_ID_MAX_LEN} bytes"),
            )),
            Ok(()) => {}
        }
        let sku = Sku::parse(sku).map_err(|e| bad.push(sku_violation(e))).ok();
        if quantity < 1 || quantity > max_quantity {
            bad.push(("quantity".into(), format!("must be 1..={max_quantity}")));
        }
        match (order_id, sku) {
            (Some(order_id), Some(sku)) if bad.is_empty() => Ok(Self {
                order_id,
                user_id: user_id.to_owned(),
                sku,
                quantity,
            }),
            _ => Err(StockError::Invalid(bad)),
        }
    }
}

/// A canonical hyphenated UUID (the contract's one spelling of an order id).
pub fn parse_order_id(raw: &str) -> Result<uuid::Uuid, StockError> {
    flashsale_contract::parse_canonical_uuid(raw).ok_or_else(|| {
        let description = if uuid::Uuid::try_parse(raw).is_ok() {
            "must be a UUID in canonical hyphenated form"
        } else {
            "must be a UUID"
        };
        StockError::invalid("order_id", description)
    })
}

/// Where one order's reservation is in the database.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReservationState {
    Reserved,
    Committed,
    Released,
}

impl ReservationState {
    pub fn as_db(self) -> &'static str {
        match self {
            Self::Reserved => "RESERVED",
            Self::Committed => "COMMITTED",
            Self::Released => "RELEASED",
        }
    }

    pub fn from_db(s: &str) -> Option<Self> {
        match s {
            "RESERVED" => Some(Self::Reserved),
            "COMMITTED" => Some(Self::Committed),
            "RELEASED" => Some(Self::Released),
            _ => None,
        }
    }
}

/// One order's reservation row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub order_id: uuid::Uuid,
    pub sku: Sku,
    pub user_id: String,
    pub quantity: i64,
    pub state: ReservationState,
    pub policy: DeductionPolicy,
}

impl Reservation {
    /// The row an order's `order.created` writes: its units reserved, or under COMMIT_AT_ORDER
    /// (ticketing) deducted at once.
    pub fn taken(
        order_id: uuid::Uuid,
        sku: Sku,
        user_id: &str,
        quantity: i64,
        policy: DeductionPolicy,
    ) -> Self {
        let state = match policy {
            DeductionPolicy::ReserveThenCommit => ReservationState::Reserved,
            DeductionPolicy::CommitAtOrder => ReservationState::Committed,
        };
        Self {
            order_id,
            sku,
            user_id: user_id.to_owned(),
            quantity,
            state,
            policy,
        }
    }

    /// What taking it moves on its product's stock row, `(on_hand, reserved)`, and the ledger
    /// row's kind.
    pub fn taking(&self) -> (i64, i64, &'static str) {
        match self.policy {
            DeductionPolicy::ReserveThenCommit => (0, self.quantity, "RESERVE"),
            DeductionPolicy::CommitAtOrder => (-self.quantity, 0, "COMMIT"),
        }
    }

    /// What committing it at shipment moves, `(on_hand, reserved)`: its units leave both.
    pub fn committing(&self) -> (i64, i64) {
        (-self.quantity, -self.quantity)
    }
}

#[cfg(test)]
mod tests;
