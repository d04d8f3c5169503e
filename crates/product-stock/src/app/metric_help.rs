//! The help text of every metric family product-stock exports ([`describe`], once at start).

use metrics::{describe_counter, describe_gauge};

/// Describes product-stock's metric families to the process's recorder.
pub fn describe() {
    for (name, help) in [
        ("flashsale_reserve_accepted_total", "Units the gate reserved."),
        ("flashsale_reserve_refused_total", "Reservations the gate refused, by reason."),
        ("flashsale_holds_expired_total", "Gate holds released because their order was never written."),
        ("flashsale_holds_kept_total", "Expired gate holds kept because their orders exist (their order.created is still on its way)."),
        ("flashsale_holds_retaken_released_total", "Holds retaken by a late replay of a request whose order already existed, given back."),
        ("flashsale_hold_sweeps_deferred_total", "Hold sweeps put off while the order service did not answer."),
        ("flashsale_gate_rebuilds_total", "Products whose gate was rebuilt from the database."),
        ("flashsale_gate_rebuilds_refused_total", "Gate rebuilds put off because the order service could not list its pending orders (the gate stays closed)."),
        ("flashsale_gate_rebuilds_waiting_total", "Reservations refused UNAVAILABLE while a lost gate waits for the orders in flight to be written before it is rebuilt."),
        ("flashsale_gate_repairs_total", "Products whose gate an admin's reconcile repaired."),
        ("flashsale_gate_script_reloads_total", "Times a gate script was missing from Redis (NOSCRIPT) and loaded again, by script."),
        ("flashsale_gate_stale_restarts_total", "Redis nodes found back with data from an earlier life (a stale snapshot, a promoted replica): their gates were dropped and rebuild from the database."),
        ("flashsale_gate_transfers_total", "Transfers of units between a product's stock buckets."),
        ("flashsale_gate_transfers_settled_total", "Transfers between stock buckets that their borrower left, settled by the reconciler."),
        ("flashsale_gate_borrow_exhausted_total", "Reservations answered UNAVAILABLE because stock kept moving between the product's buckets."),
        ("flashsale_releases_settled_total", "Releases of units (cancelled orders) settled by the reconciler between the gate and the database."),
        ("flashsale_reservation_failed_in_db_total", "Holds the gate granted that the database could not reserve: dropped without giving the units back."),
        ("flashsale_write_offs_refused_total", "Write-offs refused for want of free units."),
        ("flashsale_write_offs_raced_total", "Write-offs undone and refused because reservations took the units meanwhile."),
    ] {
        describe_counter!(name, help);
    }
    describe_gauge!(
        super::reconcile::GATE_DRIFT,
        "The gate's counter minus what the database says it should be, units, by product, at the last periodic check (0: they agree)."
    );
}
