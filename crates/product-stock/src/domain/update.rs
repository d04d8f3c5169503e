//! UpdateProduct: which of a product's terms may change, and the rules a change follows
//! (docs/adr/0008-sale-window-on-the-product.md). Values that exist are valid: a
//! [`ProductUpdate`] names only fields that may change, each with an acceptable value; whether
//! the change may apply to the product as it is now is [`ProductUpdate::apply`]'s to say.

use flashsale_contract::{
    MAX_PRICE_CENTS, MAX_UNITS, NAME_MAX_LEN, REQUEST_ID_MAX_LEN, check_optional_text, check_text,
};

use super::{Product, Sale, Sku, StockError, check_trimmed, sale::MAX_SALE_MS, sku_violation};

/// The fields UpdateProduct may change, as `update_mask` names them.
pub const UPDATABLE: [&str; 6] = [
    "name",
    "price_cents",
    "per_user_limit",
    "sale_start",
    "sale_end",
    "sale_price_cents",
];

/// The fields of a product that exist but never change through UpdateProduct.
const FIXED: [&str; 11] = [
    "sku",
    "deduction_policy",
    "stock_buckets",
    "on_hand",
    "reserved",
    "available",
    "gate_available",
    "create_time",
    "update_time",
    "etag",
    "initial_stock",
];

/// The new values a request carries, as read off the wire (the instants in milliseconds;
/// `None` where unset, or unreadable and named in `unreadable`).
#[derive(Clone, Debug, Default)]
pub struct UpdateValues {
    pub name: String,
    pub price_cents: i64,
    pub per_user_limit: u32,
    pub sale: Sale,
    pub unreadable: Vec<(String, String)>,
}

/// A change of a product's terms, checked field by field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProductUpdate {
    pub request_id: String,
    pub sku: Sku,
    /// The version the change is for (`None`: whatever the product's is).
    pub etag: Option<i64>,
    pub name: Option<String>,
    pub price_cents: Option<i64>,
    pub per_user_limit: Option<u32>,
    /// `Some(None)` removes the field.
    pub sale_start: Option<Option<i64>>,
    pub sale_end: Option<Option<i64>>,
    pub sale_price_cents: Option<Option<i64>>,
}

/// A product's terms after an update.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewTerms {
    pub name: String,
    pub price_cents: i64,
    pub per_user_limit: u32,
    pub sale: Sale,
}

/// A product's etag: its terms' version, in decimal.
pub fn etag_of(version: i64) -> String {
    version.to_string()
}

