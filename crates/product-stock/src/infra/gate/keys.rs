//! Key names and input checks of the gate. Every key of one stock bucket carries the same Redis
//! Cluster hash tag, so each script touches a single slot: `{p:SKU}` for bucket 0 (the only
//! bucket of a product without buckets, and the keys the gate always used), `{p:SKU:b}` for
//! bucket b ≥ 1. A sku never contains a colon, so the two forms cannot meet.

use uuid::Uuid;

use super::GateError;

pub use crate::domain::REFILLS_MAX_LEN;
pub use flashsale_contract::{MAX_QUANTITY, MAX_SAFE_INTEGER, SKU_MAX_LEN, USER_ID_MAX_LEN};

/// Longest adjustment request id the gate accepts (bytes). Wider than the contract's
/// `REQUEST_ID_MAX_LEN` (64) on purpose: the gate only bounds the size of the key it builds.
/// The contract's limit is checked where a request enters (`domain::Adjustment`), and a
/// `stock.adjusted` already queued with a longer id must still apply rather than be parked.
pub const REQUEST_ID_MAX_LEN: usize = 128;

/// The hash tag shared by every key of `sku`, braces included: `{p:SKU}`.
pub fn product_tag(sku: &str) -> String {
    format!("{{p:{sku}}}")
}

/// The hash tag of bucket `bucket` of `sku`: `{p:SKU}` for bucket 0, `{p:SKU:b}` otherwise.
pub fn bucket_tag(sku: &str, bucket: u32) -> String {
    if bucket == 0 {
        product_tag(sku)
    } else {
        format!("{{p:{sku}:{bucket}}}")
    }
}

pub(super) fn validate_bucket(bucket: u32) -> Result<(), GateError> {
    if bucket >= crate::domain::MAX_STOCK_BUCKETS {
        return Err(GateError::InvalidInput("bucket must be 0..=63"));
    }
    Ok(())
}

pub(super) fn validate_buckets(buckets: u32) -> Result<(), GateError> {
    if !(1..=crate::domain::MAX_STOCK_BUCKETS).contains(&buckets) {
        return Err(GateError::InvalidInput("buckets must be 1..=64"));
    }
    Ok(())
}

/// Checks that `sku` is a sku of the contract (1..=64 characters of `[A-Za-z0-9._-]`): never a
/// brace (which would move the hash tag), a colon (which would blur key boundaries) or a glob
/// character.
pub fn validate_sku(sku: &str) -> Result<(), GateError> {
    flashsale_contract::check_sku(sku)
        .map_err(|_| GateError::InvalidInput("sku must be 1..=64 characters of [A-Za-z0-9._-]"))
}

pub(super) fn validate_user(user_id: &str) -> Result<(), GateError> {
    if user_id.is_empty() || user_id.len() > USER_ID_MAX_LEN {
        return Err(GateError::InvalidInput("user_id must be 1..=128 bytes"));
    }
    Ok(())
}

pub(super) fn validate_qty(qty: i64) -> Result<(), GateError> {
    if !(1..=MAX_QUANTITY).contains(&qty) {
        return Err(GateError::InvalidInput("qty must be 1..=1000000"));
    }
    Ok(())
}

pub(super) fn validate_amount(value: i64, what: &'static str) -> Result<(), GateError> {
    if !(0..=MAX_SAFE_INTEGER).contains(&value) {
        return Err(GateError::InvalidInput(what));
    }
    Ok(())
}

/// The prefix goes in front of the hash tag, so a brace in it would become the tag.
pub(super) fn validate_prefix(prefix: &str) -> Result<(), GateError> {
    if prefix.contains(['{', '}']) {
        return Err(GateError::InvalidInput(
            "the gate's key prefix must not contain braces",
        ));
    }
    Ok(())
}

/// `text` with the glob characters of a SCAN pattern escaped.
pub(super) fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 4);
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A SCAN pattern matching every gate key of every product under `prefix`.
pub(super) fn all_products_pattern(prefix: &str) -> String {
    let mut out = glob_escape(prefix);
    out.push_str("stock:*");
    out
}

/// The key holding the run id of the Redis the gate was last built against (outside the
/// `stock:` keys, so deleting those keeps it).
pub(super) fn gate_run_key(prefix: &str) -> String {
    format!("{prefix}gate_run")
}

