//! A product's sale window and sale price (docs/adr/0008-sale-window-on-the-product.md): when
//! the gate starts and stops selling it, and at what price.

use flashsale_contract::MAX_PRICE_CENTS;

/// When a product is on sale and at what price. All unset: on sale from its creation until it
/// is sold out, at its price. Instants are milliseconds since the Unix epoch, judged by the
/// stock gate's clock (the Redis server's), never by a service replica's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sale {
    /// Before it, reservations are refused `SALE_NOT_STARTED`.
    pub start_ms: Option<i64>,
    /// From it on, reservations are refused `SALE_ENDED`.
    pub end_ms: Option<i64>,
    /// The unit price of every order accepted; `None`: the product's price.
    pub price_cents: Option<i64>,
}

/// The latest instant a window may name: 9999-12-31T23:59:59.999Z.
pub const MAX_SALE_MS: i64 = 253_402_300_799_999;

impl Sale {
    /// The field violations of this sale on a product priced `price_cents`, judged at `now_ms`
    /// (empty when it is acceptable): each instant after 1970 and before year 10000, the end
    /// after the start and not already past, the sale price within `0..=price_cents`.
    pub fn violations(&self, price_cents: i64, now_ms: i64) -> Vec<(String, String)> {
        let mut bad = Vec::new();
        let in_range = |ms: i64| (1..=MAX_SALE_MS).contains(&ms);
        if let Some(s) = self.start_ms.filter(|s| !in_range(*s)) {
            bad.push((
                "sale_start".into(),
                format!("must be after 1970 and before year 10000 (got {s} ms)"),
            ));
        }
        match self.end_ms {
            Some(e) if !in_range(e) => bad.push((
                "sale_end".into(),
                format!("must be after 1970 and before year 10000 (got {e} ms)"),
            )),
            Some(e) if self.start_ms.is_some_and(|s| e <= s) => {
                bad.push(("sale_end".into(), "must be after sale_start".into()));
            }
            Some(e) if e <= now_ms => {
                bad.push(("sale_end".into(), "must not be in the past".into()));
            }
            _ => {}
        }
        if let Some(p) = self.price_cents {
            let top = price_cents.clamp(0, MAX_PRICE_CENTS);
            if !(0..=top).contains(&p) {
                bad.push((
                    "sale_price_cents".into(),
                    format!("must be 0..={top} (at most price_cents)"),
                ));
            }
        }
        bad
    }

    /// The unit price of an order accepted in the window.
    pub fn unit_price(&self, price_cents: i64) -> i64 {
        self.price_cents.unwrap_or(price_cents)
    }

    /// Whether the sale is open at `now_ms` (by the gate's clock).
    pub fn is_open_at(&self, now_ms: i64) -> bool {
        self.start_ms.is_none_or(|s| now_ms >= s) && self.end_ms.is_none_or(|e| now_ms < e)
    }

    /// The window as the reserve script's arguments: start and end in milliseconds, 0 where
    /// unset.
    pub fn gate_args(&self) -> (i64, i64) {
        (self.start_ms.unwrap_or(0), self.end_ms.unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000_000;

    fn fields(v: &[(String, String)]) -> Vec<&str> {
        v.iter().map(|(f, _)| f.as_str()).collect()
    }

    #[test]
    fn no_window_is_always_open_at_the_price() {
        let s = Sale::default();
        assert!(s.violations(100, NOW).is_empty());
        assert!(s.is_open_at(0) && s.is_open_at(NOW));
        assert_eq!(s.unit_price(100), 100);
        assert_eq!(s.gate_args(), (0, 0));
    }

    #[test]
    fn a_window_opens_at_its_start_and_closes_at_its_end() {
        let s = Sale {
            start_ms: Some(NOW + 1_000),
            end_ms: Some(NOW + 2_000),
            price_cents: Some(60),
        };
        assert!(s.violations(100, NOW).is_empty());
        assert!(!s.is_open_at(NOW + 999));
        assert!(s.is_open_at(NOW + 1_000));
        assert!(s.is_open_at(NOW + 1_999));
        assert!(!s.is_open_at(NOW + 2_000));
        assert_eq!(s.unit_price(100), 60);
        assert_eq!(s.gate_args(), (NOW + 1_000, NOW + 2_000));
    }

    #[test]
    fn a_start_in_the_past_is_a_sale_already_open() {
        let s = Sale {
            start_ms: Some(NOW - 60_000),
            ..Sale::default()
        };
        assert!(s.violations(100, NOW).is_empty());
        assert!(s.is_open_at(NOW));
    }

    #[test]
    fn bad_windows_and_prices_are_named() {
        let end_first = Sale {
            start_ms: Some(NOW + 2_000),
            end_ms: Some(NOW + 2_000),
            price_cents: Some(101),
        };
        assert_eq!(
            fields(&end_first.violations(100, NOW)),
            ["sale_end", "sale_price_cents"]
        );
        let past = Sale {
            end_ms: Some(NOW),
            price_cents: Some(-1),
            ..Sale::default()
        };
        let v = past.violations(100, NOW);
        assert_eq!(fields(&v), ["sale_end", "sale_price_cents"]);
        assert!(v[0].1.contains("past"), "{v:?}");
        let out_of_range = Sale {
            start_ms: Some(0),
            end_ms: Some(MAX_SALE_MS + 1),
            price_cents: None,
        };
        assert_eq!(
            fields(&out_of_range.violations(100, NOW)),
            ["sale_start", "sale_end"]
        );
        let free = Sale {
            price_cents: Some(0),
            ..Sale::default()
        };
        assert!(free.violations(0, NOW).is_empty(), "a free sale is a sale");
    }
}