impl ProductUpdate {
    /// Checks the request: its key, sku, etag and mask, and each value the mask names. Every
    /// bad field is reported at once.
    pub fn new(
        request_id: &str,
        sku: &str,
        etag: &str,
        mask: &[String],
        v: UpdateValues,
    ) -> Result<Self, StockError> {
        let mut bad = Vec::new();
        match check_text("request_id", request_id, REQUEST_ID_MAX_LEN) {
            Err(e) => bad.push(e),
            Ok(()) if request_id.len() > REQUEST_ID_MAX_LEN => bad.push((
                "request_id".into(),
                format!("must be at most {REQUEST_ID_MAX_LEN} bytes"),
            )),
            Ok(()) => {}
        }
        let sku = Sku::parse(sku)
            .map_err(|e| {
                let (_, d) = sku_violation(e);
                bad.push(("product.sku".into(), d));
            })
            .ok();
        let etag = match etag {
            "" => None,
            e => match e.parse::<i64>() {
                Ok(n) if n > 0 => Some(n),
                _ => {
                    bad.push((
                        "product.etag".into(),
                        "must be an etag this server gave (or empty)".into(),
                    ));
                    None
                }
            },
        };
        if mask.is_empty() {
            bad.push((
                "update_mask".into(),
                format!("must name at least one of {}", UPDATABLE.join(", ")),
            ));
        }
        let mut seen = Vec::new();
        for path in mask {
            if FIXED.contains(&path.as_str()) {
                bad.push(("update_mask".into(), format!("`{path}` cannot be changed")));
            } else if !UPDATABLE.contains(&path.as_str()) {
                bad.push((
                    "update_mask".into(),
                    format!(
                        "`{path}` is not a field of a product (may change: {})",
                        UPDATABLE.join(", ")
                    ),
                ));
            } else if seen.contains(&path.as_str()) {
                bad.push(("update_mask".into(), format!("`{path}` is named twice")));
            } else {
                seen.push(path.as_str());
            }
        }
        let named = |f: &str| seen.contains(&f);
        let unreadable = |f: &str| v.unreadable.iter().any(|(u, _)| u == f);
        for (f, d) in &v.unreadable {
            if named(f) {
                bad.push((format!("product.{f}"), d.clone()));
            }
        }
        let name = named("name").then(|| {
            if let Err((_, d)) = check_trimmed("name", &v.name, NAME_MAX_LEN) {
                bad.push(("product.name".into(), d));
            }
            v.name.trim().to_owned()
        });
        // A string the mask leaves out is still checked for control characters: none is
        // taken in, whatever field it is sent in (the contract).
        if name.is_none()
            && let Err(e) = check_optional_text("product.name", &v.name, usize::MAX)
        {
            bad.push(e);
        }
        let price_cents = named("price_cents").then(|| {
            if !(0..=MAX_PRICE_CENTS).contains(&v.price_cents) {
                bad.push((
                    "product.price_cents".into(),
                    "must be >= 0 (and sane)".into(),
                ));
            }
            v.price_cents
        });
        let per_user_limit = named("per_user_limit").then(|| {
            if i64::from(v.per_user_limit) > MAX_UNITS {
                bad.push((
                    "product.per_user_limit".into(),
                    format!("must be 0..={MAX_UNITS}"),
                ));
            }
            v.per_user_limit
        });
        let mut instant = |f: &str, ms: Option<i64>| {
            if !named(f) || unreadable(f) {
                return None;
            }
            if let Some(ms) = ms.filter(|ms| !(1..=MAX_SALE_MS).contains(ms)) {
                bad.push((
                    format!("product.{f}"),
                    format!("must be after 1970 and before year 10000 (got {ms} ms)"),
                ));
            }
            Some(ms)
        };
        let sale_start = instant("sale_start", v.sale.start_ms);
        let sale_end = instant("sale_end", v.sale.end_ms);
        let sale_price_cents = named("sale_price_cents").then(|| {
            if let Some(p) = v.sale.price_cents.filter(|p| !(0..=MAX_PRICE_CENTS).contains(p)) {
                bad.push((
                    "product.sale_price_cents".into(),
                    format!("must be 0..=price_cents (got {p})"),
                ));
            }
            v.sale.price_cents
        });
        match sku {
            Some(sku) if bad.is_empty() => Ok(Self {
                request_id: request_id.to_owned(),
                sku,
                etag,
                name,
                price_cents,
                per_user_limit,
                sale_start,
                sale_end,
                sale_price_cents,
            }),
            _ => Err(StockError::Invalid(bad)),
        }
    }

