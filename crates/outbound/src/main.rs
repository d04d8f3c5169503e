//! `flashsale-outbound`: load settings, start telemetry, serve until SIGTERM/SIGINT.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let settings = flashsale_outbound::config::load()?;
    let _telemetry = flashsale_platform::telemetry::init(&settings.telemetry, "outbound")?;
    flashsale_outbound::startup::build(settings)
        .await?
        .run_until_signalled()
        .await
}
