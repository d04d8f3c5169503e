//! Sales that test the payment deadline: paying too slowly fails the sale and counts its late
//! payments; a sustained sale reports a timeline and ships every payment.

use serde_json::Value;

use crate::full_stack::{FullStack, report};

#[tokio::test]
async fn a_sale_that_pays_too_slowly_for_the_deadline_fails_and_counts_its_late_payments() {
    let stack = FullStack::spawn(|_| {}).await;
    // A thousand winners paid one at a time cannot all pay within the 2 s payment timeout:
    // the sale itself makes them late, which must fail the run, not pass with nothing paid.
    let run = stack
        .sale(&[
            "--buyers",
            "1000",
            "--stock",
            "1000",
            "--concurrency",
            "64",
            "--pay",
            "1",
            "--never-pay",
            "0",
            "--pay-late",
            "0",
            "--pay-concurrency",
            "1",
            "--max-duration-secs",
            "120",
            "--quiet",
            "--json",
        ])
        .await;
    assert!(
        !run.ok,
        "a sale whose payers missed their deadline passed: {}",
        run.stdout
    );
    let r: Value = serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("no report ({e}): {}\n{}", run.stdout, run.stderr));
    let late = &r["payments"]["lateBySale"];
    assert!(late["total"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(late["deliberate"], 0, "{r}");
    assert_eq!(r["payments"]["payConcurrency"], 1, "{r}");
    let checks = r["invariants"].as_array().unwrap();
    let on_time = checks
        .iter()
        .find(|c| c["name"] == "payers paid in time")
        .unwrap();
    assert_eq!(on_time["pass"], false, "{r}");
    assert!(
        on_time["detail"]
            .as_str()
            .unwrap()
            .contains("--pay-concurrency"),
        "{on_time}"
    );
    // Everything else still holds: nobody who paid in time lost their goods.
    for c in checks.iter().filter(|c| c["name"] != "payers paid in time") {
        assert_eq!(c["pass"], true, "{c}");
    }
}

#[tokio::test]
async fn a_sustained_sale_reports_a_timeline_and_ships_every_payment() {
    // A deadline no loaded test machine can miss: this test is about the timeline, not about
    // payments made late (the sale fails those, as the next assertion would show).
    let stack = FullStack::spawn_with(600_000, |_| {}).await;
    let run = stack
        .sale(&[
            "--arrival-rate",
            "20",
            "--sustain-secs",
            "3",
            "--stock",
            "1000",
            "--pay",
            "1",
            "--never-pay",
            "0",
            "--pay-late",
            "0",
            "--order-database-url",
            &stack.order_db_url,
            "--max-duration-secs",
            "90",
            "--json",
        ])
        .await;
    let r = report(&run);
    assert_eq!(r["mode"], "sustained", "{r}");
    assert_eq!(r["arrivals"], 60, "{r}");
    assert_eq!(r["accepted"], 60, "{r}");
    assert_eq!(r["paidAtProvider"], 60, "{r}");
    assert_eq!(r["paidLeftUnshipped"], 0, "{r}");
    assert_eq!(r["paidNotTaken"], 0, "{r}");
    assert!(r["drainSecs"].as_f64().is_some(), "{r}");
    let timeline = r["timeline"].as_array().unwrap();
    assert!(timeline.len() >= 3, "{r}");
    let last = timeline.last().unwrap();
    assert_eq!(last["shipped"], 60, "{r}");
    assert_eq!(last["pending"], 0, "{r}");
    assert_eq!(last["outboxUnsent"]["order"], 0, "{r}");
    let checks: Vec<(&str, bool)> = r["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].as_str().unwrap(), c["pass"] == true))
        .collect();
    assert_eq!(
        checks,
        vec![
            ("units sold <= stock", true),
            ("per-user limit held", true),
            ("gate equals database", true),
            ("OVERLOADED refusals answered at once", true)
        ],
        "{r}"
    );
    assert_eq!(r["pass"], true, "{r}");
    // Every call answered, none refused for load at this pace; the latencies are reported.
    assert_eq!(r["overloaded"], 0, "{r}");
    assert_eq!(r["latency"]["createOrderAccepted"]["count"], 60, "{r}");
    assert!(
        r["latency"]["payOrder"]["count"].as_u64().unwrap_or(0) >= 60,
        "{r}"
    );
    // The cost of a completed order: the machine's CPU over the sale per shipped order.
    assert_eq!(r["cpu"]["completed"], 60, "{r}");
    assert!(
        r["cpu"]["ms_per_completed"]["machine"]
            .as_f64()
            .is_some_and(|ms| ms > 0.0),
        "{r}"
    );
    assert!(
        r["meta"]["machine"]["cpus_online"]
            .as_u64()
            .is_some_and(|n| n > 0),
        "{r}"
    );
}
