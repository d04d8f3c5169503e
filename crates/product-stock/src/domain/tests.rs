use super::*;

#[test]
fn sku_accepts_the_documented_alphabet_only() {
    assert!(Sku::parse("WINE-2024_magnum.75").is_ok());
    assert!(Sku::parse(&"a".repeat(64)).is_ok());
    for bad in ["", "a b", "x{y}", "a:b", "é", &"a".repeat(65)] {
        assert!(Sku::parse(bad).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn draft_reports_every_bad_field() {
    let e = ProductDraft::new("", " ", -1, -5, 0, None, 65)
        .unwrap_err()
        .violations();
    let fields: Vec<_> = e.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(
        fields,
        [
            "sku",
            "name",
            "price_cents",
            "initial_stock",
            "deduction_policy",
            "stock_buckets"
        ]
    );
    assert!(
        ProductDraft::new(
            "S1",
            "Wine",
            0,
            0,
            0,
            Some(DeductionPolicy::CommitAtOrder),
            0
        )
        .is_ok()
    );
}

#[test]
fn adjustment_rejects_zero_delta_and_bad_keys() {
    assert!(Adjustment::new("r1", "S1", 5, "restock").is_ok());
    let e = Adjustment::new("", "S1", 0, "").unwrap_err().violations();
    let fields: Vec<_> = e.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(fields, ["request_id", "delta", "reason"]);
    assert!(Adjustment::new(&"r".repeat(65), "S1", 1, "x").is_err());
}

#[test]
fn reserve_request_bounds_quantity_and_checks_ids() {
    let id = uuid::Uuid::new_v4().to_string();
    assert!(ReserveRequest::new(&id, "u1", "S1", 1, 10).is_ok());
    assert!(ReserveRequest::new(&id, "u1", "S1", 0, 10).is_err());
    assert!(ReserveRequest::new(&id, "u1", "S1", 11, 10).is_err());
    assert!(ReserveRequest::new("not-a-uuid", "u1", "S1", 1, 10).is_err());
    assert!(ReserveRequest::new(&id.replace('-', ""), "u1", "S1", 1, 10).is_err());
    assert!(ReserveRequest::new(&id, "", "S1", 1, 10).is_err());
}

#[test]
fn gate_target_follows_the_policy() {
    let now = chrono::Utc::now();
    let mut p = Product {
        sku: Sku::parse("S").unwrap(),
        name: "n".into(),
        price_cents: 1,
        per_user_limit: 0,
        policy: DeductionPolicy::ReserveThenCommit,
        on_hand: 10,
        reserved: 3,
        stock_buckets: 1,
        sale: Sale::default(),
        version: 1,
        created_at: now,
        updated_at: now,
    };
    assert_eq!((p.available(), p.gate_target()), (7, 7));
    p.policy = DeductionPolicy::CommitAtOrder;
    assert_eq!(p.gate_target(), 10);
}

#[test]
fn an_extreme_delta_is_refused_without_overflowing() {
    for delta in [
        i64::MIN,
        i64::MIN + 1,
        i64::MAX,
        MAX_UNITS + 1,
        -MAX_UNITS - 1,
    ] {
        let e = Adjustment::new("r1", "S1", delta, "restock")
            .unwrap_err()
            .violations();
        assert_eq!(e.len(), 1, "{delta}: {e:?}");
        assert_eq!(e[0].0, "delta");
    }
    assert!(Adjustment::new("r1", "S1", -MAX_UNITS, "write-off").is_ok());
    assert!(Adjustment::new("r1", "S1", MAX_UNITS, "restock").is_ok());
}

#[test]
fn control_characters_are_refused_in_every_string_and_name_the_field() {
    let id = uuid::Uuid::new_v4().to_string();
    let fields =
        |e: StockError| -> Vec<String> { e.violations().into_iter().map(|(f, _)| f).collect() };
    let draft = ProductDraft::new(
        "S1",
        "Wine\0",
        1,
        1,
        0,
        Some(DeductionPolicy::ReserveThenCommit),
        1,
    );
    assert_eq!(fields(draft.unwrap_err()), ["name"]);
    // Trimming does not hide one at the end.
    let draft = ProductDraft::new(
        "S1",
        "Wine\n",
        1,
        1,
        0,
        Some(DeductionPolicy::ReserveThenCommit),
        1,
    );
    assert_eq!(fields(draft.unwrap_err()), ["name"]);
    let adj = Adjustment::new("r\0", "S1", 1, "restock\u{7}").unwrap_err();
    assert_eq!(fields(adj), ["request_id", "reason"]);
    let reserve = ReserveRequest::new(&id, "u\0", "S1", 1, 10).unwrap_err();
    assert_eq!(fields(reserve), ["user_id"]);
    // 64 characters of 2 bytes each: within the character limit, over the byte limit.
    let wide = "é".repeat(64);
    assert_eq!(
        fields(Adjustment::new(&wide, "S1", 1, "x").unwrap_err()),
        ["request_id"]
    );
}

#[test]
fn stock_buckets_default_to_one_and_are_bounded() {
    let draft = |n| {
        ProductDraft::new(
            "S1",
            "Wine",
            1,
            1,
            0,
            Some(DeductionPolicy::CommitAtOrder),
            n,
        )
    };
    assert_eq!(draft(0).unwrap().stock_buckets, 1);
    assert_eq!(draft(1).unwrap().stock_buckets, 1);
    assert_eq!(
        draft(MAX_STOCK_BUCKETS).unwrap().stock_buckets,
        MAX_STOCK_BUCKETS
    );
    for bad in [MAX_STOCK_BUCKETS + 1, u32::MAX] {
        let e = draft(bad).unwrap_err().violations();
        assert_eq!(e.len(), 1, "{bad}: {e:?}");
        assert_eq!(e[0].0, "stock_buckets");
        assert!(e[0].1.contains("64"), "{e:?}");
    }
}

#[test]
fn a_user_always_maps_to_the_same_bucket_and_users_spread_over_all() {
    assert_eq!(bucket_of("anyone", 1), 0);
    assert_eq!(bucket_of("anyone", 0), 0);
    // Pinned: the mapping must never change, or orders would be looked for in the wrong bucket.
    assert_eq!(bucket_of("u1", 8), bucket_of("u1", 8));
    assert_eq!(bucket_of("", 8), (0xcbf2_9ce4_8422_2325_u64 % 8) as u32);
    let mut seen = [0u32; 8];
    for i in 0..800 {
        let b = bucket_of(&format!("user-{i}"), 8);
        assert!(b < 8);
        seen[b as usize] += 1;
    }
    assert!(seen.iter().all(|n| *n > 50), "{seen:?}");
}

#[test]
fn stock_splits_evenly_with_the_remainder_first() {
    assert_eq!(split_evenly(10, 4), [3, 3, 2, 2]);
    assert_eq!(split_evenly(2, 4), [1, 1, 0, 0]);
    assert_eq!(split_evenly(0, 3), [0, 0, 0]);
    assert_eq!(split_evenly(7, 1), [7]);
    assert_eq!(split_evenly(5, 0), [5]);
}
