//! `flashsale health --only <service>`: one service's grpc.health.v1, as a container's health
//! check asks it; a service that does not answer fails it, and an unknown name is refused.

use crate::{
    full_stack::FullStack,
    helpers::{Run, command, output},
};

async fn health(stack: &FullStack, args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = command(&["health", "--timeout-ms", "2000"]);
    cmd.args(args)
        .env("FLASHSALE_PRODUCT_STOCK_URL", &stack.stock_url)
        .env("FLASHSALE_ORDER_URL", &stack.order_url)
        .env("FLASHSALE_OUTBOUND_URL", &stack.outbound_url)
        .env("FLASHSALE_PAYMENT_SIM_URL", &stack.payment_sim_url)
        .env_remove("FLASHSALE_SERVICE");
    for (k, v) in env {
        cmd.env(k, v);
    }
    output(cmd).await
}

#[tokio::test]
async fn health_checks_one_service_when_asked_and_fails_when_it_does_not_answer() {
    let stack = FullStack::spawn(|_| {}).await;
    for only in ["product-stock", "order", "outbound", "payment-sim"] {
        let run = health(&stack, &["--only", only], &[]).await;
        assert!(run.ok, "{only}: {}{}", run.stdout, run.stderr);
        let lines: Vec<&str> = run.stdout.lines().collect();
        assert_eq!(lines.len(), 1, "{}", run.stdout);
        assert!(
            lines[0].starts_with(only) && lines[0].ends_with("SERVING"),
            "{}",
            run.stdout
        );
    }
    // From the environment, as the image's health check reads it.
    let run = health(&stack, &[], &[("FLASHSALE_SERVICE", "order")]).await;
    assert!(run.ok && run.stdout.lines().count() == 1, "{}", run.stdout);
    // Without --only: the three services, not the simulator.
    let run = health(&stack, &[], &[]).await;
    assert!(run.ok && run.stdout.lines().count() == 3, "{}", run.stdout);
    assert!(!run.stdout.contains("payment-sim"), "{}", run.stdout);

    let down = health(
        &stack,
        &["--only", "outbound", "--outbound-url", "http://127.0.0.1:1"],
        &[],
    )
    .await;
    assert!(!down.ok && down.stdout.contains("DOWN"), "{}", down.stdout);
    let unknown = health(&stack, &["--only", "warehouse"], &[]).await;
    assert!(
        !unknown.ok && unknown.stderr.contains("--only"),
        "{}",
        unknown.stderr
    );
}
