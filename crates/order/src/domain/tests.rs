use super::*;

#[test]
fn state_machine_allows_only_the_saga_transitions() {
    use Status::*;
    assert!(Pending.can_become(AwaitingPayment));
    assert!(AwaitingPayment.can_become(Paid));
    assert!(Paid.can_become(Shipped));
    assert!(Paid.can_become(Cancelled));
    for terminal in [Shipped, Cancelled] {
        assert!(
            Status::ALL.iter().all(|&to| !terminal.can_become(to)),
            "{terminal} moved"
        );
    }
    assert!(!Pending.can_become(Paid));
    assert!(!AwaitingPayment.can_become(Shipped));
}

#[test]
fn same_key_and_payload_give_the_same_order_id_and_another_payload_another() {
    let a = PlaceOrder::new("alice", "k1", "SKU", 1, 10).unwrap();
    assert_eq!(
        a.order_id(),
        PlaceOrder::new("alice", "k1", "SKU", 1, 10)
            .unwrap()
            .order_id()
    );
    assert_ne!(
        a.order_id(),
        PlaceOrder::new("alice", "k1", "SKU", 2, 10)
            .unwrap()
            .order_id()
    );
    assert_ne!(
        a.order_id(),
        PlaceOrder::new("bob", "k1", "SKU", 1, 10)
            .unwrap()
            .order_id()
    );
}

#[test]
fn bad_orders_and_payments_name_every_field() {
    let e = PlaceOrder::new("u", "", "bad sku", 0, 10)
        .unwrap_err()
        .violations();
    let fields: Vec<_> = e.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(fields, ["request_id", "sku", "quantity"]);
    assert!(PlaceOrder::new("u", &"k".repeat(65), "S", 1, 10).is_err());
    assert!(PlaceOrder::new("u", "k", "S", 11, 10).is_err());
    let e = StartPayment::new("x", &"p".repeat(65), -1)
        .unwrap_err()
        .violations();
    let fields: Vec<_> = e.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(fields, ["order_id", "payment_id", "amount_cents"]);
}

#[test]
fn db_names_round_trip() {
    for s in Status::ALL {
        assert_eq!(Status::from_db(s.as_db()), Some(s));
    }
    for r in CancelReason::ALL {
        assert_eq!(CancelReason::from_db(r.as_db()), Some(r));
    }
}

#[test]
fn lookup_ids_are_one_to_five_hundred_canonical_uuids() {
    let id = uuid::Uuid::new_v4();
    assert_eq!(parse_order_ids(&[id.to_string()]).unwrap(), vec![id]);
    assert!(parse_order_ids(&[]).is_err());
    let many: Vec<String> = (0..=MAX_LOOKUP_IDS)
        .map(|_| uuid::Uuid::new_v4().to_string())
        .collect();
    assert!(parse_order_ids(&many[..MAX_LOOKUP_IDS]).is_ok());
    assert!(parse_order_ids(&many).is_err());
    let e = parse_order_ids(&[id.to_string(), "x".into(), id.simple().to_string()]).unwrap_err();
    let fields: Vec<String> = e.violations().into_iter().map(|(f, _)| f).collect();
    assert_eq!(fields, ["order_ids[1]", "order_ids[2]"]);
}
