//! `flashsale-order`: load settings, start telemetry, serve until SIGTERM/SIGINT.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let settings = flashsale_order::config::load()?;
    let _telemetry = flashsale_platform::telemetry::init(&settings.telemetry, "order")?;
    flashsale_order::startup::build(settings)
        .await?
        .run_until_signalled()
        .await
}