/// On a Redis Cluster, the key holding the run id of the master serving `slot` (one of its
/// slots): `<prefix>gate_run:{sN}`, a hash tag of that slot, so it lives on that master.
pub(super) fn node_run_key(prefix: &str, slot: u16) -> Option<String> {
    use std::{collections::HashMap, sync::Mutex};
    // Finding a tag costs ~16,000 checksums; a cluster has few masters, so remember them.
    static TAGS: Mutex<Option<HashMap<u16, String>>> = Mutex::new(None);
    let cached = TAGS
        .lock()
        .ok()
        .and_then(|tags| tags.as_ref()?.get(&slot).cloned());
    let tag = match cached {
        Some(tag) => tag,
        None => {
            let tag = flashsale_platform::redis::slot_tag(slot)?;
            if let Ok(mut tags) = TAGS.lock() {
                tags.get_or_insert_with(HashMap::new)
                    .insert(slot, tag.clone());
            }
            tag
        }
    };
    Some(format!("{prefix}gate_run:{tag}"))
}

/// The keys of one product: `<prefix>stock:{p:SKU}:<part>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProductKeys {
    base: String,
}

impl ProductKeys {
    /// Keys of `sku` under `prefix`; both must have been validated.
    pub fn new(prefix: &str, sku: &str) -> Self {
        Self::in_bucket(prefix, sku, 0)
    }

    /// Keys of bucket `bucket` of `sku` under `prefix` (bucket 0: the same as [`Self::new`]).
    pub fn in_bucket(prefix: &str, sku: &str, bucket: u32) -> Self {
        Self {
            base: format!("{prefix}stock:{}", bucket_tag(sku, bucket)),
        }
    }

    /// String: units taken out of this bucket by a transfer to another bucket that is not yet
    /// settled (see `take.lua`).
    pub fn moving(&self) -> String {
        self.part("moving")
    }

    /// Hash: transfer id → `to:qty:generation:taken at ms` of the transfers out of this bucket
    /// not settled.
    pub fn transfers(&self) -> String {
        self.part("xfers")
    }

    /// String: what became of transfer `id` into this bucket: `G` given (no TTL, deleted once
    /// the donor settled), `C` cancelled or `S` stale (with a TTL; see `land.lua`).
    pub fn landing(&self, id: Uuid) -> String {
        format!("{}:xin:{}", self.base, id.hyphenated())
    }

    /// String: units the gate may still hand out.
    pub fn avail(&self) -> String {
        self.part("avail")
    }

    /// String: Σ qty of holds the database does not have yet.
    pub fn held(&self) -> String {
        self.part("held")
    }

    /// Sorted set: order id → reserve time (ms) of holds the database does not have yet.
    pub fn pending(&self) -> String {
        self.part("pending")
    }

    /// Hash: user id → units bought through the gate and not released.
    pub fn users(&self) -> String {
        self.part("users")
    }

    /// String: bumped by every change that follows a database change (see `repair_if_unchanged`).
    pub fn epoch(&self) -> String {
        self.part("epoch")
    }

    /// String: the product's refills count, bumped by every change that may give units back to
    /// `avail` (a release, an adjustment, a repair) and started afresh from the clock by a
    /// rebuild. While it stays put and `avail` stays at zero, no new buyer can appear (see
    /// [`RedisGate::buyers`](super::RedisGate::buyers)).
    pub fn refills(&self) -> String {
        self.part("refills")
    }

    /// Sorted set: order id → prepare time (ms) of releases prepared (state `B`) and not yet
    /// settled, for the reconciler to settle should their consumer die between commit and
    /// finish.
    pub fn releasing(&self) -> String {
        self.part("releasing")
    }

    /// String: set afresh by every load, so a release prepared before a rebuild is known as
    /// such (see `settle_release.lua`).
    pub fn generation(&self) -> String {
        self.part("generation")
    }

    /// String, on a Redis Cluster only: the id of the node that loaded this gate
    /// (`CLUSTER MYID`). A replica promoted after its master died has another id, and may
    /// lack the master's last writes: `reserve.lua` then drops the gate so it is rebuilt
    /// before it sells again.
    pub fn node(&self) -> String {
        self.part("node")
    }

    /// String with a TTL: while the product's gate is missing, the time (ms) before which it may
    /// not be rebuilt (see [`RedisGate::rebuild_not_before`](super::RedisGate::rebuild_not_before)).
    pub fn rebuild_after(&self) -> String {
        self.part("rebuild_after")
    }

