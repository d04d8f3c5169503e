//! `flashsale verify` against the whole stack: every check of the three services passes, and
//! what the run made is cleaned up; without the payment simulator the checks that need a
//! payment are reported as not made and the command fails; bad options and a service out of
//! reach fail it.

use crate::{
    full_stack::FullStack,
    helpers::{Run, command, output},
};

async fn verify(stack: &FullStack, args: &[&str]) -> Run {
    let mut cmd = command(&["verify"]);
    cmd.args(args)
        .env("FLASHSALE_PRODUCT_STOCK_URL", &stack.stock_url)
        .env("FLASHSALE_ORDER_URL", &stack.order_url)
        .env("FLASHSALE_OUTBOUND_URL", &stack.outbound_url)
        .env_remove("FLASHSALE_VERIFY_PAYMENT_SIM_URL");
    output(cmd).await
}

/// The run's prefix, from its first line (`run verify-… (…)`).
fn run_id(run: &Run) -> String {
    run.stdout
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("run "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no run line: {}", run.stdout))
        .to_owned()
}

/// `flashsale product get <sku>` as JSON.
async fn product(stack: &FullStack, sku: &str) -> serde_json::Value {
    let mut cmd = command(&["product", "get", sku]);
    cmd.env("FLASHSALE_PRODUCT_STOCK_URL", &stack.stock_url);
    output(cmd).await.json()
}

#[tokio::test]
async fn verify_passes_every_check_of_the_three_services_and_writes_off_its_stock() {
    // A payment deadline the suite's own orders never meet.
    let stack = FullStack::spawn_with(120_000, |_| {}).await;
    let run = verify(
        &stack,
        &[
            "--service",
            "all",
            "--payment-sim-url",
            &stack.payment_sim_url,
        ],
    )
    .await;
    assert!(run.ok, "{}\n{}", run.stdout, run.stderr);
    let checks = run
        .stdout
        .lines()
        .filter(|l| l.starts_with("ok    "))
        .count();
    assert!(checks >= 80, "only {checks} checks:\n{}", run.stdout);
    assert!(
        !run.stdout
            .lines()
            .any(|l| l.starts_with("FAIL") || l.starts_with("--")),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout
            .contains(&format!("{checks} passed, 0 failed, 0 not made")),
        "{}",
        run.stdout
    );
    // The order suite's products: its orders were cancelled, shipped or refused, and what is
    // left was written off.
    let id = run_id(&run);
    for name in ["order", "limited", "one-left", "ship"] {
        let p = product(&stack, &format!("{id}-{name}")).await;
        let p = &p["product"];
        // Protobuf JSON: an int64 is a string, and zero is left out.
        let units = |field: &str| p[field].as_str().map_or(0, |n| n.parse::<i64>().unwrap());
        assert_eq!(p["sku"], format!("{id}-{name}").as_str(), "{p}");
        assert_eq!(units("available"), 0, "{name}: {p}");
        assert_eq!(units("reserved"), 0, "{name}: {p}");
    }
}

#[tokio::test]
async fn verify_without_a_payment_names_the_checks_it_could_not_make_and_fails() {
    let stack = FullStack::spawn_with(120_000, |_| {}).await;
    let run = verify(&stack, &["--service", "outbound"]).await;
    assert!(!run.ok, "{}", run.stdout);
    assert!(
        run.stdout
            .lines()
            .any(|l| l.starts_with("--    a paid order is shipped")
                && l.contains("no --payment-sim-url")),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("0 failed, 1 not made"),
        "{}",
        run.stdout
    );
}

#[tokio::test]
async fn verify_refuses_bad_options_and_fails_on_a_service_out_of_reach() {
    for (args, says) in [
        (
            &["--service", "all", "--endpoint", "http://127.0.0.1:1"][..],
            "--endpoint names one service's endpoint",
        ),
        (
            &["--service", "order", "--timeout-ms", "0"][..],
            "--timeout-ms",
        ),
        (
            &["--service", "order", "--saga-timeout-secs", "0"][..],
            "--saga-timeout-secs",
        ),
        (&["--service", "nothing"][..], "invalid value 'nothing'"),
    ] {
        let mut cmd = command(&["verify"]);
        cmd.args(args);
        let run = output(cmd).await;
        assert!(!run.ok, "{args:?}: {}", run.stdout);
        assert!(run.stderr.contains(says), "{args:?}: {}", run.stderr);
    }

    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let mut cmd = command(&["verify", "--service", "product-stock", "--endpoint", &url]);
    cmd.args(["--timeout-ms", "2000"]);
    let run = output(cmd).await;
    assert!(!run.ok, "{}", run.stdout);
    assert!(
        run.stdout
            .lines()
            .any(|l| l.starts_with("FAIL  the suite ran to its end") && l.contains("connect")),
        "{}",
        run.stdout
    );
}