    /// The fields this update changes, in the order of [`UPDATABLE`].
    pub fn fields(&self) -> Vec<&'static str> {
        let set = [
            self.name.is_some(),
            self.price_cents.is_some(),
            self.per_user_limit.is_some(),
            self.sale_start.is_some(),
            self.sale_end.is_some(),
            self.sale_price_cents.is_some(),
        ];
        UPDATABLE
            .iter()
            .zip(set)
            .filter_map(|(f, s)| s.then_some(*f))
            .collect()
    }

    /// What a repeat of this request must carry to be its replay: everything but the etag
    /// (a replay's etag is stale by then).
    pub fn digest(&self) -> String {
        format!(
            "{}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}",
            self.sku,
            self.name,
            self.price_cents,
            self.per_user_limit,
            self.sale_start,
            self.sale_end,
            self.sale_price_cents
        )
    }

    /// The product's terms after this change, judged at `now_ms`, or why it may not apply:
    /// the window ends after it starts, an instant that changes is not in the past, an open
    /// sale keeps its start ([`StockError::SaleInProgress`]), and the sale price stays within
    /// the price.
    pub fn apply(&self, current: &Product, now_ms: i64) -> Result<NewTerms, StockError> {
        let old = current.sale;
        let sale = Sale {
            start_ms: self.sale_start.unwrap_or(old.start_ms),
            end_ms: self.sale_end.unwrap_or(old.end_ms),
            price_cents: self.sale_price_cents.unwrap_or(old.price_cents),
        };
        let price_cents = self.price_cents.unwrap_or(current.price_cents);
        let mut bad = Vec::new();
        let start_moves = sale.start_ms != old.start_ms;
        if start_moves && sale.start_ms.is_some_and(|s| s <= now_ms) {
            bad.push((
                "product.sale_start".into(),
                "must not be in the past".into(),
            ));
        }
        if sale.end_ms != old.end_ms && sale.end_ms.is_some_and(|e| e <= now_ms) {
            bad.push(("product.sale_end".into(), "must not be in the past".into()));
        }
        if let (Some(s), Some(e)) = (sale.start_ms, sale.end_ms)
            && e <= s
        {
            bad.push(("product.sale_end".into(), "must be after sale_start".into()));
        }
        if let Some(p) = sale.price_cents
            && p > price_cents
        {
            let field = if self.sale_price_cents.is_some() {
                "product.sale_price_cents"
            } else {
                "product.price_cents"
            };
            bad.push((
                field.into(),
                format!("the sale price ({p}) must not be above the price ({price_cents})"),
            ));
        }
        if !bad.is_empty() {
            return Err(StockError::Invalid(bad));
        }
        let open = old.start_ms.is_some_and(|s| s <= now_ms) && old.end_ms.is_none_or(|e| e > now_ms);
        if start_moves && open {
            return Err(StockError::SaleInProgress);
        }
        Ok(NewTerms {
            name: self.name.clone().unwrap_or_else(|| current.name.clone()),
            price_cents,
            per_user_limit: self.per_user_limit.unwrap_or(current.per_user_limit),
            sale,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::DeductionPolicy;

    const NOW: i64 = 1_800_000_000_000;

    fn product(sale: Sale) -> Product {
        let t = chrono::DateTime::from_timestamp_millis(NOW).unwrap_or_default();
        Product {
            sku: Sku::parse("S").unwrap(),
            name: "Gin".into(),
            price_cents: 2_500,
            per_user_limit: 2,
            policy: DeductionPolicy::ReserveThenCommit,
            on_hand: 10,
            reserved: 0,
            stock_buckets: 1,
            sale,
            version: 3,
            created_at: t,
            updated_at: t,
        }
    }

    fn mask(fields: &[&str]) -> Vec<String> {
        fields.iter().map(|f| (*f).to_owned()).collect()
    }

    fn update(fields: &[&str], v: UpdateValues) -> Result<ProductUpdate, StockError> {
        ProductUpdate::new("r1", "S", "3", &mask(fields), v)
    }

    fn violated(e: StockError) -> Vec<String> {
        e.violations().into_iter().map(|(f, _)| f).collect()
    }

    #[test]
    fn the_mask_names_only_fields_that_change_and_each_once() {
        let e = ProductUpdate::new("", "a b", "x", &mask(&[]), UpdateValues::default())
            .unwrap_err();
        assert_eq!(
            violated(e),
            ["request_id", "product.sku", "product.etag", "update_mask"]
        );
        let e = update(
            &["stock_buckets", "colour", "name", "name"],
            UpdateValues {
                name: "Gin".into(),
                ..UpdateValues::default()
            },
        )
        .unwrap_err();
        let v = e.violations();
        assert_eq!(v.len(), 3, "{v:?}");
        assert!(v[0].1.contains("cannot be changed"), "{v:?}");
        assert!(v[1].1.contains("not a field"), "{v:?}");
        assert!(v[2].1.contains("twice"), "{v:?}");
        let u = update(
            &["price_cents", "sale_start"],
            UpdateValues {
                price_cents: 1_000,
                ..UpdateValues::default()
            },
        )
        .unwrap();
        assert_eq!(u.fields(), ["price_cents", "sale_start"]);
        assert_eq!(u.sale_start, Some(None), "named but unset: removed");
        assert_eq!(u.name, None, "not named: unchanged");
        assert_eq!(u.etag, Some(3));
    }

    #[test]
    fn bad_values_are_named_only_where_the_mask_names_them() {
        let v = UpdateValues {
            name: " ".into(),
            price_cents: -1,
            sale: Sale {
                start_ms: Some(0),
                end_ms: None,
                price_cents: Some(-2),
            },
            ..UpdateValues::default()
        };
        assert!(update(&["per_user_limit"], v.clone()).is_ok());
        // A control character is refused even in a field the mask leaves out.
        let hidden = UpdateValues {
            name: "Gin\u{0}".into(),
            ..UpdateValues::default()
        };
        let e = update(&["per_user_limit"], hidden).unwrap_err();
        assert_eq!(violated(e), ["product.name"]);
        let e = update(
            &["name", "price_cents", "sale_start", "sale_price_cents"],
            v,
        )
        .unwrap_err();
        assert_eq!(
            violated(e),
            [
                "product.name",
                "product.price_cents",
                "product.sale_start",
                "product.sale_price_cents"
            ]
        );
    }

    #[test]
    fn a_new_window_must_end_after_it_starts_and_not_move_into_the_past() {
        let p = product(Sale::default());
        let window = |start: i64, end: i64| UpdateValues {
            sale: Sale {
                start_ms: Some(start),
                end_ms: Some(end),
                price_cents: None,
            },
            ..UpdateValues::default()
        };
        let u = update(&["sale_start", "sale_end"], window(NOW + 10, NOW + 20)).unwrap();
        let t = u.apply(&p, NOW).unwrap();
        assert_eq!(
            (t.sale.start_ms, t.sale.end_ms),
            (Some(NOW + 10), Some(NOW + 20))
        );
        let u = update(&["sale_start", "sale_end"], window(NOW + 20, NOW + 10)).unwrap();
        assert_eq!(violated(u.apply(&p, NOW).unwrap_err()), ["product.sale_end"]);
        let u = update(&["sale_start", "sale_end"], window(NOW - 20, NOW - 10)).unwrap();
        assert_eq!(
            violated(u.apply(&p, NOW).unwrap_err()),
            ["product.sale_start", "product.sale_end"]
        );
    }

    #[test]
    fn an_open_sale_keeps_its_start_but_may_close_early_and_change_its_price() {
        let open = product(Sale {
            start_ms: Some(NOW - 1_000),
            end_ms: Some(NOW + 60_000),
            price_cents: Some(1_999),
        });
        let later = UpdateValues {
            sale: Sale {
                start_ms: Some(NOW + 5_000),
                ..Sale::default()
            },
            ..UpdateValues::default()
        };
        let u = update(&["sale_start"], later.clone()).unwrap();
        assert!(matches!(
            u.apply(&open, NOW),
            Err(StockError::SaleInProgress)
        ));
        let close = UpdateValues {
            sale: Sale {
                end_ms: Some(NOW + 1),
                price_cents: Some(1_500),
                ..Sale::default()
            },
            ..UpdateValues::default()
        };
        let t = update(&["sale_end", "sale_price_cents"], close)
            .unwrap()
            .apply(&open, NOW)
            .unwrap();
        assert_eq!((t.sale.end_ms, t.sale.price_cents), (Some(NOW + 1), Some(1_500)));
        // Once it has ended, a new window: the sale returns.
        let ended = product(Sale {
            start_ms: Some(NOW - 60_000),
            end_ms: Some(NOW - 1_000),
            price_cents: None,
        });
        let again = UpdateValues {
            sale: Sale {
                start_ms: Some(NOW + 5_000),
                end_ms: Some(NOW + 9_000),
                price_cents: None,
            },
            ..UpdateValues::default()
        };
        assert!(
            update(&["sale_start", "sale_end"], again)
                .unwrap()
                .apply(&ended, NOW)
                .is_ok()
        );
        // A price change leaves an ended window alone, however old.
        let price = UpdateValues {
            price_cents: 3_000,
            ..UpdateValues::default()
        };
        assert!(update(&["price_cents"], price).unwrap().apply(&ended, NOW).is_ok());
        // A product without a window may get one.
        assert!(update(&["sale_start"], later).unwrap().apply(&product(Sale::default()), NOW).is_ok());
    }

    #[test]
    fn the_sale_price_stays_within_the_price_whichever_changes() {
        let p = product(Sale {
            price_cents: Some(1_999),
            ..Sale::default()
        });
        let cheaper = UpdateValues {
            price_cents: 1_000,
            ..UpdateValues::default()
        };
        assert_eq!(
            violated(update(&["price_cents"], cheaper).unwrap().apply(&p, NOW).unwrap_err()),
            ["product.price_cents"]
        );
        let dearer = UpdateValues {
            sale: Sale {
                price_cents: Some(2_501),
                ..Sale::default()
            },
            ..UpdateValues::default()
        };
        assert_eq!(
            violated(
                update(&["sale_price_cents"], dearer)
                    .unwrap()
                    .apply(&p, NOW)
                    .unwrap_err()
            ),
            ["product.sale_price_cents"]
        );
    }

    #[test]
    fn a_replay_is_the_same_change_whatever_its_etag() {
        let v = UpdateValues {
            price_cents: 1_000,
            ..UpdateValues::default()
        };
        let a = ProductUpdate::new("r1", "S", "3", &mask(&["price_cents"]), v.clone()).unwrap();
        let b = ProductUpdate::new("r1", "S", "", &mask(&["price_cents"]), v).unwrap();
        assert_eq!(a.digest(), b.digest());
        let c = ProductUpdate::new(
            "r1",
            "S",
            "3",
            &mask(&["price_cents"]),
            UpdateValues {
                price_cents: 1_001,
                ..UpdateValues::default()
            },
        )
        .unwrap();
        assert_ne!(a.digest(), c.digest());
    }
}