    /// Hash with a TTL: one order's record (`s` state, `q` qty, `u` user, `n` first answer).
    pub fn order(&self, order_id: Uuid) -> String {
        format!("{}:o:{}", self.base, order_id.hyphenated())
    }

    /// String with a TTL: marks an adjustment request as applied.
    pub fn adjustment(&self, request_id: &str) -> String {
        format!("{}:adj:{request_id}", self.base)
    }

    /// A SCAN pattern matching every key of the product (glob characters of the prefix escaped).
    pub fn pattern(&self) -> String {
        let mut out = glob_escape(&self.base);
        out.push_str(":*");
        out
    }

    fn part(&self, name: &str) -> String {
        format!("{}:{name}", self.base)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The part of `key` Redis Cluster hashes: the first `{…}` with something inside.
    fn cluster_hash_part(key: &str) -> &str {
        if let Some(open) = key.find('{')
            && let Some(len) = key[open + 1..].find('}')
            && len > 0
        {
            return &key[open + 1..open + 1 + len];
        }
        key
    }

    #[test]
    fn keys_of_one_product_share_one_hash_tag() {
        let keys = ProductKeys::new("fs:test:", "SKU-1.a_b");
        let all = [
            keys.avail(),
            keys.held(),
            keys.pending(),
            keys.users(),
            keys.epoch(),
            keys.refills(),
            keys.releasing(),
            keys.generation(),
            keys.order(Uuid::new_v4()),
            keys.adjustment("req-1"),
        ];
        for key in &all {
            assert_eq!(cluster_hash_part(key), "p:SKU-1.a_b", "{key}");
            assert!(key.starts_with("fs:test:stock:{p:SKU-1.a_b}:"), "{key}");
        }
        let other = ProductKeys::new("fs:test:", "SKU-2");
        assert_ne!(
            cluster_hash_part(&other.avail()),
            cluster_hash_part(&keys.avail())
        );
    }

    #[test]
    fn a_master_s_run_key_lives_in_the_slot_it_is_made_for() {
        for slot in [0, 5461, 10923, 16383] {
            let key = node_run_key("fs:", slot).unwrap();
            assert!(key.starts_with("fs:gate_run:{"), "{key}");
            assert_eq!(flashsale_platform::redis::key_slot(key.as_bytes()), slot);
            assert!(!key.contains("stock:"), "{key}");
        }
    }

    #[test]
    fn bucket_zero_keeps_the_product_keys_and_other_buckets_get_their_own_tag() {
        let plain = ProductKeys::new("fs:", "SKU-1");
        let zero = ProductKeys::in_bucket("fs:", "SKU-1", 0);
        assert_eq!(plain, zero);
        assert_eq!(zero.avail(), "fs:stock:{p:SKU-1}:avail");
        let three = ProductKeys::in_bucket("fs:", "SKU-1", 3);
        for key in [
            three.avail(),
            three.held(),
            three.users(),
            three.moving(),
            three.transfers(),
            three.landing(Uuid::new_v4()),
            three.order(Uuid::new_v4()),
        ] {
            assert_eq!(cluster_hash_part(&key), "p:SKU-1:3", "{key}");
        }
        assert_eq!(three.avail(), "fs:stock:{p:SKU-1:3}:avail");
        // Bucket 0's SCAN pattern never matches another bucket's keys.
        assert_eq!(zero.pattern(), "fs:stock:{p:SKU-1}:*");
        assert!(validate_bucket(63).is_ok() && validate_bucket(64).is_err());
        assert!(validate_buckets(0).is_err() && validate_buckets(65).is_err());
    }

    #[test]
    fn skus_outside_the_alphabet_are_refused() {
        for bad in ["", "a b", "a{b", "a}b", "a:b", "a*", &"x".repeat(65)] {
            assert!(validate_sku(bad).is_err(), "{bad:?}");
        }
        for good in ["a", "A-1.b_2", &"x".repeat(64)] {
            assert!(validate_sku(good).is_ok(), "{good:?}");
        }
        assert!(validate_prefix("fs{x}:").is_err());
        assert!(validate_prefix("fs:").is_ok());
    }

    #[test]
    fn the_scan_pattern_escapes_glob_characters_of_the_prefix() {
        let keys = ProductKeys::new("a*b?[c]:", "S");
        assert_eq!(keys.pattern(), "a\\*b\\?\\[c\\]:stock:{p:S}:*");
    }
}
