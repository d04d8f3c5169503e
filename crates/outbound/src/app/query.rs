//! GetShipment and ListShipments.

use chrono::{DateTime, Utc};
use flashsale_platform::auth::{Caller, Role};
use uuid::Uuid;

use super::Shipping;
use crate::{
    domain::{OutboundError, Shipment, ShipmentStatus},
    infra::db,
};

pub const DEFAULT_PAGE_SIZE: i64 = 50;
pub const MAX_PAGE_SIZE: i64 = 500;
/// The largest `older_than_ms` of ListShipments: 30 days.
pub const MAX_OLDER_THAN_MS: i64 = 30 * 86_400_000;

impl Shipping {
    /// The shipment of an order the caller may see (another user's is NOT_FOUND).
    pub async fn get(&self, caller: &Caller, order_id: Uuid) -> Result<Shipment, OutboundError> {
        match db::by_order(&self.db, order_id).await? {
            Some(s) if caller.role == Role::Admin || s.user_id == caller.subject => Ok(s),
            _ => Err(OutboundError::NotFound(order_id)),
        }
    }

    /// A page of shipments, newest first, created more than `older_than_ms` ago when it is not
    /// 0, and the next page's token.
    pub async fn list(
        &self,
        status: Option<ShipmentStatus>,
        older_than_ms: i64,
        page_size: i32,
        token: &str,
    ) -> Result<(Vec<Shipment>, String), OutboundError> {
        let size = match page_size {
            n if n < 0 => return Err(OutboundError::invalid("page_size", "must not be negative")),
            0 => DEFAULT_PAGE_SIZE,
            n => i64::from(n).min(MAX_PAGE_SIZE),
        };
        if !(0..=MAX_OLDER_THAN_MS).contains(&older_than_ms) {
            return Err(OutboundError::invalid(
                "older_than_ms",
                format!("must be within 0..={MAX_OLDER_THAN_MS}"),
            ));
        }
        let created_before =
            (older_than_ms > 0).then(|| Utc::now() - chrono::Duration::milliseconds(older_than_ms));
        let filter = format!(
            "{}-{older_than_ms}",
            status.map_or("*", ShipmentStatus::as_db)
        );
        let filter = filter.as_str();
        let after = decode(token, filter)?;
        let mut page = db::list(&self.db, status, created_before, after, size + 1).await?;
        let next = if page.len() as i64 > size {
            page.truncate(size as usize);
            page.last()
                .map(|s| encode(s.created_at, s.shipment_id, filter))
                .unwrap_or_default()
        } else {
            String::new()
        };
        Ok((page, next))
    }
}

/// The latest instant a token carries, the end of year 9999 in microseconds. Tokens carry
/// instants from the Unix epoch up to it: PostgreSQL's `timestamptz` holds all of these, while
/// a forged instant outside its range would fail the page's query as the server's fault.
const MAX_MICROS: i64 = 253_402_300_799_999_999;

fn encode(at: DateTime<Utc>, id: Uuid, filter: &str) -> String {
    format!("s1.{}.{}.{filter}", at.timestamp_micros(), id.simple())
}

fn decode(token: &str, filter: &str) -> Result<Option<(DateTime<Utc>, Uuid)>, OutboundError> {
    if token.is_empty() {
        return Ok(None);
    }
    let bad = || {
        OutboundError::invalid(
            "page_token",
            "not a token this server issued for this filter",
        )
    };
    let mut parts = token.splitn(4, '.');
    let (Some("s1"), Some(micros), Some(id), Some(f)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad());
    };
    if f != filter {
        return Err(bad());
    }
    let at = micros
        .parse::<i64>()
        .ok()
        .filter(|m| (0..=MAX_MICROS).contains(m))
        .and_then(DateTime::<Utc>::from_timestamp_micros)
        .ok_or_else(bad)?;
    let id = Uuid::try_parse(id).map_err(|_| bad())?;
    // Only the spelling `encode` writes: no `+`, leading zeros, uppercase or hyphenated id.
    if encode(at, id, filter) != token {
        return Err(bad());
    }
    Ok(Some((at, id)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_only_for_their_filter() {
        let (at, id) = (Utc::now(), Uuid::new_v4());
        let t = encode(at, id, "FAILED-0");
        assert_eq!(decode(&t, "FAILED-0").unwrap().unwrap().1, id);
        assert!(decode(&t, "*-0").is_err());
        assert!(decode(&t, "FAILED-1000").is_err());
        assert!(decode("junk", "*").is_err());
    }

    #[test]
    fn a_second_spelling_of_a_token_or_an_instant_outside_the_database_is_refused() {
        let id = Uuid::from_u128(0xabc7);
        assert!(decode(&format!("s1.5.{}.*", id.simple()), "*").is_ok());
        for junk in [
            format!("s1.+5.{}.*", id.simple()),
            format!("s1.05.{}.*", id.simple()),
            format!("s1.5.{}.*", id.hyphenated()),
            format!("s1.5.{}.*", id.simple().to_string().to_uppercase()),
            format!("s1.-1.{}.*", id.simple()),
            format!("s1.-8000000000000000000.{}.*", id.simple()),
            format!("s1.{}.{}.*", MAX_MICROS + 1, id.simple()),
        ] {
            assert!(decode(&junk, "*").is_err(), "{junk} accepted");
        }
    }

    #[test]
    fn no_generated_token_panics_the_decoder_or_passes_unless_the_encoder_wrote_it() {
        use flashsale_test_support::page_tokens::{check_cut_or_extended_refused, check_decoder};
        let at = DateTime::<Utc>::from_timestamp_micros(1_700_000_000_123_456).unwrap();
        for filter in ["*", "FAILED"] {
            let issued = vec![
                encode(at, Uuid::new_v4(), filter),
                encode(DateTime::UNIX_EPOCH, Uuid::nil(), filter),
            ];
            check_decoder(issued.clone(), 1024, |t| {
                let (at, id) = decode(t, filter).ok()??;
                Some(encode(at, id, filter))
            })
            .unwrap();
            check_cut_or_extended_refused(&issued[0], 256, |t| decode(t, filter).is_ok()).unwrap();
        }
    }
}
